//! How `upcc run` executes a spec's nodes: the `executor:` section of a spec (or of the user
//! config file), never part of any key. The Slurm executor itself is the command line's
//! (`pipeline/cli/slurm.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Resources of one job.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobResources {
    #[serde(default)]
    pub cpus: Option<usize>,
    #[serde(default)]
    pub mem_mb: Option<u64>,
    /// Slurm time limit (`HH:MM:SS`, `D-HH:MM:SS`, minutes).
    #[serde(default)]
    pub time: Option<String>,
    /// GPUs (`--gres=gpu:N`).
    #[serde(default)]
    pub gpus: Option<usize>,
    #[serde(default)]
    pub partition: Option<String>,
}

/// The `executor:` section of a spec (or of `~/.config/upcc/config.yaml`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorSection {
    /// `local` (default) or `slurm`: what `upcc run` uses without `--executor`.
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub slurm: SlurmSettings,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSettings {
    #[serde(default)]
    pub partition: Option<String>,
    #[serde(default)]
    pub account: Option<String>,
    /// More `sbatch` arguments for every job (`["--qos=normal"]`).
    #[serde(default)]
    pub sbatch: Vec<String>,
    /// Seconds between polls of the queue while attached (default 5).
    #[serde(default)]
    pub poll_seconds: Option<f64>,
    /// Stage name (`train`, `pretrain`, `expert`, …) or `training` (every stage that trains
    /// networks) or `default` → resources; the most specific entry wins, field by field.
    #[serde(default)]
    pub resources: BTreeMap<String, JobResources>,
}

impl SlurmSettings {
    /// Problems, as (field, message).
    pub fn check(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if self
            .poll_seconds
            .is_some_and(|s| !(s.is_finite() && s > 0.0))
        {
            p.push((
                "poll_seconds".into(),
                "must be a positive number of seconds".into(),
            ));
        }
        for (k, r) in &self.resources {
            if r.cpus == Some(0) {
                p.push((format!("resources.{k}.cpus"), "must be at least 1".into()));
            }
            if r.mem_mb == Some(0) {
                p.push((format!("resources.{k}.mem_mb"), "must be at least 1".into()));
            }
            if r.time.as_deref().is_some_and(|t| {
                t.is_empty()
                    || !t
                        .chars()
                        .all(|c| c.is_ascii_digit() || c == ':' || c == '-')
            }) {
                p.push((
                    format!("resources.{k}.time"),
                    "is not a Slurm time limit (`HH:MM:SS`, `D-HH:MM:SS` or minutes)".into(),
                ));
            }
        }
        p
    }

    /// The resources of a node: its stage's entry, then `training` for training stages, then
    /// `default`, then upcc's defaults (training: 4 CPUs, 24 h, a GPU when training on CUDA;
    /// the rest: 1 CPU, 2 h; memory: the node's estimate + 1 GiB).
    pub fn resources_for(
        &self,
        stage: &str,
        trains: bool,
        memory_mb: u64,
        gpu: bool,
    ) -> JobResources {
        let mut r = JobResources {
            cpus: None,
            mem_mb: None,
            time: None,
            gpus: None,
            partition: None,
        };
        let chain = [Some(stage), trains.then_some("training"), Some("default")];
        for name in chain.into_iter().flatten() {
            if let Some(e) = self.resources.get(name) {
                r.cpus = r.cpus.or(e.cpus);
                r.mem_mb = r.mem_mb.or(e.mem_mb);
                r.time = r.time.clone().or_else(|| e.time.clone());
                r.gpus = r.gpus.or(e.gpus);
                r.partition = r.partition.clone().or_else(|| e.partition.clone());
            }
        }
        JobResources {
            cpus: Some(r.cpus.unwrap_or(if trains { 4 } else { 1 })),
            mem_mb: Some(r.mem_mb.unwrap_or(memory_mb + 1024)),
            time: Some(
                r.time
                    .unwrap_or_else(|| if trains { "24:00:00" } else { "02:00:00" }.into()),
            ),
            gpus: Some(r.gpus.unwrap_or(usize::from(trains && gpu))),
            partition: r.partition.or_else(|| self.partition.clone()),
        }
    }
}
