//! The shared wiring every stage and method file builds on: adding a node whose key parameters
//! are its task (one struct, serialised for the key and run by the engine), the cell of a grid a
//! method trains for, and the resources a node asks the executor for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{DagBuilder, InputDef, NodeDef, NodeIndex, Resources, Task, TaskContext};
use upcc_stages::table::PARQUET_MEDIA_TYPE;
use upcc_stages::{Monitor, StageError};

use crate::device::{Compute, NodeCompute};
use crate::error::{Error, Result};
use crate::specs::axis::Axis;
use crate::specs::schema::{DatasetSpec, SpecFile, StageParams, SupervisionSpec};

/// Whether a node's output bits depend on the compute device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// Exact, device-independent computation (data handling, k-means in f64, tables).
    Exact,
    /// Trains networks on the run's device (`cpu-f32-avx512`, `cuda-f32-sm90-…`, …).
    Device,
}

/// One node as a stage file describes it. The task is the node's parameters: its serialised
/// form (fields marked `#[serde(skip)]` aside) goes into the node key, so what the key names and
/// what the task runs with cannot drift apart.
pub struct NodeSpec<T> {
    pub id: String,
    pub stage: &'static str,
    pub version: u32,
    pub numerics: Numerics,
    pub inputs: Vec<(String, InputDef)>,
    pub outputs: &'static [&'static str],
    pub labels: BTreeMap<String, String>,
    pub resources: Resources,
    pub task: T,
}

/// What wiring reads of a loaded spec: its file, its checked stage parameters, the datasets'
/// shapes known at load, and the folder relative paths start from.
#[derive(Clone, Copy)]
pub struct Setup<'a> {
    pub file: &'a SpecFile,
    pub params: &'a StageParams,
    pub shapes: &'a BTreeMap<String, Option<upcc_stages::features::Shape>>,
    pub dir: &'a std::path::Path,
}

impl Setup<'_> {
    /// A path of the spec (a dataset file), relative to its folder.
    pub fn resolve_path(&self, path: &str) -> std::path::PathBuf {
        self.dir.join(path)
    }
}

/// The DAG under construction.
pub struct Wiring<'a> {
    pub spec: Setup<'a>,
    b: DagBuilder,
    /// Threads of a CPU training node.
    pub threads: usize,
    pub compute: Arc<Compute>,
    /// Numerics class of the nodes that train networks.
    pub numerics: String,
    /// Optional grid axes that appear in node ids (corruption and budget, where some target
    /// varies them).
    pub id_axes: BTreeSet<Axis>,
    /// What each training node's networks need in memory, where the dataset's shape is known
    /// at load (checked against the process's memory budget once the DAG is built).
    pub memory_needs: Vec<MemoryNeed>,
    /// The folder of dataset files for offline machines (fetch nodes look there first).
    pub data_mirror: Option<std::path::PathBuf>,
}

/// The memory one training node needs: the node, the settings section whose sizes decide it,
/// what the estimate covers, and the bytes.
#[derive(Clone, Debug)]
pub struct MemoryNeed {
    pub node: String,
    pub section: String,
    pub what: String,
    pub bytes: u128,
}

impl<'a> Wiring<'a> {
    pub fn new(spec: Setup<'a>, threads: usize, compute: Arc<Compute>, numerics: String) -> Self {
        let id_axes = spec
            .file
            .targets
            .values()
            .flat_map(|t| {
                [Axis::Corruption, Axis::Budget]
                    .into_iter()
                    .filter(|a| a.in_grid(&t.grid))
            })
            .collect();
        Wiring {
            spec,
            b: DagBuilder::new(),
            threads: threads.max(1),
            compute,
            numerics,
            id_axes,
            memory_needs: Vec::new(),
            data_mirror: None,
        }
    }

    /// The shape of dataset `name` as known at load (`expect:`, or the head of its file).
    pub fn shape(&self, name: &str) -> Option<upcc_stages::features::Shape> {
        self.spec.shapes.get(name).copied().flatten()
    }

    /// The classes of dataset `name` as known at load (`n_classes`, `expect.classes`), else 1
    /// (memory estimates are then lower bounds).
    pub fn classes(&self, name: &str) -> usize {
        let d = &self.spec.file.datasets[name];
        d.n_classes
            .or(d.expect.as_ref().and_then(|e| e.classes))
            .unwrap_or(1)
    }

    /// Resources of a training node whose networks need `bytes` (when known at load), and a
    /// record of the need for the memory check: the memory slot is the estimate with room for
    /// the data, never below `floor_mb`.
    pub fn trainer_sized(
        &mut self,
        node: &str,
        section: &str,
        what: String,
        bytes: Option<u128>,
        floor_mb: u64,
        gpu_mb: u64,
    ) -> Resources {
        let mut memory_mb = floor_mb;
        if let Some(b) = bytes {
            let mb = u64::try_from(b / (1 << 20)).unwrap_or(u64::MAX);
            memory_mb = memory_mb.max(mb.saturating_add(mb / 4).saturating_add(512));
            if !self.memory_needs.iter().any(|m| m.node == node) {
                self.memory_needs.push(MemoryNeed {
                    node: node.to_string(),
                    section: section.to_string(),
                    what,
                    bytes: b,
                });
            }
        }
        self.trainer(memory_mb, gpu_mb)
    }

    /// Add a node (or find the identical one added before: shared nodes such as features,
    /// experts and pretraining are added once).
    pub fn add<T: Task + Serialize + 'static>(&mut self, n: NodeSpec<T>) -> Result<usize> {
        let params = serde_json::to_value(&n.task)
            .map_err(|e| Error::internal(format!("cannot serialise parameters: {e}")))?;
        let numerics = match n.numerics {
            Numerics::Exact => "exact".to_string(),
            Numerics::Device => self.numerics.clone(),
        };
        let def = NodeDef {
            id: n.id,
            stage: n.stage.into(),
            stage_version: n.version,
            params,
            code: crate::code::stage_code(n.stage, &numerics),
            numerics,
            inputs: n.inputs,
            outputs: n.outputs.iter().map(|s| s.to_string()).collect(),
            labels: n.labels,
            resources: n.resources,
            task: Arc::new(n.task),
        };
        self.b
            .add(def)
            .map(|i| i.0)
            .map_err(|e| Error::internal(e.to_string()))
    }

    pub fn build(self) -> upcc_engine::Dag {
        self.b.build()
    }

    /// Resources of a node that trains networks: a GPU slot with `gpu_mb` of GPU memory and
    /// one CPU thread to drive it on a GPU, else the per-node CPU threads.
    pub fn trainer(&self, memory_mb: u64, gpu_mb: u64) -> Resources {
        if self.compute.is_gpu() {
            Resources {
                threads: 1,
                memory_mb,
                gpu_memory_mb: gpu_mb,
            }
        } else {
            Resources {
                threads: self.threads,
                memory_mb,
                gpu_memory_mb: 0,
            }
        }
    }

    /// Resources of a CPU node using the per-node threads (k-means).
    pub fn cpu(&self, memory_mb: u64) -> Resources {
        Resources {
            threads: self.threads,
            memory_mb,
            gpu_memory_mb: 0,
        }
    }

    /// Resources of a small single-threaded node.
    pub fn small(memory_mb: u64) -> Resources {
        Resources {
            threads: 1,
            memory_mb,
            gpu_memory_mb: 0,
        }
    }
}

/// The labels of a node (what selectors match): its stage and its coordinates.
pub fn labels(
    stage: &str,
    coords: impl IntoIterator<Item = (Axis, String)>,
) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = coords
        .into_iter()
        .map(|(a, v)| (a.name().to_string(), v))
        .collect();
    l.insert("stage".to_string(), stage.to_string());
    l
}

/// Input `name` of a node: output `output` of node `node`.
pub fn input(name: &str, node: usize, output: &str) -> (String, InputDef) {
    (
        name.to_string(),
        InputDef::Node {
            node: NodeIndex(node),
            output: output.to_string(),
        },
    )
}

pub use crate::specs::axis::fmt_f;

/// One cell × trial of a target's grid: what a method trains for.
pub struct Cell<'s> {
    pub dataset: &'s str,
    pub dspec: &'s DatasetSpec,
    pub supervision: &'s str,
    pub sspec: &'s SupervisionSpec,
    pub corruption: f64,
    pub budget: usize,
    pub method: &'s str,
    pub pretrain: bool,
    pub seed: u64,
    /// A hyperparameter-search run: trains on the training split without the dataset's
    /// validation rows, which score it (the final runs use the full training split).
    pub holdout: bool,
    /// The method's sections as it trains with them ([`NO_SECTIONS`] for a cell without a
    /// method): recorded with the cell's metrics.
    pub sections: &'s BTreeMap<String, serde_json::Value>,
}

/// The sections of a cell without a method.
pub static NO_SECTIONS: BTreeMap<String, serde_json::Value> = BTreeMap::new();

impl Cell<'_> {
    /// `/pi0.3`, `/n9000` for the optional axes some target varies.
    pub fn axes_suffix(&self, w: &Wiring) -> String {
        let mut s = String::new();
        if w.id_axes.contains(&Axis::Corruption) {
            s.push_str(&format!("/pi{}", self.coord(Axis::Corruption)));
        }
        if w.id_axes.contains(&Axis::Budget) {
            s.push_str(&format!("/n{}", self.coord(Axis::Budget)));
        }
        s
    }

    /// The dataset as node ids name it: `mnist5k`, or `mnist5k@val` for the nodes of search
    /// runs (features without the validation rows, and everything trained on them).
    pub fn data_id(&self) -> String {
        if self.holdout {
            format!("{}@val", self.dataset)
        } else {
            self.dataset.to_string()
        }
    }

    /// `dataset/supervision[/pi…][/n…]/method/pre|nopre/tN`: the id of the cell's nodes.
    pub fn id(&self, w: &Wiring) -> String {
        format!(
            "{}/{}{}/{}/{}/t{}",
            self.data_id(),
            self.supervision,
            self.axes_suffix(w),
            self.method,
            if self.pretrain { "pre" } else { "nopre" },
            self.seed
        )
    }

    /// The cell's coordinate on axis `a`, as coordinates, labels and node ids write it.
    pub fn coord(&self, a: Axis) -> String {
        match a {
            Axis::Dataset => self.dataset.to_string(),
            Axis::Supervision => self.supervision.to_string(),
            Axis::Corruption => fmt_f(self.corruption),
            Axis::Budget => self.budget.to_string(),
            Axis::Method => self.method.to_string(),
            Axis::Pretrain => self.pretrain.to_string(),
        }
    }

    /// The cell's coordinates on `axes` (axis name → value).
    pub fn coords(&self, axes: &[Axis]) -> BTreeMap<String, String> {
        axes.iter()
            .map(|&a| (a.name().to_string(), self.coord(a)))
            .collect()
    }

    /// Labels of a node of this cell (what selectors match): every axis, the stage and the
    /// trial.
    pub fn labels(&self, stage: &str) -> BTreeMap<String, String> {
        let mut l = self.coords(&Axis::ALL);
        l.insert("stage".to_string(), stage.to_string());
        l.insert("trial".to_string(), self.seed.to_string());
        l
    }
}

/// Adapts the engine's context to the stages' monitor.
pub struct Mon<'a>(pub &'a mut TaskContext);

impl Monitor for Mon<'_> {
    fn log(&mut self, message: &str) {
        self.0.log(message);
    }
    fn progress(&mut self, done: u64, total: u64, message: &str) {
        self.0.progress(done, total, message);
    }
}

pub fn stage_err(e: StageError) -> upcc_engine::TaskError {
    use upcc_engine::TaskError;
    match &e {
        StageError::Device(d) if d.is_fatal() => TaskError::DeviceLost(e.to_string()),
        _ if e.is_user() => match e.detail() {
            Some(detail) => TaskError::InputDetail {
                message: e.to_string(),
                detail,
            },
            None => TaskError::Input(e.to_string()),
        },
        _ => TaskError::Failed(e.to_string()),
    }
}

/// [`stage_err`] for a training node whose networks the settings section `section` sizes: an
/// allocation refused by the GPU or by the process's memory limit says which settings to lower
/// (exit 1).
pub fn train_err(section: &'static str) -> impl Fn(StageError) -> upcc_engine::TaskError {
    move |e| {
        match &e {
        StageError::Device(upcc_nn::DeviceError::OutOfMemory { device, .. })
            if device.starts_with("cuda") =>
        {
            upcc_engine::TaskError::Failed(format!(
                "{e}: this node's networks do not fit in the GPU memory left to it; lower `{section}.hidden` or `{section}.batch_size`, or leave the GPU more room (other processes on it show in `nvidia-smi`; `--gpus` spreads nodes over more GPUs)"
            ))
        }
        StageError::Device(upcc_nn::DeviceError::OutOfMemory { .. }) => {
            upcc_engine::TaskError::Failed(format!(
                "{e}: this node's networks do not fit in the memory left to this process; lower `{section}.hidden` or `{section}.batch_size`, or give the run more memory"
            ))
        }
        _ => stage_err(e),
    }
    }
}

/// Store a Parquet output.
pub fn parquet(
    ctx: &mut TaskContext,
    name: &str,
    bytes: std::result::Result<Vec<u8>, StageError>,
) -> std::result::Result<(), upcc_engine::TaskError> {
    ctx.put_output(
        name,
        bytes.map_err(stage_err)?,
        PARQUET_MEDIA_TYPE,
        &format!("{name}.parquet"),
    );
    Ok(())
}

/// The device one node computes on: the run's CPU, or the GPU of the slot the executor
/// assigned, with a stream and cuBLAS handle of its own.
pub fn node_device(
    compute: &Compute,
    ctx: &mut TaskContext,
) -> std::result::Result<NodeCompute, upcc_engine::TaskError> {
    let c = compute.for_node(ctx.gpu()).map_err(|e| {
        let msg = format!("device error: {e}");
        if e.is_fatal() {
            upcc_engine::TaskError::DeviceLost(msg)
        } else {
            upcc_engine::TaskError::Failed(msg)
        }
    })?;
    let (name, numerics) = crate::on_device!(&c, |d| (
        upcc_nn::Device::<f32>::name(d),
        upcc_nn::Device::<f32>::numerics(d)
    ));
    ctx.log(format!("device {name} ({numerics})"));
    Ok(c)
}

/// The run's device, for tasks (skipped when a task is serialised into its key: the numerics
/// class names what matters of it).
pub type ComputeRef = Arc<Compute>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_allocation_names_the_settings_to_lower() {
        let oom = StageError::Device(upcc_nn::DeviceError::OutOfMemory {
            device: "cpu".into(),
            bytes: 1 << 40,
        });
        match train_err("pretrain")(oom) {
            upcc_engine::TaskError::Failed(m) => {
                assert!(m.contains("out of memory allocating"), "{m}");
                assert!(
                    m.contains("`pretrain.hidden` or `pretrain.batch_size`"),
                    "{m}"
                );
            }
            other => panic!("an environment failure (exit 1) expected, got {other:?}"),
        }
        // Out of GPU memory speaks of the GPU, not of the process's memory.
        let gpu = StageError::Device(upcc_nn::DeviceError::OutOfMemory {
            device: "cuda:0".into(),
            bytes: 1 << 30,
        });
        match train_err("train")(gpu) {
            upcc_engine::TaskError::Failed(m) => {
                assert!(m.contains("GPU memory left to it"), "{m}");
                assert!(m.contains("`train.hidden` or `train.batch_size`"), "{m}");
                assert!(!m.contains("memory left to this process"), "{m}");
            }
            other => panic!("an environment failure (exit 1) expected, got {other:?}"),
        }
        // Other errors keep their kind.
        let input = StageError::input("bad");
        assert!(matches!(
            train_err("train")(input),
            upcc_engine::TaskError::Input(_)
        ));
    }
}
