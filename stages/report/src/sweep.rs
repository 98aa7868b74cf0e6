//! Sweep figures (the paper's robustness and sensitivity figures): a clustering metric, mean ±
//! spread over trials, against one axis of the grid, one line per value of another axis, a
//! panel per metric (rows) and per value of the remaining axes (columns).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::figure::{register_font, COLORS};
use crate::{aggregate, product, Agg, CellResult, Metric, ReportError, TableLayout};

/// Which axes a sweep figure puts where.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepAxes {
    /// The axis along x (its values in grid order, evenly spaced).
    pub x: String,
    /// The axis with one line per value (`None`: one line).
    pub lines: Option<String>,
    /// The split drawn (`test`, as the paper's figures).
    pub split: String,
    /// Tick labels of x values (others show their names).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub x_labels: std::collections::BTreeMap<String, String>,
    /// The x axis' title (default: the axis name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_title: Option<String>,
}

/// The drawn figure and the plotted values: (panel, line, x, metric) → mean ± std over trials.
pub struct SweepFigure {
    pub svg: String,
    pub png: Vec<u8>,
    pub points: Vec<SweepPoint>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SweepPoint {
    pub panel: String,
    pub line: String,
    pub x: String,
    pub metric: Metric,
    pub agg: Agg,
}

struct Panel {
    title: String,
    /// Per line: (x index, mean, std).
    lines: Vec<Vec<(usize, f64, f64)>>,
}

/// Aggregate the trials of every cell (as a table does) and draw the sweep.
pub fn render_sweep(
    title: &str,
    layout: &TableLayout,
    axes: &SweepAxes,
    results: &[CellResult],
) -> Result<SweepFigure, ReportError> {
    let agg = aggregate(layout, results)?;
    let axis = |name: &str| {
        layout
            .axes
            .iter()
            .position(|(a, _)| a == name)
            .ok_or_else(|| ReportError::Layout(format!("`{name}` is not an axis of the grid")))
    };
    let xi = axis(&axes.x)?;
    let li = axes.lines.as_deref().map(axis).transpose()?;
    let x_values = &layout.axes[xi].1;
    let ticks: Vec<String> = x_values
        .iter()
        .map(|v| axes.x_labels.get(v).cloned().unwrap_or_else(|| v.clone()))
        .collect();
    let x_desc = axes.x_title.clone().unwrap_or_else(|| axes.x.clone());
    let line_values: Vec<String> = match li {
        Some(i) => layout.axes[i].1.clone(),
        None => vec![String::new()],
    };
    let rest: Vec<(usize, (String, Vec<String>))> = layout
        .axes
        .iter()
        .cloned()
        .enumerate()
        .filter(|(i, _)| *i != xi && Some(*i) != li)
        .collect();
    let rest_axes: Vec<(String, Vec<String>)> = rest.iter().map(|(_, a)| a.clone()).collect();
    // Axes with one value say nothing in a panel's title.
    let titled: Vec<usize> = rest_axes
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| v.len() > 1)
        .map(|(i, _)| i)
        .collect();
    let mut panels = Vec::new();
    let mut points = Vec::new();
    for &metric in &layout.metrics {
        for key in product(&rest_axes) {
            let name: Vec<String> = titled
                .iter()
                .map(|&i| crate::display_value(&rest_axes[i].0, &key[i]))
                .collect();
            let panel_name = if name.is_empty() {
                metric.label().to_string()
            } else {
                format!("{}: {}", name.join(", "), metric.label())
            };
            let mut lines = Vec::new();
            for lv in &line_values {
                let mut pts = Vec::new();
                for (x, xv) in x_values.iter().enumerate() {
                    let mut coord = vec![String::new(); layout.axes.len()];
                    coord[xi] = xv.clone();
                    if let Some(i) = li {
                        coord[i] = lv.clone();
                    }
                    for ((i, _), v) in rest.iter().zip(&key) {
                        coord[*i] = v.clone();
                    }
                    if let Some(a) = agg.get(&(coord, axes.split.clone(), metric)) {
                        if a.mean.is_finite() {
                            pts.push((x, a.mean, a.std));
                            points.push(SweepPoint {
                                panel: panel_name.clone(),
                                line: lv.clone(),
                                x: xv.clone(),
                                metric,
                                agg: *a,
                            });
                        }
                    }
                }
                lines.push(pts);
            }
            panels.push(Panel {
                title: panel_name,
                lines,
            });
        }
    }
    let cols = (panels.len() / layout.metrics.len().max(1)).max(1);
    let rows = layout.metrics.len().max(1);
    let (w, h) = (
        (330 * cols as u32)
            .max(700)
            .max(crate::figure::width_for_title(title)),
        116 + 300 * rows as u32,
    );
    let line_names: Vec<String> = match li {
        Some(i) => line_values
            .iter()
            .map(|v| crate::display_value(&layout.axes[i].0, v))
            .collect(),
        None => vec![String::new()],
    };
    register_font();
    let y_desc = if layout.settings.percent {
        format!("{} score (%)", axes.split)
    } else {
        format!("{} score", axes.split)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        draw(
            &root,
            title,
            (rows, cols),
            &panels,
            &ticks,
            &line_names,
            &x_desc,
            &y_desc,
        )
        .map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        draw(
            &root,
            title,
            (rows, cols),
            &panels,
            &ticks,
            &line_names,
            &x_desc,
            &y_desc,
        )
        .map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    Ok(SweepFigure {
        svg,
        png: crate::png::encode_rgb(&rgb, w, h),
        points,
    })
}

#[allow(clippy::too_many_arguments)]
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    grid: (usize, usize),
    panels: &[Panel],
    x_values: &[String],
    line_values: &[String],
    x_desc: &str,
    y_desc: &str,
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| format!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = crate::figure::title_fitted(root, title).map_err(e)?;
    let (plots, legend) = root.split_vertically(root.dim_in_pixel().1.saturating_sub(36));
    let items: Vec<(String, RGBColor, bool)> = line_values
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| (l.clone(), COLORS[i % COLORS.len()], false))
        .collect();
    crate::figure::legend_row(&legend, &items).map_err(e)?;
    let areas = plots.split_evenly(grid);
    let n = x_values.len();
    // Lines side by side around each category, so that error bars do not overlap.
    let lines = line_values.len().max(1);
    let dodge = |li: usize| {
        if lines == 1 {
            0.0
        } else {
            (li as f64 - (lines as f64 - 1.0) / 2.0) * (0.5 / lines as f64)
        }
    };
    for (p, (area, panel)) in areas.iter().zip(panels).enumerate() {
        let pts: Vec<&(usize, f64, f64)> = panel.lines.iter().flatten().collect();
        let (mut lo, mut hi) = pts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, m, s)| {
                (lo.min(m - s), hi.max(m + s))
            });
        if !lo.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        if hi - lo < 1e-9 {
            (lo, hi) = (lo - 0.5, hi + 0.5);
        }
        let pad = 0.08 * (hi - lo);
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo - pad)..(hi + pad))
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(if p % grid.1 == 0 { y_desc } else { "" })
            // One key point per category: no unlabelled ticks between them.
            .x_labels(n.max(1))
            .x_max_light_lines(0)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                    x_values[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .y_labels(5)
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style(("sans-serif", 11))
            .axis_desc_style(("sans-serif", 11))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(e)?;
        for (li, line) in panel.lines.iter().enumerate() {
            let color = COLORS[li % COLORS.len()];
            let off = dodge(li);
            chart
                .draw_series(line.iter().map(|(x, m, s)| {
                    ErrorBar::new_vertical(
                        *x as f64 + off,
                        m - s,
                        *m,
                        m + s,
                        color.stroke_width(1),
                        6,
                    )
                }))
                .map_err(e)?;
            chart
                .draw_series(LineSeries::new(
                    line.iter().map(|(x, m, _)| (*x as f64 + off, *m)),
                    color.stroke_width(2),
                ))
                .map_err(e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{ScoreRow, TableSettings};

    fn result(ds: &str, sup: &str, method: &str, trial: u32, acc: f64) -> CellResult {
        CellResult {
            coords: BTreeMap::from([
                ("dataset".to_string(), ds.to_string()),
                ("supervision".to_string(), sup.to_string()),
                ("method".to_string(), method.to_string()),
            ]),
            trial: trial.to_string(),
            scores: vec![ScoreRow {
                split: "test".into(),
                acc,
                nmi_arithmetic: acc / 2.0,
                nmi_geometric: acc / 2.0,
                ari: acc / 3.0,
            }],
        }
    }

    #[test]
    fn one_line_per_method_against_the_swept_axis() {
        let layout = TableLayout {
            title: "robustness".into(),
            axes: vec![
                ("dataset".into(), vec!["mnist".into(), "fmnist".into()]),
                (
                    "supervision".into(),
                    vec!["lv0.1".into(), "lv0.01".into(), "lv0.001".into()],
                ),
                ("method".into(), vec!["probpair".into(), "eci-pp".into()]),
            ],
            columns: vec!["method".into()],
            metrics: vec![Metric::Acc, Metric::Nmi],
            splits: vec!["test".into()],
            settings: TableSettings::default(),
            highlight_best: false,
            caption: None,
            published: None,
            published_text: None,
        };
        let mut results = Vec::new();
        for ds in ["mnist", "fmnist"] {
            for (i, sup) in ["lv0.1", "lv0.01", "lv0.001"].iter().enumerate() {
                for (m, method) in ["probpair", "eci-pp"].iter().enumerate() {
                    for t in 1..=2 {
                        let acc = 0.5 + 0.1 * i as f64 + 0.05 * m as f64 + 0.01 * t as f64;
                        results.push(result(ds, sup, method, t, acc));
                    }
                }
            }
        }
        // One cell left out: its point is missing, not zero.
        results.retain(|r| {
            !(r.coords["dataset"] == "fmnist"
                && r.coords["supervision"] == "lv0.001"
                && r.coords["method"] == "eci-pp")
        });
        let axes = SweepAxes {
            x: "supervision".into(),
            lines: Some("method".into()),
            split: "test".into(),
            x_labels: BTreeMap::from([("lv0.001".to_string(), "0.1%".to_string())]),
            x_title: Some("expert quality".into()),
        };
        let f = render_sweep("Figure 2", &layout, &axes, &results).unwrap();
        // 2 metrics × 2 datasets × 2 methods × 3 levels, less the missing cell's 2 metrics.
        assert_eq!(f.points.len(), 22);
        let p = f
            .points
            .iter()
            .find(|p| p.panel == "mnist: ACC" && p.line == "eci-pp" && p.x == "lv0.01")
            .unwrap();
        assert!(
            (p.agg.mean - 66.5).abs() < 1e-9 && (p.agg.std - 0.5).abs() < 1e-9 && p.agg.n == 2,
            "{p:?}"
        );
        assert!(!f
            .points
            .iter()
            .any(|p| p.panel.starts_with("fmnist") && p.line == "eci-pp" && p.x == "lv0.001"));
        for label in [
            "0.1%",
            "lv0.01",
            "expert quality",
            "mnist: NMI",
            "fmnist: ACC",
            // The legend names methods as the paper does.
            "ECI-PP",
            "ProbPair",
        ] {
            assert!(f.svg.contains(label), "SVG lacks `{label}`");
        }
        assert_eq!(&f.png[..8], b"\x89PNG\r\n\x1a\n");
        let again = render_sweep("Figure 2", &layout, &axes, &results).unwrap();
        assert_eq!((again.png, again.svg), (f.png, f.svg));
    }
}
