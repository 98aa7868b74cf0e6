//! `select`: a hyperparameter chosen by mean validation ACC over repeated runs (VolMaxDCC's λ,
//! the expert-aware ensembles' α). Its output is the chosen value, so a rerun that chooses the
//! same value leaves everything trained with it fresh (early cutoff).

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::ensemble::{select_best, SearchScope};
use upcc_stages::metrics;
use upcc_stages::table::{Table, TableBuilder};

use crate::error::Result;
use crate::specs::axis::Axis;
use crate::wiring::{input, labels, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

pub const VERSION: u32 = 1;

#[derive(Serialize)]
pub struct SelectTask {
    /// The parameter's name (`lambda`, `alpha`).
    pub parameter: String,
    pub grid: Vec<f64>,
    /// Input `r{i}_{j}` holds the metrics of run j of grid value i.
    pub runs: usize,
}

impl Task for SelectTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let mut accs: Vec<Vec<f64>> = Vec::new();
        for i in 0..self.grid.len() {
            let mut v = Vec::new();
            for j in 0..self.runs {
                let s =
                    metrics::from_parquet(ctx.input(&format!("r{i}_{j}"))?).map_err(stage_err)?;
                let val = s.iter().find(|x| x.split == "val").ok_or_else(|| {
                    TaskError::Input(format!(
                        "selecting `{}` needs validation scores, and the dataset reserves no validation rows; set the dataset's `validation` (the paper: 1000)",
                        self.parameter
                    ))
                })?;
                v.push(val.acc);
            }
            accs.push(v);
        }
        let (best, mean) = select_best(&accs)
            .ok_or_else(|| TaskError::Failed("no candidate to select from".into()))?;
        let chosen = self.grid[best];
        for (g, a) in self.grid.iter().zip(&accs) {
            ctx.log(format!(
                "{} = {g}: mean validation ACC {:.4} over {} runs",
                self.parameter,
                a.iter().sum::<f64>() / a.len() as f64,
                a.len()
            ));
        }
        ctx.log(format!(
            "chose {} = {chosen} (mean validation ACC {mean:.4})",
            self.parameter
        ));
        ctx.summary(&self.parameter, chosen);
        ctx.summary("mean_val_acc", mean);
        // The chosen value alone: what the final training reads, so that a selection that picks
        // the same value again (another grid order, another run count) keeps it fresh.
        parquet(
            ctx,
            "chosen",
            TableBuilder::new()
                .f64("value", vec![chosen])
                .meta("parameter", &self.parameter)
                .meta("chosen", chosen)
                .to_parquet(),
        )?;
        parquet(
            ctx,
            "table",
            TableBuilder::new()
                .f64("value", self.grid.clone())
                .f64(
                    "mean_val_acc",
                    accs.iter()
                        .map(|a| a.iter().sum::<f64>() / a.len() as f64)
                        .collect(),
                )
                .str(
                    "chosen",
                    (0..self.grid.len())
                        .map(|i| if i == best { "yes" } else { "" }.to_string())
                        .collect(),
                )
                .meta("parameter", &self.parameter)
                .meta("chosen", chosen)
                .to_parquet(),
        )
    }
}

/// A hyperparameter search: the supervision setting whose runs decide, the parameter's name
/// (`lambda`, `alpha`), its candidate values, the runs per value and where it runs.
pub struct Search<'a> {
    pub supervision: &'a str,
    pub parameter: &'a str,
    pub grid: &'a [f64],
    pub runs: usize,
    pub scope: SearchScope,
}

/// The chosen value of a `chosen` output.
pub fn chosen(bytes: &[u8]) -> std::result::Result<f64, TaskError> {
    let t = Table::from_parquet(bytes, "selection").map_err(stage_err)?;
    t.meta("chosen")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| TaskError::Failed("the selection records no chosen value".into()))
}

/// Wire a search: for every grid value and run r = 1..=runs, `run` adds the nodes of one
/// training of `cell` (its supervision `supervision`, trial seed r, the method labelled
/// `method@parameter=value`) on the features node it is given (the dataset without its
/// validation rows) and returns its `assignments` node; each gets metrics; the selection node
/// reads them all. Returns the selection node.
pub fn wire(
    w: &mut Wiring,
    cell: &Cell,
    search: Search<'_>,
    run: &mut dyn FnMut(&mut Wiring, &Cell, usize, f64) -> Result<usize>,
) -> Result<usize> {
    let Search {
        supervision,
        parameter,
        grid,
        runs,
        scope,
    } = search;
    let spec = w.spec;
    // The paper selects once per dataset and setting, at its main setting (9k constraints,
    // π = 0.3: the spec's `constraints` section), and uses the choice at every budget and
    // corruption; `search_scope: cell` searches again in each cell.
    let (corruption, budget) = match scope {
        SearchScope::Setting => (
            spec.params.constraints.corruption,
            spec.params.constraints.budget,
        ),
        SearchScope::Cell => (cell.corruption, cell.budget),
    };
    let sspec = &spec.file.supervision[supervision];
    // The search trains without the validation rows (unless every training does anyway).
    let holdout = cell.dspec.validation_scope != crate::specs::schema::ValidationScope::All;
    let feat = super::features::wire_holdout(w, cell.dataset)?;
    let mut inputs = Vec::new();
    for (i, &g) in grid.iter().enumerate() {
        let method = format!("{}@{parameter}={}", cell.method, crate::wiring::fmt_f(g));
        for r in 0..runs {
            let search = Cell {
                dataset: cell.dataset,
                dspec: cell.dspec,
                supervision,
                sspec,
                corruption,
                budget,
                method: &method,
                pretrain: cell.pretrain,
                seed: r as u64 + 1,
                holdout,
                sections: cell.sections,
            };
            let assign = run(w, &search, feat, g)?;
            let m = super::metrics::wire(w, assign, &search)?;
            inputs.push(input(&format!("r{i}_{r}"), m, "metrics"));
        }
    }
    let at = Cell {
        corruption,
        budget,
        ..*cell
    };
    let suffix = at.axes_suffix(w);
    w.add(NodeSpec {
        id: format!(
            "select/{}/{}/{supervision}{suffix}/{}",
            cell.method,
            cell.dataset,
            if cell.pretrain { "pre" } else { "nopre" }
        ),
        stage: "select",
        version: VERSION,
        numerics: Numerics::Exact,
        inputs,
        outputs: &["chosen", "table"],
        labels: labels(
            "select",
            [
                (Axis::Dataset, cell.coord(Axis::Dataset)),
                (Axis::Supervision, supervision.to_string()),
                (Axis::Method, cell.coord(Axis::Method)),
                (Axis::Pretrain, cell.coord(Axis::Pretrain)),
            ],
        ),
        resources: Wiring::small(128),
        task: SelectTask {
            parameter: parameter.to_string(),
            grid: grid.to_vec(),
            runs,
        },
    })
}
