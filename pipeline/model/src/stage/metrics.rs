//! `metrics`: ACC, NMI (both normalisations) and ARI of a cell's assignments, per split. Each
//! result carries what identifies it — the cell's coordinates and trial, and the resolved
//! parameters of the training it measures — in its key (so the manifest says it) and in every
//! row of its table (so polars or DuckDB over the store can answer "which run is this").

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::metrics::Ident;
use upcc_stages::{cluster, metrics};

use crate::error::Result;
use crate::specs::axis::Axis;
use crate::wiring::{input, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

/// What identifies the result: no parameter changes the metrics themselves.
#[derive(Serialize)]
pub struct MetricsTask {
    /// The cell's coordinates on every axis, and its trial (which is its seed).
    pub cell: BTreeMap<String, String>,
    /// The parameters of the training measured, `section.field` → value (the names `--set`
    /// takes): the method's sections, and the shared constraints, cluster, expert and (when
    /// the cell pretrains) pretrain sections.
    pub params: BTreeMap<String, Value>,
}

impl MetricsTask {
    /// The identifying columns of the metrics table: coordinates (typed), trial, parameters.
    fn ident(&self) -> Vec<(String, Ident)> {
        let mut out = Vec::new();
        for a in Axis::ALL {
            let Some(v) = self.cell.get(a.name()) else {
                continue;
            };
            let typed = match a {
                Axis::Pretrain => Ident::Bool(v == "true"),
                Axis::Corruption => v.parse().map(Ident::Float).unwrap_or(Ident::Str(v.clone())),
                Axis::Budget => v.parse().map(Ident::Int).unwrap_or(Ident::Str(v.clone())),
                _ => Ident::Str(v.clone()),
            };
            out.push((a.name().to_string(), typed));
        }
        if let Some(t) = self.cell.get("trial").and_then(|t| t.parse().ok()) {
            out.push(("trial".to_string(), Ident::Int(t)));
        }
        for (k, v) in &self.params {
            let typed = match v {
                Value::Bool(b) => Ident::Bool(*b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => Ident::Int(i),
                    None => Ident::Float(n.as_f64().unwrap_or(f64::NAN)),
                },
                Value::String(s) => Ident::Str(s.clone()),
                Value::Null => continue,
                other => Ident::Str(other.to_string()),
            };
            out.push((k.clone(), typed));
        }
        out
    }
}

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
        parquet(
            ctx,
            "metrics",
            metrics::to_parquet_identified(&s, &self.ident()),
        )
    }
}

/// `section.field` → value for every leaf of `v` under `prefix` (lists stay whole).
pub fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                flatten(&format!("{prefix}.{k}"), x, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// The parameters a cell's metrics record (see [`MetricsTask::params`]).
pub fn cell_params(w: &Wiring, cell: &Cell) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (section, v) in cell.sections {
        flatten(section, v, &mut out);
    }
    let p = w.spec.params;
    let mut shared = vec![
        ("constraints", serde_json::to_value(&p.constraints)),
        ("cluster", serde_json::to_value(&p.cluster)),
        ("expert", serde_json::to_value(&p.expert)),
    ];
    if cell.pretrain {
        shared.push(("pretrain", serde_json::to_value(&p.pretrain.settings)));
    }
    for (section, v) in shared {
        if let Ok(v) = v {
            flatten(section, &v, &mut out);
        }
    }
    // The cell's own point on the constraint axes wins over the section's setting.
    out.insert(
        "constraints.corruption".into(),
        serde_json::json!(cell.corruption),
    );
    out.insert("constraints.budget".into(), serde_json::json!(cell.budget));
    out
}

/// The metrics node of a cell, on output `assignments` of node `assign`.
pub fn wire(w: &mut Wiring, assign: usize, cell: &Cell) -> Result<usize> {
    let mut ident = cell.labels("metrics");
    ident.remove("stage");
    let params = cell_params(w, cell);
    w.add(NodeSpec {
        id: format!("metrics/{}", cell.id(w)),
        stage: "metrics",
        version: metrics::VERSION,
        numerics: Numerics::Exact,
        inputs: vec![input("assignments", assign, "assignments")],
        outputs: &["metrics"],
        labels: cell.labels("metrics"),
        resources: Wiring::small(128),
        task: MetricsTask {
            cell: ident,
            params,
        },
    })
}
