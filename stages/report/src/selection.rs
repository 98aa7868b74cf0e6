//! Tables of selected hyperparameters (the paper's Tables 5 and 6): one chosen value per cell,
//! no trials and no spread.

use std::collections::BTreeMap;

use upcc_stages::table::TableBuilder;

use crate::{csv_field, latex_escape, product, Pivot, Rendered, ReportError, TableLayout};

/// The value a selection chose for one cell, and its mean validation accuracy (0–1).
#[derive(Clone, Debug, PartialEq)]
pub struct ChosenCell {
    pub coords: BTreeMap<String, String>,
    pub parameter: String,
    pub value: f64,
    pub mean_val_acc: f64,
}

/// How a chosen value is written (Markdown, LaTeX): with `powers`, powers of ten below 1 as the
/// paper writes λ (`1e-3`, `$10^{-3}$`); anything else in its shortest decimal form (`0.05`,
/// `1`), as the paper writes α.
fn show(v: f64, powers: bool) -> (String, String) {
    if powers && v > 0.0 && v < 1.0 {
        let e = v.log10();
        if (e - e.round()).abs() < 1e-9 {
            let e = e.round() as i32;
            return (format!("1e{e}"), format!("$10^{{{e}}}$"));
        }
    }
    let s = format!("{v}");
    (s.clone(), s)
}

/// Render the chosen values of a `selection` target: the layout's column axes span columns,
/// the others rows; each cell shows the value and (Markdown) its mean validation ACC.
pub fn render_chosen(layout: &TableLayout, cells: &[ChosenCell]) -> Result<Rendered, ReportError> {
    let pivot = Pivot::new(layout)?;
    let (row_axes, col_axes) = (&pivot.rows, &pivot.cols);
    let by_coord: BTreeMap<Vec<String>, &ChosenCell> = cells
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
    let full = |r: &[String], c: &[String]| pivot.coord(r, c);
    let rows = product(row_axes);
    let cols = product(col_axes);
    let col_name = |c: &[String]| pivot.col_name(c);
    let parameters: Vec<&str> = {
        let mut p: Vec<&str> = cells.iter().map(|c| c.parameter.as_str()).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let header: Vec<String> = row_axes
        .iter()
        .map(|(a, _)| a.clone())
        .chain(cols.iter().map(|c| col_name(c)))
        .collect();
    let mut md = format!("### {}\n\n", layout.title);
    md.push_str(&match &layout.caption {
        Some(c) => format!("{c}; — = no result yet.\n\n"),
        None => format!(
            "The {} chosen by mean validation ACC (in parentheses, %); — = no result yet.\n\n",
            if parameters.is_empty() {
                "value".to_string()
            } else {
                parameters.join(" / ")
            }
        ),
    });
    md.push_str(&format!("| {} |\n", header.join(" | ")));
    md.push_str(&format!(
        "|{}|\n",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    ));
    let mut tex_rows = Vec::new();
    let mut complete = 0;
    for r in &rows {
        let mut cm = Vec::new();
        let mut ct = Vec::new();
        for c in &cols {
            match by_coord.get(&full(r, c)) {
                Some(cell) => {
                    complete += 1;
                    let (m, t) = show(cell.value, cell.parameter == "lambda");
                    cm.push(format!("{m} ({:.1})", 100.0 * cell.mean_val_acc));
                    ct.push(t);
                }
                None => {
                    cm.push("—".into());
                    ct.push("--".into());
                }
            }
        }
        md.push_str(&format!("| {} | {} |\n", r.join(" | "), cm.join(" | ")));
        tex_rows.push(format!(
            "{} & {} \\\\",
            r.iter()
                .map(|s| latex_escape(s))
                .collect::<Vec<_>>()
                .join(" & "),
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
                text: show(c.value, c.parameter == "lambda").0,
                value: Some(c.value),
                device: None,
            })
            .collect();
        md.push_str(&crate::published::render_text_deltas(
            layout,
            p,
            &reproduced,
        ));
    }
    let mut tex = format!(
        "{}\\begin{{table}}[t]\n\\centering\n",
        crate::LATEX_PACKAGES
    );
    tex.push_str(&format!(
        "\\caption{{{}. Values are selected by mean validation ACC.}}\n",
        latex_escape(&layout.title)
    ));
    tex.push_str(&format!(
        "\\begin{{tabular}}{{{}}}\n\\toprule\n{} \\\\\n\\midrule\n",
        "l".repeat(row_axes.len()) + &"c".repeat(cols.len()),
        header
            .iter()
            .map(|h| latex_escape(h))
            .collect::<Vec<_>>()
            .join(" & ")
    ));
    for row in tex_rows {
        tex.push_str(&row);
        tex.push('\n');
    }
    tex.push_str("\\bottomrule\n\\end{tabular}\n\\end{table}\n");
    // CSV and Parquet: long, one row per cell of the grid.
    let names: Vec<&str> = layout.axes.iter().map(|(a, _)| a.as_str()).collect();
    let mut csv = format!("{},parameter,value,mean_val_acc\n", names.join(","));
    let mut pcols: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    let (mut pparam, mut pvalue, mut pacc) = (vec![], vec![], vec![]);
    for coord in product(&layout.axes) {
        let cell = by_coord.get(&coord);
        csv.push_str(&format!(
            "{},{},{},{}\n",
            coord
                .iter()
                .map(|v| csv_field(v))
                .collect::<Vec<_>>()
                .join(","),
            cell.map(|c| csv_field(&c.parameter)).unwrap_or_default(),
            cell.map(|c| format!("{}", c.value)).unwrap_or_default(),
            cell.map(|c| format!("{}", c.mean_val_acc))
                .unwrap_or_default()
        ));
        for (col, v) in pcols.iter_mut().zip(&coord) {
            col.push(v.clone());
        }
        pparam.push(cell.map(|c| c.parameter.clone()).unwrap_or_default());
        pvalue.push(cell.map(|c| c.value));
        pacc.push(cell.map(|c| c.mean_val_acc));
    }
    let mut tb = TableBuilder::new();
    for (name, c) in names.iter().zip(pcols) {
        tb = tb.str(name, c);
    }
    let parquet = tb
        .str("parameter", pparam)
        .f64_opt("value", pvalue)
        .f64_opt("mean_val_acc", pacc)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metric, TableSettings};

    fn layout() -> TableLayout {
        TableLayout {
            title: "Table 5".into(),
            axes: vec![
                ("dataset".into(), vec!["mnist".into(), "fmnist".into()]),
                ("supervision".into(), vec!["lv0.1".into(), "multi3".into()]),
                ("method".into(), vec!["volmax-dcc".into()]),
            ],
            columns: vec!["supervision".into()],
            metrics: vec![Metric::Acc],
            splits: vec!["val".into()],
            settings: TableSettings::default(),
            highlight_best: false,
            caption: None,
            published: None,
            published_text: None,
        }
    }

    fn cell(ds: &str, sup: &str, value: f64) -> ChosenCell {
        ChosenCell {
            coords: BTreeMap::from([
                ("dataset".to_string(), ds.to_string()),
                ("supervision".to_string(), sup.to_string()),
                ("method".to_string(), "volmax-dcc".to_string()),
            ]),
            parameter: "lambda".into(),
            value,
            mean_val_acc: 0.712,
        }
    }

    #[test]
    fn powers_of_ten_are_written_as_the_paper_writes_them() {
        assert_eq!(show(0.001, true), ("1e-3".into(), "$10^{-3}$".into()));
        assert_eq!(show(1e-5, true).1, "$10^{-5}$");
        assert_eq!(show(0.1, true).0, "1e-1");
        assert_eq!(show(0.0, true), ("0".into(), "0".into()));
        assert_eq!(show(0.05, true), ("0.05".into(), "0.05".into()));
        assert_eq!(show(1.0, true), ("1".into(), "1".into()));
        assert_eq!(show(0.002, true).0, "0.002");
        assert_eq!(show(0.01, false).0, "0.01");
    }

    #[test]
    fn rows_and_columns_with_missing_cells() {
        let r = render_chosen(
            &layout(),
            &[
                cell("mnist", "lv0.1", 0.01),
                cell("mnist", "multi3", 0.0),
                cell("fmnist", "lv0.1", 1e-4),
            ],
        )
        .unwrap();
        assert!(
            r.markdown.contains("| dataset | method | lv0.1 | multi3 |"),
            "{}",
            r.markdown
        );
        assert!(
            r.markdown
                .contains("| mnist | volmax-dcc | 1e-2 (71.2) | 0 (71.2) |"),
            "{}",
            r.markdown
        );
        assert!(
            r.markdown
                .contains("| fmnist | volmax-dcc | 1e-4 (71.2) | — |"),
            "{}",
            r.markdown
        );
        assert!(r.markdown.contains("3 of 4 cells complete"));
        assert!(
            r.latex.contains("mnist & volmax-dcc & $10^{-2}$ & 0 \\\\"),
            "{}",
            r.latex
        );
        assert_eq!((r.cells_total, r.cells_complete), (4, 3));
        assert!(r.csv.contains("fmnist,multi3,volmax-dcc,,,\n"), "{}", r.csv);
        assert!(
            r.csv.contains("mnist,lv0.1,volmax-dcc,lambda,0.01,0.712\n"),
            "{}",
            r.csv
        );
    }
}
