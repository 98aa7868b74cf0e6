//! upcc-report: a table target rendered from the metrics of its cells.
//!
//! The long table of per-trial scores is aggregated with polars (group by the grid axes,
//! split and metric; mean, standard deviation and count), then laid out as the paper's
//! tables: Markdown for the terminal, LaTeX in the paper's style (train in blue, test in
//! black; best bold, second underlined, per row and split) and CSV. Cells without results
//! are shown as missing, never dropped.

use std::collections::BTreeMap;

pub mod figure;
pub mod histogram;
mod png;
pub mod published;
pub mod selection;
pub mod sweep;
pub mod text;

use polars::prelude::*;
use serde::{Deserialize, Serialize};
use upcc_stages::table::TableBuilder;

/// Which NMI normalisation a table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NmiVariant {
    Arithmetic,
    Geometric,
}

/// A metric column of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    Acc,
    Nmi,
    Ari,
}

impl Metric {
    pub fn label(self) -> &'static str {
        match self {
            Metric::Acc => "ACC",
            Metric::Nmi => "NMI",
            Metric::Ari => "ARI",
        }
    }
}

/// Presentation settings (part of the table node's key; nothing upstream depends on them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TableSettings {
    pub nmi: NmiVariant,
    pub decimals: usize,
    /// Delta degrees of freedom of the standard deviation (0: population, as numpy).
    pub std_ddof: u8,
    /// Show scores in percent, as the paper.
    pub percent: bool,
}

impl Default for TableSettings {
    fn default() -> Self {
        TableSettings {
            nmi: NmiVariant::Geometric,
            decimals: 1,
            std_ddof: 0,
            percent: true,
        }
    }
}

impl upcc_stages::Check for TableSettings {
    fn check(&self) -> Vec<upcc_stages::Problem> {
        let mut c = upcc_stages::check::Checker::new();
        if self.decimals > 6 {
            c.push(
                "decimals",
                format!("must be at most 6, got {}", self.decimals),
            );
        }
        if self.std_ddof > 1 {
            c.push(
                "std_ddof",
                format!(
                    "must be 0 (population) or 1 (sample), got {}",
                    self.std_ddof
                ),
            );
        }
        c.done()
    }
}

/// Layout of one table target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableLayout {
    pub title: String,
    /// Every axis of the grid with its values, in order.
    pub axes: Vec<(String, Vec<String>)>,
    /// Axes spanning the columns (the rest span rows).
    pub columns: Vec<String>,
    pub metrics: Vec<Metric>,
    pub splits: Vec<String>,
    pub settings: TableSettings,
    /// Mark the best (bold) and second (underlined) column of every row.
    pub highlight_best: bool,
    /// The sentence under the title (default: how scores are shown).
    pub caption: Option<String>,
    /// Published values to show reproduced − published against (not in keys when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<published::Published>,
    /// Printed values of a text table's cells (blind-spot counts, chosen λ/α, wall times) to
    /// set beside the reproduced ones (not in keys when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_text: Option<published::PublishedTexts>,
}

/// Scores of one split of one trial of one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoreRow {
    pub split: String,
    pub acc: f64,
    pub nmi_arithmetic: f64,
    pub nmi_geometric: f64,
    pub ari: f64,
}

/// The result of one trial of one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct CellResult {
    pub coords: BTreeMap<String, String>,
    pub trial: String,
    pub scores: Vec<ScoreRow>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("aggregation failed: {0}")]
    Polars(#[from] PolarsError),
    #[error("{0}")]
    Stage(#[from] upcc_stages::StageError),
    #[error("table layout: {0}")]
    Layout(String),
}

/// Aggregated value of one (cell, split, metric).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agg {
    pub mean: f64,
    pub std: f64,
    pub n: u32,
}

/// The rendered target.
pub struct Rendered {
    pub markdown: String,
    pub latex: String,
    pub csv: String,
    /// Long table (axes…, split, metric, mean, std, n) as Parquet.
    pub parquet: Vec<u8>,
    pub cells_total: usize,
    pub cells_complete: usize,
}

type Key = (Vec<String>, String, Metric);

/// Mean, standard deviation (with `ddof`) and count of `values` per distinct key (string
/// tuples), in order of first appearance. The one place polars aggregates.
pub fn group_stats(
    keys: &[Vec<String>],
    values: &[f64],
    ddof: u8,
) -> Result<Vec<(Vec<String>, Agg)>, ReportError> {
    let width = keys.first().map(|k| k.len()).unwrap_or(0);
    if keys.is_empty() {
        return Ok(vec![]);
    }
    let names: Vec<String> = (0..width).map(|i| format!("k{i}")).collect();
    let mut columns: Vec<Column> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            Column::new(
                n.as_str().into(),
                keys.iter().map(|k| k[i].clone()).collect::<Vec<_>>(),
            )
        })
        .collect();
    columns.push(Column::new("value".into(), values.to_vec()));
    let df = DataFrame::new_infer_height(columns)?;
    // The eager group-by API is deprecated upstream in favour of the lazy engine, whose
    // feature would add polars-lazy and its planner to every build; these are the only
    // aggregations upcc needs.
    #[allow(deprecated)]
    let (mean, std, count) = {
        let gb = df.group_by_stable(names.clone())?;
        (
            gb.clone().select(["value"]).mean()?,
            gb.clone().select(["value"]).std(ddof)?,
            gb.select(["value"]).count()?,
        )
    };
    let key_cols: Vec<Vec<String>> = names
        .iter()
        .map(|k| {
            Ok(mean
                .column(k)?
                .str()?
                .iter()
                .map(|v| v.unwrap_or_default().to_string())
                .collect())
        })
        .collect::<Result<_, PolarsError>>()?;
    let means: Vec<f64> = mean
        .column("value_mean")?
        .f64()?
        .iter()
        .map(|v| v.unwrap_or(f64::NAN))
        .collect();
    let stds: Vec<f64> = std
        .column(std.get_column_names()[width].as_str())?
        .f64()?
        .iter()
        .map(|v| v.unwrap_or(0.0))
        .collect();
    let counts: Vec<u32> = count
        .column("value_count")?
        .cast(&DataType::UInt32)?
        .u32()?
        .iter()
        .map(|v| v.unwrap_or(0))
        .collect();
    Ok((0..means.len())
        .map(|g| {
            let key = (0..width).map(|i| key_cols[i][g].clone()).collect();
            (
                key,
                Agg {
                    mean: means[g],
                    std: if stds[g].is_finite() { stds[g] } else { 0.0 },
                    n: counts[g],
                },
            )
        })
        .collect())
}

/// Aggregate per-trial results with polars: mean, std (ddof) and count per cell/split/metric.
pub fn aggregate(
    layout: &TableLayout,
    results: &[CellResult],
) -> Result<BTreeMap<Key, Agg>, ReportError> {
    let axes: Vec<&str> = layout.axes.iter().map(|(a, _)| a.as_str()).collect();
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for r in results {
        for s in &r.scores {
            for m in &layout.metrics {
                let v = match m {
                    Metric::Acc => s.acc,
                    Metric::Ari => s.ari,
                    Metric::Nmi => match layout.settings.nmi {
                        NmiVariant::Arithmetic => s.nmi_arithmetic,
                        NmiVariant::Geometric => s.nmi_geometric,
                    },
                };
                let mut key = Vec::with_capacity(axes.len() + 2);
                for a in &axes {
                    key.push(
                        r.coords.get(*a).cloned().ok_or_else(|| {
                            ReportError::Layout(format!("result lacks axis `{a}`"))
                        })?,
                    );
                }
                key.push(s.split.clone());
                key.push(m.label().to_string());
                keys.push(key);
                values.push(if layout.settings.percent {
                    100.0 * v
                } else {
                    v
                });
            }
        }
    }
    let mut out = BTreeMap::new();
    for (key, agg) in group_stats(&keys, &values, layout.settings.std_ddof)? {
        let n = axes.len();
        let metric = match key[n + 1].as_str() {
            "ACC" => Metric::Acc,
            "NMI" => Metric::Nmi,
            _ => Metric::Ari,
        };
        out.insert((key[..n].to_vec(), key[n].clone(), metric), agg);
    }
    Ok(out)
}

pub(crate) fn product(axes: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![vec![]];
    for (_, values) in axes {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut p = prefix.clone();
                    p.push(v.clone());
                    p
                })
            })
            .collect();
    }
    out
}

/// Which axes of a layout span rows and which span columns.
pub(crate) struct Pivot<'a> {
    layout: &'a TableLayout,
    pub rows: Vec<(String, Vec<String>)>,
    pub cols: Vec<(String, Vec<String>)>,
}

impl<'a> Pivot<'a> {
    pub fn new(layout: &'a TableLayout) -> Result<Self, ReportError> {
        let mut cols = Vec::new();
        for c in &layout.columns {
            match layout.axes.iter().find(|(a, _)| a == c) {
                Some(axis) => cols.push(axis.clone()),
                None => {
                    return Err(ReportError::Layout(format!(
                        "column axis `{c}` is not an axis of the grid"
                    )))
                }
            }
        }
        let rows = layout
            .axes
            .iter()
            .filter(|(a, _)| !layout.columns.contains(a))
            .cloned()
            .collect();
        Ok(Pivot { layout, rows, cols })
    }

    /// The full coordinate (every axis, in layout order) of row `r` and column `c`.
    pub fn coord(&self, r: &[String], c: &[String]) -> Vec<String> {
        self.layout
            .axes
            .iter()
            .map(|(a, _)| match self.rows.iter().position(|(x, _)| x == a) {
                Some(i) => r[i].clone(),
                None => c[self
                    .cols
                    .iter()
                    .position(|(x, _)| x == a)
                    .expect("a column")]
                .clone(),
            })
            .collect()
    }

    /// A column's header: a single column axis, or the method, is named by its values alone.
    pub fn col_name(&self, c: &[String]) -> String {
        self.cols
            .iter()
            .zip(c)
            .map(|((a, _), v)| {
                if a == "method" || self.cols.len() == 1 {
                    v.clone()
                } else {
                    format!("{a}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Render a table target from per-trial results.
pub fn render(
    layout: &TableLayout,
    results: &[CellResult],
    expected_trials: usize,
) -> Result<Rendered, ReportError> {
    let agg = aggregate(layout, results)?;
    let pivot = Pivot::new(layout)?;
    let (row_axes, col_axes) = (&pivot.rows, &pivot.cols);
    let full_coord = |r: &[String], c: &[String]| pivot.coord(r, c);
    let rows = product(row_axes);
    let cols = product(col_axes);
    let d = layout.settings.decimals;
    // A spread over one trial says nothing: show the mean alone.
    let fmt = |a: &Agg| {
        if a.n <= 1 {
            format!("{:.d$}", a.mean)
        } else {
            format!("{:.d$}±{:.d$}", a.mean, a.std)
        }
    };
    let col_name = |c: &[String]| pivot.col_name(c);
    let mut cells_total = 0;
    let mut cells_complete = 0;
    for r in &rows {
        for c in &cols {
            cells_total += 1;
            let coord = full_coord(r, c);
            let complete = layout.splits.iter().all(|s| {
                layout.metrics.iter().all(|m| {
                    agg.get(&(coord.clone(), s.clone(), *m))
                        .is_some_and(|a| a.n as usize >= expected_trials)
                })
            });
            if complete {
                cells_complete += 1;
            }
        }
    }
    // Rank columns per (row, metric, split): best and second best means.
    let rank = |coords: &[Vec<String>], split: &str, m: Metric| -> (Option<f64>, Option<f64>) {
        let mut v: Vec<f64> = coords
            .iter()
            .filter_map(|c| agg.get(&(c.clone(), split.to_string(), m)).map(|a| a.mean))
            .collect();
        v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
        v.dedup();
        (v.first().copied(), v.get(1).copied())
    };
    let round = |x: f64| (x * 10f64.powi(d as i32)).round();

    // Markdown.
    let mut md = format!("### {}\n\n", layout.title);
    let nmi_note = match layout.settings.nmi {
        NmiVariant::Arithmetic => "NMI normalised by the arithmetic mean of the entropies",
        NmiVariant::Geometric => "NMI normalised by the geometric mean of the entropies",
    };
    match &layout.caption {
        Some(c) => md.push_str(&format!("{c}; — = no result yet.\n\n")),
        None => md.push_str(&format!(
            "{} ({}), cells show {}; {nmi_note}; **best** per row; — = no result yet.\n\n",
            if expected_trials == 1 {
                "One trial"
            } else {
                "Mean ± std over trials"
            },
            if layout.settings.percent {
                "%"
            } else {
                "fraction"
            },
            layout.splits.join(" / ")
        )),
    }
    let header: Vec<String> = row_axes
        .iter()
        .map(|(a, _)| a.clone())
        .chain(["metric".to_string()])
        .chain(cols.iter().map(|c| col_name(c)))
        .collect();
    md.push_str(&format!("| {} |\n", header.join(" | ")));
    md.push_str(&format!(
        "|{}|\n",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    ));
    let mut latex_rows = Vec::new();
    for r in &rows {
        for m in &layout.metrics {
            let coords: Vec<Vec<String>> = cols.iter().map(|c| full_coord(r, c)).collect();
            let mut cells_md = Vec::new();
            let mut cells_tex = Vec::new();
            for coord in &coords {
                let mut parts_md = Vec::new();
                let mut parts_tex = Vec::new();
                for s in &layout.splits {
                    let (best, second) = rank(&coords, s, *m);
                    match agg.get(&(coord.clone(), s.clone(), *m)) {
                        Some(a) => {
                            let is_best = layout.highlight_best
                                && best.is_some_and(|b| round(b) == round(a.mean));
                            let is_second = layout.highlight_best
                                && !is_best
                                && second.is_some_and(|b| round(b) == round(a.mean));
                            let text = fmt(a);
                            parts_md.push(if is_best { format!("**{text}**") } else { text });
                            let num = format!("{:.d$}", a.mean);
                            let num = if is_best {
                                format!("\\textbf{{{num}}}")
                            } else if is_second {
                                format!("\\underline{{{num}}}")
                            } else {
                                num
                            };
                            // The spread over trials, as the paper's appendix tables show it.
                            let num = if a.n > 1 {
                                format!("{num}$\\pm${:.d$}", a.std)
                            } else {
                                num
                            };
                            parts_tex.push(if s == "train" {
                                format!("\\textcolor{{blue}}{{{num}}}")
                            } else {
                                num
                            });
                        }
                        None => {
                            parts_md.push("—".to_string());
                            parts_tex.push("--".to_string());
                        }
                    }
                }
                cells_md.push(parts_md.join(" / "));
                cells_tex.push(parts_tex.join(", "));
            }
            let lead: Vec<String> = r.iter().cloned().chain([m.label().to_string()]).collect();
            md.push_str(&format!(
                "| {} | {} |\n",
                lead.join(" | "),
                cells_md.join(" | ")
            ));
            latex_rows.push(format!(
                "{} & {} \\\\",
                lead.iter()
                    .map(|s| latex_escape(s))
                    .collect::<Vec<_>>()
                    .join(" & "),
                cells_tex.join(" & ")
            ));
        }
    }
    if cells_complete < cells_total {
        md.push_str(&format!(
            "\n{cells_complete} of {cells_total} cells complete ({expected_trials} {} each).\n",
            if expected_trials == 1 {
                "trial"
            } else {
                "trials"
            }
        ));
    }

    if let Some(p) = &layout.published {
        md.push_str(&published::render_deltas(layout, p, &agg)?);
    }

    // LaTeX in the paper's style.
    let mut tex = String::from(LATEX_PACKAGES);
    tex.push_str("\\begin{table}[h]\n\\centering\n");
    let spread = if expected_trials > 1 {
        format!("; mean$\\pm$std over {expected_trials} trials")
    } else {
        String::new()
    };
    tex.push_str(&format!(
        "\\caption{{{} ({}{spread}). \\textcolor{{blue}}{{Blue}} and black represent \\textcolor{{blue}}{{training}} and test results; best in \\textbf{{bold}}, second \\underline{{underlined}}.}}\n",
        latex_escape(&layout.title),
        nmi_note
    ));
    tex.push_str(&format!(
        "\\begin{{tabular}}{{{}}}\n\\toprule\n",
        "l".repeat(row_axes.len() + 1) + &"c".repeat(cols.len())
    ));
    let head: Vec<String> = header.iter().map(|h| latex_escape(h)).collect();
    tex.push_str(&format!("{} \\\\\n\\midrule\n", head.join(" & ")));
    for row in latex_rows {
        tex.push_str(&row);
        tex.push('\n');
    }
    tex.push_str("\\bottomrule\n\\end{tabular}\n\\end{table}\n");

    // CSV and Parquet (long, every cell including missing ones).
    let mut csv = String::new();
    let axis_names: Vec<&str> = layout.axes.iter().map(|(a, _)| a.as_str()).collect();
    csv.push_str(&format!(
        "{},split,metric,mean,std,n\n",
        axis_names.join(",")
    ));
    let mut pcols: Vec<Vec<String>> = vec![Vec::new(); axis_names.len()];
    let (mut psplit, mut pmetric, mut pmean, mut pstd, mut pn) =
        (vec![], vec![], vec![], vec![], vec![]);
    for coord in product(&layout.axes) {
        for s in &layout.splits {
            for m in &layout.metrics {
                let a = agg.get(&(coord.clone(), s.clone(), *m));
                csv.push_str(&format!(
                    "{},{s},{},{},{},{}\n",
                    coord
                        .iter()
                        .map(|v| csv_field(v))
                        .collect::<Vec<_>>()
                        .join(","),
                    m.label(),
                    a.map(|a| format!("{}", a.mean)).unwrap_or_default(),
                    a.map(|a| format!("{}", a.std)).unwrap_or_default(),
                    a.map(|a| a.n).unwrap_or(0)
                ));
                for (c, v) in pcols.iter_mut().zip(&coord) {
                    c.push(v.clone());
                }
                psplit.push(s.clone());
                pmetric.push(m.label().to_string());
                pmean.push(a.map(|a| a.mean));
                pstd.push(a.map(|a| a.std));
                pn.push(a.map(|a| a.n).unwrap_or(0));
            }
        }
    }
    let mut tb = TableBuilder::new();
    for (name, c) in axis_names.iter().zip(pcols) {
        tb = typed_axis(tb, name, c);
    }
    let parquet = tb
        .str("split", psplit)
        .str("metric", pmetric)
        .f64_opt("mean", pmean)
        .f64_opt("std", pstd)
        .u32("n", pn)
        .meta("nmi", format!("{:?}", layout.settings.nmi).to_lowercase())
        .to_parquet()?;
    Ok(Rendered {
        markdown: md,
        latex: tex,
        csv,
        parquet,
        cells_total,
        cells_complete,
    })
}

/// An axis column of a table's Parquet, typed: `pretrain` boolean, `corruption` float64,
/// `budget` int64 (when every value reads as one), any other axis text.
pub fn typed_axis(tb: TableBuilder, name: &str, values: Vec<String>) -> TableBuilder {
    match name {
        "pretrain" if values.iter().all(|v| v == "true" || v == "false") => {
            tb.bool(name, values.iter().map(|v| v == "true").collect())
        }
        "corruption" if values.iter().all(|v| v.parse::<f64>().is_ok()) => {
            tb.f64(name, values.iter().filter_map(|v| v.parse().ok()).collect())
        }
        "budget" if values.iter().all(|v| v.parse::<i64>().is_ok()) => {
            tb.i64(name, values.iter().filter_map(|v| v.parse().ok()).collect())
        }
        _ => tb.str(name, values),
    }
}

/// How figures name a coordinate: methods by the paper's names (a search run's
/// `probpair@lambda=0.1` keeps its suffix), pretraining in words, the constraint axes with
/// their symbols; anything else as written.
pub fn display_value(axis: &str, v: &str) -> String {
    match axis {
        "method" => {
            let (base, rest) = v.split_once('@').map_or((v, None), |(b, r)| (b, Some(r)));
            let name = match base {
                "probpair" => "ProbPair",
                "weighted-probpair" => "Weighted ProbPair",
                "eci-pp" => "ECI-PP",
                "vanilla-dcc" => "VanillaDCC",
                "volmax-dcc" => "VolMaxDCC",
                "cidec" => "CIDEC",
                "spherepair" => "SpherePair",
                "sp-ea" => "SP-EA",
                "wpp-ea" => "WPP-EA",
                other => other,
            };
            match rest {
                Some(r) => format!("{name} ({r})"),
                None => name.to_string(),
            }
        }
        "pretrain" => match v {
            "true" => "pretrained".to_string(),
            "false" => "no pretraining".to_string(),
            other => other.to_string(),
        },
        "corruption" => format!("π = {v}"),
        "budget" => format!("{v} constraints"),
        _ => v.to_string(),
    }
}

/// The first line of every generated `.tex`: what a document needs to `\\input` it.
pub(crate) const LATEX_PACKAGES: &str =
    "% upcc table: \\input it in a document that loads \\usepackage{booktabs,xcolor}\n";

pub(crate) fn latex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let greek = GREEK.iter().find(|(g, _)| *g == c).map(|(_, n)| *n);
        match (c, greek) {
            (_, Some(name)) => {
                out.push_str("$\\");
                out.push_str(name);
                out.push('$');
            }
            ('\\', _) => out.push_str("\\textbackslash{}"),
            ('_' | '%' | '&' | '#' | '$' | '{' | '}', _) => {
                out.push('\\');
                out.push(c);
            }
            ('~', _) => out.push_str("\\textasciitilde{}"),
            ('^', _) => out.push_str("\\textasciicircum{}"),
            ('—', _) => out.push_str("---"),
            ('–', _) => out.push_str("--"),
            ('±', _) => out.push_str("$\\pm$"),
            ('×', _) => out.push_str("$\\times$"),
            ('→', _) => out.push_str("$\\to$"),
            ('≤', _) => out.push_str("$\\le$"),
            ('≥', _) => out.push_str("$\\ge$"),
            ('≈', _) => out.push_str("$\\approx$"),
            ('·', _) => out.push_str("$\\cdot$"),
            ('−', _) => out.push_str("$-$"),
            ('…', _) => out.push_str("\\ldots{}"),
            ('‘' | '’', _) => out.push('\''),
            ('“', _) => out.push_str("``"),
            ('”', _) => out.push_str("''"),
            (c, _) if c.is_ascii() => out.push(c),
            // Anything else stock pdflatex may not know: named, never passed raw.
            (c, _) => out.push_str(&format!("[U+{:04X}]", c as u32)),
        }
    }
    out
}

/// Greek letters a title may use (π, λ, α, …) and their LaTeX names, typeset in math mode.
const GREEK: &[(char, &str)] = &[
    ('α', "alpha"),
    ('β', "beta"),
    ('γ', "gamma"),
    ('δ', "delta"),
    ('ε', "epsilon"),
    ('ζ', "zeta"),
    ('η', "eta"),
    ('θ', "theta"),
    ('κ', "kappa"),
    ('λ', "lambda"),
    ('μ', "mu"),
    ('ν', "nu"),
    ('ξ', "xi"),
    ('π', "pi"),
    ('ρ', "rho"),
    ('σ', "sigma"),
    ('τ', "tau"),
    ('φ', "phi"),
    ('χ', "chi"),
    ('ψ', "psi"),
    ('ω', "omega"),
    ('Γ', "Gamma"),
    ('Δ', "Delta"),
    ('Θ', "Theta"),
    ('Λ', "Lambda"),
    ('Ξ', "Xi"),
    ('Π', "Pi"),
    ('Σ', "Sigma"),
    ('Φ', "Phi"),
    ('Ψ', "Psi"),
    ('Ω', "Omega"),
];

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains(',') || s.contains('"') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> TableLayout {
        TableLayout {
            title: "t".into(),
            axes: vec![
                ("dataset".into(), vec!["d1".into()]),
                ("method".into(), vec!["a".into(), "b".into(), "c".into()]),
            ],
            columns: vec!["method".into()],
            metrics: vec![Metric::Acc, Metric::Nmi],
            splits: vec!["train".into(), "test".into()],
            settings: TableSettings::default(),
            highlight_best: true,
            caption: None,
            published: None,
            published_text: None,
        }
    }

    fn result(method: &str, trial: &str, acc: f64) -> CellResult {
        CellResult {
            coords: BTreeMap::from([
                ("dataset".into(), "d1".into()),
                ("method".into(), method.into()),
            ]),
            trial: trial.into(),
            scores: ["train", "test"]
                .iter()
                .map(|s| ScoreRow {
                    split: s.to_string(),
                    acc,
                    nmi_arithmetic: 0.1,
                    nmi_geometric: 0.2,
                    ari: 0.3,
                })
                .collect(),
        }
    }

    #[test]
    fn a_one_trial_table_shows_no_spread() {
        let results = vec![result("a", "1", 0.5), result("b", "1", 0.4)];
        let r = render(&layout(), &results, 1).unwrap();
        assert!(!r.markdown.contains('±'), "{}", r.markdown);
        assert!(r.markdown.contains("One trial (%)"), "{}", r.markdown);
        assert!(
            r.markdown.contains("2 of 3 cells complete (1 trial each)"),
            "{}",
            r.markdown
        );
    }

    #[test]
    fn mean_std_and_missing_cells() {
        let results = vec![
            result("a", "1", 0.5),
            result("a", "2", 0.7),
            result("b", "1", 0.4),
        ];
        let r = render(&layout(), &results, 2).unwrap();
        // a: mean 60.0, population std 10.0; b: one trial (no spread to show); c: missing.
        assert!(r.markdown.contains("**60.0±10.0**"), "{}", r.markdown);
        assert!(r.markdown.contains("| 40.0 / 40.0 |"), "{}", r.markdown);
        assert!(!r.markdown.contains("40.0±"), "{}", r.markdown);
        assert!(r.markdown.contains("— / —"), "{}", r.markdown);
        assert_eq!((r.cells_total, r.cells_complete), (3, 1));
        // Geometric NMI is shown by default.
        assert!(r.markdown.contains("20.0±0.0"));
        assert!(
            r.latex.contains("\\textbf{60.0}") && r.latex.contains("\\underline{40.0}"),
            "{}",
            r.latex
        );
        // Training in blue, the spread over trials beside the mean, as the appendix shows it.
        assert!(
            r.latex
                .contains("\\textcolor{blue}{\\textbf{60.0}$\\pm$10.0}"),
            "{}",
            r.latex
        );
        assert!(!r.latex.contains("40.0$\\pm$"), "one trial: no spread");
        assert!(r.latex.is_ascii());
        assert!(
            r.csv.lines().any(|l| l.starts_with("d1,c,test,ACC,,,0")),
            "{}",
            r.csv
        );
    }

    #[test]
    fn sample_std_when_asked() {
        let mut l = layout();
        l.settings.std_ddof = 1;
        let results = vec![result("a", "1", 0.5), result("a", "2", 0.7)];
        let agg = aggregate(&l, &results).unwrap();
        let a = agg[&(
            vec!["d1".to_string(), "a".to_string()],
            "test".to_string(),
            Metric::Acc,
        )];
        assert!((a.std - (200.0f64).sqrt()).abs() < 1e-9, "{}", a.std);
        assert_eq!(a.n, 2);
    }
}
