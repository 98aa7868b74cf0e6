//! Tables whose cells are text rather than scores: the experts' blind-spot counts (the paper's
//! Table 2) and the training wall times (Table 11). One entry per cell of the grid, no trials.

use std::collections::BTreeMap;

use upcc_stages::table::TableBuilder;

use crate::{csv_field, latex_escape, product, Pivot, Rendered, ReportError, TableLayout};

/// One cell's text: as Markdown and CSV show it, and as LaTeX does (already escaped), plus
/// the number behind it when there is one (seconds of a wall time).
#[derive(Clone, Debug, PartialEq)]
pub struct TextCell {
    pub coords: BTreeMap<String, String>,
    pub text: String,
    pub latex: String,
    pub value: Option<f64>,
    /// What it was measured on (wall times), for the comparison with published values.
    pub device: Option<String>,
}

/// Render a table of text cells: the layout's column axes span columns, the rest rows;
/// `caption` is the sentence under the title; cells without an entry show `—`.
pub fn render_text(
    layout: &TableLayout,
    cells: &[TextCell],
    caption: &str,
) -> Result<Rendered, ReportError> {
    let pivot = Pivot::new(layout)?;
    let by_coord: BTreeMap<Vec<String>, &TextCell> = cells
        .iter()
        .map(|c| {
            let key = layout
                .axes
                .iter()
                .map(|(a, _)| c.coords.get(a).cloned().unwrap_or_default())
                .collect();
            (key, c)
        })
        .collect();
    let rows = product(&pivot.rows);
    let cols = product(&pivot.cols);
    let header: Vec<String> = pivot
        .rows
        .iter()
        .map(|(a, _)| a.clone())
        .chain(cols.iter().map(|c| pivot.col_name(c)))
        .collect();
    let mut md = format!("### {}\n\n{caption}; — = no result yet.\n\n", layout.title);
    md.push_str(&format!("| {} |\n", header.join(" | ")));
    md.push_str(&format!(
        "|{}|\n",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    ));
    let mut tex = crate::LATEX_PACKAGES.to_string()
        + &format!(
        "\\begin{{table}}[t]\n\\centering\n\\caption{{{}. {}.}}\n\\begin{{tabular}}{{{}}}\n\\toprule\n{} \\\\\n\\midrule\n",
        latex_escape(&layout.title),
        latex_escape(caption),
        "l".repeat(pivot.rows.len()) + &"c".repeat(cols.len()),
        header
            .iter()
            .map(|h| latex_escape(h))
            .collect::<Vec<_>>()
            .join(" & ")
    );
    let mut complete = 0;
    for r in &rows {
        let (mut cm, mut ct) = (Vec::new(), Vec::new());
        for c in &cols {
            match by_coord.get(&pivot.coord(r, c)) {
                Some(cell) => {
                    complete += 1;
                    cm.push(cell.text.clone());
                    ct.push(cell.latex.clone());
                }
                None => {
                    cm.push("—".into());
                    ct.push("--".into());
                }
            }
        }
        md.push_str(&format!("| {} | {} |\n", r.join(" | "), cm.join(" | ")));
        let label: Vec<String> = r.iter().map(|s| latex_escape(s)).collect();
        tex.push_str(&format!(
            "{} & {} \\\\\n",
            label.join(" & "),
            ct.join(" & ")
        ));
    }
    let total = rows.len() * cols.len();
    if complete < total {
        md.push_str(&format!("\n{complete} of {total} cells complete.\n"));
    }
    if let Some(p) = &layout.published_text {
        let reproduced: Vec<crate::published::ReproducedText> = by_coord
            .iter()
            .map(|(coord, c)| crate::published::ReproducedText {
                coord: coord.clone(),
                text: c.text.clone(),
                value: c.value,
                device: c.device.clone(),
            })
            .collect();
        md.push_str(&crate::published::render_text_deltas(
            layout,
            p,
            &reproduced,
        ));
    }
    tex.push_str("\\bottomrule\n\\end{tabular}\n\\end{table}\n");
    let names: Vec<&str> = layout.axes.iter().map(|(a, _)| a.as_str()).collect();
    let mut csv = format!("{},text,value\n", names.join(","));
    let mut pcols: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    let (mut ptext, mut pvalue) = (vec![], vec![]);
    for coord in product(&layout.axes) {
        let cell = by_coord.get(&coord);
        let fields: Vec<String> = coord.iter().map(|v| csv_field(v)).collect();
        csv.push_str(&format!(
            "{},{},{}\n",
            fields.join(","),
            cell.map(|c| csv_field(&c.text)).unwrap_or_default(),
            cell.and_then(|c| c.value)
                .map(|v| format!("{v}"))
                .unwrap_or_default()
        ));
        for (col, v) in pcols.iter_mut().zip(&coord) {
            col.push(v.clone());
        }
        ptext.push(cell.map(|c| c.text.clone()));
        pvalue.push(cell.and_then(|c| c.value));
    }
    let mut tb = TableBuilder::new();
    for (name, c) in names.iter().zip(pcols) {
        tb = tb.str(name, c);
    }
    let parquet = tb
        .str(
            "text",
            ptext.into_iter().map(|t| t.unwrap_or_default()).collect(),
        )
        .f64_opt("value", pvalue)
        .to_parquet()?;
    Ok(Rendered {
        markdown: md,
        latex: tex,
        csv,
        parquet,
        cells_total: total,
        cells_complete: complete,
    })
}

/// `(4,3,3)`: the unfamiliar-class count of each expert, from the experts' `unfamiliar`
/// lists (comma-separated class ids, one per expert).
pub fn blind_spot_counts(unfamiliar: &[String]) -> String {
    let counts: Vec<String> = unfamiliar
        .iter()
        .map(|u| {
            u.split(',')
                .filter(|c| !c.trim().is_empty())
                .count()
                .to_string()
        })
        .collect();
    format!("({})", counts.join(","))
}

/// `1h03m05s`, `22m41s`, `0m41s`: the paper's Table 11 style.
pub fn hms(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, sec) => format!("{h}h{m:02}m{sec:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metric, TableSettings};

    #[test]
    fn text_cells_pivot_and_missing_ones_show_a_dash() {
        let layout = TableLayout {
            title: "Table 2".into(),
            axes: vec![
                ("dataset".into(), vec!["mnist".into(), "reuters".into()]),
                ("supervision".into(), vec!["multi2".into(), "multi3".into()]),
            ],
            columns: vec!["supervision".into()],
            metrics: vec![Metric::Acc],
            splits: vec!["test".into()],
            settings: TableSettings::default(),
            highlight_best: false,
            caption: None,
            published: None,
            published_text: None,
        };
        let cell = |d: &str, s: &str, t: &str| TextCell {
            coords: BTreeMap::from([
                ("dataset".to_string(), d.to_string()),
                ("supervision".to_string(), s.to_string()),
            ]),
            text: t.into(),
            latex: format!("${t}$"),
            value: None,
            device: None,
        };
        let r = render_text(
            &layout,
            &[
                cell("mnist", "multi3", "(4,3,3)"),
                cell("reuters", "multi2", "(2,2)"),
            ],
            "Unfamiliar classes per expert",
        )
        .unwrap();
        assert!(
            r.markdown.contains("| mnist | — | (4,3,3) |"),
            "{}",
            r.markdown
        );
        assert!(r.markdown.contains("| reuters | (2,2) | — |"));
        assert!(r.markdown.contains("2 of 4 cells complete"));
        assert!(r.latex.contains("mnist & -- & $(4,3,3)$ \\\\"));
        assert!(r.csv.contains("mnist,multi3,\"(4,3,3)\","), "{}", r.csv);
        assert_eq!((r.cells_total, r.cells_complete), (4, 2));
    }

    #[test]
    fn counts_and_times_read_as_the_paper_writes_them() {
        assert_eq!(
            blind_spot_counts(&["0,1,2,3".into(), "4,5,6".into(), "7,8,9".into()]),
            "(4,3,3)"
        );
        assert_eq!(blind_spot_counts(&["".into(), "3".into()]), "(0,1)");
        assert_eq!(hms(41.4), "0m41s");
        assert_eq!(hms(22.0 * 60.0 + 41.0), "22m41s");
        assert_eq!(hms(3600.0 + 3.0 * 60.0 + 5.0), "1h03m05s");
    }
}
