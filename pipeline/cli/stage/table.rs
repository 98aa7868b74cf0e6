//! `table` and `figure`: the targets' renderings from the cells' results.

use std::collections::BTreeMap;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_report::selection::ChosenCell;
use upcc_report::{CellResult, ScoreRow, TableLayout};
use upcc_stages::table::PARQUET_MEDIA_TYPE;
use upcc_stages::{metrics, StageError};

use crate::wiring::{parquet, stage_err};

const MARKDOWN: &str = "text/markdown";
const LATEX: &str = "application/x-latex";
const CSV: &str = "text/csv";

/// Version of the table stage (rendering lives in `upcc-report`).
pub const TABLE_VERSION: u32 = 1;
/// Version of the figure stage (drawing lives in `upcc-report`).
pub const FIGURE_VERSION: u32 = 1;

/// Input name of a cell/trial's metrics in a table node, and its coordinates.
#[derive(Clone, Debug, Serialize)]
pub struct TableInput {
    pub input: String,
    pub coords: BTreeMap<String, String>,
    pub trial: String,
}

/// What a table aggregates (its `kind` in the key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TableSource {
    #[serde(rename = "table")]
    /// Clustering scores of each cell (`metrics` outputs).
    Metrics,
    /// Expert test accuracies (`experts` outputs): the mean over a setting's experts.
    Experts,
    /// Chosen hyperparameters (selection nodes' `table` outputs).
    Selection,
    /// The experts' unfamiliar-class counts (`experts` outputs).
    #[serde(rename = "blind-spots")]
    BlindSpots,
}

impl TableSource {
    /// What a table target of this kind reads.
    pub fn of(kind: crate::spec::TargetKind) -> Self {
        use crate::spec::TargetKind;
        match kind {
            TargetKind::Experts => TableSource::Experts,
            TargetKind::Selection => TableSource::Selection,
            TargetKind::BlindSpots => TableSource::BlindSpots,
            // A runtime target's node is its cells' clustering table; the times are read
            // from the manifests when it is shown (wall time is provenance, not content).
            // Figures and constraint values never render as tables.
            TargetKind::Table
            | TargetKind::Figure
            | TargetKind::Sweep
            | TargetKind::Runtime
            | TargetKind::ConstraintValues => TableSource::Metrics,
        }
    }
}

/// The chosen value of a selection node's `table` output, for a selection table.
pub fn chosen_cell(input: &TableInput, bytes: &[u8]) -> Result<ChosenCell, StageError> {
    let t = upcc_stages::table::Table::from_parquet(bytes, "selection table")?;
    let parameter = t.meta("parameter").unwrap_or_default().to_string();
    let value: f64 = t
        .meta("chosen")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| StageError::failed("the selection table records no chosen value"))?;
    let values = t.f64("value")?;
    let accs = t.f64("mean_val_acc")?;
    let mean_val_acc = values
        .iter()
        .position(|v| *v == value)
        .map(|i| accs[i])
        .unwrap_or(f64::NAN);
    Ok(ChosenCell {
        coords: input.coords.clone(),
        parameter,
        value,
        mean_val_acc,
    })
}

/// Render a table target from the bytes of its inputs, in order.
pub fn render_target(
    source: TableSource,
    layout: &TableLayout,
    inputs: &[(&TableInput, &[u8])],
    trials: usize,
) -> Result<upcc_report::Rendered, StageError> {
    let r = if source == TableSource::BlindSpots {
        let cells = inputs
            .iter()
            .map(|(i, b)| {
                let t = upcc_stages::table::Table::from_parquet(b, "expert summary")?;
                let text = upcc_report::text::blind_spot_counts(&t.str("unfamiliar")?);
                Ok(upcc_report::text::TextCell {
                    coords: i.coords.clone(),
                    latex: format!("${text}$"),
                    text,
                    value: None,
                    device: None,
                })
            })
            .collect::<Result<Vec<_>, StageError>>()?;
        upcc_report::text::render_text(
            layout,
            &cells,
            "Unfamiliar-class counts of each expert, read from the trained experts",
        )
    } else if source == TableSource::Selection {
        let cells = inputs
            .iter()
            .map(|(i, b)| chosen_cell(i, b))
            .collect::<Result<Vec<_>, _>>()?;
        upcc_report::selection::render_chosen(layout, &cells)
    } else {
        let results = inputs
            .iter()
            .map(|(i, b)| cell_result(source, i, b))
            .collect::<Result<Vec<_>, _>>()?;
        upcc_report::render(layout, &results, trials)
    };
    r.map_err(|e| StageError::failed(e.to_string()))
}

#[derive(Serialize)]
pub struct TableTask {
    #[serde(rename = "kind")]
    pub source: TableSource,
    pub layout: TableLayout,
    pub trials: usize,
    pub inputs: Vec<TableInput>,
}

/// Per-trial results from the bytes a table reads.
pub fn cell_result(
    source: TableSource,
    input: &TableInput,
    bytes: &[u8],
) -> Result<CellResult, StageError> {
    if source == TableSource::Experts {
        let t = upcc_stages::table::Table::from_parquet(bytes, "expert summary")?;
        let acc = t.f64("test_accuracy")?;
        let mean = acc.iter().sum::<f64>() / acc.len().max(1) as f64;
        return Ok(CellResult {
            coords: input.coords.clone(),
            trial: input.trial.clone(),
            scores: vec![ScoreRow {
                split: "test".into(),
                acc: mean,
                nmi_arithmetic: f64::NAN,
                nmi_geometric: f64::NAN,
                ari: f64::NAN,
            }],
        });
    }
    let scores = metrics::from_parquet(bytes)?;
    Ok(CellResult {
        coords: input.coords.clone(),
        trial: input.trial.clone(),
        scores: scores
            .into_iter()
            .map(|s| ScoreRow {
                split: s.split,
                acc: s.acc,
                nmi_arithmetic: s.nmi_arithmetic,
                nmi_geometric: s.nmi_geometric,
                ari: s.ari,
            })
            .collect(),
    })
}

impl Task for TableTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let mut bytes = Vec::new();
        for i in &self.inputs {
            bytes.push(ctx.input(&i.input)?.to_vec());
        }
        let inputs: Vec<(&TableInput, &[u8])> = self
            .inputs
            .iter()
            .zip(&bytes)
            .map(|(i, b)| (i, b.as_slice()))
            .collect();
        let r =
            render_target(self.source, &self.layout, &inputs, self.trials).map_err(stage_err)?;
        ctx.summary("cells", r.cells_total);
        ctx.put_output("table", r.parquet, PARQUET_MEDIA_TYPE, "table.parquet");
        ctx.put_output("markdown", r.markdown.into_bytes(), MARKDOWN, "table.md");
        ctx.put_output("latex", r.latex.into_bytes(), LATEX, "table.tex");
        ctx.put_output("csv", r.csv.into_bytes(), CSV, "table.csv");
        Ok(())
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
            let label = if varying.is_empty() {
                i.coords.values().cloned().collect::<Vec<_>>().join(" ")
            } else {
                varying
                    .iter()
                    .map(|k| i.coords[k].clone())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
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
            let mut col = i.coords["dataset"].clone();
            for k in ["corruption", "budget"] {
                if let Some(v) = i.coords.get(k) {
                    col.push_str(&format!(" {k}={v}"));
                }
            }
            panels.push(ValuePanel {
                row: i.coords["supervision"].clone(),
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
