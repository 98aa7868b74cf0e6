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
