//! `kind: constraint-values`: histograms of the recorded constraint values of each setting
//! (clean and corrupted records stacked), from the first trial's constraints: the paper's
//! constraint-value distribution figure.

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};

use super::{check_per_setting, figure_node, Cells, CheckCx, NodeCx, TableInput, Target, View};
use crate::specs::axis::Axis;
use crate::specs::source::Problems;
use crate::wiring::{parquet, stage_err, Wiring};

/// The constraint values of each setting.
pub struct ConstraintValues;

impl Target for ConstraintValues {
    fn name(&self) -> &'static str {
        "constraint-values"
    }
    fn summary(&self) -> &'static str {
        "histograms of the recorded constraint values of each setting, clean and corrupted stacked"
    }
    fn cells(&self) -> Cells {
        Cells::ConstraintRecords
    }
    fn view(&self) -> View {
        View::Figure
    }
    fn default_columns(&self) -> Option<&'static [Axis]> {
        Some(&[Axis::Supervision])
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        check_per_setting(cx, p, true, false);
    }
    fn node(&self, w: &mut Wiring, cx: NodeCx<'_>) -> crate::error::Result<usize> {
        figure_node(
            w,
            cx.name,
            cx.wires,
            512,
            ValuesTask {
                kind: "constraint-values",
                title: cx.layout.title.clone(),
                inputs: cx.inputs.to_vec(),
            },
        )
    }
}

/// The constraint-value histograms: one panel per setting (rows: supervision; columns:
/// dataset, and corruption/budget when the grid varies them), from the first trial's records.
#[derive(Serialize)]
pub struct ValuesTask {
    pub kind: &'static str,
    pub title: String,
    pub inputs: Vec<TableInput>,
}

impl Task for ValuesTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        use upcc_report::histogram::{render_values, ValuePanel};
        let mut panels = Vec::new();
        for i in &self.inputs {
            let c = upcc_stages::constraints::Constraints::from_parquet(
                ctx.input(&i.input)?,
                "constraints artifact",
            )
            .map_err(stage_err)?;
            let corrupted = if c.corrupted.iter().all(Option::is_some) && !c.corrupted.is_empty() {
                Some(c.corrupted.iter().map(|f| f.unwrap_or(false)).collect())
            } else {
                None
            };
            let mut col = i.coord(Axis::Dataset).unwrap_or_default().to_string();
            for a in [Axis::Corruption, Axis::Budget] {
                if let Some(v) = i.coord(a) {
                    col.push_str(&format!(" {a}={v}"));
                }
            }
            panels.push(ValuePanel {
                row: i.coord(Axis::Supervision).unwrap_or_default().to_string(),
                col,
                values: c.y,
                corrupted,
            });
        }
        let h =
            render_values(&self.title, &panels).map_err(|e| TaskError::Failed(e.to_string()))?;
        let b = &h.bins;
        let table = upcc_stages::table::TableBuilder::new()
            .str("supervision", b.iter().map(|b| b.row.clone()).collect())
            .str("panel", b.iter().map(|b| b.col.clone()).collect())
            .f64("lo", b.iter().map(|b| b.lo).collect())
            .f64("hi", b.iter().map(|b| b.hi).collect())
            .u32("clean", b.iter().map(|b| b.clean).collect())
            .u32("corrupted", b.iter().map(|b| b.corrupted).collect())
            .to_parquet();
        ctx.put_output("png", h.png, "image/png", "figure.png");
        ctx.put_output("svg", h.svg.into_bytes(), "image/svg+xml", "figure.svg");
        parquet(ctx, "table", table)
    }
}
