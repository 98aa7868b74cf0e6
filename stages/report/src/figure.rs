//! The held-out diagnostics figure (the paper's Figure 3 and Appendix C.4): eight panels of
//! mean ± std over trials against the iteration, one line per cell, as SVG and PNG.

use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{group_stats, Agg, ReportError};

/// Column of the diagnostics artifact and the panel title, in the paper's order (A–H).
pub const PANELS: [(&str, &str); 8] = [
    ("brier_estimator", "(A) Brier of estimated relations"),
    ("brier_corrected_clean", "(B) Brier of corrected (clean)"),
    ("brier_integrator", "(C) Brier of integrated relations"),
    ("gap_clean", "(D) post-correction gap (clean)"),
    ("auc", "(E) AUC of gap vs corruption"),
    ("ap", "(F) AP of gap vs corruption"),
    ("auc_oracle", "(G) AUC, oracle supervision"),
    ("ap_oracle", "(H) AP, oracle supervision"),
];

/// The y-axis title of each panel (A–H).
pub const Y_DESC: [&str; 8] = [
    "Brier score",
    "Brier score",
    "Brier score",
    "gap",
    "AUC",
    "AP",
    "AUC",
    "AP",
];

/// Diagnostics tabulated with the panels (in the figure's table) but not drawn: how much the
/// Correctors correct and how much screening keeps, over the training constraints.
pub const EXTRA: [(&str, &str); 2] = [
    ("mean_abs_delta", "mean |Δ̂| over the training constraints"),
    (
        "mean_w",
        "mean screening weight w over the training constraints",
    ),
];

/// Every column a figure reads: the eight panels, then `EXTRA`.
pub fn columns() -> impl Iterator<Item = &'static str> {
    PANELS.iter().chain(EXTRA.iter()).map(|c| c.0)
}

pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
static FONT_ONCE: Once = Once::new();

/// Register the vendored DejaVu Sans as `sans-serif` (once per process).
pub(crate) fn register_font() {
    FONT_ONCE.call_once(|| {
        // The vendored DejaVu Sans is a valid font; failure would only lose the text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Title `title` over `root` in the largest font up to 22 px that fits its width (never
/// clipped at both ends); the area below it.
pub(crate) fn title_fitted<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<DrawingArea<DB, Shift>, DrawingAreaErrorKind<DB::ErrorType>> {
    let w = root.dim_in_pixel().0 as f64;
    let size = fitting_font(title, w - 24.0, 22.0);
    root.titled(title, ("sans-serif", size))
}

/// The largest font size up to `max` at which `text` is about `width` pixels wide or less
/// (DejaVu Sans: about 0.6 em per character), never below 10.
pub(crate) fn fitting_font(text: &str, width: f64, max: f64) -> f64 {
    let chars = text.chars().count().max(1) as f64;
    (width / (0.6 * chars)).clamp(10.0, max)
}

/// The width an image needs for `title` at 16 px or more (see [`fitting_font`]).
pub(crate) fn width_for_title(title: &str) -> u32 {
    (title.chars().count() as f64 * 0.6 * 16.0 + 40.0) as u32
}

/// A legend as one centred row under the panels, off every panel's data: per entry a line
/// (`false`) or a filled box (`true`) in its colour, then its label.
pub(crate) fn legend_row<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(String, RGBColor, bool)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if items.is_empty() {
        return Ok(());
    }
    let (w, h) = area.dim_in_pixel();
    let size = 14.0;
    let widths: Vec<i32> = items
        .iter()
        .map(|(l, _, _)| 30 + (l.chars().count() as f64 * 0.6 * size) as i32 + 22)
        .collect();
    let total: i32 = widths.iter().sum();
    let mut x = ((w as i32 - total) / 2).max(4);
    let y = h as i32 / 2;
    for ((label, color, boxed), width) in items.iter().zip(&widths) {
        if *boxed {
            area.draw(&Rectangle::new(
                [(x, y - 6), (x + 22, y + 6)],
                color.filled(),
            ))?;
        } else {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                color.stroke_width(3),
            ))?;
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 30, y - 8),
            ("sans-serif", size),
        ))?;
        x += width;
    }
    Ok(())
}

/// One trial's diagnostics: iteration → the value of every column (`columns()`).
#[derive(Clone, Debug, PartialEq)]
pub struct TrialDiagnostics {
    pub iterations: Vec<u32>,
    /// `values[c][i]`: column c of `columns()` at `iterations[i]` (NaN: not recorded).
    pub values: Vec<Vec<f64>>,
}

/// One line of the figure: a cell and its trials.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub trials: Vec<TrialDiagnostics>,
}

/// The rendered figure.
pub struct Figure {
    pub svg: String,
    pub png: Vec<u8>,
    /// (series, panel, iteration) → mean ± std over trials.
    pub stats: Vec<(String, String, u32, Agg)>,
}

type Curve = Vec<(f64, f64, f64)>;

/// Aggregate trials with polars and draw the eight panels.
pub fn render(title: &str, series: &[Series], std_ddof: u8) -> Result<Figure, ReportError> {
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for s in series {
        for t in &s.trials {
            for (p, name) in columns().enumerate() {
                for (i, &it) in t.iterations.iter().enumerate() {
                    let v = t
                        .values
                        .get(p)
                        .and_then(|c| c.get(i))
                        .copied()
                        .unwrap_or(f64::NAN);
                    if v.is_finite() {
                        keys.push(vec![s.label.clone(), name.to_string(), format!("{it:08}")]);
                        values.push(v);
                    }
                }
            }
        }
    }
    let stats: Vec<(String, String, u32, Agg)> = group_stats(&keys, &values, std_ddof)?
        .into_iter()
        .map(|(k, a)| (k[0].clone(), k[1].clone(), k[2].parse().unwrap_or(0), a))
        .collect();
    // curves[series][panel] = (iteration, mean, std) sorted by iteration.
    let curves: Vec<Vec<Curve>> = series
        .iter()
        .map(|s| {
            PANELS
                .iter()
                .map(|(name, _)| {
                    let mut c: Curve = stats
                        .iter()
                        .filter(|(l, p, _, _)| *l == s.label && p == name)
                        .map(|(_, _, it, a)| (*it as f64, a.mean, a.std))
                        .collect();
                    c.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
                    c
                })
                .collect()
        })
        .collect();
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    register_font();
    let (w, h) = (1600u32.max(width_for_title(title)), 800u32);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        draw(&root, title, &labels, &curves).map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        draw(&root, title, &labels, &curves).map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    let png = crate::png::encode_rgb(&rgb, w, h);
    Ok(Figure { svg, png, stats })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    labels: &[&str],
    curves: &[Vec<Curve>],
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| format!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = title_fitted(root, title).map_err(e)?;
    let (plots, legend) = root.split_vertically(root.dim_in_pixel().1.saturating_sub(36));
    let items: Vec<(String, RGBColor, bool)> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.to_string(), COLORS[i % COLORS.len()], false))
        .collect();
    legend_row(&legend, &items).map_err(e)?;
    let panels = plots.split_evenly((2, 4));
    for (p, area) in panels.iter().enumerate() {
        let pts: Vec<&(f64, f64, f64)> = curves.iter().flat_map(|c| c[p].iter()).collect();
        let (mut lo, mut hi) = pts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, m, s)| {
                (lo.min(m - s), hi.max(m + s))
            });
        if !lo.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        if hi - lo < 1e-9 {
            (lo, hi) = (lo - 0.05, hi + 0.05);
        }
        let pad = 0.05 * (hi - lo);
        let (x0, x1) = pts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (x, _, _)| {
                (a.min(*x), b.max(*x))
            });
        let (x0, x1) = if x0.is_finite() && x1 > x0 {
            (x0, x1)
        } else {
            (0.0, 1.0)
        };
        let mut chart = ChartBuilder::on(area)
            .caption(PANELS[p].1, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, (lo - pad)..(hi + pad))
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("iteration")
            .y_desc(Y_DESC[p])
            // Iterations are whole: at most one label per iteration, none between them.
            .x_labels(((x1 - x0).round() as usize + 1).clamp(2, 6))
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-9 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .y_labels(5)
            .label_style(("sans-serif", 12))
            .axis_desc_style(("sans-serif", 12))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(e)?;
        for (si, c) in curves.iter().enumerate() {
            let color = COLORS[si % COLORS.len()];
            let band: Vec<(f64, f64)> = c[p]
                .iter()
                .map(|(x, m, s)| (*x, m + s))
                .chain(c[p].iter().rev().map(|(x, m, s)| (*x, m - s)))
                .collect();
            if band.len() >= 3 {
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        band,
                        color.mix(0.18).filled(),
                    )))
                    .map_err(e)?;
            }
            chart
                .draw_series(LineSeries::new(
                    c[p].iter().map(|(x, m, _)| (*x, *m)),
                    color.stroke_width(2),
                ))
                .map_err(e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(offset: f64) -> TrialDiagnostics {
        let iterations = vec![1, 2, 3];
        let v = |base: f64| vec![base + offset, base - 0.1 + offset, base - 0.15 + offset];
        TrialDiagnostics {
            iterations,
            values: vec![
                v(0.3),
                v(0.25),
                v(0.2),
                v(0.1),
                v(0.7),
                v(0.6),
                v(0.8),
                v(0.7),
                v(0.05),
                v(0.5),
            ],
        }
    }

    #[test]
    fn figure_has_eight_panels_and_aggregates_over_trials() {
        let s = Series {
            label: "mnist5k multi3".into(),
            trials: vec![trial(0.0), trial(0.02)],
        };
        let f = render("diagnostics", &[s], 0).unwrap();
        for (_, title) in PANELS {
            let plain = title.split(' ').next_back().unwrap();
            assert!(f.svg.contains(plain), "SVG lacks `{title}`");
        }
        assert_eq!(&f.png[..8], b"\x89PNG\r\n\x1a\n");
        // The undrawn columns are tabulated too, and nowhere drawn.
        let w = f
            .stats
            .iter()
            .find(|(_, p, it, _)| p == "mean_w" && *it == 2)
            .unwrap();
        assert!((w.3.mean - 0.41).abs() < 1e-9, "{:?}", w.3);
        assert!(!f.svg.contains("screening weight"));
        let a = f
            .stats
            .iter()
            .find(|(_, p, it, _)| p == "auc" && *it == 1)
            .unwrap();
        assert!(
            (a.3.mean - 0.71).abs() < 1e-12 && (a.3.std - 0.01).abs() < 1e-12 && a.3.n == 2,
            "{a:?}"
        );
        // The same data give the same bytes.
        let again = render(
            "diagnostics",
            &[Series {
                label: "mnist5k multi3".into(),
                trials: vec![trial(0.0), trial(0.02)],
            }],
            0,
        )
        .unwrap();
        assert_eq!(again.png, f.png);
        assert_eq!(again.svg, f.svg);
    }
}
