//! `kind: figure`: ECI-PP's held-out diagnostics per iteration, drawn as the paper's 8-panel
//! figure; panels G and H from the same cells run on oracle judgments (`oracle_panels: run`,
//! the default) or from the oracle columns of the cells' own diagnostics (`relabel`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;
use upcc_engine::{Task, TaskContext, TaskError};

use super::{
    figure_node, own, own_fields, Cells, CheckCx, NodeCx, OwnSettings, TableInput, Target, View,
};
use crate::specs::schema::SupervisionSpec;
use crate::specs::source::Problems;
use crate::wiring::{parquet, stage_err, Wiring};

/// Where a figure's oracle-supervision panels (G, H) come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OraclePanels {
    /// A second ECI-PP run of each cell on oracle judgments through the same corruption
    /// channel (supervision `SUP.oracle`), read from that run's own diagnostics (the paper).
    #[default]
    Run,
    /// The expert-trained run's networks, scored against the corrupted oracle labels of the
    /// held-out pairs instead of the experts' (no second run).
    Relabel,
}

/// A figure's own fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FigureFields {
    /// Where panels G and H come from (default: a run on oracle judgments).
    #[serde(default)]
    oracle_panels: OraclePanels,
}

/// ECI-PP's held-out diagnostics.
pub struct Figure;

impl Target for Figure {
    fn name(&self) -> &'static str {
        "figure"
    }
    fn summary(&self) -> &'static str {
        "ECI-PP's held-out diagnostics per iteration, drawn as the paper's 8-panel figure"
    }
    fn cells(&self) -> Cells {
        Cells::Runs { diagnostics: true }
    }
    fn view(&self) -> View {
        View::Figure
    }
    fn own_fields(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "oracle_panels",
            "chooses where a figure's panels G and H come from",
        )]
    }
    fn resolve_own(
        &self,
        target: &str,
        fields: &BTreeMap<String, Value>,
        p: &mut Problems<'_>,
    ) -> Option<OwnSettings> {
        own_fields::<FigureFields>(target, fields, p).map(|f| Arc::new(f) as OwnSettings)
    }
    fn oracle_runs(&self, settings: &OwnSettings) -> bool {
        own::<FigureFields>(settings).oracle_panels == OraclePanels::Run
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        let t = cx.name;
        for (m, r) in cx.grid_methods() {
            if !r.method.records_diagnostics() {
                p.add(&cx.grid("method"), format!("target `{t}` (kind: figure) draws ECI-PP's held-out diagnostics; method `{m}` ({}) records none", r.method.kind()), None);
            }
        }
        for sup in &cx.target.grid.supervision {
            if matches!(
                cx.file.supervision.get(sup),
                Some(SupervisionSpec::File { .. })
            ) {
                p.add(&cx.grid("supervision"), format!("target `{t}` (kind: figure): supervision `{sup}` comes from a file, which has no held-out diagnostic set (it needs the experts' judgments and the oracle labels)"), Some("draw the figure for an expert supervision setting".into()));
            }
        }
        if cx.diagnostic_pairs == 0 {
            p.add(
                &["params", "constraints", "diagnostic_pairs"],
                format!("`params.constraints.diagnostic_pairs` is 0, but target `{t}` (kind: figure) draws the held-out diagnostics of those pairs"),
                Some("use at least 1 (the paper: 1000)".into()),
            );
        }
    }
    fn node(&self, w: &mut Wiring, cx: NodeCx<'_>) -> crate::error::Result<usize> {
        figure_node(
            w,
            cx.name,
            cx.wires,
            256,
            FigureTask {
                kind: "figure",
                title: cx.layout.title.clone(),
                inputs: cx.inputs.to_vec(),
                oracle_inputs: cx.oracle_inputs,
                std_ddof: cx.std_ddof,
            },
        )
    }
}

/// The diagnostics figure: its key holds only what the drawing uses (title, inputs, the
/// spread's degrees of freedom), so table-only settings never redraw it.
#[derive(Serialize)]
pub struct FigureTask {
    pub kind: &'static str,
    pub title: String,
    pub inputs: Vec<TableInput>,
    /// Input → the input holding the diagnostics of the same cell's run on oracle judgments:
    /// panels G and H come from its AUC and AP. An input without one (`oracle_panels:
    /// relabel`, or an oracle supervision itself) shows its own oracle columns.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub oracle_inputs: BTreeMap<String, String>,
    pub std_ddof: u8,
}

impl Task for FigureTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        use upcc_report::figure::{render, Series, TrialDiagnostics};
        // One line per cell: label it by the coordinates that vary across the figure.
        let varying: Vec<String> = {
            let mut keys: Vec<String> = self
                .inputs
                .first()
                .map(|i| i.coords.keys().cloned().collect())
                .unwrap_or_default();
            keys.retain(|k| {
                self.inputs
                    .iter()
                    .any(|i| i.coords.get(k) != self.inputs[0].coords.get(k))
            });
            keys
        };
        let mut series: Vec<Series> = Vec::new();
        for i in &self.inputs {
            let t = upcc_stages::table::Table::from_parquet(
                ctx.input(&i.input)?,
                "diagnostics artifact",
            )
            .map_err(stage_err)?;
            let iterations = t.u32("iteration").map_err(stage_err)?;
            // Diagnostics written before a column existed read as not recorded (NaN).
            let values = upcc_report::figure::columns()
                .map(|name| {
                    if t.has_column(name) {
                        t.f64(name).map_err(stage_err)
                    } else {
                        Ok(vec![f64::NAN; iterations.len()])
                    }
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let mut values = values;
            if let Some(o) = self.oracle_inputs.get(&i.input) {
                oracle_panels(ctx.input(o)?, &iterations, &mut values)?;
            }
            // In the paper's words (`ECI-PP, multi3, pretrained`), the method first.
            let keys: Vec<&String> = if varying.is_empty() {
                let mut k: Vec<&String> = i.coords.keys().filter(|k| *k != "dataset").collect();
                k.sort_by_key(|k| *k != "method");
                k
            } else {
                varying.iter().collect()
            };
            let label = keys
                .iter()
                .map(|k| upcc_report::display_value(k, &i.coords[*k]))
                .collect::<Vec<_>>()
                .join(", ");
            let trial = TrialDiagnostics { iterations, values };
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.trials.push(trial),
                None => series.push(Series {
                    label,
                    trials: vec![trial],
                }),
            }
        }
        if series
            .iter()
            .all(|s| s.trials.iter().all(|t| t.iterations.is_empty()))
        {
            return Err(TaskError::Input(
                "no held-out diagnostics were recorded (is `eci.diagnostics_every` 0, or the supervision a file without a diagnostic set?)".into(),
            ));
        }
        let f = render(&self.title, &series, self.std_ddof)
            .map_err(|e| TaskError::Failed(e.to_string()))?;
        let table = upcc_stages::table::TableBuilder::new()
            .str("series", f.stats.iter().map(|s| s.0.clone()).collect())
            .str("panel", f.stats.iter().map(|s| s.1.clone()).collect())
            .u32("iteration", f.stats.iter().map(|s| s.2).collect())
            .f64("mean", f.stats.iter().map(|s| s.3.mean).collect())
            .f64("std", f.stats.iter().map(|s| s.3.std).collect())
            .u32("n", f.stats.iter().map(|s| s.3.n).collect())
            .to_parquet();
        ctx.put_output("png", f.png, "image/png", "figure.png");
        ctx.put_output("svg", f.svg.into_bytes(), "image/svg+xml", "figure.svg");
        parquet(ctx, "table", table)
    }
}

/// Panels G and H (columns 6 and 7 of `values`) from the oracle run's own AUC and AP of the
/// gap as a corruption detector, matched by iteration (NaN where it recorded none).
fn oracle_panels(
    bytes: &[u8],
    iterations: &[u32],
    values: &mut [Vec<f64>],
) -> Result<(), TaskError> {
    let t = upcc_stages::table::Table::from_parquet(bytes, "oracle-run diagnostics artifact")
        .map_err(stage_err)?;
    let its = t.u32("iteration").map_err(stage_err)?;
    let (auc, ap) = (
        t.f64("auc").map_err(stage_err)?,
        t.f64("ap").map_err(stage_err)?,
    );
    for (i, it) in iterations.iter().enumerate() {
        let j = its.iter().position(|x| x == it);
        values[6][i] = j.map_or(f64::NAN, |j| auc[j]);
        values[7][i] = j.map_or(f64::NAN, |j| ap[j]);
    }
    Ok(())
}
