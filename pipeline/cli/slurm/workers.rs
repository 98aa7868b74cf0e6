//! The Slurm executor's `workers` mode: a few jobs compute many nodes.
//!
//! A node is either a training node (its numerics class is the device's) or another node
//! (features, experts, constraints, k-means, metrics, tables: `exact`). A *worker* is one
//! Slurm job of one kind that runs `upcc worker`: the local executor, against the shared store,
//! over every node of its kind whose inputs are computed or computable by itself, again and
//! again until none is left. Workers of a kind share their nodes through the engine's leases
//! (a node leased by one is skipped by the others until it is published), so each node is
//! computed once however many workers run.
//!
//! The driver (`upcc run --executor slurm`) keeps at most `workers.training` training workers
//! and `workers.other` other workers alive, and never more than `max_jobs` jobs of the store
//! queued or running at once; when a kind has nodes that can run and no worker, it submits
//! workers for it. A worker killed by the scheduler loses only the node it was computing (its
//! lease dies with it); the driver sees the nodes still missing and submits another worker. A
//! kind whose workers twice end without a new node computed has failed nodes: the driver
//! stops submitting for them and reports them with the jobs' logs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use upcc_engine::{Dag, JobsLock, NodeStatus, Store};
use upcc_model::error::{Error, Result};

use super::{
    command_succeeded, job_states, read_record, sh_quote, Invocation, JobRecord, JobResources,
    JobState, SlurmSettings,
};
use crate::eta::History;

/// Whether node `i` trains networks (its numerics class is the device's).
pub fn trains(dag: &Dag, i: usize) -> bool {
    dag.node(i).numerics != "exact"
}

/// The two kinds of worker.
pub const KINDS: [bool; 2] = [false, true];

/// A kind's name in records, command lines and messages.
pub fn kind_name(trains: bool) -> &'static str {
    if trains {
        "training"
    } else {
        "other"
    }
}

/// The nodes a worker of kind `trains` may compute now: not `done`, of its kind, not in
/// `blocked`, and each input done or itself such a node (indices are in topological order).
pub fn runnable(dag: &Dag, done: &[bool], kind: bool, blocked: &BTreeSet<usize>) -> Vec<usize> {
    let mut ok = vec![false; dag.len()];
    let mut out = Vec::new();
    for i in 0..dag.len() {
        if done[i] || blocked.contains(&i) || trains(dag, i) != kind {
            continue;
        }
        if dag.upstream(i).iter().all(|&u| done[u] || ok[u]) {
            ok[i] = true;
            out.push(i);
        }
    }
    out
}

/// One group of identical worker jobs of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlannedJobs {
    /// 1 for the first nodes that can run, 2 for those they unblock, …
    pub wave: usize,
    pub kind: &'static str,
    /// Workers (Slurm jobs).
    pub jobs: usize,
    /// Nodes they compute between them.
    pub nodes: usize,
    pub cpus: usize,
    pub mem_mb: u64,
    pub gpus: usize,
    pub time: String,
    pub partition: Option<String>,
}

/// The job plan of a run in which every job succeeds: waves of workers, each wave the nodes
/// that the previous waves' results make runnable. What `--dry-run` prints.
pub fn job_plan(
    dag: &Dag,
    done: &[bool],
    settings: &SlurmSettings,
    gpu: bool,
    history: &History,
) -> Vec<PlannedJobs> {
    let mut done = done.to_vec();
    let mut out = Vec::new();
    let none = BTreeSet::new();
    for wave in 1.. {
        let ready: Vec<(bool, Vec<usize>)> = KINDS
            .iter()
            .map(|&k| (k, runnable(dag, &done, k, &none)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        if ready.is_empty() {
            break;
        }
        for (k, r) in ready {
            let jobs = settings
                .workers_for(k)
                .min(r.len())
                .min(settings.max_jobs());
            let res = worker_resources(dag, &r, k, jobs, settings, gpu, history);
            out.push(PlannedJobs {
                wave,
                kind: kind_name(k),
                jobs,
                nodes: r.len(),
                cpus: res.cpus.unwrap_or(1),
                mem_mb: res.mem_mb.unwrap_or(0),
                gpus: res.gpus.unwrap_or(0),
                time: res.time.unwrap_or_default(),
                partition: res.partition,
            });
            for i in r {
                done[i] = true;
            }
        }
    }
    out
}

/// Seconds a node is expected to take where the store has no history of its kind.
fn guess_seconds(dag: &Dag, i: usize) -> f64 {
    if trains(dag, i) {
        1800.0
    } else {
        60.0
    }
}

/// `HH:MM:SS` (or `D-HH:MM:SS`) for Slurm.
fn slurm_time(seconds: f64) -> String {
    let s = seconds.ceil().max(60.0) as u64;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// The resources of each of `jobs` workers of kind `trains` over `nodes`: the largest any of
/// its nodes asks for (CPUs, memory, GPUs: `executor.slurm.resources`, else each node's
/// estimate at load), and a time limit: the configured one, else twice the nodes' share of
/// the store's recorded times (a guess where it has none) plus 10 minutes, at most a day for
/// training workers and 4 hours for the others (a worker that stops at its limit loses only
/// the node it was computing; the next worker goes on).
pub fn worker_resources(
    dag: &Dag,
    nodes: &[usize],
    trains: bool,
    jobs: usize,
    settings: &SlurmSettings,
    gpu: bool,
    history: &History,
) -> JobResources {
    let mut r = JobResources {
        cpus: Some(1),
        mem_mb: Some(1024),
        time: None,
        gpus: Some(0),
        partition: None,
    };
    for &i in nodes {
        let n = dag.node(i);
        let nr = settings.resources_for(&n.stage, trains, n.resources.memory_mb, gpu);
        r.cpus = r.cpus.max(nr.cpus);
        r.mem_mb = r.mem_mb.max(nr.mem_mb);
        r.gpus = r.gpus.max(nr.gpus);
        r.partition = r.partition.or(nr.partition);
    }
    let configured = settings
        .resources
        .get(if trains { "training" } else { "default" })
        .and_then(|e| e.time.clone())
        .or_else(|| {
            settings
                .resources
                .get("default")
                .and_then(|e| e.time.clone())
        });
    r.time = Some(configured.unwrap_or_else(|| {
        let total: f64 = nodes
            .iter()
            .map(|&i| {
                history
                    .node_seconds(dag, i)
                    .unwrap_or_else(|| guess_seconds(dag, i))
            })
            .sum();
        let cap = if trains { 86_400.0 } else { 4.0 * 3600.0 };
        slurm_time((2.0 * total / jobs.max(1) as f64 + 600.0).min(cap))
    }));
    r
}

/// The name of a worker's record in the job book.
fn record_name(job_id: &str) -> String {
    format!("w-{}", job_id.replace(['_', '.'], "-"))
}

/// The live records of the store (any spec: workers, their nodes, per-node jobs), after
/// dropping the worker records of ended jobs; the ended workers that did not complete are
/// returned as messages.
fn live_workers(store: &Store, lock: &JobsLock) -> Result<(Vec<JobRecord>, Vec<String>)> {
    let records: Vec<JobRecord> = store
        .jobs()
        .list()
        .into_iter()
        .filter_map(|(_, b)| serde_json::from_slice::<JobRecord>(&b).ok())
        .collect();
    if records.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let ids: Vec<String> = records.iter().map(|r| r.job_id.clone()).collect();
    let states = job_states(&ids)?;
    let (mut live, mut ended) = (Vec::new(), Vec::new());
    for r in records {
        let mut st = states.get(&r.job_id).cloned().unwrap_or(JobState::Unknown);
        if let (JobState::Queued(reason), Some(_)) = (&st, &r.worker) {
            if super::UNSCHEDULABLE.contains(&reason.as_str()) {
                // It would wait forever: cancel it and say why.
                let _ = Command::new("scancel").arg(&r.job_id).output();
                st = JobState::Ended(format!(
                    "unstarted: it can never start here ({reason}); lower `executor.slurm.resources`"
                ));
            }
        }
        if st.alive() {
            live.push(r);
        } else if let Some(kind) = r.worker.clone() {
            if read_record(store, &r.recipe).is_some() {
                store.jobs().remove(lock, &r.recipe)?;
                if !matches!(&st, JobState::Ended(s) if s == "COMPLETED") {
                    let how = match &st {
                        JobState::Ended(s) => format!("ended {s}"),
                        _ => "is gone".into(),
                    };
                    ended.push(format!(
                        "{kind} worker (slurm job {}) {how}; log: {}",
                        r.job_id, r.log
                    ));
                }
            }
        }
        // A node's record of an ended job stays for `status` to name the job and its log.
    }
    Ok((live, ended))
}

/// Submit one worker of kind `trains`.
fn submit_worker(
    store: &Store,
    lock: &JobsLock,
    settings: &SlurmSettings,
    inv: &Invocation,
    trains: bool,
    res: &JobResources,
) -> Result<String> {
    let logs = fs_err::canonicalize(store.jobs().log_dir())
        .map_err(|e| Error::env(format!("cannot find the jobs' log folder: {e}")))?;
    let kind = kind_name(trains);
    let log = logs.join(format!("worker-{kind}.%j.out"));
    let mut cmd = super::sbatch_command(&format!("upcc:{kind}"), &log, res, settings);
    cmd.args(&settings.sbatch);
    cmd.arg(format!(
        "--wrap={}",
        inv.worker_command(
            trains,
            res.cpus.unwrap_or(1),
            &log.display().to_string(),
            settings.linger_seconds.unwrap_or(300.0)
        )?
    ));
    let id = super::sbatch(&mut cmd, &format!("a {kind} worker"))?;
    record_job(store, lock, inv, &id, &log, kind)?;
    Ok(id)
}

/// Record a worker's or the driver's job in the job book.
fn record_job(
    store: &Store,
    lock: &JobsLock,
    inv: &Invocation,
    id: &str,
    log: &std::path::Path,
    kind: &str,
) -> Result<()> {
    super::write_record(
        store,
        lock,
        &JobRecord {
            job_id: id.to_string(),
            node: String::new(),
            recipe: record_name(id),
            spec: inv.spec.clone(),
            sets: inv.sets.clone(),
            submitted: upcc_engine::fsutil::rfc3339(std::time::SystemTime::now()),
            user: std::env::var("USER").ok(),
            host: upcc_engine::fsutil::host_name(),
            log: log.display().to_string().replace("%j", id),
            worker: Some(kind.to_string()),
        },
    )
}

/// How a driven run ended.
pub struct Driven {
    /// Worker jobs this driver submitted.
    pub submitted: usize,
    /// The most jobs of the store queued or running at once, as the driver saw them.
    pub peak_queued: usize,
    /// Nodes left missing, with why.
    pub failed: Vec<(usize, String)>,
}

/// Keep workers alive for the nodes of `dag` that are not computed until every node is
/// computed or can no longer be.
pub fn drive(
    dag: &Dag,
    spec: &str,
    store: &Store,
    settings: &SlurmSettings,
    inv: &Invocation,
    gpu: bool,
    poll: Duration,
    quiet: bool,
) -> Result<Driven> {
    let t0 = Instant::now();
    let history = History::read(store)?;
    let mut blocked: BTreeSet<usize> = BTreeSet::new();
    let mut why: BTreeMap<usize, String> = BTreeMap::new();
    // Per kind: fresh nodes when its workers were last submitted, and passes without progress.
    let mut last_submit: HashMap<bool, usize> = HashMap::new();
    let mut idle_passes: HashMap<bool, usize> = HashMap::new();
    let mut last_ended: HashMap<bool, String> = HashMap::new();
    let (mut submitted, mut peak, mut last_line) = (0, 0, String::new());
    loop {
        let lock = store.jobs().lock()?;
        let entries = upcc_engine::plan(dag, store, spec)?;
        let done: Vec<bool> = entries
            .iter()
            .map(|e| e.status == NodeStatus::Fresh)
            .collect();
        let n_done = done.iter().filter(|d| **d).count();
        let (live, ended) = live_workers(store, &lock)?;
        for m in &ended {
            if !quiet {
                eprintln!("upcc: slurm: {m}");
            }
            let k = m.starts_with("training");
            last_ended.insert(k, m.clone());
        }
        let mine = |k: bool| {
            live.iter()
                .filter(|r| {
                    r.worker.as_deref() == Some(kind_name(k))
                        && r.spec == inv.spec
                        && r.sets == inv.sets
                })
                .count()
        };
        // Jobs, not records: a worker's record and those of the nodes it computes share one.
        let mut queued = live
            .iter()
            .map(|r| r.job_id.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        let (mut waiting, mut starved) = (0, false);
        for k in KINDS {
            let alive = mine(k);
            waiting += alive;
            let ready = runnable(dag, &done, k, &blocked);
            if ready.is_empty() {
                continue;
            }
            // Workers of this kind ran and ended with nothing new computed: count a pass.
            if alive == 0 && last_submit.get(&k) == Some(&n_done) {
                let n = idle_passes.entry(k).or_insert(0);
                *n += 1;
                if *n >= 2 {
                    let reason = last_ended.get(&k).cloned().unwrap_or_else(|| {
                        format!(
                            "its {} workers ended twice without computing it; their logs are in {}",
                            kind_name(k),
                            store.jobs().log_dir().display()
                        )
                    });
                    for i in ready {
                        why.insert(i, reason.clone());
                        blocked.insert(i);
                    }
                    continue;
                }
            } else if alive == 0 {
                idle_passes.insert(k, 0);
            }
            // Live workers take what becomes ready (they linger for it); more are added while
            // there are more ready nodes than workers, up to the kind's limit.
            let want = settings
                .workers_for(k)
                .min(ready.len())
                .saturating_sub(alive);
            let room = settings.max_jobs().saturating_sub(queued);
            let n = want.min(room);
            if n == 0 {
                // Enough workers, or the queue is full: wait for jobs to end.
                starved |= want > 0;
                continue;
            }
            let res = worker_resources(dag, &ready, k, n, settings, gpu, &history);
            for _ in 0..n {
                submit_worker(store, &lock, settings, inv, k, &res)?;
            }
            if !quiet {
                eprintln!(
                    "upcc: slurm: submitted {n} {} worker{} for {} nodes ({} CPUs, {} MB{}, {} each)",
                    kind_name(k),
                    if n == 1 { "" } else { "s" },
                    ready.len(),
                    res.cpus.unwrap_or(1),
                    res.mem_mb.unwrap_or(0),
                    match res.gpus.unwrap_or(0) {
                        0 => String::new(),
                        g => format!(", {g} GPU"),
                    },
                    res.time.as_deref().unwrap_or("?")
                );
            }
            submitted += n;
            queued += n;
            waiting += n;
            last_submit.insert(k, n_done);
        }
        peak = peak.max(queued);
        drop(lock);
        let line = format!(
            "slurm: {n_done} of {} nodes done, {waiting} workers queued or running",
            dag.len()
        );
        if !quiet && line != last_line {
            eprintln!("upcc: {line} ({:.0} s)", t0.elapsed().as_secs_f64());
            last_line = line;
        }
        if n_done == dag.len() || (waiting == 0 && !starved) {
            // This run's workers end on their own once nothing of their kind is left (they
            // have just published the last nodes); wait for them, so that the run leaves no
            // job behind. Where nodes failed, those lingering for them are cancelled.
            if n_done < dag.len() {
                cancel_workers(store, &inv.spec, &inv.sets, false)?;
            }
            wait_for_workers(store, inv, poll)?;
            let mut failed = Vec::new();
            for (i, d) in done.iter().enumerate() {
                if !d {
                    let w = why
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| "an input of it was not computed".to_string());
                    failed.push((i, w));
                }
            }
            return Ok(Driven {
                submitted,
                peak_queued: peak,
                failed,
            });
        }
        std::thread::sleep(poll);
    }
}

/// Wait until no worker of this run's spec and overrides is queued or running.
fn wait_for_workers(store: &Store, inv: &Invocation, poll: Duration) -> Result<()> {
    loop {
        let alive = {
            let lock = store.jobs().lock()?;
            let (live, _) = live_workers(store, &lock)?;
            live.iter().any(|r| {
                matches!(r.worker.as_deref(), Some("training" | "other"))
                    && r.spec == inv.spec
                    && r.sets == inv.sets
            })
        };
        if !alive {
            return Ok(());
        }
        std::thread::sleep(poll);
    }
}

/// Submit the driver itself as a job (`run --detach` in workers mode), unless one is queued or
/// running for this spec and overrides: its job id, and whether it is new. Its resources are
/// `executor.slurm.resources.driver` (default 1 CPU, 2 GB, 3 days: the driver sleeps between
/// polls of the queue).
pub fn submit_driver(
    store: &Store,
    settings: &SlurmSettings,
    inv: &Invocation,
) -> Result<(String, bool)> {
    let lock = store.jobs().lock()?;
    let (live, _) = live_workers(store, &lock)?;
    if let Some(r) = live
        .iter()
        .find(|r| r.worker.as_deref() == Some("driver") && r.spec == inv.spec && r.sets == inv.sets)
    {
        return Ok((r.job_id.clone(), false));
    }
    let e = settings.resources.get("driver");
    let logs = fs_err::canonicalize(store.jobs().log_dir())
        .map_err(|e| Error::env(format!("cannot find the jobs' log folder: {e}")))?;
    let log = logs.join("driver.%j.out");
    let res = JobResources {
        cpus: Some(e.and_then(|e| e.cpus).unwrap_or(1)),
        mem_mb: Some(e.and_then(|e| e.mem_mb).unwrap_or(2048)),
        time: Some(
            e.and_then(|e| e.time.clone())
                .unwrap_or_else(|| "3-00:00:00".into()),
        ),
        gpus: Some(0),
        partition: e.and_then(|e| e.partition.clone()),
    };
    let mut cmd = super::sbatch_command("upcc:driver", &log, &res, settings);
    cmd.args(&settings.sbatch);
    cmd.arg(format!("--wrap={}", inv.driver_command()?));
    let id = super::sbatch(&mut cmd, "the driver's job")?;
    record_job(store, &lock, inv, &id, &log, "driver")?;
    Ok((id, true))
}

/// Cancel the live worker jobs of this spec (and its overrides), and its detached driver's
/// with `with_driver`; returns their ids.
pub fn cancel_workers(
    store: &Store,
    spec: &str,
    sets: &[String],
    with_driver: bool,
) -> Result<Vec<String>> {
    let lock = store.jobs().lock()?;
    let (live, _) = live_workers(store, &lock)?;
    let ids: Vec<&JobRecord> = live
        .iter()
        .filter(|r| {
            r.worker
                .as_deref()
                .is_some_and(|w| with_driver || w != "driver")
                && r.spec == spec
                && r.sets == sets
        })
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    command_succeeded(
        Command::new("scancel").args(ids.iter().map(|r| r.job_id.as_str())),
        "scancel",
    )?;
    for r in &ids {
        store.jobs().remove(&lock, &r.recipe)?;
    }
    Ok(ids.iter().map(|r| r.job_id.clone()).collect())
}

/// `sh`-quoted words of a worker's command line (for `Invocation::worker_command`).
pub(super) fn worker_words(trains: bool, log: &str, linger: f64) -> Vec<String> {
    vec![
        "worker".into(),
        "--kind".into(),
        kind_name(trains).into(),
        "--log".into(),
        sh_quote(log),
        "--linger".into(),
        format!("{linger}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_times_read_as_slurm_writes_them() {
        assert_eq!(slurm_time(5.0), "00:01:00");
        assert_eq!(slurm_time(3725.0), "01:02:05");
        assert_eq!(slurm_time(90_061.0), "1-01:01:01");
        assert_eq!(record_name("123_4"), "w-123-4");
    }
}
