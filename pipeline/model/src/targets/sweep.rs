//! `kind: sweep`: a clustering metric (mean ± spread over trials) against one axis of the
//! grid (`x`), one line per value of another (`lines`, default `method`), a panel per metric
//! and per value of the remaining axes: the paper's robustness and sensitivity figures.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_report::TableLayout;

use super::table::cell_result;
use super::{
    figure_node, own, own_fields, Cells, CheckCx, NodeCx, OwnSettings, TableInput, TableSource,
    Target, View,
};
use crate::specs::axis::Axis;
use crate::specs::source::Problems;
use crate::wiring::{parquet, stage_err, Wiring};

/// A sweep's own fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFields {
    /// The grid axis along the x axis (e.g. `supervision`, `corruption`, `budget`, or `method`
    /// over variants of one method).
    #[serde(default)]
    x: Option<String>,
    /// The grid axis with one line per value (default `method`; `none`: one line).
    #[serde(default)]
    lines: Option<String>,
    /// Tick labels for x values (e.g. `eci-pp-k2: "2"` when x sweeps method variants);
    /// unlisted values show their names.
    #[serde(default)]
    x_labels: BTreeMap<String, String>,
    /// The x axis' title (default: the axis name).
    #[serde(default)]
    x_title: Option<String>,
}

/// A metric against one axis of the grid.
pub struct Sweep;

impl Target for Sweep {
    fn name(&self) -> &'static str {
        "sweep"
    }
    fn summary(&self) -> &'static str {
        "a clustering metric against one axis of the grid, one line per value of another"
    }
    fn cells(&self) -> Cells {
        Cells::Runs { diagnostics: false }
    }
    fn view(&self) -> View {
        View::Figure
    }
    fn own_fields(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("x", "places a sweep figure's axes"),
            ("lines", "places a sweep figure's axes"),
            ("x_labels", "places a sweep figure's axes"),
            ("x_title", "places a sweep figure's axes"),
        ]
    }
    fn resolve_own(
        &self,
        target: &str,
        fields: &BTreeMap<String, Value>,
        p: &mut Problems<'_>,
    ) -> Option<OwnSettings> {
        own_fields::<SweepFields>(target, fields, p).map(|f| Arc::new(f) as OwnSettings)
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        let (t, target) = (cx.name, own::<SweepFields>(cx.own));
        let axes: Vec<&str> = cx.axes.iter().map(|a| a.name()).collect();
        let g = &cx.target.grid;
        match target.x.as_deref() {
            None => p.add(
                &["targets", t, "x"],
                format!("target `{t}` (kind: sweep) needs `x`: the grid axis along the x axis"),
                Some(format!("one of: {}", axes.join(", "))),
            ),
            Some(x) if !axes.contains(&x) => p.add(
                &["targets", t, "x"],
                format!("target `{t}`: `x: {x}` is not an axis of its grid"),
                Some(format!("one of: {}", axes.join(", "))),
            ),
            Some(_) => {}
        }
        if let Some((x, axis)) = target
            .x
            .as_deref()
            .and_then(|x| Axis::parse(x).map(|a| (x, a)))
        {
            let values = axis.values(g);
            for k in target.x_labels.keys() {
                if !values.contains(k) {
                    p.add(
                        &["targets", t, "x_labels", k.as_str()],
                        format!("target `{t}`: `x_labels` names `{k}`, which is not a value of `x: {x}`"),
                        Some(format!("values: {}", values.join(", "))),
                    );
                }
            }
        }
        let lines = target.lines.as_deref().unwrap_or(Axis::Method.name());
        if lines != "none" && !axes.contains(&lines) {
            p.add(
                &["targets", t, "lines"],
                format!("target `{t}`: `lines: {lines}` is not an axis of its grid"),
                Some(format!("one of: {}, or `none`", axes.join(", "))),
            );
        } else if target.x.as_deref() == Some(lines) {
            p.add(
                &["targets", t, "lines"],
                format!("target `{t}`: `lines` and `x` are both `{lines}`"),
                Some(
                    "draw one line per value of another axis (default `method`), or `lines: none`"
                        .into(),
                ),
            );
        }
    }
    fn node(&self, w: &mut Wiring, cx: NodeCx<'_>) -> crate::error::Result<usize> {
        let (target, fields) = (cx.target, own::<SweepFields>(cx.own));
        figure_node(
            w,
            cx.name,
            cx.wires,
            256,
            SweepTask {
                kind: "sweep",
                layout: cx.layout.clone(),
                axes: upcc_report::sweep::SweepAxes {
                    x: fields.x.clone().unwrap_or_default(),
                    lines: match fields.lines.as_deref() {
                        Some("none") => None,
                        Some(l) => Some(l.to_string()),
                        None => Some(Axis::Method.name().into()),
                    },
                    split: if target.splits.iter().any(|s| s == "test") {
                        "test".into()
                    } else {
                        target.splits[0].clone()
                    },
                    x_labels: fields.x_labels.clone(),
                    x_title: fields.x_title.clone(),
                },
                inputs: cx.inputs.to_vec(),
            },
        )
    }
}

/// A sweep figure: the cells' metrics aggregated as a table, drawn against one axis.
#[derive(Serialize)]
pub struct SweepTask {
    pub kind: &'static str,
    pub layout: TableLayout,
    pub axes: upcc_report::sweep::SweepAxes,
    pub inputs: Vec<TableInput>,
}

impl Task for SweepTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let mut results = Vec::new();
        for i in &self.inputs {
            results.push(
                cell_result(TableSource::Metrics, i, ctx.input(&i.input)?).map_err(stage_err)?,
            );
        }
        let f = upcc_report::sweep::render_sweep(
            &self.layout.title,
            &self.layout,
            &self.axes,
            &results,
        )
        .map_err(|e| TaskError::Failed(e.to_string()))?;
        let p = &f.points;
        let table = upcc_stages::table::TableBuilder::new()
            .str("panel", p.iter().map(|p| p.panel.clone()).collect())
            .str("line", p.iter().map(|p| p.line.clone()).collect())
            .str("x", p.iter().map(|p| p.x.clone()).collect())
            .str(
                "metric",
                p.iter().map(|p| p.metric.label().to_string()).collect(),
            )
            .f64("mean", p.iter().map(|p| p.agg.mean).collect())
            .f64("std", p.iter().map(|p| p.agg.std).collect())
            .u32("n", p.iter().map(|p| p.agg.n).collect())
            .meta("x_axis", &self.axes.x)
            .meta("split", &self.axes.split)
            .to_parquet();
        ctx.put_output("png", f.png, "image/png", "figure.png");
        ctx.put_output("svg", f.svg.into_bytes(), "image/svg+xml", "figure.svg");
        parquet(ctx, "table", table)
    }
}
