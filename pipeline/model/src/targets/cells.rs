//! A target's cells: each cell × trial of its grid wired on the shared stages and its methods,
//! with the node whose output the target reads. A kind's cells are one of four shapes
//! ([`Cells`]); [`Target::wire_cells`] picks the function here that enumerates them, and a
//! kind whose cells are none of these overrides it.
//!
//! [`Target::wire_cells`]: super::Target::wire_cells

use std::collections::BTreeMap;

use super::{CellTrial, Cells, OwnSettings, TargetKind};
use crate::error::Result;
use crate::method::ResolvedMethod;
use crate::specs::schema::{oracle_run_name, SpecFile, StageParams, SupervisionSpec, TargetSpec};
use crate::stage;
use crate::wiring::{Cell, Wiring};

/// What enumerating a target's cells reads of the spec.
pub struct CellsCx<'a> {
    pub target: &'a TargetSpec,
    pub kind: TargetKind,
    /// What its kind resolved of the fields only it reads.
    pub own: &'a OwnSettings,
    pub file: &'a SpecFile,
    pub params: &'a StageParams,
    /// The spec's methods, resolved.
    pub methods: &'a BTreeMap<String, ResolvedMethod>,
    /// The spec's trials (their seeds).
    pub trials: &'a [u64],
    /// Oracle supervision settings derived for figure targets (`SUP.oracle`).
    pub oracle_runs: &'a BTreeMap<String, SupervisionSpec>,
}

impl<'a> CellsCx<'a> {
    /// A supervision setting by name: the spec's own or a derived oracle run.
    fn supervision(&self, name: &str) -> &'a SupervisionSpec {
        self.file
            .supervision
            .get(name)
            .or_else(|| self.oracle_runs.get(name))
            .expect("validated supervision name")
    }

    /// The experts' seeds: every trial's, or the first when the trials share one set of
    /// experts per setting.
    pub fn expert_trials(&self) -> &'a [u64] {
        if self.params.expert_sharing.per_trial {
            self.trials
        } else {
            &self.trials[..1]
        }
    }

    /// Results per cell when complete.
    pub fn trials_per_cell(&self) -> usize {
        self.kind
            .cells()
            .trials(self.trials.len(), self.expert_trials().len())
    }

    /// The grid's (corruption, budget) points: its own, else the spec's one setting.
    fn constraint_points(&self) -> Vec<(f64, usize)> {
        let g = &self.target.grid;
        let c = &self.params.constraints;
        let corruptions = g.corruption.clone().unwrap_or_else(|| vec![c.corruption]);
        let budgets = g.budget.clone().unwrap_or_else(|| vec![c.budget]);
        corruptions
            .iter()
            .flat_map(|&pi| budgets.iter().map(move |&b| (pi, b)))
            .collect()
    }

    /// The cell at a grid point, untouched by any method (experts and constraint records).
    fn cell(&self, ds: &'a str, sup: &'a str, (pi, budget): (f64, usize), seed: u64) -> Cell<'a> {
        Cell {
            dataset: ds,
            dspec: &self.file.datasets[ds],
            supervision: sup,
            sspec: self.supervision(sup),
            corruption: pi,
            budget,
            method: "",
            pretrain: false,
            seed,
            holdout: false,
            sections: &crate::wiring::NO_SECTIONS,
        }
    }
}

/// [`Cells::ConstraintRecords`]: the first trial's constraint records per dataset ×
/// supervision × (corruption × budget).
pub fn constraint_records(w: &mut Wiring, cx: &CellsCx<'_>) -> Result<Vec<CellTrial>> {
    let axes = super::axes_of(cx.target, cx.kind);
    let mut cells = Vec::new();
    for ds in &cx.target.grid.dataset {
        let feat = stage::features::wire(w, ds)?;
        for sup in &cx.target.grid.supervision {
            // The first trial's records: the distribution, not its spread.
            for point in cx.constraint_points() {
                let cell = cx.cell(ds, sup, point, cx.trials[0]);
                let leaf = stage::constraints::wire(w, feat, &cell)?;
                cells.push(CellTrial::new(&cell, &axes, leaf, "constraints", None));
            }
        }
    }
    Ok(cells)
}

/// [`Cells::Experts`]: the experts of each dataset × supervision, under every expert seed or
/// the first.
pub fn experts(w: &mut Wiring, cx: &CellsCx<'_>, first_seed_only: bool) -> Result<Vec<CellTrial>> {
    let axes = super::axes_of(cx.target, cx.kind);
    let seeds = match cx.expert_trials() {
        s if first_seed_only => &s[..1],
        s => s,
    };
    let c = &cx.params.constraints;
    let mut cells = Vec::new();
    for ds in &cx.target.grid.dataset {
        let feat = stage::features::wire(w, ds)?;
        for sup in &cx.target.grid.supervision {
            for &seed in seeds {
                let cell = cx.cell(ds, sup, (c.corruption, c.budget), seed);
                let leaf = stage::expert::wire(w, feat, ds, sup, cell.sspec, seed)?
                    .expect("validated: experts targets have experts");
                cells.push(CellTrial::new(&cell, &axes, leaf, "experts", None));
            }
        }
    }
    Ok(cells)
}

/// [`Cells::Selections`]: one per method cell, the node of its hyperparameter search (whose
/// runs use seeds `1..=runs` whatever the trials).
pub fn selections(w: &mut Wiring, cx: &CellsCx<'_>) -> Result<Vec<CellTrial>> {
    method_cells(w, cx, &cx.trials[..1], |w, cell, m, _| {
        let node = m
            .method
            .selection(w, cell, &m.settings)?
            .expect("validated: selection targets list methods with a search");
        Ok((node, "table", None))
    })
}

/// [`Cells::Runs`]: every method cell × trial, its metrics, or with `diagnostics` its
/// training node (and, for a kind that draws panels G and H, the same cell's run on oracle
/// judgments).
pub fn runs(w: &mut Wiring, cx: &CellsCx<'_>, diagnostics: bool) -> Result<Vec<CellTrial>> {
    let oracle = diagnostics && cx.kind.oracle_runs(cx.own);
    method_cells(w, cx, cx.trials, |w, cell, m, feat| {
        let nodes = m.method.wire(w, cell, &m.settings, feat)?;
        let metrics = stage::metrics::wire(w, nodes.assignments, cell)?;
        let (leaf, output) = if diagnostics {
            (nodes.train, "diagnostics")
        } else {
            (metrics, "metrics")
        };
        let oracle_leaf = match cx
            .oracle_runs
            .get_key_value(&oracle_run_name(cell.supervision))
        {
            Some((name, sspec)) if oracle => {
                let oracle_cell = Cell {
                    supervision: name,
                    sspec,
                    ..*cell
                };
                Some(m.method.wire(w, &oracle_cell, &m.settings, feat)?.train)
            }
            _ => None,
        };
        Ok((leaf, output, oracle_leaf))
    })
}

/// What a method cell's target reads: the leaf node, its output, its oracle run's node.
type Leaf = (usize, &'static str, Option<usize>);

/// The method cells of the grid (dataset × supervision × corruption × budget × method ×
/// pretraining × `seeds`, in that order), each wired by `leaf`.
fn method_cells(
    w: &mut Wiring,
    cx: &CellsCx<'_>,
    seeds: &[u64],
    mut leaf: impl FnMut(&mut Wiring, &Cell<'_>, &ResolvedMethod, usize) -> Result<Leaf>,
) -> Result<Vec<CellTrial>> {
    let g = &cx.target.grid;
    let axes = super::axes_of(cx.target, cx.kind);
    let mut cells = Vec::new();
    for ds in &g.dataset {
        let feat = stage::features::wire(w, ds)?;
        for sup in &g.supervision {
            for point in cx.constraint_points() {
                for method in &g.method {
                    let m = &cx.methods[method];
                    for pretrain in g.pretrain_for(m.method.pretrainable()) {
                        for &seed in seeds {
                            let cell = Cell {
                                method,
                                pretrain,
                                sections: &m.sections,
                                ..cx.cell(ds, sup, point, seed)
                            };
                            let (node, output, oracle) = leaf(w, &cell, m, feat)?;
                            cells.push(CellTrial::new(&cell, &axes, node, output, oracle));
                        }
                    }
                }
            }
        }
    }
    Ok(cells)
}

impl Cells {
    /// Enumerate and wire the cells of this shape.
    pub(super) fn wire(self, w: &mut Wiring, cx: &CellsCx<'_>) -> Result<Vec<CellTrial>> {
        match self {
            Cells::ConstraintRecords => constraint_records(w, cx),
            Cells::Experts { first_seed_only } => experts(w, cx, first_seed_only),
            Cells::Selections => selections(w, cx),
            Cells::Runs { diagnostics } => runs(w, cx, diagnostics),
        }
    }
}
