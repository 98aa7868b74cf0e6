//! From a spec to the DAG: every target cell × trial is wired by its method (see `method/`),
//! on the shared stages (see `stage/`), then metrics; every target gets a table or figure
//! node over its cells. Nodes shared between cells (features, experts, constraints,
//! pretraining) are added once.

use std::collections::BTreeMap;
use std::sync::Arc;

use upcc_engine::Dag;
use upcc_report::TableLayout;

use crate::device::Compute;
use crate::error::Result;
use crate::specs::{oracle_run_name, OraclePanels, Spec};
use crate::stage;
use crate::targets::{CellTrial, Cells, NodeCx, PublishedAs, TableInput, TargetNodes};
use crate::wiring::{fmt_f, input, Cell, Setup, Wiring};

pub struct Built {
    pub dag: Dag,
    pub targets: Vec<TargetNodes>,
    /// What the training nodes on datasets of known shape need in memory.
    pub memory_needs: Vec<crate::wiring::MemoryNeed>,
}

/// What building a DAG takes from the machine, which the command line reads (the model reads
/// no environment).
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// A folder of dataset files put there by hand, for offline machines
    /// (`$UPCC_DATA_MIRROR`).
    pub data_mirror: Option<std::path::PathBuf>,
}

/// Build the full DAG of a spec: CPU training nodes get `threads` threads each; `compute` is
/// the training device.
pub fn build(spec: &Spec, threads: usize, compute: Arc<Compute>, host: &Host) -> Result<Built> {
    let numerics = compute.numerics();
    build_with(spec, threads, compute, numerics, host)
}

/// The DAG whose training nodes carry numerics class `numerics`, for planning only (which
/// results of that device class are in the store); its tasks would compute on the CPU.
pub fn build_for_numerics(spec: &Spec, numerics: &str, host: &Host) -> Result<Built> {
    build_with(spec, 1, Compute::cpu(), numerics.to_string(), host)
}

fn build_with(
    spec: &Spec,
    threads: usize,
    compute: Arc<Compute>,
    numerics: String,
    host: &Host,
) -> Result<Built> {
    let setup = Setup {
        file: &spec.file,
        params: &spec.params,
        shapes: &spec.shapes,
        dir: &spec.dir,
    };
    let mut w = Wiring::new(setup, threads, compute, numerics);
    w.data_mirror = host.data_mirror.clone();
    let params = &spec.params;
    let mut targets = Vec::new();
    for (tname, target) in &spec.file.targets {
        let g = &target.grid;
        let corruptions = g
            .corruption
            .clone()
            .unwrap_or_else(|| vec![params.constraints.corruption]);
        let budgets = g
            .budget
            .clone()
            .unwrap_or_else(|| vec![params.constraints.budget]);
        let kind = spec.kind(tname);
        let selection = kind.cells() == Cells::Selections;
        let diagnostics = kind.cells() == (Cells::Runs { diagnostics: true });
        let oracle_panels = target.oracle_panels.unwrap_or_default();
        // Experts shared by the trials are one result per setting.
        let expert_trials: Vec<u64> = if params.expert_sharing.per_trial {
            spec.trials.clone()
        } else {
            spec.trials[..1].to_vec()
        };
        let trials = kind.cells().trials(spec.trials.len(), expert_trials.len());
        let mut cells = Vec::new();
        // Published values of the cells, keyed by coordinates (the first trial's pass).
        let published = spec.published.get(tname);
        let mut published_values: Vec<(BTreeMap<String, String>, &crate::specs::PublishedRow)> =
            Vec::new();
        // An experts table's published accuracies, by (dataset, supervision).
        let mut published_cells: Vec<upcc_report::published::PublishedValue> = Vec::new();
        for ds in &g.dataset {
            let dspec = &spec.file.datasets[ds];
            let feat = stage::features::wire(&mut w, ds)?;
            for sup in &g.supervision {
                let sspec = spec.supervision(sup);
                if kind.cells() == Cells::ConstraintRecords {
                    // The first trial's records: the distribution, not its spread.
                    for &pi in &corruptions {
                        for &budget in &budgets {
                            let mut coords = BTreeMap::from([
                                ("dataset".to_string(), ds.clone()),
                                ("supervision".to_string(), sup.clone()),
                            ]);
                            if g.corruption.is_some() {
                                coords.insert("corruption".into(), fmt_f(pi));
                            }
                            if g.budget.is_some() {
                                coords.insert("budget".into(), budget.to_string());
                            }
                            let cell = Cell {
                                dataset: ds,
                                dspec,
                                supervision: sup,
                                sspec,
                                corruption: pi,
                                budget,
                                method: "",
                                pretrain: false,
                                seed: spec.trials[0],
                                holdout: false,
                            };
                            let c = stage::constraints::wire(&mut w, feat, &cell)?;
                            cells.push(CellTrial {
                                coords,
                                trial: spec.trials[0],
                                leaf: c,
                                output: "constraints",
                                oracle_leaf: None,
                            });
                        }
                    }
                    continue;
                }
                if let Some(p) =
                    published.filter(|_| kind.published() == Some(PublishedAs::PrintedScores))
                {
                    let coords = BTreeMap::from([
                        ("dataset".to_string(), ds.clone()),
                        ("supervision".to_string(), sup.clone()),
                    ]);
                    // Validated: an experts table's printed values are numbers.
                    if let Some(v) = p.printed_at(&coords).and_then(|t| t.parse().ok()) {
                        published_cells.push(upcc_report::published::PublishedValue {
                            coord: vec![ds.clone(), sup.clone()],
                            split: "test".into(),
                            metric: upcc_report::Metric::Acc,
                            value: v,
                        });
                    }
                }
                if let Cells::Experts { first_seed_only } = kind.cells() {
                    let seeds = if first_seed_only {
                        &expert_trials[..1]
                    } else {
                        &expert_trials[..]
                    };
                    for &seed in seeds {
                        let coords = BTreeMap::from([
                            ("dataset".to_string(), ds.clone()),
                            ("supervision".to_string(), sup.clone()),
                        ]);
                        let ex = stage::expert::wire(&mut w, feat, ds, sup, sspec, seed)?
                            .expect("validated: experts targets have experts");
                        cells.push(CellTrial {
                            coords,
                            trial: seed,
                            leaf: ex,
                            output: "experts",
                            oracle_leaf: None,
                        });
                    }
                    continue;
                }
                for &pi in &corruptions {
                    for &budget in &budgets {
                        for method in &g.method {
                            let resolved = &spec.methods[method];
                            for pre in g.pretrain_for(resolved.method.pretrainable()) {
                                // A selection is one per cell: its search runs use seeds
                                // 1..=runs whatever the trials.
                                let seeds = if selection {
                                    &spec.trials[..1]
                                } else {
                                    &spec.trials[..]
                                };
                                for &seed in seeds {
                                    let mut coords = BTreeMap::from([
                                        ("dataset".to_string(), ds.clone()),
                                        ("supervision".to_string(), sup.clone()),
                                        ("method".to_string(), method.clone()),
                                    ]);
                                    if g.pretrain.is_some() {
                                        coords.insert("pretrain".into(), pre.to_string());
                                    }
                                    if g.corruption.is_some() {
                                        coords.insert("corruption".into(), fmt_f(pi));
                                    }
                                    if g.budget.is_some() {
                                        coords.insert("budget".into(), budget.to_string());
                                    }
                                    let cell = Cell {
                                        dataset: ds,
                                        dspec,
                                        supervision: sup,
                                        sspec,
                                        corruption: pi,
                                        budget,
                                        method,
                                        pretrain: pre,
                                        seed,
                                        holdout: false,
                                    };
                                    if selection {
                                        let node = resolved
                                            .method
                                            .selection(&mut w, &cell, &resolved.settings)?
                                            .expect("validated: selection targets list methods with a search");
                                        cells.push(CellTrial {
                                            coords,
                                            trial: seed,
                                            leaf: node,
                                            output: "table",
                                            oracle_leaf: None,
                                        });
                                        continue;
                                    }
                                    if let Some(p) = published.filter(|_| seed == spec.trials[0]) {
                                        let kind = resolved.method.kind();
                                        for row in p.matching(ds, sup, kind, pre, pi, budget) {
                                            published_values.push((coords.clone(), row));
                                        }
                                    }
                                    let nodes = resolved.method.wire(
                                        &mut w,
                                        &cell,
                                        &resolved.settings,
                                        feat,
                                    )?;
                                    let metrics =
                                        stage::metrics::wire(&mut w, nodes.assignments, &cell)?;
                                    let (leaf, output) = if diagnostics {
                                        (nodes.train, "diagnostics")
                                    } else {
                                        (metrics, "metrics")
                                    };
                                    // Panels G and H: the same cell on oracle judgments.
                                    let figure_run =
                                        diagnostics && oracle_panels == OraclePanels::Run;
                                    let oracle_leaf =
                                        match spec.oracle_runs.get_key_value(&oracle_run_name(sup))
                                        {
                                            Some((name, sspec)) if figure_run => {
                                                let oracle_cell = Cell {
                                                    supervision: name,
                                                    sspec,
                                                    ..cell
                                                };
                                                let run = resolved.method.wire(
                                                    &mut w,
                                                    &oracle_cell,
                                                    &resolved.settings,
                                                    feat,
                                                )?;
                                                Some(run.train)
                                            }
                                            _ => None,
                                        };
                                    cells.push(CellTrial {
                                        coords,
                                        trial: seed,
                                        leaf,
                                        output,
                                        oracle_leaf,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        let axes: Vec<(String, Vec<String>)> = crate::targets::axes_of(target, kind)
            .into_iter()
            .map(|a| {
                let vals: Vec<String> = match a {
                    "dataset" => g.dataset.clone(),
                    "supervision" => g.supervision.clone(),
                    "method" => g.method.clone(),
                    "pretrain" => g.pretrain.iter().flatten().map(|b| b.to_string()).collect(),
                    "corruption" => corruptions.iter().map(|c| fmt_f(*c)).collect(),
                    _ => budgets.iter().map(|b| b.to_string()).collect(),
                };
                (a.to_string(), vals)
            })
            .collect();
        let experts = kind.cells().per_setting();
        let mut settings = params.table.clone();
        if experts {
            // The experts table shows accuracies only: the NMI variant does not touch it.
            settings.nmi = upcc_report::TableSettings::default().nmi;
        }
        // Blind-spot, selection and runtime tables: the printed values of their cells.
        let printed = match kind.published() {
            Some(PublishedAs::Printed(comparison)) => Some(comparison),
            _ => None,
        };
        let published_text = published.zip(printed).map(|(p, comparison)| {
            let mut values: Vec<upcc_report::published::PublishedText> = Vec::new();
            for c in &cells {
                let coord: Vec<String> = axes
                    .iter()
                    .map(|(a, _)| c.coords.get(a).cloned().unwrap_or_default())
                    .collect();
                if values.iter().any(|v| v.coord == coord) {
                    continue;
                }
                if let Some(text) = p.printed_at(&c.coords) {
                    values.push(upcc_report::published::PublishedText {
                        coord,
                        text: text.to_string(),
                    });
                }
            }
            upcc_report::published::PublishedTexts {
                source: p.source.clone(),
                comparison,
                values,
                device: p.device.clone(),
            }
        });
        let published = published
            .filter(|_| {
                matches!(
                    kind.published(),
                    Some(PublishedAs::Scores | PublishedAs::PrintedScores)
                )
            })
            .map(|p| upcc_report::published::Published {
                source: p.source.clone(),
                values: published_cells
                    .iter()
                    .cloned()
                    .chain(
                        published_values
                            .iter()
                            .filter(|(_, r)| {
                                target.splits.contains(&r.split)
                                    && target.metrics.contains(&r.metric)
                            })
                            .map(|(coords, r)| upcc_report::published::PublishedValue {
                                coord: axes.iter().map(|(a, _)| coords[a].clone()).collect(),
                                split: r.split.clone(),
                                metric: r.metric,
                                value: r.value,
                            }),
                    )
                    .collect(),
            });
        let layout = TableLayout {
            title: target.title.clone().unwrap_or_else(|| tname.clone()),
            axes,
            columns: kind.columns(target),
            metrics: if experts { vec![upcc_report::Metric::Acc] } else { target.metrics.clone() },
            splits: if experts { vec!["test".into()] } else { target.splits.clone() },
            settings,
            highlight_best: !experts,
            published,
            published_text,
            caption: experts.then(|| {
                if params.expert_sharing.per_trial {
                    "Mean ± std over trials of the experts' test accuracy (%, ACC); multi-expert settings: the mean over their experts"
                } else {
                    "The experts' test accuracy (%, ACC; one set of experts per setting, shared by the trials); multi-expert settings: the mean over their experts"
                }
                .to_string()
            }),
        };
        let inputs: Vec<TableInput> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| TableInput {
                input: format!("m{i}"),
                coords: c.coords.clone(),
                trial: c.trial.to_string(),
            })
            .collect();
        let mut wires: Vec<_> = inputs
            .iter()
            .zip(&cells)
            .map(|(ti, c)| input(&ti.input, c.leaf, c.output))
            .collect();
        // Figures: input `o{i}` is cell i's oracle run, when it has one (cells whose own
        // supervision is the oracle's have none: their own AUC/AP are the oracle run's).
        let oracle_inputs: BTreeMap<String, String> = cells
            .iter()
            .zip(&inputs)
            .enumerate()
            .filter_map(|(i, (c, ti))| {
                let leaf = c.oracle_leaf?;
                wires.push(input(&format!("o{i}"), leaf, "diagnostics"));
                Some((ti.input.clone(), format!("o{i}")))
            })
            .collect();
        let node = kind.node(
            &mut w,
            NodeCx {
                name: tname,
                target,
                wires,
                layout: &layout,
                inputs: &inputs,
                oracle_inputs,
                trials,
                std_ddof: params.table.std_ddof,
            },
        )?;
        targets.push(TargetNodes {
            name: tname.clone(),
            kind,
            node,
            layout,
            cells,
            inputs,
            trials,
        });
    }
    let memory_needs = std::mem::take(&mut w.memory_needs);
    Ok(Built {
        dag: w.build(),
        targets,
        memory_needs,
    })
}
