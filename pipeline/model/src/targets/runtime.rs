//! `kind: runtime`: the wall-clock training time of each cell (pretraining and searches
//! included), read from the manifests' recorded times: the paper's Table 11. Its node is its
//! cells' clustering table; the times are provenance, not content, so the table is composed
//! when it is shown ([`runtime_table`]).

use std::collections::BTreeSet;

use upcc_engine::{InputDef, Manifest, NodeStatus, PlanEntry, Store};
use upcc_report::published::Comparison;

use super::TargetNodes;
use super::{Cells, PublishedAs, Target, View};
use crate::error::{Error, Result};
use crate::specs::axis::Axis;

/// Training wall time per cell.
pub struct Runtime;

impl Target for Runtime {
    fn name(&self) -> &'static str {
        "runtime"
    }
    fn summary(&self) -> &'static str {
        "wall-clock training time of each cell, from the manifests' recorded times"
    }
    fn cells(&self) -> Cells {
        Cells::Runs { diagnostics: false }
    }
    fn view(&self) -> View {
        View::Runtime
    }
    // The paper's Table 11: a column per dataset, a row per method.
    fn default_columns(&self) -> Option<&'static [Axis]> {
        Some(&[Axis::Dataset])
    }
    fn published(&self) -> Option<PublishedAs> {
        Some(PublishedAs::Printed(Comparison::Duration))
    }
    fn published_axes(&self) -> (Axis, Axis) {
        (Axis::Method, Axis::Dataset)
    }
}

/// Each training node's recorded wall time and what it ran on (`None`: not computed), by
/// node index, read once per report: shared upstream nodes (pretraining, searches) are
/// reached from many cells.
pub type Durations = std::collections::HashMap<usize, Option<(f64, String)>>;

/// What a manifest says its node ran on: the GPU's model, else the CPU's with the threads.
fn ran_on(m: &Manifest) -> String {
    let p = &m.provenance;
    match p.libraries.get("device.gpu") {
        Some(gpu) => gpu.clone(),
        None => format!("{}, {} threads", p.cpu, p.threads),
    }
}

/// The summed wall time of the trainings upstream of `leaf` (nodes with a device numerics
/// class, except the simulated experts) and the devices they ran on, or `None` if one of them
/// is not computed.
pub fn training_time(
    dag: &upcc_engine::Dag,
    entries: &[PlanEntry],
    store: &Store,
    leaf: usize,
    durations: &mut Durations,
) -> Result<Option<(f64, BTreeSet<String>)>> {
    let mut stack = vec![leaf];
    let mut seen = BTreeSet::new();
    let mut total = 0.0;
    let mut devices = BTreeSet::new();
    while let Some(i) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let n = dag.node(i);
        if n.numerics != "exact" && n.stage != "expert" {
            let d = match durations.get(&i) {
                Some(d) => d.clone(),
                None => {
                    let d = fresh_manifest(store, &entries[i])?
                        .map(|m| (m.provenance.duration_s, ran_on(&m)));
                    durations.insert(i, d.clone());
                    d
                }
            };
            match d {
                Some((d, device)) => {
                    total += d;
                    devices.insert(device);
                }
                None => return Ok(None),
            }
        }
        for (_, input) in &n.inputs {
            if let InputDef::Node { node, .. } = input {
                stack.push(node.0);
            }
        }
    }
    Ok(Some((total, devices)))
}

/// A runtime target (the paper's Table 11): per cell, the mean over its timed trials of the
/// wall time of every training upstream of it (pretraining and searches included), from the
/// manifests. Wall time is provenance, not content: the table is composed when shown.
pub fn runtime_table(
    t: &TargetNodes,
    dag: &upcc_engine::Dag,
    entries: &[PlanEntry],
    store: &Store,
    durations: &mut Durations,
) -> Result<upcc_report::Rendered> {
    use upcc_report::text::{hms, render_text, TextCell};
    type ByCell<'a> = Vec<(
        &'a std::collections::BTreeMap<String, String>,
        Vec<f64>,
        BTreeSet<String>,
    )>;
    let mut by_cell: ByCell = Vec::new();
    for cell in &t.cells {
        let s = training_time(dag, entries, store, cell.leaf, durations)?;
        let i = match by_cell.iter().position(|(c, _, _)| *c == &cell.coords) {
            Some(i) => i,
            None => {
                by_cell.push((&cell.coords, vec![], BTreeSet::new()));
                by_cell.len() - 1
            }
        };
        if let Some((secs, devices)) = s {
            by_cell[i].1.push(secs);
            by_cell[i].2.extend(devices);
        }
    }
    let cells: Vec<TextCell> = by_cell
        .into_iter()
        .filter(|(_, s, _)| !s.is_empty())
        .map(|(coords, s, devices)| {
            let mean = s.iter().sum::<f64>() / s.len() as f64;
            let text = if s.len() < t.trials {
                format!("{} ({} of {} trials)", hms(mean), s.len(), t.trials)
            } else {
                hms(mean)
            };
            TextCell {
                coords: coords.clone(),
                latex: text.clone(),
                text,
                value: Some(mean),
                device: Some(devices.into_iter().collect::<Vec<_>>().join(" / ")),
            }
        })
        .collect();
    render_text(
        &t.layout,
        &cells,
        "Mean wall-clock training time per trial (pretraining and hyperparameter searches included, the simulated experts not), from the recorded times of this store's nodes",
    )
    .map_err(|e| Error::env(e.to_string()))
}

/// The manifest of a node the plan found fresh.
pub fn fresh_manifest(store: &Store, e: &PlanEntry) -> Result<Option<Manifest>> {
    match (e.status, e.key) {
        (NodeStatus::Fresh, Some(k)) => Ok(store.fresh_manifest(&k)?),
        _ => Ok(None),
    }
}
