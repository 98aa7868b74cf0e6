//! `kind: table` (the default): clustering scores (ACC, NMI, ARI) of every cell, mean ± std
//! over trials, with the paper's published values beside them. Its table task is shared by
//! the other table kinds (experts, selection, blind-spots, runtime), which read other
//! outputs of their cells ([`TableSource`]).

use std::collections::BTreeMap;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_report::selection::ChosenCell;
use upcc_report::{CellResult, ScoreRow, TableLayout};
use upcc_stages::table::PARQUET_MEDIA_TYPE;
use upcc_stages::{metrics, StageError};

use super::{Cells, PublishedAs, Target, View};
use crate::specs::axis::Axis;
use crate::wiring::stage_err;

const MARKDOWN: &str = "text/markdown";
const LATEX: &str = "application/x-latex";
const CSV: &str = "text/csv";

/// Clustering scores of every cell.
pub struct Table;

impl Target for Table {
    fn name(&self) -> &'static str {
        "table"
    }
    fn summary(&self) -> &'static str {
        "clustering scores (ACC, NMI, ARI) of every cell, mean ± std over trials"
    }
    fn cells(&self) -> Cells {
        Cells::Runs { diagnostics: false }
    }
    fn view(&self) -> View {
        View::Table
    }
    fn published(&self) -> Option<PublishedAs> {
        Some(PublishedAs::Scores)
    }
}

/// Input name of a cell/trial's metrics in a table node, and its coordinates.
#[derive(Clone, Debug, Serialize)]
pub struct TableInput {
    pub input: String,
    pub coords: BTreeMap<String, String>,
    pub trial: String,
}

impl TableInput {
    /// Its coordinate on axis `a`, if the target's grid has that axis.
    pub fn coord(&self, a: Axis) -> Option<&str> {
        self.coords.get(a.name()).map(String::as_str)
    }
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
