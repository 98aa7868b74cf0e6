//! From a spec to the DAG: each target's kind enumerates its cells (see `targets/cells.rs`),
//! each cell × trial wired by its method (see `method/`) on the shared stages (see `stage/`);
//! every target gets a table or figure node over its cells. Nodes shared between cells
//! (features, experts, constraints, pretraining) are added once.

use std::collections::BTreeMap;
use std::sync::Arc;

use upcc_engine::Dag;
use upcc_report::TableLayout;

use crate::device::Compute;
use crate::error::Result;
use crate::specs::axis::Axis;
use crate::specs::schema::TargetSpec;
use crate::specs::Spec;
use crate::targets::{axes_of, published, CellsCx, NodeCx, TableInput, TargetKind, TargetNodes};
use crate::wiring::{input, Setup, Wiring};

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
    let targets = spec
        .file
        .targets
        .iter()
        .map(|(name, target)| target_nodes(&mut w, spec, name, target))
        .collect::<Result<Vec<_>>>()?;
    let memory_needs = std::mem::take(&mut w.memory_needs);
    Ok(Built {
        dag: w.build(),
        targets,
        memory_needs,
    })
}

/// A target's cells (its kind enumerates and wires them) and its table or figure node over
/// them.
fn target_nodes(
    w: &mut Wiring,
    spec: &Spec,
    name: &str,
    target: &TargetSpec,
) -> Result<TargetNodes> {
    let resolved = spec.target(name);
    let kind = resolved.kind;
    let cx = CellsCx {
        target,
        kind,
        own: &resolved.own,
        file: &spec.file,
        params: &spec.params,
        methods: &spec.methods,
        trials: &spec.trials,
        oracle_runs: &spec.oracle_runs,
    };
    let cells = kind.wire_cells(w, &cx)?;
    let trials = cx.trials_per_cell();
    let axes = axes_of(target, kind);
    let published = published::for_cells(
        kind,
        resolved.published.as_ref(),
        target,
        &spec.methods,
        &cells,
        &axes,
    );
    let layout = layout(spec, name, target, kind, &axes, published);
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
        w,
        NodeCx {
            name,
            target,
            own: &resolved.own,
            wires,
            layout: &layout,
            inputs: &inputs,
            oracle_inputs,
            trials,
            std_ddof: spec.params.table.std_ddof,
        },
    )?;
    Ok(TargetNodes {
        name: name.to_string(),
        kind,
        node,
        layout,
        cells,
        inputs,
        trials,
    })
}

/// How a target's table is laid out: its axes, columns, metrics and splits, and the published
/// values it is compared with.
fn layout(
    spec: &Spec,
    name: &str,
    target: &TargetSpec,
    kind: TargetKind,
    axes: &[Axis],
    published: published::ForCells,
) -> TableLayout {
    let params = &spec.params;
    let experts = kind.cells().per_setting();
    let mut settings = params.table.clone();
    if experts {
        // The experts table shows accuracies only: the NMI variant does not touch it.
        settings.nmi = upcc_report::TableSettings::default().nmi;
    }
    TableLayout {
        title: target.title.clone().unwrap_or_else(|| name.to_string()),
        axes: axes
            .iter()
            .map(|a| (a.name().to_string(), a.values(&target.grid)))
            .collect(),
        columns: kind.columns(target),
        metrics: if experts { vec![upcc_report::Metric::Acc] } else { target.metrics.clone() },
        splits: if experts { vec!["test".into()] } else { target.splits.clone() },
        settings,
        highlight_best: !experts,
        published: published.scores,
        published_text: published.texts,
        caption: experts.then(|| {
            if params.expert_sharing.per_trial {
                "Mean ± std over trials of the experts' test accuracy (%, ACC); multi-expert settings: the mean over their experts"
            } else {
                "The experts' test accuracy (%, ACC; one set of experts per setting, shared by the trials); multi-expert settings: the mean over their experts"
            }
            .to_string()
        }),
    }
}
