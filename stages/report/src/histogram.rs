//! The constraint-value distributions (the paper's `fig:app_constraint_value_dist`): per
//! supervision setting (rows) and dataset (columns), a histogram of the recorded values
//! y ∈ [0, 1], clean records and corrupted ones stacked.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::figure::register_font;
use crate::ReportError;

/// Bins over [0, 1].
pub const BINS: usize = 20;

/// One panel's records.
#[derive(Clone, Debug, PartialEq)]
pub struct ValuePanel {
    /// Row (the supervision setting) and column (dataset, and corruption/budget when swept).
    pub row: String,
    pub col: String,
    pub values: Vec<f32>,
    /// Which records the corruption channel replaced (absent: file supervision, unknown).
    pub corrupted: Option<Vec<bool>>,
}

/// One bar: (row, col, bin) → clean and corrupted counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Bin {
    pub row: String,
    pub col: String,
    pub lo: f64,
    pub hi: f64,
    pub clean: u32,
    pub corrupted: u32,
}

pub struct Histograms {
    pub svg: String,
    pub png: Vec<u8>,
    pub bins: Vec<Bin>,
}

fn bin_of(v: f32) -> usize {
    ((v.clamp(0.0, 1.0) as f64 * BINS as f64) as usize).min(BINS - 1)
}

/// Count and draw. Rows and columns appear in the order they first occur in `panels`.
pub fn render_values(title: &str, panels: &[ValuePanel]) -> Result<Histograms, ReportError> {
    let mut rows: Vec<&str> = Vec::new();
    let mut cols: Vec<&str> = Vec::new();
    for p in panels {
        if !rows.contains(&p.row.as_str()) {
            rows.push(&p.row);
        }
        if !cols.contains(&p.col.as_str()) {
            cols.push(&p.col);
        }
    }
    let mut bins = Vec::new();
    let mut counts: Vec<Option<Vec<(u32, u32)>>> = vec![None; rows.len() * cols.len()];
    for p in panels {
        if let Some(c) = &p.corrupted {
            if c.len() != p.values.len() {
                return Err(ReportError::Layout(format!(
                    "{} {}: {} values but {} corruption flags",
                    p.row,
                    p.col,
                    p.values.len(),
                    c.len()
                )));
            }
        }
        let mut h = vec![(0u32, 0u32); BINS];
        for (i, v) in p.values.iter().enumerate() {
            if !v.is_finite() {
                return Err(ReportError::Layout(format!(
                    "{} {}: a recorded constraint value is not finite",
                    p.row, p.col
                )));
            }
            let b = bin_of(*v);
            if p.corrupted.as_ref().is_some_and(|c| c[i]) {
                h[b].1 += 1;
            } else {
                h[b].0 += 1;
            }
        }
        for (b, (clean, corrupted)) in h.iter().enumerate() {
            bins.push(Bin {
                row: p.row.clone(),
                col: p.col.clone(),
                lo: b as f64 / BINS as f64,
                hi: (b + 1) as f64 / BINS as f64,
                clean: *clean,
                corrupted: *corrupted,
            });
        }
        let r = rows.iter().position(|x| *x == p.row).unwrap_or(0);
        let c = cols.iter().position(|x| *x == p.col).unwrap_or(0);
        counts[r * cols.len() + c] = Some(h);
    }
    register_font();
    let grid = (rows.len().max(1), cols.len().max(1));
    let (w, h) = ((320 * grid.1 as u32).max(640), 70 + 260 * grid.0 as u32);
    let titles: Vec<String> = rows
        .iter()
        .flat_map(|r| cols.iter().map(move |c| format!("{c} · {r}")))
        .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        draw(&root, title, grid, &titles, &counts).map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        draw(&root, title, grid, &titles, &counts).map_err(ReportError::Layout)?;
        root.present()
            .map_err(|e| ReportError::Layout(format!("{e:?}")))?;
    }
    Ok(Histograms {
        svg,
        png: crate::png::encode_rgb(&rgb, w, h),
        bins,
    })
}

type Counts = Option<Vec<(u32, u32)>>;

/// Whether one bin dwarfs the rest (a spike at 0 flattens every other bar): then the count
/// axis is logarithmic.
pub(crate) fn needs_log_axis(h: &[(u32, u32)]) -> bool {
    let mut nonzero: Vec<u32> = h.iter().map(|(a, b)| a + b).filter(|&n| n > 0).collect();
    if nonzero.len() < 3 {
        return false;
    }
    nonzero.sort_unstable();
    let median = nonzero[nonzero.len() / 2];
    let max = *nonzero.last().unwrap_or(&0);
    max > 20 * median.max(1)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    grid: (usize, usize),
    titles: &[String],
    counts: &[Counts],
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| format!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = crate::figure::title_fitted(root, title).map_err(e)?;
    let (plots, legend) = root.split_vertically(root.dim_in_pixel().1.saturating_sub(36));
    let clean = RGBColor(31, 119, 180);
    let corrupt = RGBColor(160, 160, 160);
    crate::figure::legend_row(
        &legend,
        &[
            ("clean".to_string(), clean, true),
            ("corrupted".to_string(), corrupt, true),
        ],
    )
    .map_err(e)?;
    for (p, area) in plots.split_evenly(grid).iter().enumerate() {
        let Some(h) = &counts[p] else { continue };
        let top = h.iter().map(|(a, b)| a + b).max().unwrap_or(0).max(1) as f64;
        if needs_log_axis(h) {
            panel(
                area,
                &titles[p],
                h,
                (0.8f64..top * 1.6).log_scale(),
                0.8,
                "count (log scale)",
            )
            .map_err(e)?;
        } else {
            panel(area, &titles[p], h, 0f64..top * 1.08, 0.0, "count").map_err(e)?;
        }
    }
    Ok(())
}

/// One histogram: stacked clean and corrupted bars on the count axis `y` (bars start at
/// `base`, its lowest value).
fn panel<DB: DrawingBackend, Y>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    h: &[(u32, u32)],
    y: Y,
    base: f64,
    y_desc: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let clean = RGBColor(31, 119, 180);
    let corrupt = RGBColor(160, 160, 160);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(8)
        .margin_right(18)
        .x_label_area_size(34)
        .y_label_area_size(58)
        .build_cartesian_2d(0f64..1f64, y)?;
    chart
        .configure_mesh()
        .x_desc("recorded value y")
        .y_desc(y_desc)
        .x_labels(6)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .y_labels(5)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 11))
        .axis_desc_style(("sans-serif", 11))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let width = 1.0 / BINS as f64;
    let bar = |b: usize, lo: f64, hi: f64, color: RGBColor| {
        Rectangle::new(
            [(b as f64 * width, lo), ((b + 1) as f64 * width, hi)],
            color.filled(),
        )
    };
    chart.draw_series(
        h.iter()
            .enumerate()
            .filter(|(_, (c, _))| *c > 0)
            .map(|(b, (c, _))| bar(b, base, *c as f64, clean)),
    )?;
    chart.draw_series(
        h.iter()
            .enumerate()
            .filter(|(_, (_, k))| *k > 0)
            .map(|(b, (c, k))| bar(b, (*c as f64).max(base), (*c + *k) as f64, corrupt)),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_binned_clean_and_corrupted_apart() {
        let panels = vec![
            ValuePanel {
                row: "lv0.01".into(),
                col: "mnist".into(),
                values: vec![0.0, 0.01, 0.5, 0.99, 1.0, 0.52],
                corrupted: Some(vec![false, false, true, false, false, false]),
            },
            ValuePanel {
                row: "multi3".into(),
                col: "mnist".into(),
                values: vec![0.3],
                corrupted: None,
            },
        ];
        let h = render_values("values", &panels).unwrap();
        assert_eq!(h.bins.len(), 2 * BINS);
        let first: Vec<&Bin> = h.bins.iter().filter(|b| b.row == "lv0.01").collect();
        assert_eq!((first[0].clean, first[0].corrupted), (2, 0));
        assert_eq!((first[10].clean, first[10].corrupted), (1, 1));
        assert_eq!(first[19].clean, 2, "1.0 falls into the last bin");
        let second: Vec<&Bin> = h.bins.iter().filter(|b| b.row == "multi3").collect();
        assert_eq!(second[6].clean, 1);
        assert!(h.svg.contains("mnist · multi3") && h.svg.contains("corrupted"));
        assert_eq!(&h.png[..8], b"\x89PNG\r\n\x1a\n");
        let bad = ValuePanel {
            row: "x".into(),
            col: "y".into(),
            values: vec![f32::NAN],
            corrupted: None,
        };
        assert!(render_values("values", &[bad]).is_err());
    }
}
