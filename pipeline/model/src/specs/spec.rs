//! A loaded, validated spec.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::schema::{SpecFile, StageParams, SupervisionSpec};
use crate::method::ResolvedMethod;
use crate::targets::{ResolvedTarget, TargetKind};

/// A loaded, validated spec.
pub struct Spec {
    /// As given on the command line (for messages).
    pub display: String,
    pub dir: PathBuf,
    pub file: SpecFile,
    pub trials: Vec<u64>,
    pub params: StageParams,
    /// Resolved methods by name.
    pub methods: BTreeMap<String, ResolvedMethod>,
    /// Target names in the order the spec declares them (tables print in this order).
    pub target_order: Vec<String>,
    /// Oracle supervision settings derived for figure targets (`SUP.oracle` → oracle
    /// judgments under SUP's number of experts).
    pub oracle_runs: BTreeMap<String, SupervisionSpec>,
    /// Each dataset's shape as known at load (`expect:`, else the head of its file), for the
    /// memory check of the nodes that train on it.
    pub shapes: BTreeMap<String, Option<upcc_stages::features::Shape>>,
    /// Each target's kind, as validation looked up its `kind:`, what the kind resolved of the
    /// fields only it reads, and its published values.
    pub targets: BTreeMap<String, ResolvedTarget>,
}

impl Spec {
    /// The kind of target `name` (validated).
    pub fn kind(&self, name: &str) -> TargetKind {
        self.targets[name].kind
    }

    /// Target `name` as validation resolved it.
    pub fn target(&self, name: &str) -> &ResolvedTarget {
        &self.targets[name]
    }

    /// A supervision setting by name: the spec's own or a derived oracle run.
    pub fn supervision(&self, name: &str) -> &SupervisionSpec {
        self.file
            .supervision
            .get(name)
            .or_else(|| self.oracle_runs.get(name))
            .expect("validated supervision name")
    }
}

impl Spec {
    /// Resolved file path of a dataset file or `embedded:NAME`.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }
}
