//! Reproduced against published: per cell, reproduced − published and whether the difference
//! lies within the trials' spread, under the table, with one summary line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Agg, Metric, Pivot, TableLayout};

/// One published value a table cell is compared with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedValue {
    /// The cell's coordinates, in the order of the layout's axes.
    pub coord: Vec<String>,
    pub split: String,
    pub metric: Metric,
    pub value: f64,
}

/// The published values of a table target's cells (part of the table node's key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// Where they come from (`paper Table 1 (table:exp1_9k_main)`).
    pub source: String,
    pub values: Vec<PublishedValue>,
}

/// A difference counts as within the spread when |Δ| ≤ std over trials plus half a unit of
/// the published value's last digit (the paper prints one decimal).
const ROUNDING: f64 = 0.05;

/// Whether a reproduced aggregate agrees with a published value.
pub fn within(a: &Agg, published: f64) -> bool {
    (a.mean - published).abs() <= a.std + ROUNDING
}

type Key = (Vec<String>, String, Metric);

/// The deltas table (Markdown) in the layout's pivot, and its summary line.
pub fn render_deltas(
    layout: &TableLayout,
    published: &Published,
    agg: &BTreeMap<Key, Agg>,
) -> Result<String, crate::ReportError> {
    let lookup: BTreeMap<Key, f64> = published
        .values
        .iter()
        .map(|v| ((v.coord.clone(), v.split.clone(), v.metric), v.value))
        .collect();
    let pivot = Pivot::new(layout)?;
    let rows = crate::product(&pivot.rows);
    let cols = crate::product(&pivot.cols);
    let d = layout.settings.decimals;
    let mut md = format!(
        "\n**Reproduced − published** ({}; cells show {}; ✓ = within the trials' spread: |Δ| ≤ std + {ROUNDING}; · = no published value; — = no result yet):\n\n",
        published.source,
        layout.splits.join(" / ")
    );
    let header: Vec<String> = pivot
        .rows
        .iter()
        .map(|(a, _)| a.clone())
        .chain(["metric".to_string()])
        .chain(cols.iter().map(|c| pivot.col_name(c)))
        .collect();
    md.push_str(&format!("| {} |\n", header.join(" | ")));
    md.push_str(&format!(
        "|{}|\n",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    ));
    let (mut compared, mut agreeing, mut abs_sum) = (0usize, 0usize, 0.0f64);
    for r in &rows {
        for m in &layout.metrics {
            let mut cells = Vec::new();
            for c in &cols {
                let coord = pivot.coord(r, c);
                let parts: Vec<String> = layout
                    .splits
                    .iter()
                    .map(|s| {
                        let key = (coord.clone(), s.clone(), *m);
                        match (lookup.get(&key), agg.get(&key)) {
                            (None, _) => "·".to_string(),
                            (Some(_), None) => "—".to_string(),
                            (Some(&p), Some(a)) => {
                                compared += 1;
                                abs_sum += (a.mean - p).abs();
                                let ok = within(a, p);
                                agreeing += usize::from(ok);
                                format!("{:+.d$}{}", a.mean - p, if ok { " ✓" } else { "" })
                            }
                        }
                    })
                    .collect();
                cells.push(parts.join(" / "));
            }
            let lead: Vec<String> = r.iter().cloned().chain([m.label().to_string()]).collect();
            md.push_str(&format!(
                "| {} | {} |\n",
                lead.join(" | "),
                cells.join(" | ")
            ));
        }
    }
    if compared == 0 {
        md.push_str(&format!(
            "\nNo value to compare yet ({} published values, none with a reproduced result).\n",
            published.values.len()
        ));
    } else {
        md.push_str(&format!(
            "\n{agreeing} of {compared} compared values lie within the trials' spread of the published one; mean |Δ| = {:.d$} points.\n",
            abs_sum / compared as f64
        ));
    }
    Ok(md)
}

/// One published clustering score (a row of `table1.csv`, `table10.csv`).
#[derive(Clone, Debug, PartialEq)]
pub struct PublishedScore {
    pub dataset: String,
    pub supervision: String,
    pub method: String,
    pub pretrain: bool,
    pub corruption: f64,
    pub budget: usize,
    pub metric: Metric,
    pub split: String,
    pub value: f64,
}

/// The scores of table `table` in a
/// `table,dataset,supervision,method,pretrain,corruption,budget,metric,split,value` CSV file;
/// errors name the file, line and field.
pub fn read_scores(
    bytes: &[u8],
    display: &str,
    table: &str,
) -> Result<Vec<PublishedScore>, String> {
    const HEADER: [&str; 10] = [
        "table",
        "dataset",
        "supervision",
        "method",
        "pretrain",
        "corruption",
        "budget",
        "metric",
        "split",
        "value",
    ];
    let rows = records(bytes, display, &HEADER)?;
    let mut out = Vec::new();
    let mut tables = std::collections::BTreeSet::new();
    for (line, f) in rows {
        let at = |what: String| format!("`{display}`:{line}: {what}");
        tables.insert(f[0].clone());
        if f[0] != table {
            continue;
        }
        let pretrain = match f[4].as_str() {
            "true" => true,
            "false" => false,
            v => return Err(at(format!("`pretrain` is `{v}`, expected true or false"))),
        };
        let corruption: f64 = f[5]
            .parse()
            .map_err(|_| at(format!("`corruption` `{}` is not a number", f[5])))?;
        let budget: usize = f[6]
            .parse()
            .map_err(|_| at(format!("`budget` `{}` is not a whole number", f[6])))?;
        let metric = match f[7].as_str() {
            "ACC" => Metric::Acc,
            "NMI" => Metric::Nmi,
            "ARI" => Metric::Ari,
            v => return Err(at(format!("`metric` is `{v}`, expected ACC, NMI or ARI"))),
        };
        if !matches!(f[8].as_str(), "train" | "test" | "val") {
            return Err(at(format!(
                "`split` is `{}`, expected train, test or val",
                f[8]
            )));
        }
        let value: f64 = f[9]
            .parse()
            .map_err(|_| at(format!("`value` `{}` is not a number", f[9])))?;
        if !value.is_finite() {
            return Err(at(format!("`value` `{}` is not finite", f[9])));
        }
        out.push(PublishedScore {
            dataset: f[1].clone(),
            supervision: f[2].clone(),
            method: f[3].clone(),
            pretrain,
            corruption,
            budget,
            metric,
            split: f[8].clone(),
            value,
        });
    }
    if out.is_empty() {
        return Err(no_rows(display, table, &tables));
    }
    Ok(out)
}

fn no_rows(display: &str, table: &str, tables: &std::collections::BTreeSet<String>) -> String {
    let known: Vec<&str> = tables.iter().map(|t| t.as_str()).collect();
    format!(
        "`{display}` has no rows of table `{table}` (its tables: {})",
        known.join(", ")
    )
}

/// The records of a CSV file with exactly `header` (RFC 4180: quoted fields, commas inside
/// quotes), each with its line number; errors name the file and line.
fn records(
    bytes: &[u8],
    display: &str,
    header: &[&str],
) -> Result<Vec<(u64, Vec<String>)>, String> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(true)
        .from_reader(bytes);
    let h = r
        .headers()
        .map_err(|e| format!("`{display}`: {e}"))?
        .clone();
    if h.iter().collect::<Vec<_>>() != header {
        return Err(format!(
            "`{display}`:1: the header must be `{}`",
            header.join(",")
        ));
    }
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| match e.position() {
            Some(p) => format!("`{display}`:{}: {e}", p.line()),
            None => format!("`{display}`: {e}"),
        })?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        if rec.len() != header.len() {
            return Err(format!(
                "`{display}`:{line}: {} fields, expected {}",
                rec.len(),
                header.len()
            ));
        }
        out.push((line, rec.iter().map(str::to_string).collect()));
    }
    Ok(out)
}

/// One value of a `table,row,column,value` file (the paper's tables that are not clustering
/// scores), as printed: `1e-3`, `(4,3,3)`, `34m39s`, `88.76`.
#[derive(Clone, Debug, PartialEq)]
pub struct PrintedCell {
    pub row: String,
    pub column: String,
    pub text: String,
    /// The line of the file it is on.
    pub line: u64,
}

/// The cells of table `table` in a `table,row,column,value` CSV file (RFC 4180: fields may be
/// quoted); errors name the file and line.
pub fn read_printed(bytes: &[u8], display: &str, table: &str) -> Result<Vec<PrintedCell>, String> {
    let rows = records(bytes, display, &["table", "row", "column", "value"])?;
    let mut cells = Vec::new();
    let mut tables = std::collections::BTreeSet::new();
    for (line, f) in rows {
        tables.insert(f[0].clone());
        if f[0] != table {
            continue;
        }
        if f[3].is_empty() {
            return Err(format!("`{display}`:{line}: the value is empty"));
        }
        cells.push(PrintedCell {
            row: f[1].clone(),
            column: f[2].clone(),
            text: f[3].clone(),
            line,
        });
    }
    if cells.is_empty() {
        return Err(no_rows(display, table, &tables));
    }
    Ok(cells)
}

/// How printed values are held against reproduced ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Comparison {
    /// The same text, spaces aside (blind-spot counts `(4,3,3)`).
    Exact,
    /// The same number (a chosen λ or α: `1e-3` = 0.001).
    Number,
    /// Wall times (`1h15m41s`): shown side by side with their ratio.
    Duration,
}

/// One printed value, at the cell's coordinates in the layout's axes order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedText {
    pub coord: Vec<String>,
    pub text: String,
}

/// The printed values of a text table's cells (part of the table node's key when set).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedTexts {
    pub source: String,
    pub comparison: Comparison,
    pub values: Vec<PublishedText>,
    /// What the published values were measured on (wall times: the paper's A100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// A reproduced cell of a text table: its text, the number behind it (seconds, a chosen
/// value) and, for wall times, what it was measured on.
#[derive(Clone, Debug, PartialEq)]
pub struct ReproducedText {
    pub coord: Vec<String>,
    pub text: String,
    pub value: Option<f64>,
    pub device: Option<String>,
}

/// Seconds of a wall time as the paper prints it: `1h15m41s`, `34m39s`, `0m41s`, `12s`.
pub fn parse_duration(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    let mut total = 0.0;
    let mut num = String::new();
    let mut units = 0;
    for c in t.chars() {
        match c {
            '0'..='9' | '.' => num.push(c),
            'h' | 'm' | 's' => {
                let v: f64 = num.parse().ok()?;
                num.clear();
                units += 1;
                total += v * match c {
                    'h' => 3600.0,
                    'm' => 60.0,
                    _ => 1.0,
                };
            }
            _ => return None,
        }
    }
    (num.is_empty() && units > 0).then_some(total)
}

fn parse_number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The comparison of a text table with its printed values (Markdown), in the layout's cell
/// order: one row per printed value, with the reproduced value, and ✓ where they agree
/// (`Exact`, `Number`) or their ratio (`Duration`), and a summary line.
pub fn render_text_deltas(
    layout: &TableLayout,
    published: &PublishedTexts,
    cells: &[ReproducedText],
) -> String {
    let by_coord: BTreeMap<&Vec<String>, &ReproducedText> =
        cells.iter().map(|c| (&c.coord, c)).collect();
    let printed: BTreeMap<&Vec<String>, &str> = published
        .values
        .iter()
        .map(|v| (&v.coord, v.text.as_str()))
        .collect();
    let axes: Vec<&str> = layout.axes.iter().map(|(a, _)| a.as_str()).collect();
    let last = match published.comparison {
        Comparison::Duration => "reproduced ÷ published",
        _ => "agree",
    };
    let mut md = format!(
        "\n**Reproduced against published** ({}):\n\n| {} | reproduced | published | {last} |\n|{}|\n",
        published.source,
        axes.join(" | "),
        vec!["---"; axes.len() + 3].join("|")
    );
    let (mut compared, mut agreeing) = (0usize, 0usize);
    let mut ratios = Vec::new();
    let mut devices = std::collections::BTreeSet::new();
    for coord in crate::product(&layout.axes) {
        let Some(text) = printed.get(&coord) else {
            continue;
        };
        let (shown, verdict) = match by_coord.get(&coord) {
            None => ("—".to_string(), String::new()),
            Some(c) => {
                if let Some(d) = &c.device {
                    devices.insert(d.clone());
                }
                let verdict = match published.comparison {
                    Comparison::Exact => {
                        compared += 1;
                        let same = c.text.replace(' ', "") == text.replace(' ', "");
                        agreeing += usize::from(same);
                        if same { "✓" } else { "✗" }.to_string()
                    }
                    Comparison::Number => {
                        match (
                            c.value.or_else(|| parse_number(&c.text)),
                            parse_number(text),
                        ) {
                            (Some(a), Some(b)) => {
                                compared += 1;
                                let same = (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
                                agreeing += usize::from(same);
                                if same { "✓" } else { "✗" }.to_string()
                            }
                            _ => "?".to_string(),
                        }
                    }
                    Comparison::Duration => {
                        match (
                            c.value.or_else(|| parse_duration(&c.text)),
                            parse_duration(text),
                        ) {
                            (Some(a), Some(b)) if b > 0.0 => {
                                compared += 1;
                                ratios.push(a / b);
                                format!("{:.2}", a / b)
                            }
                            _ => "?".to_string(),
                        }
                    }
                };
                (c.text.clone(), verdict)
            }
        };
        md.push_str(&format!(
            "| {} | {shown} | {text} | {verdict} |\n",
            coord.join(" | ")
        ));
    }
    md.push('\n');
    if compared == 0 {
        md.push_str(&format!(
            "No value to compare yet ({} published values, none with a reproduced result).\n",
            published.values.len()
        ));
        return md;
    }
    match published.comparison {
        Comparison::Exact | Comparison::Number => md.push_str(&format!(
            "{agreeing} of {compared} compared values are the published ones.\n"
        )),
        Comparison::Duration => {
            ratios.sort_by(|a, b| a.total_cmp(b));
            let median = if ratios.len() % 2 == 1 {
                ratios[ratios.len() / 2]
            } else {
                (ratios[ratios.len() / 2 - 1] + ratios[ratios.len() / 2]) / 2.0
            };
            md.push_str(&format!(
                "Reproduced ÷ published wall time: median {median:.2} over {compared} cells (from {:.2} to {:.2}). Reproduced on {}; published on {}.\n",
                ratios[0],
                ratios[ratios.len() - 1],
                if devices.is_empty() {
                    "an unrecorded device".to_string()
                } else {
                    devices.into_iter().collect::<Vec<_>>().join("; ")
                },
                published.device.as_deref().unwrap_or("an unstated device")
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CellResult, ScoreRow, TableSettings};

    #[test]
    fn deltas_mark_agreement_within_the_spread_and_count_it() {
        let layout = TableLayout {
            title: "t".into(),
            axes: vec![
                ("dataset".into(), vec!["d".into()]),
                ("method".into(), vec!["a".into(), "b".into()]),
            ],
            columns: vec!["method".into()],
            metrics: vec![Metric::Acc],
            splits: vec!["test".into()],
            settings: TableSettings::default(),
            highlight_best: true,
            caption: None,
            published_text: None,
            published: Some(Published {
                source: "paper".into(),
                values: vec![
                    PublishedValue {
                        coord: vec!["d".into(), "a".into()],
                        split: "test".into(),
                        metric: Metric::Acc,
                        value: 50.0,
                    },
                    PublishedValue {
                        coord: vec!["d".into(), "b".into()],
                        split: "test".into(),
                        metric: Metric::Acc,
                        value: 90.0,
                    },
                ],
            }),
        };
        // a: trials 0.49 and 0.53 → 51.0 ± 2.0, within 1.0 of 50; b: 0.80 twice → −10.
        let result = |m: &str, t: &str, acc: f64| CellResult {
            coords: [("dataset", "d"), ("method", m)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            trial: t.into(),
            scores: vec![ScoreRow {
                split: "test".into(),
                acc,
                nmi_arithmetic: f64::NAN,
                nmi_geometric: f64::NAN,
                ari: f64::NAN,
            }],
        };
        let results = vec![
            result("a", "1", 0.49),
            result("a", "2", 0.53),
            result("b", "1", 0.8),
            result("b", "2", 0.8),
        ];
        let r = crate::render(&layout, &results, 2).unwrap();
        assert!(
            r.markdown.contains("| d | ACC | +1.0 ✓ | -10.0 |"),
            "{}",
            r.markdown
        );
        assert!(
            r.markdown.contains("1 of 2 compared values lie within the trials' spread of the published one; mean |Δ| = 5.5 points."),
            "{}",
            r.markdown
        );
    }
}
