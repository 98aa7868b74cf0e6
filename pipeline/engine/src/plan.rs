//! Planning: which nodes are fresh, stale (and why) or missing, without running anything.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::dag::{Dag, InputDef, Source};
use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::error::EngineError;
use crate::key::{diff, KeyMaterial, KEY_SCHEMA_VERSION};
use crate::remote::RemoteCache;
use crate::store::{OutputRecord, Store};

/// State of a node before a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// A manifest for the current key is stored with all outputs.
    Fresh,
    /// It was computed before (for this spec) under another key.
    Stale,
    /// Never computed for this spec.
    Missing,
}

/// One row of `upcc status`.
#[derive(Clone, Debug, Serialize)]
pub struct PlanEntry {
    pub id: String,
    pub stage: String,
    pub status: NodeStatus,
    /// Known when all inputs are known.
    pub key: Option<Digest<NodeKeyTag>>,
    /// What the key is computed from (when all inputs are known).
    #[serde(skip)]
    pub material: Option<KeyMaterial>,
    /// Why it is stale: changed params, inputs, versions; or the upstream that will rerun.
    pub reasons: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Not fresh here, but the remote cache holds a usable result for the key (`run` downloads
    /// it instead of computing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
}

/// Hashes of source files, read once per command.
#[derive(Default)]
pub struct SourceCache {
    entries: HashMap<String, (Digest<Artifact>, Arc<Vec<u8>>)>,
    keep_bytes: bool,
}

impl SourceCache {
    pub fn new(keep_bytes: bool) -> Self {
        SourceCache {
            entries: HashMap::new(),
            keep_bytes,
        }
    }

    pub fn get(
        &mut self,
        source: &Source,
    ) -> Result<(Digest<Artifact>, Arc<Vec<u8>>), EngineError> {
        let name = source.display();
        if let Some(e) = self.entries.get(&name) {
            return Ok(e.clone());
        }
        let (digest, bytes) = source.digest().map_err(|e| EngineError::Source {
            context: source.context.clone(),
            path: name.clone(),
            message: e.to_string(),
        })?;
        let kept = if self.keep_bytes {
            Arc::new(bytes)
        } else {
            Arc::new(Vec::new())
        };
        self.entries.insert(name, (digest, kept.clone()));
        Ok((digest, kept))
    }
}

/// Key material of node `i`, or `None` while an upstream output is unknown.
pub(crate) fn material_for(
    dag: &Dag,
    i: usize,
    resolved: &[Option<BTreeMap<String, OutputRecord>>],
    sources: &mut SourceCache,
) -> Result<Option<KeyMaterial>, EngineError> {
    let node = dag.node(i);
    let mut inputs = BTreeMap::new();
    for (name, input) in &node.inputs {
        let digest = match input {
            InputDef::Node { node: up, output } => match &resolved[up.0] {
                Some(outs) => outs.get(output).map(|o| o.digest).ok_or_else(|| {
                    EngineError::Internal(format!(
                        "`{}` lacks output `{output}`",
                        dag.node(up.0).id
                    ))
                })?,
                None => return Ok(None),
            },
            InputDef::Source(src) => sources.get(src)?.0,
        };
        inputs.insert(name.clone(), digest);
    }
    Ok(Some(KeyMaterial {
        key_schema: KEY_SCHEMA_VERSION,
        stage: node.stage.clone(),
        stage_version: node.stage_version,
        params: node.params.clone(),
        inputs,
        numerics: node.numerics.clone(),
        code: node.code.clone(),
    }))
}

/// Plan `dag` against `store` without writing anything.
pub fn plan(dag: &Dag, store: &Store, spec: &str) -> Result<Vec<PlanEntry>, EngineError> {
    plan_with(dag, store, spec, None)
}

/// [`plan`], asking `remote` (when given) about every node that is not fresh here: a node
/// whose key it answers is marked `remote`, and its manifest's outputs give the keys of the
/// nodes below it, as a local result would.
pub fn plan_with(
    dag: &Dag,
    store: &Store,
    spec: &str,
    remote: Option<&RemoteCache>,
) -> Result<Vec<PlanEntry>, EngineError> {
    plan_with_sources(dag, store, spec, remote, &mut SourceCache::new(false))
}

/// [`plan_with`] hashing source files through `sources` (a run plans with the cache it
/// computes with, so each source is read once).
pub(crate) fn plan_with_sources(
    dag: &Dag,
    store: &Store,
    spec: &str,
    remote: Option<&RemoteCache>,
    sources: &mut SourceCache,
) -> Result<Vec<PlanEntry>, EngineError> {
    let mut resolved: Vec<Option<BTreeMap<String, OutputRecord>>> = vec![None; dag.len()];
    let mut out: Vec<PlanEntry> = Vec::with_capacity(dag.len());
    for i in 0..dag.len() {
        let node = dag.node(i);
        let previous = store.read_ref(spec, &node.id)?;
        let material = material_for(dag, i, &resolved, sources)?;
        let key = material.as_ref().map(|m| m.digest()).transpose()?;
        let mut on_remote = false;
        let mut kept = None;
        let (status, reasons) = match (&material, key) {
            (Some(material), Some(key)) => {
                if let Some(m) = store.fresh_manifest(&key)? {
                    resolved[i] = Some(m.outputs);
                    (NodeStatus::Fresh, vec![])
                } else if let Some((m, files)) =
                    store.kept_despite_code(previous.as_ref(), material)?
                {
                    // The user keeps results whose stage code changed: the last one serves.
                    let prev = previous.as_ref().expect("a kept result has a ref");
                    resolved[i] = Some(m.outputs);
                    kept = Some((prev.key, prev.material.clone()));
                    (
                        NodeStatus::Fresh,
                        vec![format!(
                            "kept although its code changed ({})",
                            files.join(", ")
                        )],
                    )
                } else {
                    if let Some(m) = remote.and_then(|r| r.planning_manifest(&key)) {
                        resolved[i] = Some(m.outputs);
                        on_remote = true;
                    }
                    if let Some(prev) = &previous {
                        let mut reasons: Vec<String> = diff(&prev.material, material)
                            .iter()
                            .map(|c| c.to_string())
                            .collect();
                        if reasons.is_empty() {
                            reasons.push("its stored result is missing or incomplete (deleted, quarantined or never finished)".into());
                        }
                        (NodeStatus::Stale, reasons)
                    } else {
                        (NodeStatus::Missing, vec![])
                    }
                }
            }
            _ if previous.is_some() => {
                // Computed before, but an input will change first.
                let waiting = dag
                    .upstream(i)
                    .into_iter()
                    .filter(|&u| resolved[u].is_none())
                    .map(|u| format!("upstream `{}` will run first", dag.node(u).id))
                    .collect();
                (NodeStatus::Stale, waiting)
            }
            _ => (NodeStatus::Missing, vec![]),
        };
        let (key, material) = match kept {
            Some((k, m)) => (Some(k), Some(m)),
            None => (key, material),
        };
        out.push(PlanEntry {
            id: node.id.clone(),
            stage: node.stage.clone(),
            status,
            key,
            material,
            reasons,
            labels: node.labels.clone(),
            remote: on_remote,
        });
    }
    Ok(out)
}
