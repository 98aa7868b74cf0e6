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
    /// networks) or `default` → resources; the most specific entry wins, field by field. In
    /// `workers` mode a training worker takes the `training` entry and every other worker the
    /// `default` one; `driver` is the detached driver's job.
    #[serde(default)]
    pub resources: BTreeMap<String, JobResources>,
    /// `workers` (default): a few jobs that each run the local executor against the shared
    /// store until nothing they may compute is left; `per-node`: one job per node.
    #[serde(default)]
    pub mode: SlurmMode,
    /// The most jobs upcc keeps queued or running at once (default 200).
    #[serde(default)]
    pub max_jobs: Option<usize>,
    /// The most workers at once that compute training nodes (default 8) and the rest
    /// (default 2).
    #[serde(default)]
    pub workers: WorkerLimits,
    /// The numerics class of the training jobs' device (as `upcc device` prints it on a node
    /// of their partition), for a driver on a machine without that device: training nodes are
    /// planned for it, and a job whose device computes another class refuses to start.
    #[serde(default)]
    pub numerics: Option<String>,
    /// Seconds a worker with nothing ready waits for inputs other jobs compute before it
    /// ends (default 300).
    #[serde(default)]
    pub linger_seconds: Option<f64>,
}

/// How the Slurm executor maps nodes to jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlurmMode {
    #[default]
    Workers,
    PerNode,
}

/// How many workers of each kind may run at once.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerLimits {
    #[serde(default)]
    pub training: Option<usize>,
    #[serde(default)]
    pub other: Option<usize>,
}

/// Default of `max_jobs`: well under common per-user limits.
pub const DEFAULT_MAX_JOBS: usize = 200;

impl SlurmSettings {
    /// The most jobs queued or running at once.
    pub fn max_jobs(&self) -> usize {
        self.max_jobs.unwrap_or(DEFAULT_MAX_JOBS)
    }

    /// The most workers at once for training nodes (`trains`) or the rest.
    pub fn workers_for(&self, trains: bool) -> usize {
        if trains {
            self.workers.training.unwrap_or(8)
        } else {
            self.workers.other.unwrap_or(2)
        }
    }
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
        if self
            .linger_seconds
            .is_some_and(|s| !(s.is_finite() && s >= 0.0))
        {
            p.push((
                "linger_seconds".into(),
                "must be a number of seconds, 0 or more".into(),
            ));
        }
        if self.max_jobs == Some(0) {
            p.push(("max_jobs".into(), "must be at least 1".into()));
        }
        for (k, v) in [
            ("training", self.workers.training),
            ("other", self.workers.other),
        ] {
            if v == Some(0) {
                p.push((format!("workers.{k}"), "must be at least 1".into()));
            }
        }
        if self
            .numerics
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            p.push((
                "numerics".into(),
                "is empty; give a class as `upcc device` prints it (e.g. `cpu-f32-avx512`)".into(),
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
