//! The Slurm executor. In `workers` mode (the default, `workers.rs`) a few jobs each run the
//! local executor over many nodes; in `per-node` mode every node a run would compute becomes
//! one `sbatch` job that runs `upcc job` for exactly that node against the shared store, with
//! `afterok` dependencies on the jobs of its inputs.
//!
//! Jobs are tracked by node recipe in the store's job book (`jobs/<recipe>.json`, written
//! durably by `upcc_engine::jobs` under its lock `jobs/submit.lock`, which a driver holds while
//! it decides what to submit), so a node already queued or running is never submitted twice —
//! by a second driver, a rerun or another user. A job publishes through the engine like a local run
//! (lease, atomic publish), so a job killed by Slurm leaves no partial result; its lease is a
//! `flock` that the kernel (or the cluster filesystem's lock manager, after its lease period)
//! releases only when the process is gone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use upcc_engine::{Dag, Digest, JobsLock, NodeStatus, PlanEntry, Store};

use upcc_model::error::{Error, Result};
pub use upcc_model::specs::executor::{ExecutorSection, JobResources, SlurmMode, SlurmSettings};

pub mod workers;

/// The user config file: `$UPCC_CONFIG`, else `$XDG_CONFIG_HOME/upcc/config.yaml`, else
/// `~/.config/upcc/config.yaml`. Its `executor:` section applies where a spec has none.
pub fn user_config_path() -> Option<PathBuf> {
    if let Some(p) = crate::env::config() {
        return Some(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("upcc/config.yaml"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserConfig {
    #[serde(default)]
    executor: Option<ExecutorSection>,
    /// The remote cache where neither flag, environment nor spec names one.
    #[serde(default)]
    remote: Option<String>,
    /// Whose results are served, and the keys trusted (read by the trust module).
    #[serde(default)]
    trust: Option<serde_yaml_ng::Value>,
}

/// The user config file's `trust:` section as written, if it has one.
pub fn user_config_trust() -> Result<Option<serde_yaml_ng::Value>> {
    Ok(read_user_config()?.and_then(|c| c.trust))
}

/// The user config file's `remote:`, if it has one.
pub fn user_config_remote() -> Result<Option<String>> {
    Ok(read_user_config()?.and_then(|c| c.remote))
}

fn read_user_config() -> Result<Option<UserConfig>> {
    let Some(path) = user_config_path().filter(|p| p.exists()) else {
        return Ok(None);
    };
    let text = fs_err::read_to_string(&path)
        .map_err(|e| Error::user(format!("cannot read `{}`: {e}", path.display())))?;
    serde_yaml_ng::from_str(&text).map(Some).map_err(|e| {
        Error::user(format!("`{}`: {e}", path.display()))
            .hint("the user config holds `executor: {kind: slurm, slurm: {...}}`, `remote: URL` and `trust: {keys: [...], store: signed|any, remote: signed|any}` (README, On a Slurm cluster; Sharing results through a remote cache)")
    })
}

/// The executor section that applies: the spec's, else the user config file's, else defaults.
pub fn executor_section(spec: Option<&ExecutorSection>) -> Result<ExecutorSection> {
    if let Some(s) = spec {
        return Ok(s.clone());
    }
    let Some(cfg) = read_user_config()? else {
        return Ok(ExecutorSection::default());
    };
    let path = user_config_path().unwrap_or_default();
    let section = cfg.executor.unwrap_or_default();
    if let Some((field, msg)) = section.slurm.check().into_iter().next() {
        return Err(Error::user(format!(
            "`{}`: executor.slurm.{field} {msg}",
            path.display()
        )));
    }
    Ok(section)
}

/// Each node's recipe: a hash of its id, stage, version, parameters and numerics class and of
/// its inputs' recipes (sources by path). Unlike a node key it is known before the inputs are
/// computed, so jobs are tracked by it: the same recipe is the same request, whoever submits.
pub fn recipes(dag: &Dag) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(dag.len());
    for n in dag.nodes() {
        let inputs: Vec<serde_json::Value> = n
            .inputs
            .iter()
            .map(|(name, input)| match input {
                upcc_engine::InputDef::Node { node, output } => {
                    serde_json::json!([name, out[node.0], output])
                }
                upcc_engine::InputDef::Source(src) => {
                    // The same file named from another working directory is the same input.
                    let shown = match &src.location {
                        upcc_engine::SourceLocation::File(p) => fs_err::canonicalize(p)
                            .unwrap_or_else(|_| p.clone())
                            .display()
                            .to_string(),
                        upcc_engine::SourceLocation::Embedded { .. } => src.display(),
                    };
                    serde_json::json!([name, shown])
                }
            })
            .collect();
        let material = serde_json::json!({
            "id": n.id, "stage": n.stage, "version": n.stage_version, "params": n.params,
            "numerics": n.numerics, "inputs": inputs,
        });
        let bytes = serde_json::to_vec(&material).expect("JSON serialises");
        out.push(Digest::<upcc_engine::Artifact>::of_bytes(&bytes).to_hex());
    }
    out
}

/// What the store remembers of a submitted job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub job_id: String,
    pub node: String,
    pub recipe: String,
    pub spec: String,
    /// The driver's `--set` overrides (the job runs the spec with them).
    #[serde(default)]
    pub sets: Vec<String>,
    pub submitted: String,
    pub user: Option<String>,
    pub host: String,
    /// The job's stdout and stderr (Slurm's `--output`).
    pub log: String,
    /// A worker's record (`training` or `other`) or a detached driver's (`driver`), named by
    /// its job; `None`: a node's record, named by its recipe (per-node jobs, and the node a
    /// worker is computing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

/// Whether Slurm jobs were ever submitted against this store.
pub fn has_jobs(store: &Store) -> bool {
    store.jobs().any()
}

/// The record of the job of the node of recipe `recipe`, if the store has a readable one.
pub fn read_record(store: &Store, recipe: &str) -> Option<JobRecord> {
    let bytes = store.jobs().read(recipe).ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// The spec as jobs and records name it: an absolute path when it is a file.
pub fn job_spec(spec: &str) -> String {
    match fs_err::canonicalize(spec) {
        Ok(p) if p.is_file() => p.display().to_string(),
        _ => spec.to_string(),
    }
}

/// `sbatch --parsable` with a job's name, log, resources, account (the caller adds the
/// command, and `executor.slurm.sbatch` last).
fn sbatch_command(name: &str, log: &Path, res: &JobResources, settings: &SlurmSettings) -> Command {
    let mut cmd = Command::new("sbatch");
    cmd.arg("--parsable")
        .arg(format!("--job-name={name}"))
        .arg(format!("--output={}", log.display()))
        .arg(format!("--cpus-per-task={}", res.cpus.unwrap_or(1)))
        .arg(format!("--mem={}M", res.mem_mb.unwrap_or(1024)))
        .arg(format!(
            "--time={}",
            res.time.as_deref().unwrap_or("02:00:00")
        ));
    if let Some(p) = res.partition.as_ref().or(settings.partition.as_ref()) {
        cmd.arg(format!("--partition={p}"));
    }
    if let Some(a) = &settings.account {
        cmd.arg(format!("--account={a}"));
    }
    if let Some(g) = res.gpus.filter(|g| *g > 0) {
        cmd.arg(format!("--gres=gpu:{g}"));
    }
    cmd
}

/// Run `sbatch --parsable …` (`cmd`) and return the job id it printed.
fn sbatch(cmd: &mut Command, what: &str) -> Result<String> {
    let o = command_output(cmd, "sbatch")?;
    if !o.status.success() {
        return Err(Error::env(format!(
            "sbatch refused {what}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
        .hint("check the partition, account and resources in the `executor.slurm` section (README, On a Slurm cluster)"));
    }
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return Err(Error::env(format!(
            "sbatch printed no job id: `{}`",
            out.trim()
        )));
    }
    Ok(id)
}

fn write_record(store: &Store, lock: &JobsLock, r: &JobRecord) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(r).expect("record serialises");
    Ok(store.jobs().write(lock, &r.recipe, &bytes)?)
}

/// Record that a worker's job computes a node now (the record is named by the node's recipe).
pub fn write_node_record(store: &Store, r: &JobRecord) -> Result<()> {
    let lock = store.jobs().lock()?;
    write_record(store, &lock, r)
}

/// Forget the job of recipe `recipe` (its node is computed, or the job was cancelled).
pub fn remove_record(store: &Store, recipe: &str) -> Result<()> {
    let lock = store.jobs().lock()?;
    Ok(store.jobs().remove(&lock, recipe)?)
}

/// Pending reasons that mean a job can never start on its partition.
const UNSCHEDULABLE: [&str; 7] = [
    "DependencyNeverSatisfied",
    "PartitionConfig",
    "BadConstraints",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "InvalidAccount",
    "InvalidQOS",
];

/// A job's state as Slurm reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    /// Waiting (the reason: `Dependency`, `Resources`, `Priority`, …).
    Queued(String),
    Running,
    /// Ended: `COMPLETED`, `FAILED`, `TIMEOUT`, `CANCELLED`, `OUT_OF_MEMORY`, `NODE_FAIL`, …
    Ended(String),
    /// Neither the queue nor accounting knows it any more.
    Unknown,
}

impl JobState {
    pub fn alive(&self) -> bool {
        matches!(self, JobState::Queued(_) | JobState::Running)
    }

    pub fn describe(&self, id: &str) -> String {
        match self {
            JobState::Queued(r) if r.is_empty() || r == "None" => {
                format!("queued (slurm job {id})")
            }
            JobState::Queued(r) => format!("queued (slurm job {id}: {r})"),
            JobState::Running => format!("running (slurm job {id})"),
            JobState::Ended(s) => format!("slurm job {id} ended {s} without a result"),
            JobState::Unknown => format!("slurm job {id} is gone without a result"),
        }
    }
}

fn parse_state(state: &str, reason: &str) -> JobState {
    let s = state
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches('+');
    match s {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "SUSPENDED" | "RESV_DEL_HOLD"
        | "CONFIGURING" => JobState::Queued(reason.to_string()),
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED" => {
            JobState::Running
        }
        "" => JobState::Unknown,
        other => JobState::Ended(other.to_string()),
    }
}

fn command_output(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    cmd.output().map_err(|e| {
        Error::env(format!("cannot run `{what}`: {e}"))
            .hint("the Slurm executor needs Slurm's client commands (sbatch, squeue, scancel) on the PATH")
    })
}

/// [`command_output`] of a command that must succeed: a failure is an error quoting its stderr.
pub(crate) fn command_succeeded(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    let o = command_output(cmd, what)?;
    if !o.status.success() {
        return Err(Error::env(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok(o)
}

/// The state of each job: `squeue` (which keeps finished jobs for the cluster's MinJobAge),
/// then `sacct` for the rest when accounting is available.
pub fn job_states(ids: &[String]) -> Result<HashMap<String, JobState>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(200) {
        let list = chunk.join(",");
        let o = command_output(
            Command::new("squeue").args(["-h", "-t", "all", "-o", "%i|%T|%r", "-j", &list]),
            "squeue",
        )?;
        let text = if o.status.success() {
            String::from_utf8_lossy(&o.stdout).to_string()
        } else {
            // Some ids unknown to the controller make the whole query fail: list everything.
            let all = command_succeeded(
                Command::new("squeue").args(["-h", "-t", "all", "-o", "%i|%T|%r"]),
                "squeue",
            )?;
            String::from_utf8_lossy(&all.stdout).to_string()
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() >= 3 && chunk.iter().any(|i| i == f[0]) {
                out.insert(f[0].to_string(), parse_state(f[1], f[2]));
            }
        }
    }
    let rest: Vec<&String> = ids.iter().filter(|i| !out.contains_key(*i)).collect();
    if !rest.is_empty() {
        let list = rest
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let acct = Command::new("sacct")
            .args(["-n", "-P", "-X", "-o", "JobID,State", "-j", &list])
            .output();
        if let Some(o) = acct.ok().filter(|o| o.status.success()) {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                if let Some((id, state)) = line.split_once('|') {
                    if rest.iter().any(|i| *i == id) {
                        out.insert(id.to_string(), parse_state(state, ""));
                    }
                }
            }
        }
    }
    for id in ids {
        out.entry(id.clone()).or_insert(JobState::Unknown);
    }
    Ok(out)
}

/// Single-quote a word for `sh`.
fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// How the driver was asked to run, for the jobs' command lines.
pub struct Invocation {
    pub spec: String,
    /// The driver's selectors (workers compute what they reach, as the driver plans).
    pub selectors: Vec<String>,
    pub sets: Vec<String>,
    pub store: PathBuf,
    pub device: Option<String>,
    pub gpus: Option<String>,
    /// The numerics class the driver planned training nodes with (jobs plan with it too).
    pub numerics: String,
    /// `--remote` as the driver was given it (jobs resolve `$UPCC_REMOTE`, the spec and the
    /// user config themselves, as the driver did).
    pub remote: Option<String>,
}

impl Invocation {
    /// The spec as a job sees it: an absolute path when it is a file.
    pub fn new(
        spec: &str,
        sets: &[String],
        store: &Path,
        device: Option<String>,
        gpus: Option<String>,
        numerics: String,
    ) -> Invocation {
        let spec = job_spec(spec);
        let store = fs_err::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
        Invocation {
            spec,
            selectors: Vec::new(),
            sets: sets.to_vec(),
            store,
            device,
            gpus,
            numerics,
            remote: None,
        }
    }

    /// `UPCC_THREADS=… exec upcc --store … [--device …] [--gpus …]`: what every job's command
    /// line starts with.
    fn command_prefix(&self, threads: usize, device: Option<&str>) -> Result<Vec<String>> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::env(format!("cannot find upcc's own executable: {e}")))?;
        let mut words = vec![
            format!("UPCC_THREADS={threads}"),
            "exec".to_string(),
            sh_quote(&exe.display().to_string()),
            "--store".into(),
            sh_quote(&self.store.display().to_string()),
        ];
        if let Some(d) = device {
            words.extend(["--device".into(), sh_quote(d)]);
        }
        if let Some(g) = &self.gpus {
            words.extend(["--gpus".into(), sh_quote(g)]);
        }
        Ok(words)
    }

    /// `--numerics … --set … --remote …`: the spec as the driver planned it.
    fn spec_words(&self) -> Vec<String> {
        let mut words = vec!["--numerics".into(), sh_quote(&self.numerics)];
        for s in &self.sets {
            words.extend(["--set".into(), sh_quote(s)]);
        }
        if let Some(r) = &self.remote {
            words.extend(["--remote".into(), sh_quote(r)]);
        }
        words
    }

    fn job_command(&self, node: &str, recipe: &str, threads: usize) -> Result<String> {
        let mut words = self.command_prefix(threads, self.device.as_deref())?;
        words.extend([
            "job".into(),
            sh_quote(&self.spec),
            sh_quote(node),
            "--recipe".into(),
            recipe.to_string(),
        ]);
        words.extend(self.spec_words());
        Ok(words.join(" "))
    }

    /// A worker's command line: training workers train on the device the driver planned for
    /// (the GPU when its class is a GPU's), the others need none.
    fn worker_command(
        &self,
        trains: bool,
        threads: usize,
        log: &str,
        linger: f64,
    ) -> Result<String> {
        let device = match (trains, self.numerics.starts_with("cuda")) {
            (true, true) => "cuda",
            _ => "cpu",
        };
        let mut words = self.command_prefix(threads, Some(device))?;
        words.extend(workers::worker_words(trains, log, linger));
        words.push(sh_quote(&self.spec));
        words.extend(self.selectors.iter().map(|s| sh_quote(s)));
        words.extend(self.spec_words());
        Ok(words.join(" "))
    }

    /// A detached driver's command line: `upcc run --executor slurm` itself, in a job.
    fn driver_command(&self) -> Result<String> {
        let mut words = self.command_prefix(1, Some("cpu"))?;
        words.extend(["run".into(), sh_quote(&self.spec)]);
        words.extend(self.selectors.iter().map(|s| sh_quote(s)));
        words.extend(self.spec_words());
        words.extend([
            "--executor".into(),
            "slurm".into(),
            "--progress".into(),
            "plain".into(),
        ]);
        Ok(words.join(" "))
    }
}

/// What a submission pass did.
pub struct Submitted {
    /// Node index → its job id (new or already queued/running).
    pub jobs: BTreeMap<usize, String>,
    pub new: usize,
    pub attached: usize,
    /// Every node's recipe (`recipes(dag)`), for reading the records afterwards.
    pub recipes: Vec<String>,
}

/// Submit a job for every node of `dag` that is not computed and has no live job yet; reuse
/// live ones. The store is read under the submission lock, so what another driver submitted or
/// a job finished meanwhile is seen.
pub fn submit(
    dag: &Dag,
    spec: &str,
    store: &Store,
    settings: &SlurmSettings,
    inv: &Invocation,
    gpu: bool,
) -> Result<Submitted> {
    let lock = store.jobs().lock()?;
    let entries = upcc_engine::plan(dag, store, spec)?;
    let todo: Vec<usize> = (0..dag.len())
        .filter(|&i| entries[i].status != NodeStatus::Fresh)
        .collect();
    let recipe = recipes(dag);
    let mut records: BTreeMap<usize, JobRecord> = BTreeMap::new();
    for &i in &todo {
        if let Some(r) = read_record(store, &recipe[i]) {
            records.insert(i, r);
        }
    }
    let ids: Vec<String> = records.values().map(|r| r.job_id.clone()).collect();
    let states = if ids.is_empty() {
        HashMap::new()
    } else {
        job_states(&ids)?
    };
    let mut jobs = BTreeMap::new();
    let (mut new, mut attached) = (0, 0);
    let host = upcc_engine::fsutil::host_name();
    // Absolute, so that the records point at the logs from any working directory.
    let logs = fs_err::canonicalize(store.jobs().log_dir())
        .map_err(|e| Error::env(format!("cannot find the jobs' log folder: {e}")))?;
    for &i in &todo {
        if let Some(r) = records.get(&i) {
            if states.get(&r.job_id).is_some_and(JobState::alive) {
                jobs.insert(i, r.job_id.clone());
                attached += 1;
                continue;
            }
        }
        let node = dag.node(i);
        let deps: Vec<&String> = dag.upstream(i).iter().filter_map(|u| jobs.get(u)).collect();
        let trains = node.numerics != "exact";
        let res = settings.resources_for(&node.stage, trains, node.resources.memory_mb, gpu);
        let log = logs.join(format!("{}.%j.out", recipe[i]));
        let mut cmd = sbatch_command(&format!("upcc:{}", node.id), &log, &res, settings);
        cmd.arg("--kill-on-invalid-dep=yes");
        if !deps.is_empty() {
            let d: Vec<&str> = deps.iter().map(|s| s.as_str()).collect();
            cmd.arg(format!("--dependency=afterok:{}", d.join(":")));
        }
        cmd.args(&settings.sbatch);
        cmd.arg(format!(
            "--wrap={}",
            inv.job_command(&node.id, &recipe[i], res.cpus.unwrap_or(1))?
        ));
        let id = sbatch(&mut cmd, &format!("the job of node `{}`", node.id))?;
        write_record(
            store,
            &lock,
            &JobRecord {
                job_id: id.clone(),
                node: node.id.clone(),
                recipe: recipe[i].clone(),
                spec: inv.spec.clone(),
                sets: inv.sets.clone(),
                submitted: upcc_engine::fsutil::rfc3339(std::time::SystemTime::now()),
                user: std::env::var("USER").ok(),
                host: host.clone(),
                log: log.display().to_string().replace("%j", &id),
                worker: None,
            },
        )?;
        jobs.insert(i, id);
        new += 1;
    }
    Ok(Submitted {
        jobs,
        new,
        attached,
        recipes: recipe,
    })
}

/// How the nodes of a submission ended.
pub struct Outcome {
    pub done: Vec<usize>,
    /// Node → what happened to its job.
    pub failed: Vec<(usize, String)>,
}

/// Wait for the jobs: poll the store (a node is done when its result is published) and the
/// queue (a job that ended without publishing failed), print progress on stderr.
pub fn attach(
    dag: &Dag,
    spec: &str,
    jobs: &BTreeMap<usize, String>,
    store: &Store,
    poll: Duration,
    quiet: bool,
) -> Result<Outcome> {
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        // Keys of nodes downstream of computed ones become known as results are published.
        let entries = upcc_engine::plan(dag, store, spec)?;
        let mut done = Vec::new();
        let mut pending = Vec::new();
        for (&i, id) in jobs {
            if entries[i].status == NodeStatus::Fresh {
                done.push(i);
            } else {
                pending.push((i, id.clone()));
            }
        }
        let ids: Vec<String> = pending.iter().map(|(_, id)| id.clone()).collect();
        let states = if ids.is_empty() {
            HashMap::new()
        } else {
            job_states(&ids)?
        };
        let (mut queued, mut running, mut failed) = (0, 0, Vec::new());
        for (i, id) in &pending {
            match &states[id] {
                JobState::Queued(r) if UNSCHEDULABLE.contains(&r.as_str()) => {
                    // It would wait forever: cancel it (its dependents follow) and say why.
                    let _ = Command::new("scancel").arg(id).output();
                    let why = if r == "DependencyNeverSatisfied" {
                        format!(
                            "slurm job {id} can never start: the job of one of its inputs failed"
                        )
                    } else {
                        format!(
                            "slurm job {id} can never start here ({r}): the job asks for more than the partition has; lower `executor.slurm.resources` (README, On a Slurm cluster)"
                        )
                    };
                    failed.push((*i, why));
                }
                JobState::Queued(_) => queued += 1,
                JobState::Running => running += 1,
                s => {
                    // The result may have been published just after the store was read.
                    let published =
                        match upcc_engine::plan(&dag.restrict(&[*i]), store, spec)?.last() {
                            Some(e) => e.status == NodeStatus::Fresh,
                            None => false,
                        };
                    if published {
                        done.push(*i);
                    } else {
                        failed.push((*i, s.describe(id)));
                    }
                }
            }
        }
        let line = format!(
            "slurm: {} of {} nodes done, {running} running, {queued} queued, {} failed",
            done.len(),
            jobs.len(),
            failed.len()
        );
        if !quiet && line != last {
            eprintln!("upcc: {line} ({:.0} s)", t0.elapsed().as_secs_f64());
            last = line;
        }
        if queued + running == 0 {
            for (i, _) in &failed {
                eprintln!("upcc: node `{}` failed", dag.node(*i).id);
            }
            return Ok(Outcome { done, failed });
        }
        std::thread::sleep(poll);
    }
}

/// Cancel the live jobs of these nodes (but those of `done`, cancelled already); returns how
/// many were cancelled and how many records cleared.
pub fn cancel(
    dag: &Dag,
    entries: &[PlanEntry],
    store: &Store,
    done: &[String],
) -> Result<(usize, usize)> {
    let lock = store.jobs().lock()?;
    let recipe = recipes(dag);
    let mut records = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.status != NodeStatus::Fresh {
            if let Some(r) = read_record(store, &recipe[i]) {
                records.push((recipe[i].clone(), r));
            }
        }
    }
    let ids: Vec<String> = records.iter().map(|(_, r)| r.job_id.clone()).collect();
    let states = if ids.is_empty() {
        HashMap::new()
    } else {
        job_states(&ids)?
    };
    let live: Vec<&str> = records
        .iter()
        .filter(|(_, r)| states.get(&r.job_id).is_some_and(JobState::alive))
        .map(|(_, r)| r.job_id.as_str())
        .filter(|id| !done.iter().any(|d| d == id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !live.is_empty() {
        command_succeeded(Command::new("scancel").args(&live), "scancel")?;
    }
    for (k, _) in &records {
        store.jobs().remove(&lock, k)?;
    }
    Ok((live.len(), records.len()))
}

/// The store's job records whose jobs may still run (queued or running; every record when
/// the queue cannot be asked): what `gc` must not take inputs from.
pub fn live_records(store: &Store) -> Result<Vec<JobRecord>> {
    let records: Vec<JobRecord> = store
        .jobs()
        .list()
        .into_iter()
        .filter_map(|(_, b)| serde_json::from_slice(&b).ok())
        .collect();
    if records.is_empty() {
        return Ok(records);
    }
    let ids: Vec<String> = records.iter().map(|r| r.job_id.clone()).collect();
    Ok(match job_states(&ids) {
        Ok(states) => records
            .into_iter()
            .filter(|r| states.get(&r.job_id).is_some_and(JobState::alive))
            .collect(),
        Err(_) => records,
    })
}

/// The last lines of a job's Slurm log, for `explain`.
pub fn log_tail(record: &JobRecord, lines: usize) -> Option<String> {
    let text = fs_err::read_to_string(&record.log).ok()?;
    let all: Vec<&str> = text.lines().collect();
    Some(all[all.len().saturating_sub(lines)..].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_resources_read_as_slurm_writes_them() {
        assert_eq!(
            parse_state("PENDING", "Dependency"),
            JobState::Queued("Dependency".into())
        );
        assert_eq!(parse_state("RUNNING", "None"), JobState::Running);
        assert_eq!(
            parse_state("CANCELLED by 0", ""),
            JobState::Ended("CANCELLED".into())
        );
        assert_eq!(
            parse_state("TIMEOUT", ""),
            JobState::Ended("TIMEOUT".into())
        );
        assert!(!parse_state("COMPLETED", "").alive());
        let s: SlurmSettings = serde_yaml_ng::from_str(
            "partition: cpu\nresources:\n  training: {gpus: 1, time: '12:00:00', partition: gpu}\n  train: {cpus: 8}\n  default: {mem_mb: 2000}\n",
        )
        .unwrap();
        let asked = |r: JobResources| (r.cpus, r.mem_mb, r.time, r.gpus, r.partition);
        assert_eq!(
            asked(s.resources_for("train", true, 500, true)),
            (
                Some(8),
                Some(2000),
                Some("12:00:00".into()),
                Some(1),
                Some("gpu".into())
            )
        );
        assert_eq!(
            asked(s.resources_for("metrics", false, 256, true)),
            (
                Some(1),
                Some(2000),
                Some("02:00:00".into()),
                Some(0),
                Some("cpu".into())
            )
        );
        // Without a GPU device, training jobs ask for none by default.
        let r = SlurmSettings::default().resources_for("pretrain", true, 3000, false);
        assert_eq!((r.cpus, r.mem_mb, r.gpus), (Some(4), Some(4024), Some(0)));
        let bad: SlurmSettings =
            serde_yaml_ng::from_str("poll_seconds: 0\nresources: {train: {cpus: 0, time: soon}}")
                .unwrap();
        assert_eq!(bad.check().len(), 3);
        assert_eq!(sh_quote("a b'c"), "'a b'\\''c'");
        assert_eq!(sh_quote("/x/y.yaml"), "/x/y.yaml");
    }
}
