//! `metrics`: ACC, NMI (both normalisations) and ARI of a cell's assignments, per split.

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::{cluster, metrics};

use crate::error::Result;
use crate::wiring::{input, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

/// No parameters: the metrics are fixed.
#[derive(Serialize)]
pub struct MetricsTask {}

impl Task for MetricsTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let a = cluster::Assignments::from_parquet(ctx.input("assignments")?).map_err(stage_err)?;
        let s = metrics::run(&a);
        for x in &s {
            ctx.log(format!(
                "{}: ACC {:.4} NMI {:.4} (arith) {:.4} (geom) ARI {:.4}",
                x.split, x.acc, x.nmi_arithmetic, x.nmi_geometric, x.ari
            ));
            ctx.summary(&format!("{}_nmi_geometric", x.split), x.nmi_geometric);
            ctx.summary(&format!("{}_acc", x.split), x.acc);
        }
        parquet(ctx, "metrics", metrics::to_parquet(&s))
    }
}

/// The metrics node of a cell, on output `assignments` of node `assign`.
pub fn wire(w: &mut Wiring, assign: usize, cell: &Cell) -> Result<usize> {
    w.add(NodeSpec {
        id: format!("metrics/{}", cell.id(w)),
        stage: "metrics",
        version: metrics::VERSION,
        numerics: Numerics::Exact,
        inputs: vec![input("assignments", assign, "assignments")],
        outputs: &["metrics"],
        labels: cell.labels("metrics"),
        resources: Wiring::small(128),
        task: MetricsTask {},
    })
}
