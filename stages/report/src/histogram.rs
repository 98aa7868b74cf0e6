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

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    grid: (usize, usize),
    titles: &[String],
    counts: &[Counts],
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| format!("{x:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let clean = RGBColor(31, 119, 180);
    let corrupt = RGBColor(160, 160, 160);
    for (p, area) in root.split_evenly(grid).iter().enumerate() {
        let Some(h) = &counts[p] else { continue };
        let top = h.iter().map(|(a, b)| a + b).max().unwrap_or(0).max(1) as f64 * 1.08;
        let mut chart = ChartBuilder::on(area)
            .caption(&titles[p], ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, 0f64..top)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("recorded value y")
            .x_labels(6)
            .x_label_formatter(&|x| format!("{x:.1}"))
            .y_labels(5)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 11))
            .axis_desc_style(("sans-serif", 11))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(e)?;
        let width = 1.0 / BINS as f64;
        let bar = |b: usize, lo: f64, hi: f64, color: RGBColor| {
            Rectangle::new(
                [(b as f64 * width, lo), ((b + 1) as f64 * width, hi)],
                color.filled(),
            )
        };
        let drawn = chart
            .draw_series(
                h.iter()
                    .enumerate()
                    .map(|(b, (c, _))| bar(b, 0.0, *c as f64, clean)),
            )
            .map_err(e)?;
        let legend = p == 0;
        if legend {
            drawn.label("clean").legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], clean.filled())
            });
        }
        let drawn = chart
            .draw_series(
                h.iter()
                    .enumerate()
                    .filter(|(_, (_, k))| *k > 0)
                    .map(|(b, (c, k))| bar(b, *c as f64, (*c + *k) as f64, corrupt)),
            )
            .map_err(e)?;
        if legend {
            drawn.label("corrupted").legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], corrupt.filled())
            });
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperMiddle)
                .label_font(("sans-serif", 11))
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(200, 200, 200))
                .draw()
                .map_err(e)?;
        }
    }
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
