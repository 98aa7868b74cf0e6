//! The local executor: runs ready nodes in parallel under CPU and memory slots.
//!
//! Scheduling happens on the calling thread; every node runs on its own worker thread inside
//! a rayon pool of the threads it asked for. A node is run only while its lease is held, and
//! its outputs are stored before its manifest, so a crash or a kill at any moment leaves
//! either a complete result or none. Independent nodes keep going when one fails if
//! `keep_going` is set; results already stored are never lost.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::dag::{Dag, InputDef};
use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::error::{EngineError, Tier};
use crate::fsutil::{host_name, peak_rss_bytes, rfc3339};
use crate::key::KeyMaterial;
use crate::lease::{try_acquire, Lease, LeaseAttempt, LeaseHolder};
use crate::plan::{material_for, SourceCache};
use crate::store::{
    Manifest, OutputRecord, Provenance, RefRecord, Store, StoreError, MANIFEST_SCHEMA_VERSION,
};
use crate::task::{ProgressEvent, TaskContext, TaskError};

/// What a run reports as it goes. The engine draws nothing itself: whoever runs it renders
/// these (the CLI as progress bars or plain lines).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RunEvent<'a> {
    /// A node starts computing in this process.
    Started { node: usize, id: &'a str },
    /// A running node's progress (`done` of `total` steps).
    Progress {
        node: usize,
        id: &'a str,
        done: u64,
        total: u64,
        message: &'a str,
    },
    /// A node is settled for this run.
    Finished {
        node: usize,
        id: &'a str,
        outcome: Outcome,
        seconds: Option<f64>,
        error: Option<&'a str>,
    },
    /// A node reported `Finished` must run again (a corrupt output of it was found downstream).
    Reopened { node: usize },
    /// A node waits for another process that holds its lease.
    Waiting {
        id: &'a str,
        holder: Option<&'a LeaseHolder>,
    },
    /// A corrupt stored object was quarantined; its producer will be recomputed.
    Corrupt {
        digest: Digest<Artifact>,
        message: &'a str,
    },
}

/// Receives a run's events on the scheduling thread.
pub trait Observer {
    fn event(&mut self, event: RunEvent<'_>);
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {
    fn event(&mut self, _event: RunEvent<'_>) {}
}

/// Provenance shared by every node of a run.
#[derive(Clone, Debug, Default)]
pub struct ProvenanceBase {
    pub tool: String,
    pub tool_version: String,
    pub git_revision: Option<String>,
    pub run_id: String,
    pub user: Option<String>,
    pub cpu: String,
    pub os: String,
    pub libraries: BTreeMap<String, String>,
}

/// Settings of one `run`.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Namespace of refs (the spec's name), for "why is it stale".
    pub spec: String,
    /// CPU slots.
    pub threads: usize,
    /// Memory slots in MiB.
    pub memory_mb: u64,
    pub keep_going: bool,
    /// Node indices to recompute even when fresh.
    pub force: BTreeSet<usize>,
    pub provenance: ProvenanceBase,
    /// How often to look again at a node another process is computing.
    pub poll_interval: Duration,
    /// GPU slots: the memory budget in MiB of each GPU nodes may be placed on (empty: nodes
    /// run without a GPU slot).
    pub gpus: Vec<u64>,
}

/// What happened to one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Computed by this process.
    Executed,
    /// Its result was already stored.
    Cached,
    /// Another process computed it while this one waited.
    ComputedElsewhere,
    Failed,
    /// Not run: an upstream node failed, or the run stopped after a failure.
    Skipped,
}

/// Report of one node.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    pub id: String,
    pub stage: String,
    pub key: Option<Digest<NodeKeyTag>>,
    pub outcome: Outcome,
    pub duration_s: Option<f64>,
    pub error: Option<String>,
    #[serde(skip)]
    pub error_tier: Option<Tier>,
    pub labels: BTreeMap<String, String>,
}

/// Report of a run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub nodes: Vec<NodeReport>,
}

impl RunReport {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.nodes.iter().filter(|n| n.outcome == outcome).count()
    }

    /// The worst tier among failures, if any failed.
    pub fn failure_tier(&self) -> Option<Tier> {
        let tiers: Vec<Tier> = self.nodes.iter().filter_map(|n| n.error_tier).collect();
        if tiers.is_empty() {
            None
        } else if tiers.contains(&Tier::Internal) {
            Some(Tier::Internal)
        } else if tiers.contains(&Tier::Environment) {
            Some(Tier::Environment)
        } else {
            Some(Tier::User)
        }
    }
}

enum State {
    Pending,
    Ready {
        material: KeyMaterial,
        key: Digest<NodeKeyTag>,
    },
    Waiting {
        material: KeyMaterial,
        key: Digest<NodeKeyTag>,
    },
    Running,
    Finished,
}

enum WorkerResult {
    Done {
        outputs: BTreeMap<String, OutputRecord>,
        seconds: f64,
    },
    TaskFailed {
        error: TaskError,
        seconds: f64,
    },
    CorruptInput {
        input: String,
        digest: Digest<Artifact>,
        message: String,
    },
    Engine(EngineError),
}

enum Event {
    Finished { node: usize, result: WorkerResult },
}

/// Run every node of `dag` that is not fresh in `store`, telling `observer` as it goes.
pub fn run(
    dag: &Dag,
    store: &Store,
    cfg: &RunConfig,
    observer: &mut dyn Observer,
) -> Result<RunReport, EngineError> {
    let n = dag.len();
    let mut state: Vec<State> = (0..n).map(|_| State::Pending).collect();
    let mut resolved: Vec<Option<BTreeMap<String, OutputRecord>>> = vec![None; n];
    let mut reports: Vec<Option<NodeReport>> = vec![None; n];
    let mut sources = SourceCache::new(true);
    let mut source_bytes: HashMap<(usize, String), Arc<Vec<u8>>> = HashMap::new();
    let mut corrupt_retries = vec![0u32; n];
    let mut free_threads = cfg.threads.max(1);
    let mut free_memory = cfg.memory_mb;
    // Free GPU memory per slot, nodes running per slot, and each running node's slot.
    let mut gpu_free: Vec<u64> = cfg.gpus.clone();
    let mut gpu_running: Vec<usize> = vec![0; cfg.gpus.len()];
    let mut gpu_of: Vec<Option<usize>> = vec![None; n];
    // GPU slots lost for this run (a node on them failed with a sticky device error), with
    // the error that lost them.
    let mut gpu_lost: Vec<Option<String>> = vec![None; cfg.gpus.len()];
    let mut running = 0usize;
    // Keys this process started: a second node of the same key (two methods of one kind)
    // waits for it quietly and then reads as cached, not as another process's work.
    let mut own_keys: std::collections::HashSet<Digest<NodeKeyTag>> = Default::default();
    let mut stopped = false;
    let (tx, rx): (Sender<Event>, Receiver<Event>) = channel();
    let (ptx, prx) = channel::<ProgressEvent>();
    let finished = |observer: &mut dyn Observer,
                    i: usize,
                    outcome: Outcome,
                    seconds: Option<f64>,
                    error: Option<&str>| {
        observer.event(RunEvent::Finished {
            node: i,
            id: &dag.node(i).id,
            outcome,
            seconds,
            error,
        })
    };
    let mut last_poll = Instant::now() - cfg.poll_interval;

    let report = |i: usize, key: Option<Digest<NodeKeyTag>>, outcome: Outcome| NodeReport {
        id: dag.node(i).id.clone(),
        stage: dag.node(i).stage.clone(),
        key,
        outcome,
        duration_s: None,
        error: None,
        error_tier: None,
        labels: dag.node(i).labels.clone(),
    };

    loop {
        // 1. Resolve pending nodes whose inputs are all known (topological order: one pass).
        for i in 0..n {
            if !matches!(state[i], State::Pending) {
                continue;
            }
            let ups = dag.upstream(i);
            if ups.iter().any(|&u| {
                matches!(
                    reports[u].as_ref().map(|r| r.outcome),
                    Some(Outcome::Failed | Outcome::Skipped)
                )
            }) {
                let mut r = report(i, None, Outcome::Skipped);
                r.error = Some("an upstream node failed".into());
                reports[i] = Some(r);
                state[i] = State::Finished;
                finished(observer, i, Outcome::Skipped, None, None);
                continue;
            }
            let Some(material) = material_for(dag, i, &resolved, &mut sources)? else {
                continue;
            };
            for (name, input) in &dag.node(i).inputs {
                if let InputDef::Source(src) = input {
                    source_bytes.insert((i, name.clone()), sources.get(src)?.1);
                }
            }
            let key = material.digest()?;
            if !cfg.force.contains(&i) {
                if let Some(m) = store.fresh_manifest(&key)? {
                    resolved[i] = Some(m.outputs);
                    update_ref(store, &cfg.spec, &dag.node(i).id, &material, key)?;
                    reports[i] = Some(report(i, Some(key), Outcome::Cached));
                    state[i] = State::Finished;
                    finished(observer, i, Outcome::Cached, None, None);
                    continue;
                }
            }
            state[i] = State::Ready { material, key };
        }

        // 2. Start what fits, take over nodes other processes were computing.
        let poll_due = last_poll.elapsed() >= cfg.poll_interval;
        if poll_due {
            last_poll = Instant::now();
        }
        let mut progressed = false;
        if !stopped {
            for i in 0..n {
                let waiting = matches!(state[i], State::Waiting { .. });
                if !(matches!(state[i], State::Ready { .. }) || (waiting && poll_due)) {
                    continue;
                }
                let (material, key) = match &state[i] {
                    State::Ready { material, key } | State::Waiting { material, key } => {
                        (material.clone(), *key)
                    }
                    _ => unreachable!("checked above"),
                };
                if waiting && !cfg.force.contains(&i) {
                    if let Some(m) = store.fresh_manifest(&key)? {
                        resolved[i] = Some(m.outputs);
                        update_ref(store, &cfg.spec, &dag.node(i).id, &material, key)?;
                        let outcome = if own_keys.contains(&key) {
                            Outcome::Cached
                        } else {
                            Outcome::ComputedElsewhere
                        };
                        reports[i] = Some(report(i, Some(key), outcome));
                        state[i] = State::Finished;
                        progressed = true;
                        finished(observer, i, outcome, None, None);
                        continue;
                    }
                }
                let res = dag.node(i).resources;
                let threads = res.threads.clamp(1, cfg.threads.max(1));
                let fits_memory = res.memory_mb <= free_memory || running == 0;
                if threads > free_threads || !fits_memory {
                    continue;
                }
                // A GPU with room for it (most free memory first; an idle GPU always takes it),
                // never one lost earlier in this run. When every GPU is lost, the node fails.
                if res.gpu_memory_mb > 0
                    && !cfg.gpus.is_empty()
                    && gpu_lost.iter().all(Option::is_some)
                {
                    let why = gpu_lost
                        .iter()
                        .flatten()
                        .next()
                        .cloned()
                        .unwrap_or_default();
                    let msg = format!(
                        "not started: every GPU of this run failed earlier and cannot be used again by this process ({why}); run upcc again to retry on a fresh GPU context"
                    );
                    let mut r = report(i, Some(key), Outcome::Failed);
                    r.error = Some(msg.clone());
                    r.error_tier = Some(Tier::Environment);
                    reports[i] = Some(r);
                    state[i] = State::Finished;
                    progressed = true;
                    finished(observer, i, Outcome::Failed, None, Some(&msg));
                    if !cfg.keep_going {
                        stopped = true;
                    }
                    continue;
                }
                let gpu = if res.gpu_memory_mb > 0 && !cfg.gpus.is_empty() {
                    let slot = (0..cfg.gpus.len())
                        .filter(|&g| gpu_lost[g].is_none())
                        .filter(|&g| res.gpu_memory_mb <= gpu_free[g] || gpu_running[g] == 0)
                        .max_by_key(|&g| (gpu_free[g], std::cmp::Reverse(g)));
                    match slot {
                        Some(g) => Some(g),
                        None => continue,
                    }
                } else {
                    None
                };
                let lock_path = store.ensure_lock_parent(&key)?;
                let holder = LeaseHolder {
                    host: host_name(),
                    pid: std::process::id(),
                    run_id: cfg.provenance.run_id.clone(),
                    since: rfc3339(SystemTime::now()),
                    heartbeat: None,
                    heartbeat_every_s: None,
                };
                let lease = match try_acquire(&lock_path, &holder)? {
                    LeaseAttempt::Acquired(l) => l,
                    LeaseAttempt::Busy(who) => {
                        if !waiting && !own_keys.contains(&key) {
                            observer.event(RunEvent::Waiting {
                                id: &dag.node(i).id,
                                holder: who.as_ref(),
                            });
                        }
                        state[i] = State::Waiting { material, key };
                        continue;
                    }
                };
                // Someone may have finished it between our check and the lease.
                if !cfg.force.contains(&i) {
                    if let Some(m) = store.fresh_manifest(&key)? {
                        drop(lease);
                        resolved[i] = Some(m.outputs);
                        update_ref(store, &cfg.spec, &dag.node(i).id, &material, key)?;
                        let outcome = if own_keys.contains(&key) {
                            Outcome::Cached
                        } else {
                            Outcome::ComputedElsewhere
                        };
                        reports[i] = Some(report(i, Some(key), outcome));
                        state[i] = State::Finished;
                        progressed = true;
                        finished(observer, i, outcome, None, None);
                        continue;
                    }
                }
                free_threads -= threads;
                free_memory = free_memory.saturating_sub(res.memory_mb);
                if let Some(g) = gpu {
                    gpu_free[g] = gpu_free[g].saturating_sub(res.gpu_memory_mb);
                    gpu_running[g] += 1;
                    gpu_of[i] = Some(g);
                }
                running += 1;
                own_keys.insert(key);
                state[i] = State::Running;
                reports[i] = Some(report(i, Some(key), Outcome::Executed));
                observer.event(RunEvent::Started {
                    node: i,
                    id: &dag.node(i).id,
                });
                let job = Job {
                    index: i,
                    dag_node: dag.node(i).clone(),
                    material,
                    key,
                    sources: dag
                        .node(i)
                        .inputs
                        .iter()
                        .filter_map(|(name, _)| {
                            source_bytes
                                .get(&(i, name.clone()))
                                .map(|b| (name.clone(), b.clone()))
                        })
                        .collect(),
                    threads,
                    gpu,
                    store: store.clone(),
                    cfg: cfg.clone(),
                };
                let tx = tx.clone();
                let ptx = ptx.clone();
                std::thread::Builder::new()
                    .name(format!("upcc-node-{i}"))
                    .spawn(move || {
                        let node = job.index;
                        let result = job.execute(lease, ptx);
                        let _ = tx.send(Event::Finished { node, result });
                    })
                    .map_err(|e| {
                        EngineError::Internal(format!("cannot spawn a worker thread: {e}"))
                    })?;
            }
        }

        if progressed {
            // Nodes finished without running (computed elsewhere): resolve their dependents.
            continue;
        }
        let waiting_any = state.iter().any(|s| matches!(s, State::Waiting { .. }));
        let ready_any = state.iter().any(|s| matches!(s, State::Ready { .. }));
        if running == 0 && (stopped || (!waiting_any && !ready_any)) {
            break;
        }

        // 3. Wait for something to happen.
        while let Ok(ev) = prx.try_recv() {
            observer.event(RunEvent::Progress {
                node: ev.node,
                id: &dag.node(ev.node).id,
                done: ev.done,
                total: ev.total,
                message: &ev.message,
            });
        }
        let event = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(e) => e,
            Err(_) => continue,
        };
        match event {
            Event::Finished { node: i, result } => {
                running -= 1;
                let res = dag.node(i).resources;
                free_threads += res.threads.clamp(1, cfg.threads.max(1));
                free_memory = (free_memory + res.memory_mb).min(cfg.memory_mb);
                let slot = gpu_of[i].take();
                if let Some(g) = slot {
                    gpu_free[g] = (gpu_free[g] + res.gpu_memory_mb).min(cfg.gpus[g]);
                    gpu_running[g] -= 1;
                }
                let r = reports[i].as_mut().expect("running node has a report");
                match result {
                    WorkerResult::Done { outputs, seconds } => {
                        r.duration_s = Some(seconds);
                        resolved[i] = Some(outputs);
                        state[i] = State::Finished;
                        finished(observer, i, Outcome::Executed, Some(seconds), None);
                    }
                    WorkerResult::TaskFailed { error, seconds } => {
                        if let (TaskError::DeviceLost(why), Some(g)) = (&error, slot) {
                            gpu_lost[g].get_or_insert_with(|| why.clone());
                        }
                        r.duration_s = Some(seconds);
                        r.outcome = Outcome::Failed;
                        r.error_tier = Some(if error.is_user_error() {
                            Tier::User
                        } else {
                            Tier::Environment
                        });
                        r.error = Some(error.to_string());
                        state[i] = State::Finished;
                        finished(
                            observer,
                            i,
                            Outcome::Failed,
                            Some(seconds),
                            Some(&error.to_string()),
                        );
                        if !cfg.keep_going {
                            stopped = true;
                        }
                    }
                    WorkerResult::CorruptInput {
                        input,
                        digest,
                        message,
                    } => {
                        // Never serve it: quarantine, forget the producer's result, rerun both.
                        store.quarantine_object(&digest)?;
                        let up = dag.upstream(i).into_iter().find(|&u| {
                            dag.node(i).inputs.iter().any(|(n, inp)| {
                                n == &input
                                    && matches!(inp, InputDef::Node { node, .. } if node.0 == u)
                            })
                        });
                        corrupt_retries[i] += 1;
                        observer.event(RunEvent::Corrupt {
                            digest,
                            message: &message,
                        });
                        match up {
                            Some(u) if corrupt_retries[i] <= 2 => {
                                if let Some(k) = reports[u].as_ref().and_then(|r| r.key) {
                                    store.quarantine_manifest(&k)?;
                                }
                                resolved[u] = None;
                                reports[u] = None;
                                state[u] = State::Pending;
                                reports[i] = None;
                                state[i] = State::Pending;
                                observer.event(RunEvent::Reopened { node: i });
                            }
                            _ => {
                                let r = reports[i].as_mut().expect("report");
                                r.outcome = Outcome::Failed;
                                r.error_tier = Some(Tier::Environment);
                                r.error = Some(format!(
                                    "input `{input}` is corrupt in the store: {message}"
                                ));
                                state[i] = State::Finished;
                                if !cfg.keep_going {
                                    stopped = true;
                                }
                            }
                        }
                    }
                    WorkerResult::Engine(e) => {
                        r.outcome = Outcome::Failed;
                        r.error_tier = Some(e.tier());
                        r.error = Some(e.to_string());
                        state[i] = State::Finished;
                        finished(observer, i, Outcome::Failed, None, Some(&e.to_string()));
                        if !cfg.keep_going {
                            stopped = true;
                        }
                    }
                }
            }
        }
    }

    let nodes = (0..n)
        .map(|i| {
            reports[i].take().unwrap_or_else(|| {
                let mut r = report(i, None, Outcome::Skipped);
                r.error = Some("not started: the run stopped after a failure (use --keep-going to run independent nodes)".into());
                r
            })
        })
        .collect();
    Ok(RunReport { nodes })
}

fn update_ref(
    store: &Store,
    spec: &str,
    node_id: &str,
    material: &KeyMaterial,
    key: Digest<NodeKeyTag>,
) -> Result<(), EngineError> {
    let current = store.read_ref(spec, node_id)?;
    if current.as_ref().map(|r| r.key) != Some(key) {
        store.write_ref(
            spec,
            &RefRecord {
                node_id: node_id.to_string(),
                key,
                material: material.clone(),
            },
        )?;
    }
    Ok(())
}

struct Job {
    index: usize,
    dag_node: crate::dag::NodeDef,
    material: KeyMaterial,
    key: Digest<NodeKeyTag>,
    sources: BTreeMap<String, Arc<Vec<u8>>>,
    threads: usize,
    gpu: Option<usize>,
    store: Store,
    cfg: RunConfig,
}

impl Job {
    fn execute(self, lease: Lease, progress: Sender<ProgressEvent>) -> WorkerResult {
        let _span =
            tracing::info_span!("node", id = %self.dag_node.id, key = %self.key.short()).entered();
        tracing::debug!(
            material = %self.material.canonical_json().unwrap_or_default(),
            "key material"
        );
        let started_at = SystemTime::now();
        let t0 = Instant::now();
        let mut inputs = BTreeMap::new();
        for (name, _) in &self.dag_node.inputs {
            if let Some(bytes) = self.sources.get(name) {
                inputs.insert(name.clone(), bytes.clone());
                continue;
            }
            let digest = self.material.inputs[name];
            match self.store.read_object(&digest) {
                Ok(bytes) => {
                    inputs.insert(name.clone(), Arc::new(bytes));
                }
                Err(e @ (StoreError::Corrupt { .. } | StoreError::MissingObject(_))) => {
                    return WorkerResult::CorruptInput {
                        input: name.clone(),
                        digest,
                        message: e.to_string(),
                    };
                }
                Err(e) => return WorkerResult::Engine(e.into()),
            }
        }
        let pool = match rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .build()
        {
            Ok(p) => p,
            Err(e) => {
                return WorkerResult::Engine(EngineError::Internal(format!(
                    "cannot build a thread pool: {e}"
                )))
            }
        };
        let mut ctx = TaskContext::new(
            self.index,
            &self.dag_node.id,
            inputs,
            Some(progress),
            self.threads,
        )
        .with_gpu(self.gpu);
        ctx.log(format!(
            "stage {} v{} key {}, {} threads{}",
            self.dag_node.stage,
            self.dag_node.stage_version,
            self.key,
            self.threads,
            self.gpu
                .map(|g| format!(", GPU slot {g}"))
                .unwrap_or_default()
        ));
        let task = self.dag_node.task.clone();
        let outcome =
            pool.install(|| std::panic::catch_unwind(AssertUnwindSafe(|| task.run(&mut ctx))));
        let seconds = t0.elapsed().as_secs_f64();
        let result = match outcome {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                Err(TaskError::Failed(format!("internal error (panic): {msg}")))
            }
        };
        if let Err(error) = result {
            ctx.log(format!("FAILED: {error}"));
            let (_, _, log) = ctx.into_parts();
            let _ = self.store.write_log(&self.key, &log);
            drop(lease);
            return WorkerResult::TaskFailed { error, seconds };
        }
        let (pending, summary, log) = ctx.into_parts();
        let result = self.publish(pending, summary, &log, started_at, seconds);
        drop(lease);
        match result {
            Ok(outputs) => WorkerResult::Done { outputs, seconds },
            Err(e) => WorkerResult::Engine(e),
        }
    }

    fn publish(
        &self,
        pending: BTreeMap<String, crate::task::PendingOutput>,
        summary: serde_json::Value,
        log: &str,
        started_at: SystemTime,
        seconds: f64,
    ) -> Result<BTreeMap<String, OutputRecord>, EngineError> {
        let declared: BTreeSet<&String> = self.dag_node.outputs.iter().collect();
        let produced: BTreeSet<&String> = pending.keys().collect();
        if declared != produced {
            return Err(EngineError::Internal(format!(
                "stage `{}` produced outputs {:?} but declares {:?}",
                self.dag_node.stage, produced, declared
            )));
        }
        let mut outputs = BTreeMap::new();
        for (name, out) in pending {
            let digest = self.store.put_object(&out.bytes)?;
            outputs.insert(
                name,
                OutputRecord {
                    digest,
                    bytes: out.bytes.len() as u64,
                    media_type: out.media_type,
                    file_name: out.file_name,
                },
            );
        }
        let p = &self.cfg.provenance;
        let manifest = Manifest {
            manifest_schema: MANIFEST_SCHEMA_VERSION,
            key: self.key,
            node_id: self.dag_node.id.clone(),
            material: self.material.clone(),
            outputs: outputs.clone(),
            summary,
            provenance: Provenance {
                tool: p.tool.clone(),
                tool_version: p.tool_version.clone(),
                git_revision: p.git_revision.clone(),
                host: host_name(),
                user: p.user.clone(),
                pid: std::process::id(),
                run_id: p.run_id.clone(),
                started_at: rfc3339(started_at),
                finished_at: rfc3339(SystemTime::now()),
                duration_s: seconds,
                threads: self.threads,
                process_peak_rss_bytes: peak_rss_bytes(),
                cpu: p.cpu.clone(),
                os: p.os.clone(),
                libraries: p.libraries.clone(),
            },
            seal: None,
        };
        self.store.write_manifest(&manifest)?;
        self.store.write_log(&self.key, log)?;
        update_ref(
            &self.store,
            &self.cfg.spec,
            &self.dag_node.id,
            &self.material,
            self.key,
        )?;
        Ok(outputs)
    }
}
