//! The local executor: runs ready nodes in parallel under CPU and memory slots.
//!
//! Scheduling happens on the calling thread; every node runs on its own worker thread inside
//! a rayon pool of the threads it asked for. A node is run only while its lease is held, and
//! its outputs are stored before its manifest, so a crash or a kill at any moment leaves
//! either a complete result or none. Independent nodes keep going when one fails if
//! `keep_going` is set; results already stored are never lost.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::dag::{Dag, InputDef};
use crate::digest::{Artifact, Digest, NodeKeyTag};
use crate::error::{EngineError, Tier};
use crate::fsutil::{host_name, peak_rss_bytes, rfc3339};
use crate::key::KeyMaterial;
use crate::lease::{try_acquire, Lease, LeaseAttempt, LeaseHolder};
use crate::plan::{material_for, SourceCache};
use crate::remote::RemoteCache;
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
    /// Every node is settled; the run waits for `left` uploads to the remote cache.
    Uploading { left: usize },
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
    /// The remote cache: asked for every node before it is computed (the node is downloaded
    /// when the remote holds its key), and given every node computed here.
    pub remote: Option<Arc<RemoteCache>>,
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
    /// Downloaded from the remote cache (computed on another machine).
    Downloaded,
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
    /// A user error's structured fields (file and place, section and fields), when it has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_detail: Option<serde_json::Value>,
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
    /// The remote cache held the node: downloaded and published here.
    Fetched {
        outputs: BTreeMap<String, OutputRecord>,
        seconds: f64,
    },
    /// The remote cache could not answer: compute the node.
    NotOnRemote,
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

/// The scheduling state of a run: each node's state, resolved outputs and report, the keys
/// this process started, what the running nodes hold, and whether the run stopped after a
/// failure. Every way a node finishes goes through its methods, so the sequence (outputs, ref,
/// report, state, event) is written once.
struct Sched<'a> {
    dag: &'a Dag,
    store: &'a Store,
    cfg: &'a RunConfig,
    observer: &'a mut dyn Observer,
    state: Vec<State>,
    resolved: Vec<Option<BTreeMap<String, OutputRecord>>>,
    reports: Vec<Option<NodeReport>>,
    /// Keys this process started: a second node of the same key (two methods of one kind)
    /// waits for it quietly and then reads as cached, not as another process's work.
    own_keys: std::collections::HashSet<Digest<NodeKeyTag>>,
    /// Nodes the remote cache was asked for (and could not answer).
    remote_tried: Vec<bool>,
    stopped: bool,
    slots: Slots,
    sources: SourceCache,
    /// The bytes of each node's source inputs, read when its key was computed.
    source_bytes: HashMap<(usize, String), Arc<Vec<u8>>>,
    /// How often each node found a corrupt input (it reruns its producer twice at most).
    corrupt_retries: Vec<u32>,
    /// What each running node holds (a download holds less than a computation), and the key
    /// of each node being downloaded (to compute it if the remote cannot answer).
    running_res: Vec<Option<crate::task::Resources>>,
    fetching: Vec<Option<(KeyMaterial, Digest<NodeKeyTag>)>>,
    /// Where workers send their results and their progress, and their results to upload.
    done_tx: Sender<Event>,
    progress_tx: Sender<ProgressEvent>,
    uploads: Option<&'a Uploads>,
}

/// Whether starting a node progressed the run without starting it (another process had
/// finished it, or it failed before it could start), so that its dependents can resolve.
#[derive(PartialEq)]
enum Started {
    Yes,
    No,
    SettledHere,
}

impl<'a> Sched<'a> {
    fn new(
        dag: &'a Dag,
        store: &'a Store,
        cfg: &'a RunConfig,
        observer: &'a mut dyn Observer,
        done_tx: Sender<Event>,
        progress_tx: Sender<ProgressEvent>,
    ) -> Self {
        let n = dag.len();
        Sched {
            dag,
            store,
            cfg,
            observer,
            state: (0..n).map(|_| State::Pending).collect(),
            resolved: vec![None; n],
            reports: vec![None; n],
            own_keys: Default::default(),
            remote_tried: vec![false; n],
            stopped: false,
            slots: Slots::new(cfg, n),
            sources: SourceCache::new(true),
            source_bytes: HashMap::new(),
            corrupt_retries: vec![0; n],
            running_res: vec![None; n],
            fetching: vec![None; n],
            done_tx,
            progress_tx,
            uploads: None,
        }
    }

    fn report(&self, i: usize, key: Option<Digest<NodeKeyTag>>, outcome: Outcome) -> NodeReport {
        let node = self.dag.node(i);
        NodeReport {
            id: node.id.clone(),
            stage: node.stage.clone(),
            key,
            outcome,
            duration_s: None,
            error: None,
            error_tier: None,
            error_detail: None,
            labels: node.labels.clone(),
        }
    }

    /// Node `i` is finished (its report already says how): tell the observer.
    fn finished(&mut self, i: usize, seconds: Option<f64>, error: Option<&str>) {
        self.state[i] = State::Finished;
        let outcome = self.reports[i]
            .as_ref()
            .expect("a finished node has a report")
            .outcome;
        self.observer.event(RunEvent::Finished {
            node: i,
            id: &self.dag.node(i).id,
            outcome,
            seconds,
            error,
        });
    }

    /// Node `i`'s result `key` is in the store: take its outputs and finish it as cached
    /// (`found_waiting`: after waiting, computed by another process unless by this one).
    fn found(
        &mut self,
        i: usize,
        material: &KeyMaterial,
        key: Digest<NodeKeyTag>,
        outputs: BTreeMap<String, OutputRecord>,
        found_waiting: bool,
    ) -> Result<(), EngineError> {
        self.resolved[i] = Some(outputs);
        update_ref(
            self.store,
            &self.cfg.spec,
            &self.dag.node(i).id,
            material,
            key,
        )?;
        let outcome = if found_waiting && !self.own_keys.contains(&key) {
            Outcome::ComputedElsewhere
        } else {
            Outcome::Cached
        };
        self.reports[i] = Some(self.report(i, Some(key), outcome));
        self.finished(i, None, None);
        Ok(())
    }

    /// Node `i` failed (`tier`, `error`); the run stops unless told to keep going.
    fn failed(&mut self, i: usize, tier: Tier, error: String, seconds: Option<f64>) {
        let mut r = self.reports[i]
            .take()
            .unwrap_or_else(|| self.report(i, None, Outcome::Failed));
        r.outcome = Outcome::Failed;
        r.duration_s = seconds.or(r.duration_s);
        r.error_tier = Some(tier);
        r.error = Some(error.clone());
        self.reports[i] = Some(r);
        self.finished(i, seconds, Some(&error));
        if !self.cfg.keep_going {
            self.stopped = true;
        }
    }

    /// Resolve the pending nodes whose inputs are all known (in topological order, so one
    /// pass): skipped after a failed upstream, cached when fresh in the store, else ready.
    fn resolve_pending(&mut self) -> Result<(), EngineError> {
        for i in 0..self.dag.len() {
            if !matches!(self.state[i], State::Pending) {
                continue;
            }
            if self.dag.upstream(i).iter().any(|&u| {
                matches!(
                    self.reports[u].as_ref().map(|r| r.outcome),
                    Some(Outcome::Failed | Outcome::Skipped)
                )
            }) {
                let mut r = self.report(i, None, Outcome::Skipped);
                r.error = Some("an upstream node failed".into());
                self.reports[i] = Some(r);
                self.finished(i, None, None);
                continue;
            }
            let Some(material) = material_for(self.dag, i, &self.resolved, &mut self.sources)?
            else {
                continue;
            };
            for (name, input) in &self.dag.node(i).inputs {
                if let InputDef::Source(src) = input {
                    let bytes = self.sources.get(src)?.1;
                    self.source_bytes.insert((i, name.clone()), bytes);
                }
            }
            let key = material.digest()?;
            if !self.cfg.force.contains(&i) {
                if let Some(m) = self.store.fresh_manifest(&key)? {
                    self.found(i, &material, key, m.outputs, false)?;
                    continue;
                }
                if self.store.keeps_code_changes() {
                    let prev = self.store.read_ref(&self.cfg.spec, &self.dag.node(i).id)?;
                    if let Some((m, _)) = self.store.kept_despite_code(prev.as_ref(), &material)? {
                        let prev = prev.expect("a kept result has a ref");
                        self.found(i, &prev.material, prev.key, m.outputs, false)?;
                        continue;
                    }
                }
            }
            self.state[i] = State::Ready { material, key };
        }
        Ok(())
    }

    /// Start every ready node that fits, and look again at the nodes waiting for another
    /// process when `poll_due`. Whether a node settled without starting.
    fn start_ready(&mut self, poll_due: bool) -> Result<bool, EngineError> {
        let mut progressed = false;
        if self.stopped {
            return Ok(false);
        }
        for i in 0..self.dag.len() {
            let waiting = matches!(self.state[i], State::Waiting { .. });
            if matches!(self.state[i], State::Ready { .. }) || (waiting && poll_due) {
                progressed |= self.start(i, waiting)? == Started::SettledHere;
            }
        }
        Ok(progressed)
    }

    /// Start ready (or `waiting`) node `i` if it fits and its lease is free: download it from
    /// the remote cache, or compute it, on a worker thread.
    fn start(&mut self, i: usize, waiting: bool) -> Result<Started, EngineError> {
        let (dag, cfg) = (self.dag, self.cfg);
        let (material, key) = match &self.state[i] {
            State::Ready { material, key } | State::Waiting { material, key } => {
                (material.clone(), *key)
            }
            _ => unreachable!("only ready and waiting nodes start"),
        };
        let forced = cfg.force.contains(&i);
        if waiting && !forced {
            if let Some(m) = self.store.fresh_manifest(&key)? {
                self.found(i, &material, key, m.outputs, true)?;
                return Ok(Started::SettledHere);
            }
        }
        // A node the remote cache may hold is first only downloaded: one thread, no memory or
        // GPU slot; computed (with its resources) when the remote cannot answer.
        let fetch = cfg
            .remote
            .as_ref()
            .is_some_and(|r| r.unreachable().is_none())
            && !self.remote_tried[i]
            && !forced;
        let res = if fetch {
            crate::task::Resources {
                threads: 1,
                memory_mb: 0,
                gpu_memory_mb: 0,
            }
        } else {
            dag.node(i).resources
        };
        let threads = res.threads.clamp(1, cfg.threads.max(1));
        if !(if fetch {
            self.slots.free_fetches > 0
        } else {
            self.slots.fits(&res, threads)
        }) {
            return Ok(Started::No);
        }
        // When every GPU is lost, a node that needs one fails.
        let needs_gpu = res.gpu_memory_mb > 0 && !cfg.gpus.is_empty();
        if let Some(why) = self.slots.all_gpus_lost().filter(|_| needs_gpu) {
            let msg = format!(
                "not started: every GPU of this run failed earlier and cannot be used again by this process ({why}); run upcc again to retry on a fresh GPU context"
            );
            self.reports[i] = Some(self.report(i, Some(key), Outcome::Failed));
            self.failed(i, Tier::Environment, msg, None);
            return Ok(Started::SettledHere);
        }
        let gpu = match needs_gpu.then(|| self.slots.pick_gpu(res.gpu_memory_mb)) {
            Some(None) => return Ok(Started::No),
            Some(g) => g,
            None => None,
        };
        let lock_path = self.store.ensure_lock_parent(&key)?;
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
                if !waiting && !self.own_keys.contains(&key) {
                    self.observer.event(RunEvent::Waiting {
                        id: &dag.node(i).id,
                        holder: who.as_ref(),
                    });
                }
                self.state[i] = State::Waiting { material, key };
                return Ok(Started::No);
            }
        };
        // Someone may have finished it between our check and the lease.
        if !forced {
            if let Some(m) = self.store.fresh_manifest(&key)? {
                drop(lease);
                self.found(i, &material, key, m.outputs, true)?;
                return Ok(Started::SettledHere);
            }
        }
        self.slots.take(i, &res, threads, gpu, fetch);
        self.own_keys.insert(key);
        self.state[i] = State::Running;
        self.running_res[i] = Some(res);
        if fetch {
            self.fetching[i] = Some((material.clone(), key));
            self.reports[i] = Some(self.report(i, Some(key), Outcome::Downloaded));
        } else {
            self.reports[i] = Some(self.report(i, Some(key), Outcome::Executed));
            self.observer.event(RunEvent::Started {
                node: i,
                id: &dag.node(i).id,
            });
        }
        let node = dag.node(i);
        let job = Job {
            fetch_only: fetch,
            index: i,
            dag_node: node.clone(),
            material,
            key,
            sources: node
                .inputs
                .iter()
                .filter_map(|(name, _)| {
                    self.source_bytes
                        .get(&(i, name.clone()))
                        .map(|b| (name.clone(), b.clone()))
                })
                .collect(),
            threads,
            gpu,
            store: self.store.clone(),
            cfg: cfg.clone(),
            uploads: if fetch {
                None
            } else {
                self.uploads.and_then(|u| u.queue.clone())
            },
        };
        let (tx, ptx) = (self.done_tx.clone(), self.progress_tx.clone());
        std::thread::Builder::new()
            .name(format!("upcc-node-{i}"))
            .spawn(move || {
                let node = job.index;
                let result = job.execute(lease, ptx);
                let _ = tx.send(Event::Finished { node, result });
            })
            .map_err(|e| EngineError::Internal(format!("cannot spawn a worker thread: {e}")))?;
        Ok(Started::Yes)
    }

    /// Whether the run is over: nothing running, and nothing left that could start.
    fn over(&self) -> bool {
        let left = self
            .state
            .iter()
            .any(|s| matches!(s, State::Waiting { .. } | State::Ready { .. }));
        self.slots.running == 0 && (self.stopped || !left)
    }

    /// Tell the observer what the running nodes reported of their progress.
    fn forward_progress(&mut self, progress: &Receiver<ProgressEvent>) {
        while let Ok(ev) = progress.try_recv() {
            self.observer.event(RunEvent::Progress {
                node: ev.node,
                id: &self.dag.node(ev.node).id,
                done: ev.done,
                total: ev.total,
                message: &ev.message,
            });
        }
    }

    /// Node `i`'s worker finished with `result`: give back what it held and settle it.
    fn on_finished(&mut self, i: usize, result: WorkerResult) -> Result<(), EngineError> {
        let res = self.running_res[i]
            .take()
            .expect("a running node holds resources");
        let slot = self.slots.release(i, &res, self.cfg);
        match result {
            WorkerResult::Fetched { outputs, seconds }
            | WorkerResult::Done { outputs, seconds } => {
                let r = self.reports[i].as_mut().expect("running node has a report");
                r.duration_s = Some(seconds);
                self.resolved[i] = Some(outputs);
                self.finished(i, Some(seconds), None);
            }
            WorkerResult::NotOnRemote => {
                // Compute it: back to ready, with the remote out of the question.
                self.remote_tried[i] = true;
                self.reports[i] = None;
                let (material, key) = self.fetching[i].take().expect("kept when started");
                self.state[i] = State::Ready { material, key };
            }
            WorkerResult::TaskFailed { error, seconds } => {
                if let (TaskError::DeviceLost(why), Some(g)) = (&error, slot) {
                    self.slots.gpu_lost[g].get_or_insert_with(|| why.clone());
                }
                let tier = if error.is_user_error() {
                    Tier::User
                } else {
                    Tier::Environment
                };
                self.failed(i, tier, error.to_string(), Some(seconds));
                if let Some(r) = self.reports[i].as_mut() {
                    r.error_detail = error.detail().cloned();
                }
            }
            WorkerResult::CorruptInput {
                input,
                digest,
                message,
            } => self.on_corrupt_input(i, &input, digest, &message)?,
            WorkerResult::Engine(e) => self.failed(i, e.tier(), e.to_string(), None),
        }
        Ok(())
    }

    /// Node `i` found its input `input` corrupt (object `digest`): never serve it. Quarantine
    /// it, forget the producer's result and rerun both (twice at most), else fail.
    fn on_corrupt_input(
        &mut self,
        i: usize,
        input: &str,
        digest: Digest<Artifact>,
        message: &str,
    ) -> Result<(), EngineError> {
        let dag = self.dag;
        self.store.quarantine_object(&digest)?;
        let up = dag.upstream(i).into_iter().find(|&u| {
            dag.node(i).inputs.iter().any(|(n, inp)| {
                n == input && matches!(inp, InputDef::Node { node, .. } if node.0 == u)
            })
        });
        self.corrupt_retries[i] += 1;
        self.observer.event(RunEvent::Corrupt { digest, message });
        match up {
            Some(u) if self.corrupt_retries[i] <= 2 => {
                if let Some(k) = self.reports[u].as_ref().and_then(|r| r.key) {
                    self.store.quarantine_manifest(&k)?;
                }
                self.resolved[u] = None;
                self.reports[u] = None;
                self.state[u] = State::Pending;
                self.reports[i] = None;
                self.state[i] = State::Pending;
                self.observer.event(RunEvent::Reopened { node: i });
            }
            _ => self.failed(
                i,
                Tier::Environment,
                format!("input `{input}` is corrupt in the store: {message}"),
                None,
            ),
        }
        Ok(())
    }

    /// The run's report: every node's, those never started skipped.
    fn into_report(mut self) -> RunReport {
        let nodes = (0..self.dag.len())
            .map(|i| {
                self.reports[i].take().unwrap_or_else(|| {
                    let mut r = self.report(i, None, Outcome::Skipped);
                    r.error = Some("not started: the run stopped after a failure (use --keep-going to run independent nodes)".into());
                    r
                })
            })
            .collect();
        RunReport { nodes }
    }
}

/// What the run's nodes may use at once: threads, memory and the GPU slots.
struct Slots {
    free_threads: usize,
    /// Downloads that may start (they hold no thread), and which running nodes are downloads.
    free_fetches: usize,
    fetch_of: Vec<bool>,
    free_memory: u64,
    /// Free GPU memory per slot, nodes running per slot, and each running node's slot.
    gpu_free: Vec<u64>,
    gpu_running: Vec<usize>,
    gpu_of: Vec<Option<usize>>,
    /// GPU slots lost for this run (a node on them failed with a sticky device error), with
    /// the error that lost them.
    gpu_lost: Vec<Option<String>>,
    running: usize,
}

impl Slots {
    fn new(cfg: &RunConfig, n: usize) -> Self {
        Slots {
            free_threads: cfg.threads.max(1),
            free_fetches: FETCHES_AT_ONCE,
            fetch_of: vec![false; n],
            free_memory: cfg.memory_mb,
            gpu_free: cfg.gpus.clone(),
            gpu_running: vec![0; cfg.gpus.len()],
            gpu_of: vec![None; n],
            gpu_lost: vec![None; cfg.gpus.len()],
            running: 0,
        }
    }

    /// Whether a node of these resources (and `threads`) fits now (one always runs alone).
    fn fits(&self, res: &crate::task::Resources, threads: usize) -> bool {
        threads <= self.free_threads && (res.memory_mb <= self.free_memory || self.running == 0)
    }

    /// Every GPU slot of the run is lost: why (the first loss).
    fn all_gpus_lost(&self) -> Option<String> {
        (!self.gpu_lost.is_empty() && self.gpu_lost.iter().all(Option::is_some)).then(|| {
            self.gpu_lost
                .iter()
                .flatten()
                .next()
                .cloned()
                .unwrap_or_default()
        })
    }

    /// A GPU slot with room for `gpu_memory_mb` (most free memory first; an idle GPU always
    /// takes it), never one lost earlier in this run.
    fn pick_gpu(&self, gpu_memory_mb: u64) -> Option<usize> {
        (0..self.gpu_free.len())
            .filter(|&g| self.gpu_lost[g].is_none())
            .filter(|&g| gpu_memory_mb <= self.gpu_free[g] || self.gpu_running[g] == 0)
            .max_by_key(|&g| (self.gpu_free[g], std::cmp::Reverse(g)))
    }

    fn take(
        &mut self,
        i: usize,
        res: &crate::task::Resources,
        threads: usize,
        gpu: Option<usize>,
        fetch: bool,
    ) {
        if fetch {
            self.free_fetches -= 1;
            self.fetch_of[i] = true;
            self.running += 1;
            return;
        }
        self.free_threads -= threads;
        self.free_memory = self.free_memory.saturating_sub(res.memory_mb);
        if let Some(g) = gpu {
            self.gpu_free[g] = self.gpu_free[g].saturating_sub(res.gpu_memory_mb);
            self.gpu_running[g] += 1;
            self.gpu_of[i] = Some(g);
        }
        self.running += 1;
    }

    /// Give back what node `i` held; its GPU slot, if it had one.
    fn release(
        &mut self,
        i: usize,
        res: &crate::task::Resources,
        cfg: &RunConfig,
    ) -> Option<usize> {
        self.running -= 1;
        if std::mem::take(&mut self.fetch_of[i]) {
            self.free_fetches += 1;
            return None;
        }
        self.free_threads += res.threads.clamp(1, cfg.threads.max(1));
        self.free_memory = (self.free_memory + res.memory_mb).min(cfg.memory_mb);
        let slot = self.gpu_of[i].take();
        if let Some(g) = slot {
            self.gpu_free[g] = (self.gpu_free[g] + res.gpu_memory_mb).min(cfg.gpus[g]);
            self.gpu_running[g] -= 1;
        }
        slot
    }
}

/// Downloads from the remote cache at once: they hold no CPU thread (their time is the
/// bucket's latency), so a slow bucket is paid once per wave of ready nodes, not per node.
const FETCHES_AT_ONCE: usize = crate::remote::DOWNLOADS_AT_ONCE;

/// Uploads to the remote cache at once, on threads of their own beside the nodes.
const UPLOADS_AT_ONCE: usize = 4;

/// The run's uploads: workers hand each computed result here and go on; the run waits for
/// them only at its end. A remote that fails only warns (the result is stored locally and
/// `upcc push` uploads it later).
struct Uploads {
    queue: Option<UploadQueue>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Where a worker hands its result to be uploaded, and how many are handed and not done.
#[derive(Clone)]
struct UploadQueue {
    tx: Sender<Manifest>,
    pending: Arc<AtomicUsize>,
}

impl UploadQueue {
    fn push(&self, m: Manifest) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(m).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Uploads {
    fn start(remote: &Arc<RemoteCache>, store: &Store) -> Result<Self, EngineError> {
        let (tx, rx) = channel::<Manifest>();
        let rx = Arc::new(Mutex::new(rx));
        let pending = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for t in 0..UPLOADS_AT_ONCE {
            let (rx, remote, store) = (rx.clone(), remote.clone(), store.clone());
            let pending = pending.clone();
            let span = tracing::Span::current();
            let handle = std::thread::Builder::new()
                .name(format!("upcc-upload-{t}"))
                .spawn(move || {
                    let _span = span.entered();
                    loop {
                        // The lock is held to take the next result, never during its upload.
                        let next = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        let Ok(m) = next else { return };
                        if let Err(e) = remote.upload(&store, &m) {
                            tracing::warn!("upload of {} failed: {e}", m.key.short());
                        }
                        pending.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .map_err(|e| {
                    EngineError::Internal(format!("cannot spawn an upload thread: {e}"))
                })?;
            threads.push(handle);
        }
        Ok(Uploads {
            queue: Some(UploadQueue { tx, pending }),
            threads,
        })
    }

    /// Wait for every upload handed over (the workers have all ended by now).
    fn finish(mut self, observer: &mut dyn Observer) {
        if let Some(q) = self.queue.take() {
            let left = q.pending.load(Ordering::SeqCst);
            if left > 0 {
                observer.event(RunEvent::Uploading { left });
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run every node of `dag` that is not fresh in `store`, telling `observer` as it goes.
pub fn run(
    dag: &Dag,
    store: &Store,
    cfg: &RunConfig,
    observer: &mut dyn Observer,
) -> Result<RunReport, EngineError> {
    let (tx, rx): (Sender<Event>, Receiver<Event>) = channel();
    let (ptx, prx) = channel::<ProgressEvent>();
    let uploads = match &cfg.remote {
        Some(remote) => Some(Uploads::start(remote, store)?),
        None => None,
    };
    let mut sc = Sched::new(dag, store, cfg, observer, tx, ptx);
    sc.uploads = uploads.as_ref();
    // The objects of every result the remote holds for this run come down together, in the
    // background (a chain of results is one wave of downloads, not one node after another).
    // Planned with the run's own source cache: each source file is still read once.
    let prefetch = cfg
        .remote
        .as_ref()
        .filter(|r| r.unreachable().is_none())
        .and_then(|remote| {
            let entries = crate::plan::plan_with_sources(
                dag,
                store,
                &cfg.spec,
                Some(remote),
                &mut sc.sources,
            )
            .ok()?;
            let keys: Vec<_> = entries
                .iter()
                .enumerate()
                .filter(|(i, e)| e.remote && !cfg.force.contains(i))
                .filter_map(|(_, e)| e.key)
                .collect();
            Some(remote.prefetch(store, &keys, FETCHES_AT_ONCE))
        });
    let mut last_poll = Instant::now() - cfg.poll_interval;
    loop {
        sc.resolve_pending()?;
        let poll_due = last_poll.elapsed() >= cfg.poll_interval;
        if poll_due {
            last_poll = Instant::now();
        }
        if sc.start_ready(poll_due)? {
            // Nodes finished without running (computed elsewhere): resolve their dependents.
            continue;
        }
        if sc.over() {
            break;
        }
        sc.forward_progress(&prx);
        if let Ok(Event::Finished { node, result }) = rx.recv_timeout(Duration::from_millis(100)) {
            sc.on_finished(node, result)?;
        }
    }
    let report = sc.into_report();
    if let Some(p) = prefetch {
        p.finish();
    }
    if let Some(u) = uploads {
        u.finish(observer);
    }
    Ok(report)
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
    /// Only download the node from the remote cache (report `NotOnRemote` if it cannot).
    fetch_only: bool,
    index: usize,
    dag_node: crate::dag::NodeDef,
    material: KeyMaterial,
    key: Digest<NodeKeyTag>,
    sources: BTreeMap<String, Arc<Vec<u8>>>,
    threads: usize,
    gpu: Option<usize>,
    store: Store,
    cfg: RunConfig,
    /// Where a computed result goes to be uploaded (when the run has a remote).
    uploads: Option<UploadQueue>,
}

impl Job {
    fn execute(self, lease: Lease, progress: Sender<ProgressEvent>) -> WorkerResult {
        let _span =
            tracing::info_span!("node", id = %self.dag_node.id, key = %self.key.short()).entered();
        if self.fetch_only {
            let t0 = Instant::now();
            let remote = self.cfg.remote.as_ref().expect("fetch jobs have a remote");
            let got = remote.fetch(&self.store, &self.key);
            let result = match got {
                Ok(Some(m)) => match update_ref(
                    &self.store,
                    &self.cfg.spec,
                    &self.dag_node.id,
                    &self.material,
                    self.key,
                ) {
                    Ok(()) => WorkerResult::Fetched {
                        outputs: m.outputs,
                        seconds: t0.elapsed().as_secs_f64(),
                    },
                    Err(e) => WorkerResult::Engine(e),
                },
                Ok(None) => WorkerResult::NotOnRemote,
                Err(e) => WorkerResult::Engine(e.into()),
            };
            drop(lease);
            return result;
        }
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
            Ok(manifest) => {
                // Shared with other machines once it is safely here, in the background: its
                // dependants start now, not after the upload (a slow bucket is not paid on the
                // critical path).
                if let Some(uploads) = &self.uploads {
                    uploads.push(manifest.clone());
                }
                WorkerResult::Done {
                    outputs: manifest.outputs,
                    seconds,
                }
            }
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
    ) -> Result<Manifest, EngineError> {
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
            outputs,
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
            signature: None,
        };
        let manifest = self.store.write_manifest(&manifest)?;
        self.store.write_log(&self.key, log)?;
        update_ref(
            &self.store,
            &self.cfg.spec,
            &self.dag_node.id,
            &self.material,
            self.key,
        )?;
        Ok(manifest)
    }
}
