//! Engine behaviour on toy stages: caching, early cutoff, stale reasons, failures, leases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::*;

/// Emits its inputs, its node id and `salt` concatenated; counts runs.
struct Echo {
    runs: Arc<AtomicUsize>,
    fail: bool,
    sleep_ms: u64,
    /// The params' `out` field if present (so other fields change the key but not the
    /// output: early cutoff), else all params.
    salt: String,
}

impl Task for Echo {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.sleep_ms));
        if self.fail {
            return Err(TaskError::Input("bad value in `data.csv` line 3".into()));
        }
        let mut out = Vec::new();
        for name in ["a", "b"] {
            if ctx.has_input(name) {
                out.extend_from_slice(ctx.input(name)?);
            }
        }
        out.extend_from_slice(ctx.node_id().as_bytes());
        out.extend_from_slice(self.salt.as_bytes());
        ctx.put_output("out", out, "text/plain", "out.txt");
        ctx.log("done");
        Ok(())
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    runs: Vec<Arc<AtomicUsize>>,
}

fn node(
    id: &str,
    params: Value,
    inputs: Vec<(String, InputDef)>,
    runs: &Arc<AtomicUsize>,
    fail: bool,
    sleep_ms: u64,
) -> NodeDef {
    NodeDef {
        id: id.into(),
        stage: "echo".into(),
        stage_version: 1,
        params: params.clone(),
        numerics: "exact".into(),
        code: BTreeMap::new(),
        inputs,
        outputs: vec!["out".into()],
        labels: BTreeMap::new(),
        resources: Resources::default(),
        task: Arc::new(Echo {
            runs: runs.clone(),
            fail,
            sleep_ms,
            salt: params.get("out").unwrap_or(&params).to_string(),
        }),
    }
}

fn input(name: &str, i: NodeIndex) -> (String, InputDef) {
    (
        name.into(),
        InputDef::Node {
            node: i,
            output: "out".into(),
        },
    )
}

/// a → b → d ; a → c ; params of each node come from `p`.
fn diamond(f: &Fixture, p: &BTreeMap<&str, Value>, fail_c: bool) -> Dag {
    let mut b = DagBuilder::new();
    let a = b
        .add(node("a", p["a"].clone(), vec![], &f.runs[0], false, 0))
        .unwrap();
    let bb = b
        .add(node(
            "b",
            p["b"].clone(),
            vec![input("a", a)],
            &f.runs[1],
            false,
            0,
        ))
        .unwrap();
    let _c = b
        .add(node(
            "c",
            p["c"].clone(),
            vec![input("a", a)],
            &f.runs[2],
            fail_c,
            0,
        ))
        .unwrap();
    let _d = b
        .add(node(
            "d",
            p["d"].clone(),
            vec![input("a", bb)],
            &f.runs[3],
            false,
            0,
        ))
        .unwrap();
    b.build()
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("store"), false).unwrap();
    Fixture {
        _dir: dir,
        store,
        runs: (0..4).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
    }
}

fn params() -> BTreeMap<&'static str, Value> {
    BTreeMap::from([
        ("a", json!({"out": "A", "x": 1})),
        ("b", json!({"y": 1})),
        ("c", json!({})),
        ("d", json!({"z": 1})),
    ])
}

fn cfg(keep_going: bool) -> RunConfig {
    RunConfig {
        spec: "test".into(),
        threads: 2,
        memory_mb: 4096,
        keep_going,
        force: BTreeSet::new(),
        provenance: ProvenanceBase {
            run_id: "r".into(),
            ..Default::default()
        },
        poll_interval: Duration::from_millis(20),
        gpus: vec![],
        remote: None,
    }
}

fn runs(f: &Fixture) -> Vec<usize> {
    f.runs.iter().map(|r| r.load(Ordering::SeqCst)).collect()
}

#[test]
fn second_identical_run_executes_nothing() {
    let f = fixture();
    let dag = diamond(&f, &params(), false);
    let r1 = run(&dag, &f.store, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r1.count(Outcome::Executed), 4);
    let r2 = run(&dag, &f.store, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r2.count(Outcome::Executed), 0);
    assert_eq!(r2.count(Outcome::Cached), 4);
    assert_eq!(runs(&f), [1, 1, 1, 1]);
}

/// Records a run's events as text.
#[derive(Default)]
struct Recorder(Vec<String>);

impl Observer for Recorder {
    fn event(&mut self, e: RunEvent<'_>) {
        self.0.push(match e {
            RunEvent::Started { id, .. } => format!("start {id}"),
            RunEvent::Finished { id, outcome, .. } => format!("finish {id} {outcome:?}"),
            RunEvent::Progress { .. } => "progress".into(),
            RunEvent::Reopened { node } => format!("reopen {node}"),
            RunEvent::Waiting { id, .. } => format!("wait {id}"),
            RunEvent::Corrupt { .. } => "corrupt".into(),
            RunEvent::Uploading { left } => format!("uploading {left}"),
        });
    }
}

#[test]
fn the_observer_hears_each_node_start_before_it_finishes_and_once_per_run() {
    let f = fixture();
    let dag = diamond(&f, &params(), false);
    let mut rec = Recorder::default();
    run(&dag, &f.store, &cfg(false), &mut rec).unwrap();
    for id in ["a", "b", "c", "d"] {
        let start = rec.0.iter().position(|e| e == &format!("start {id}"));
        let finish = rec
            .0
            .iter()
            .position(|e| e == &format!("finish {id} Executed"));
        assert!(start.is_some() && start < finish, "{:?}", rec.0);
    }
    let d = rec.0.iter().position(|e| e == "start d").unwrap();
    let b = rec.0.iter().position(|e| e == "finish b Executed");
    assert!(
        b < Some(d),
        "d starts after its input finishes: {:?}",
        rec.0
    );
    // Cached nodes finish without starting.
    let mut again = Recorder::default();
    run(&dag, &f.store, &cfg(false), &mut again).unwrap();
    let mut got = again.0.clone();
    got.sort();
    assert_eq!(
        got,
        [
            "finish a Cached",
            "finish b Cached",
            "finish c Cached",
            "finish d Cached"
        ]
    );
}

#[test]
fn param_change_reruns_only_downstream_and_status_says_why() {
    let f = fixture();
    run(
        &diamond(&f, &params(), false),
        &f.store,
        &cfg(false),
        &mut Quiet,
    )
    .unwrap();
    let mut p = params();
    p.insert("b", json!({"y": 2}));
    let dag = diamond(&f, &p, false);
    let planned = plan(&dag, &f.store, "test").unwrap();
    let status: Vec<_> = planned.iter().map(|e| (e.id.as_str(), e.status)).collect();
    assert_eq!(
        status,
        [
            ("a", NodeStatus::Fresh),
            ("b", NodeStatus::Stale),
            ("c", NodeStatus::Fresh),
            ("d", NodeStatus::Stale)
        ]
    );
    assert_eq!(planned[1].reasons, ["param `y` changed 1 → 2"]);
    assert_eq!(planned[3].reasons, ["upstream `b` will run first"]);
    // A node never computed has no reasons, only a status.
    let fresh_store = Store::open_or_create(&f._dir.path().join("other"), false).unwrap();
    let other = plan(&dag, &fresh_store, "test").unwrap();
    assert!(other
        .iter()
        .all(|e| e.status == NodeStatus::Missing && e.reasons.is_empty()));
    assert!(other[0].material.is_some() && other[1].material.is_none());
    let r = run(&dag, &f.store, &cfg(false), &mut Quiet).unwrap();
    let executed: Vec<_> = r
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Executed)
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(executed, ["b", "d"]);
}

#[test]
fn unchanged_output_bytes_cut_off_downstream() {
    let f = fixture();
    run(
        &diamond(&f, &params(), false),
        &f.store,
        &cfg(false),
        &mut Quiet,
    )
    .unwrap();
    // `a`'s params change its key but not its output bytes (Echo only emits `out`).
    let mut p = params();
    p.insert("a", json!({"out": "A", "x": 2}));
    let r = run(&diamond(&f, &p, false), &f.store, &cfg(false), &mut Quiet).unwrap();
    let executed: Vec<_> = r
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Executed)
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(executed, ["a"]);
    assert_eq!(runs(&f), [2, 1, 1, 1]);
}

#[test]
fn failure_keeps_independent_results_and_publishes_nothing_for_the_failed_node() {
    let f = fixture();
    let dag = diamond(&f, &params(), true);
    let r = run(&dag, &f.store, &cfg(true), &mut Quiet).unwrap();
    let outcome: BTreeMap<_, _> = r.nodes.iter().map(|n| (n.id.as_str(), n.outcome)).collect();
    assert_eq!(outcome["c"], Outcome::Failed);
    assert_eq!(outcome["d"], Outcome::Executed);
    assert_eq!(r.failure_tier(), Some(Tier::User));
    let c_key = r.nodes.iter().find(|n| n.id == "c").unwrap().key.unwrap();
    assert!(f.store.read_manifest(&c_key).unwrap().is_none());
    assert!(f.store.temp_files().is_empty());
}

#[test]
fn without_keep_going_the_run_stops_starting_nodes() {
    let f = fixture();
    // Only one thread, so nodes run one at a time in order: c fails before d starts.
    let mut b = DagBuilder::new();
    let a = b
        .add(node("a", json!(1), vec![], &f.runs[0], false, 0))
        .unwrap();
    b.add(node(
        "c",
        json!(2),
        vec![input("a", a)],
        &f.runs[2],
        true,
        0,
    ))
    .unwrap();
    b.add(node(
        "d",
        json!(3),
        vec![input("a", a)],
        &f.runs[3],
        false,
        0,
    ))
    .unwrap();
    let mut c = cfg(false);
    c.threads = 1;
    let r = run(&b.build(), &f.store, &c, &mut Quiet).unwrap();
    let outcome: Vec<_> = r.nodes.iter().map(|n| n.outcome).collect();
    assert_eq!(
        outcome,
        [Outcome::Executed, Outcome::Failed, Outcome::Skipped]
    );
}

#[test]
fn corrupt_input_is_quarantined_and_its_producer_recomputed() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let dag = diamond(&f, &params(), false);
    let r = run(&dag, &f.store, &cfg(false), &mut Quiet).unwrap();
    // Corrupt b's output, then force d to rerun: it must not read the corrupt bytes.
    let b_key = r.nodes[1].key.unwrap();
    let b_out = f.store.read_manifest(&b_key).unwrap().unwrap().outputs["out"].digest;
    let path = f.store.object_path(&b_out);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let mut c = cfg(false);
    c.force.insert(3);
    let r2 = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    assert_eq!(r2.count(Outcome::Failed), 0, "{:?}", r2.nodes);
    assert_eq!(runs(&f), [1, 2, 1, 2]);
    // The recomputed producer stored the same bytes again, intact.
    assert!(f.store.read_object(&b_out).is_ok());
}

#[test]
fn two_runs_at_once_compute_each_node_once() {
    let f = fixture();
    let runs_before = runs(&f);
    assert_eq!(runs_before, [0, 0, 0, 0]);
    let mut b = DagBuilder::new();
    let a = b
        .add(node("a", json!(1), vec![], &f.runs[0], false, 150))
        .unwrap();
    b.add(node(
        "b",
        json!(2),
        vec![input("a", a)],
        &f.runs[1],
        false,
        150,
    ))
    .unwrap();
    let dag = Arc::new(b.build());
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let dag = dag.clone();
            let store = f.store.clone();
            std::thread::spawn(move || run(&dag, &store, &cfg(false), &mut Quiet).unwrap())
        })
        .collect();
    let reports: Vec<RunReport> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(runs(&f)[..2], [1, 1]);
    let executed: usize = reports.iter().map(|r| r.count(Outcome::Executed)).sum();
    assert_eq!(executed, 2);
    for r in &reports {
        assert_eq!(r.count(Outcome::Failed), 0);
    }
}

/// (GPU slot, start, end) of each run.
type RunLog = Arc<std::sync::Mutex<Vec<(Option<usize>, std::time::Instant, std::time::Instant)>>>;

/// Records (GPU slot, start, end) of each run.
struct Timed {
    log: RunLog,
}

impl Task for Timed {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let t0 = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(150));
        self.log
            .lock()
            .unwrap()
            .push((ctx.gpu(), t0, std::time::Instant::now()));
        ctx.put_output("out", ctx.node_id().as_bytes().to_vec(), "text/plain", "o");
        Ok(())
    }
}

/// Two independent nodes asking 600 MiB of GPU memory each, under GPU budgets `gpus`:
/// whether they overlapped in time, and the slots they got.
fn two_gpu_nodes(gpus: Vec<u64>) -> (bool, Vec<Option<usize>>) {
    let f = fixture();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut b = DagBuilder::new();
    for id in ["g1", "g2"] {
        let mut n = node(id, json!({ "id": id }), vec![], &f.runs[0], false, 0);
        n.resources = Resources {
            threads: 1,
            memory_mb: 10,
            gpu_memory_mb: 600,
        };
        n.task = Arc::new(Timed { log: log.clone() });
        b.add(n).unwrap();
    }
    let dag = b.build();
    let mut c = cfg(false);
    c.gpus = gpus;
    let report = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    assert_eq!(report.count(Outcome::Executed), 2);
    let l = log.lock().unwrap();
    let overlap = l[0].1 < l[1].2 && l[1].1 < l[0].2;
    (overlap, l.iter().map(|x| x.0).collect())
}

#[test]
fn gpu_nodes_share_a_gpu_only_while_their_memory_fits() {
    // 2 × 600 MiB do not fit into 1000: one after the other on slot 0.
    let (overlap, slots) = two_gpu_nodes(vec![1000]);
    assert!(!overlap, "ran side by side on a GPU too small for both");
    assert_eq!(slots, vec![Some(0), Some(0)]);
    // They fit into 1200: side by side on the same GPU.
    let (overlap, slots) = two_gpu_nodes(vec![1200]);
    assert!(overlap, "should share the GPU");
    assert_eq!(slots, vec![Some(0), Some(0)]);
    // Two GPUs: one each, side by side.
    let (overlap, mut slots) = two_gpu_nodes(vec![1000, 1000]);
    assert!(overlap);
    slots.sort();
    assert_eq!(slots, vec![Some(0), Some(1)]);
    // No GPUs in the run: the nodes get no slot.
    let (_, slots) = two_gpu_nodes(vec![]);
    assert_eq!(slots, vec![None, None]);
}

/// Fails with a lost device on GPU slot 0 (as an illegal address poisons a CUDA context),
/// records the slot it ran on otherwise.
struct LosesSlotZero {
    log: RunLog,
}

impl Task for LosesSlotZero {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let t0 = std::time::Instant::now();
        if ctx.gpu() == Some(0) {
            return Err(TaskError::DeviceLost(
                "cuda:0: gather failed and the GPU cannot be used again in this process: CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
        self.log
            .lock()
            .unwrap()
            .push((ctx.gpu(), t0, std::time::Instant::now()));
        ctx.put_output("out", ctx.node_id().as_bytes().to_vec(), "text/plain", "o");
        Ok(())
    }
}

/// `count` independent nodes, the first `gpu_nodes` of them asking for GPU memory, run with
/// --keep-going under GPU budgets `gpus`.
fn after_a_lost_gpu(gpus: Vec<u64>, count: usize, gpu_nodes: usize) -> (RunReport, RunLog) {
    let f = fixture();
    let log: RunLog = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut b = DagBuilder::new();
    for k in 0..count {
        let id = format!("n{k}");
        let mut n = node(&id, json!({ "id": id }), vec![], &f.runs[0], false, 0);
        n.resources = Resources {
            threads: 1,
            memory_mb: 10,
            gpu_memory_mb: if k < gpu_nodes { 600 } else { 0 },
        };
        n.task = Arc::new(LosesSlotZero { log: log.clone() });
        b.add(n).unwrap();
    }
    let dag = b.build();
    let mut c = cfg(true);
    c.threads = 1;
    c.gpus = gpus;
    let report = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    (report, log)
}

#[test]
fn a_gpu_lost_to_a_sticky_error_gets_no_more_nodes() {
    // Two GPUs: the first node loses slot 0; every later GPU node runs on slot 1.
    let (report, log) = after_a_lost_gpu(vec![1000, 1000], 5, 5);
    assert_eq!(report.count(Outcome::Failed), 1, "{:?}", report.nodes);
    assert_eq!(report.count(Outcome::Executed), 4);
    let slots: Vec<_> = log.lock().unwrap().iter().map(|x| x.0).collect();
    assert_eq!(slots, vec![Some(1); 4], "nothing more on the lost GPU");
    // One GPU: once it is lost, the other GPU nodes fail at once, saying why; nodes that
    // need no GPU still run.
    let (report, log) = after_a_lost_gpu(vec![1000], 5, 3);
    assert_eq!(report.count(Outcome::Failed), 3, "{:?}", report.nodes);
    assert_eq!(report.count(Outcome::Executed), 2);
    let not_started: Vec<_> = report
        .nodes
        .iter()
        .filter_map(|n| n.error.as_deref())
        .filter(|e| e.starts_with("not started: every GPU of this run failed"))
        .collect();
    assert_eq!(not_started.len(), 2, "{:?}", report.nodes);
    assert!(not_started[0].contains("CUDA_ERROR_ILLEGAL_ADDRESS"));
    assert_eq!(report.failure_tier(), Some(Tier::Environment));
    let slots: Vec<_> = log.lock().unwrap().iter().map(|x| x.0).collect();
    assert_eq!(slots, vec![None, None], "only the CPU nodes ran");
}

fn dir_remote(dir: &std::path::Path) -> Arc<RemoteCache> {
    Arc::new(RemoteCache::new(
        Box::new(crate::remote::DirBucket::new(dir).unwrap()),
        false,
        Arc::default(),
    ))
}

/// A fresh store running the diamond with the folder remote at `bucket`: the fixture, the
/// report and the remote handle.
fn diamond_with_remote(bucket: &std::path::Path) -> (Fixture, RunReport, Arc<RemoteCache>) {
    let f = fixture();
    let dag = diamond(&f, &params(), false);
    let mut c = cfg(false);
    let remote = dir_remote(bucket);
    c.remote = Some(remote.clone());
    let r = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    (f, r, remote)
}

/// A second store with the first's remote downloads every node and computes none; the
/// remote's manifests are the local ones.
#[test]
fn a_second_store_downloads_what_the_first_uploaded() {
    let bucket = tempfile::tempdir().unwrap();
    let (f, r, remote) = diamond_with_remote(bucket.path());
    assert_eq!(r.count(Outcome::Executed), 4);
    assert_eq!(remote.stats().nodes_uploaded, 4);

    let (g, r2, _) = diamond_with_remote(bucket.path());
    assert_eq!(r2.count(Outcome::Downloaded), 4);
    assert_eq!(runs(&g), vec![0, 0, 0, 0], "nothing computed");
    for (a, b) in r.nodes.iter().zip(&r2.nodes) {
        assert_eq!(a.key, b.key);
        let (ma, mb) = (
            f.store.read_manifest(&a.key.unwrap()).unwrap().unwrap(),
            g.store.read_manifest(&b.key.unwrap()).unwrap().unwrap(),
        );
        assert_eq!(ma.outputs, mb.outputs);
    }
    assert!(g.store.verify(|_, _| {}).unwrap().is_clean());
    // Planning sees the remote's answers too (and keys below them).
    let h = fixture();
    let dag3 = diamond(&h, &params(), false);
    let entries = crate::plan_with(&dag3, &h.store, "test", Some(&remote)).unwrap();
    assert!(entries.iter().all(|e| e.remote && e.key.is_some()));
}

/// A manifest filed under another key, or edited to list other outputs, is refused: the node
/// is computed, and its upload replaces the bad manifest.
#[test]
fn a_remote_manifest_that_does_not_hold_is_refused_and_replaced() {
    let bucket = tempfile::tempdir().unwrap();
    let (f, r, _) = diamond_with_remote(bucket.path());
    let key_of = |id: &str| r.nodes.iter().find(|n| n.id == id).unwrap().key.unwrap();
    // d's manifest now lists a's output (a mix of two results): its seal breaks.
    let d_path = bucket
        .path()
        .join(crate::remote::manifest_path(&key_of("d")));
    let a_manifest = f.store.read_manifest(&key_of("a")).unwrap().unwrap();
    let mut m: Value = serde_json::from_slice(&std::fs::read(&d_path).unwrap()).unwrap();
    m["outputs"] = serde_json::to_value(&a_manifest.outputs).unwrap();
    std::fs::write(&d_path, serde_json::to_vec(&m).unwrap()).unwrap();
    // c's manifest is b's (filed under the wrong key).
    let c_path = bucket
        .path()
        .join(crate::remote::manifest_path(&key_of("c")));
    let b_path = bucket
        .path()
        .join(crate::remote::manifest_path(&key_of("b")));
    std::fs::copy(&b_path, &c_path).unwrap();

    let (g, r2, remote) = diamond_with_remote(bucket.path());
    assert_eq!(
        runs(&g),
        vec![0, 0, 1, 1],
        "c and d computed, a and b downloaded"
    );
    assert_eq!(r2.count(Outcome::Downloaded), 2);
    assert_eq!(remote.stats().refused, 2);
    let w = remote.warnings().join("\n");
    assert!(w.contains("sealed") && w.contains("records key"), "{w}");
    // Replaced: a third store downloads all four.
    let (_h, r3, _) = diamond_with_remote(bucket.path());
    assert_eq!(r3.count(Outcome::Downloaded), 4);
}

/// `gc` on the remote keeps what is asked (and recent things), deletes the rest, results first.
#[test]
fn remote_gc_keeps_the_roots_and_their_objects() {
    let bucket = tempfile::tempdir().unwrap();
    let (_f, r, remote) = diamond_with_remote(bucket.path());
    let keep: BTreeSet<_> = r
        .nodes
        .iter()
        .filter(|n| n.id == "a" || n.id == "b")
        .map(|n| n.key.unwrap())
        .collect();
    let recent = remote.gc(&keep, Duration::from_secs(3600), false).unwrap();
    assert_eq!((recent.manifests_deleted, recent.objects_deleted), (0, 0));
    let g = remote.gc(&keep, Duration::ZERO, false).unwrap();
    assert_eq!((g.manifests_deleted, g.manifests_kept), (2, 2));
    assert_eq!(remote.list_keys().unwrap().len(), 2);
    for k in &keep {
        let m = remote.manifest(k).expect("kept");
        for o in m.outputs.values() {
            assert!(bucket
                .path()
                .join(crate::remote::object_path(&o.digest))
                .exists());
        }
    }
}

// ---- Trust: signed results, and a remote that cannot reach outside (issue 28) ----

/// A trust that signs with `key` and trusts `trusted` (own key always).
fn signed(key: &SecretKey, trusted: &[PublicKey]) -> Arc<Trust> {
    let own: SecretKey = key.to_text().parse().unwrap();
    Arc::new(Trust::new(
        Policy::Signed,
        trusted.to_vec(),
        Some(own),
        "the test".into(),
    ))
}

/// The diamond in a fresh store signed by `key`, with a folder remote at `bucket` whose
/// policy trusts `trusted`.
fn signed_diamond(
    bucket: &std::path::Path,
    key: &SecretKey,
    trusted: &[PublicKey],
) -> (Fixture, RunReport, Arc<RemoteCache>) {
    let mut f = fixture();
    f.store = f.store.clone().with_trust(signed(key, trusted));
    let dag = diamond(&f, &params(), false);
    let mut c = cfg(false);
    let remote = Arc::new(RemoteCache::new(
        Box::new(crate::remote::DirBucket::new(bucket).unwrap()),
        false,
        signed(key, trusted),
    ));
    c.remote = Some(remote.clone());
    let r = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    (f, r, remote)
}

/// Results are served from a remote only under a trusted key: a reader that does not know
/// the writer's key computes everything (one warning naming the key), one that lists it
/// downloads everything.
#[test]
fn a_remote_serves_only_results_signed_by_a_trusted_key() {
    let bucket = tempfile::tempdir().unwrap();
    let alice = SecretKey::generate("alice").unwrap();
    let bob = SecretKey::generate("bob").unwrap();
    let (f, r, _) = signed_diamond(bucket.path(), &alice, &[]);
    assert_eq!(r.count(Outcome::Executed), 4);
    let m = f
        .store
        .read_manifest(&r.nodes[0].key.unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        Trust::signature_of(&m).unwrap(),
        alice.public(),
        "signed by its computer"
    );

    let (g, r2, remote) = signed_diamond(bucket.path(), &bob, &[]);
    assert_eq!(r2.count(Outcome::Downloaded), 0);
    assert_eq!(runs(&g), vec![1, 1, 1, 1], "bob computes all four");
    assert_eq!(remote.stats().untrusted, 4);
    let w = remote.warnings();
    assert_eq!(w.len(), 1, "one warning per signer: {w:?}");
    assert!(
        w[0].contains("`alice:") && w[0].contains("trust.keys"),
        "{w:?}"
    );

    let (h, r3, _) = signed_diamond(bucket.path(), &bob, &[alice.public()]);
    assert_eq!(r3.count(Outcome::Downloaded), 4);
    assert_eq!(runs(&h), vec![0, 0, 0, 0]);
    // The downloaded results keep alice's signature in bob's store.
    let m = h
        .store
        .read_manifest(&r3.nodes[3].key.unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(Trust::signature_of(&m).unwrap(), alice.public());
}

/// The reliability test's poisoning (R2): a manifest on the remote rewritten to list other
/// outputs and resealed — the seal is public — no longer carries a valid signature and is
/// refused, as is one whose signature was stripped; the reader's upload replaces both.
#[test]
fn a_resealed_poisoned_manifest_is_refused_with_signing_on() {
    let bucket = tempfile::tempdir().unwrap();
    let alice = SecretKey::generate("alice").unwrap();
    let (f, r, _) = signed_diamond(bucket.path(), &alice, &[]);
    let key_of = |id: &str| r.nodes.iter().find(|n| n.id == id).unwrap().key.unwrap();
    let a_outputs = f
        .store
        .read_manifest(&key_of("a"))
        .unwrap()
        .unwrap()
        .outputs;
    let path = |id: &str| {
        bucket
            .path()
            .join(crate::remote::manifest_path(&key_of(id)))
    };
    // d: points at a's output, resealed, alice's signature left in place.
    let mut d: Manifest = serde_json::from_slice(&std::fs::read(path("d")).unwrap()).unwrap();
    d.outputs = a_outputs;
    d.seal = Some(Manifest::seal_of(&d.key, &d.outputs));
    assert!(d.seal_holds(), "the forged seal holds: it is no barrier");
    std::fs::write(path("d"), serde_json::to_vec(&d).unwrap()).unwrap();
    // c: signature removed.
    let mut c: Manifest = serde_json::from_slice(&std::fs::read(path("c")).unwrap()).unwrap();
    c.signature = None;
    std::fs::write(path("c"), serde_json::to_vec(&c).unwrap()).unwrap();

    let bob = SecretKey::generate("bob").unwrap();
    let (g, r2, remote) = signed_diamond(bucket.path(), &bob, &[alice.public()]);
    assert_eq!(
        runs(&g),
        vec![0, 0, 1, 1],
        "c and d computed, a and b downloaded"
    );
    assert_eq!(r2.count(Outcome::Downloaded), 2);
    let w = remote.warnings().join("\n");
    assert!(
        w.contains("does not verify") && w.contains("unsigned"),
        "{w}"
    );
    // Bob's honest results replaced the forged ones: carol, trusting bob, downloads all four.
    let carol = SecretKey::generate("carol").unwrap();
    let (_h, r3, _) = signed_diamond(bucket.path(), &carol, &[alice.public(), bob.public()]);
    assert_eq!(r3.count(Outcome::Downloaded), 4);
}

/// In a store shared by several users, a result signed by a key its reader does not trust is
/// not served (and not quarantined): the reader computes the node and replaces it. A manifest
/// of the current schema with its seal deleted is refused outright.
#[test]
fn a_local_result_is_served_only_under_a_trusted_key_and_must_be_sealed() {
    let alice = SecretKey::generate("alice").unwrap();
    let bob = SecretKey::generate("bob").unwrap();
    let mut f = fixture();
    f.store = f.store.clone().with_trust(signed(&alice, &[]));
    let dag = diamond(&f, &params(), false);
    let r = run(&dag, &f.store, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r.count(Outcome::Executed), 4);
    let as_bob = f.store.clone().with_trust(signed(&bob, &[]));
    let k = r.nodes[1].key.unwrap();
    assert!(
        as_bob.read_manifest(&k).unwrap().is_none(),
        "alice's result is not bob's"
    );
    assert!(
        as_bob.read_manifest_intact(&k).unwrap().is_some(),
        "it stays"
    );
    let report = as_bob.verify(|_, _| {}).unwrap();
    assert!(report.is_clean());
    assert_eq!(report.untrusted.values().sum::<usize>(), 4, "{report:?}");
    let r2 = run(&dag, &as_bob, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r2.count(Outcome::Executed), 4, "bob recomputes");
    assert!(as_bob.read_manifest(&k).unwrap().is_some());
    // Alice trusts bob: his results serve her.
    let as_alice = f.store.clone().with_trust(signed(&alice, &[bob.public()]));
    assert_eq!(
        run(&dag, &as_alice, &cfg(false), &mut Quiet)
            .unwrap()
            .count(Outcome::Executed),
        0
    );

    // A manifest with its seal line deleted (R2, locally) is refused and quarantined.
    let path = f.store.manifest_path(&k);
    let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("seal");
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    let any = f.store.clone();
    assert!(any.read_manifest(&k).unwrap().is_none());
    assert!(!path.exists(), "moved to quarantine");
}

/// R1: a link planted under a folder remote's `objects/` is never followed by `gc --remote`:
/// the files it points at survive, and the link is reported as skipped. A file whose name is
/// no digest is never deleted either.
#[test]
fn remote_gc_never_follows_a_link_or_deletes_a_name_it_does_not_own() {
    let bucket = tempfile::tempdir().unwrap();
    let (_f, _r, remote) = diamond_with_remote(bucket.path());
    let victim = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(victim.path().join("sub")).unwrap();
    std::fs::write(victim.path().join("f1.txt"), "precious").unwrap();
    std::fs::write(victim.path().join("sub/d.txt"), "deep").unwrap();
    std::os::unix::fs::symlink(victim.path(), bucket.path().join("objects/zz")).unwrap();
    std::fs::create_dir_all(bucket.path().join("objects/ab")).unwrap();
    std::fs::write(bucket.path().join("objects/ab/notes.txt"), "mine").unwrap();
    let report = remote.gc(&BTreeSet::new(), Duration::ZERO, false).unwrap();
    assert!(victim.path().join("f1.txt").exists() && victim.path().join("sub/d.txt").exists());
    assert!(bucket.path().join("objects/ab/notes.txt").exists());
    assert!(
        report.skipped.iter().any(|s| s == "objects/zz"),
        "{report:?}"
    );
    assert!(
        report.skipped.iter().any(|s| s == "objects/ab/notes.txt"),
        "{report:?}"
    );
    assert_eq!(report.manifests_deleted, 4);
    assert!(remote.warnings().iter().any(|w| w.contains("not upcc's")));
}

/// R3: an object on the remote far larger than its manifest states is refused by its size,
/// without being read (a sparse 1 GiB file: reading it would take 1 GiB of memory).
#[test]
fn a_huge_remote_object_is_refused_by_its_size_before_it_is_read() {
    let bucket = tempfile::tempdir().unwrap();
    let (f, r, _) = diamond_with_remote(bucket.path());
    let key_a = r.nodes[0].key.unwrap();
    let o = f.store.read_manifest(&key_a).unwrap().unwrap().outputs["out"].clone();
    let p = bucket.path().join(crate::remote::object_path(&o.digest));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    file.set_len(1 << 30).unwrap();
    let (g, r2, remote) = diamond_with_remote(bucket.path());
    assert!(runs(&g)[0] == 1, "a computed");
    assert!(r2.count(Outcome::Executed) >= 1);
    let w = remote.warnings().join("\n");
    assert!(
        w.contains("1073741824 bytes") && w.contains("without reading it"),
        "{w}"
    );
    // Replaced on the remote by the right bytes.
    assert_eq!(std::fs::metadata(&p).unwrap().len(), o.bytes);
}

/// A bucket that runs `on_manifest_put` (once) when the first manifest is put: a `gc --remote`
/// of another machine deleting an old object between an upload's check and its publication.
struct Meddling {
    inner: crate::remote::DirBucket,
    on_manifest_put: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Bucket for Meddling {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn get(&self, path: &str, max: u64) -> Result<Got, BucketError> {
        self.inner.get(path, max)
    }
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError> {
        self.inner.head(path)
    }
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError> {
        if path.starts_with("nodes/") {
            if let Some(f) = self.on_manifest_put.lock().unwrap().take() {
                f();
            }
        }
        self.inner.put(path, bytes, mode)
    }
    fn list(&self, prefix: &str) -> Result<Listing, BucketError> {
        self.inner.list(prefix)
    }
    fn delete(&self, path: &str) -> Result<(), BucketError> {
        self.inner.delete(path)
    }
}

/// R6: an upload that found an object already on the remote (and so skipped it) checks it
/// again after publishing its manifest, and puts it back if a gc deleted it meanwhile: no
/// manifest is left listing a missing object.
#[test]
fn an_upload_restores_an_object_a_concurrent_gc_deleted() {
    let bucket = tempfile::tempdir().unwrap();
    let (f, r, _) = diamond_with_remote(bucket.path());
    let key_a = r.nodes[0].key.unwrap();
    let m = f.store.read_manifest(&key_a).unwrap().unwrap();
    let obj = bucket
        .path()
        .join(crate::remote::object_path(&m.outputs["out"].digest));
    // The manifest is gone from the remote (as if gc'd as unreachable); its object is old.
    std::fs::remove_file(bucket.path().join(crate::remote::manifest_path(&key_a))).unwrap();
    let gone = obj.clone();
    let remote = RemoteCache::new(
        Box::new(Meddling {
            inner: crate::remote::DirBucket::new(bucket.path()).unwrap(),
            on_manifest_put: std::sync::Mutex::new(Some(Box::new(move || {
                std::fs::remove_file(&gone).unwrap();
            }))),
        }),
        false,
        Arc::default(),
    );
    assert_eq!(remote.upload(&f.store, &m).unwrap(), Uploaded::Published);
    assert!(obj.exists(), "the object the new manifest lists is back");
    assert_eq!(remote.stats().objects_uploaded, 1);
}

/// R9: a FIFO, or a link to one, where the store keeps an object, manifest or ref makes no
/// command hang: `verify` quarantines the object, a manifest or ref reads as unreadable.
#[test]
fn non_regular_files_in_a_store_are_refused_without_blocking() {
    let bucket = tempfile::tempdir().unwrap();
    let (f, r, _) = diamond_with_remote(bucket.path());
    let fifo = |p: &std::path::Path| {
        let _ = std::fs::remove_file(p);
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    };
    let ka = r.nodes[0].key.unwrap();
    let kb = r.nodes[1].key.unwrap();
    let oa = f.store.read_manifest(&ka).unwrap().unwrap().outputs["out"].digest;
    let obj = f.store.object_path(&oa);
    let _ = std::fs::set_permissions(&obj, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    fifo(&obj);
    fifo(&f.store.manifest_path(&kb));
    assert!(
        f.store.read_manifest(&kb).unwrap().is_none(),
        "the FIFO manifest reads as unreadable"
    );
    assert!(f.store.read_object(&oa).is_err());
    let report = f.store.verify(|_, _| {}).unwrap();
    assert!(report.corrupt_objects.contains(&oa.to_hex()), "{report:?}");
}

/// A folder bucket whose manifest puts wait for `gate` (polled, 30 s at most) and whose gets
/// are slow and counted, to see what a slow bucket costs a run.
#[derive(Clone)]
struct Slow {
    inner: Arc<crate::remote::DirBucket>,
    gate: Arc<dyn Fn() -> bool + Send + Sync>,
    gate_timed_out: Arc<AtomicUsize>,
    gets_now: Arc<AtomicUsize>,
    gets_at_once: Arc<AtomicUsize>,
}

impl Bucket for Slow {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn get(&self, path: &str, max: u64) -> Result<Got, BucketError> {
        let now = self.gets_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.gets_at_once.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(150));
        self.gets_now.fetch_sub(1, Ordering::SeqCst);
        self.inner.get(path, max)
    }
    fn head(&self, path: &str) -> Result<Option<u64>, BucketError> {
        self.inner.head(path)
    }
    fn put(&self, path: &str, bytes: &[u8], mode: PutMode) -> Result<Put, BucketError> {
        if path.starts_with("nodes/") {
            let t0 = Instant::now();
            while !(self.gate)() {
                if t0.elapsed() > Duration::from_secs(30) {
                    self.gate_timed_out.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.inner.put(path, bytes, mode)
    }
    fn list(&self, prefix: &str) -> Result<Listing, BucketError> {
        self.inner.list(prefix)
    }
    fn delete(&self, path: &str) -> Result<(), BucketError> {
        self.inner.delete(path)
    }
}

/// R12: a node's dependants do not wait for its upload (the uploads here are held until all
/// four nodes have run, which could never happen if each upload came before its dependants),
/// the run still ends with every result uploaded, and a second store's downloads overlap even
/// on one thread: the objects of the whole chain (a, b and c, d below them) come down at once.
#[test]
fn uploads_and_downloads_are_off_the_critical_path() {
    let bucket = tempfile::tempdir().unwrap();
    let f = fixture();
    let dag = diamond(&f, &params(), false);
    let counters = f.runs.clone();
    let slow = Slow {
        inner: Arc::new(crate::remote::DirBucket::new(bucket.path()).unwrap()),
        gate: Arc::new(move || counters.iter().all(|r| r.load(Ordering::SeqCst) == 1)),
        gate_timed_out: Arc::default(),
        gets_now: Arc::default(),
        gets_at_once: Arc::default(),
    };
    let remote = Arc::new(RemoteCache::new(
        Box::new(slow.clone()),
        false,
        Arc::default(),
    ));
    let mut c = cfg(false);
    c.remote = Some(remote.clone());
    let r = run(&dag, &f.store, &c, &mut Quiet).unwrap();
    assert_eq!(r.count(Outcome::Executed), 4);
    assert_eq!(
        slow.gate_timed_out.load(Ordering::SeqCst),
        0,
        "no upload held up a node"
    );
    assert_eq!(
        remote.stats().nodes_uploaded,
        4,
        "all uploaded when run returns"
    );
    assert_eq!(remote.list_keys().unwrap().len(), 4);

    // A second store on one thread: its plan reads the four manifests, then the four objects
    // come down together (one node after another, at most b and c would overlap).
    let g = fixture();
    let dag = diamond(&g, &params(), false);
    let mut c = cfg(false);
    c.threads = 1;
    let reader = Arc::new(RemoteCache::new(
        Box::new(slow.clone()),
        false,
        Arc::default(),
    ));
    c.remote = Some(reader);
    let r = run(&dag, &g.store, &c, &mut Quiet).unwrap();
    assert_eq!(r.count(Outcome::Downloaded), 4);
    assert_eq!(runs(&g), vec![0, 0, 0, 0]);
    assert!(g.store.verify(|_, _| {}).unwrap().is_clean());
    let stats = c.remote.as_ref().unwrap().stats();
    assert_eq!((stats.nodes_downloaded, stats.objects_downloaded), (4, 4));
    assert!(
        slow.gets_at_once.load(Ordering::SeqCst) >= 3,
        "downloads of a chain overlap: {}",
        slow.gets_at_once.load(Ordering::SeqCst)
    );
}

/// The diamond with node `b`'s code recorded as `code` (one file → its digest).
fn diamond_with_code(f: &Fixture, code: &str) -> Dag {
    let p = params();
    let mut b = DagBuilder::new();
    let a = b
        .add(node("a", p["a"].clone(), vec![], &f.runs[0], false, 0))
        .unwrap();
    let mut nb = node(
        "b",
        json!({"out": "B"}),
        vec![input("a", a)],
        &f.runs[1],
        false,
        0,
    );
    nb.code = BTreeMap::from([("stages/b.rs".to_string(), code.to_string())]);
    let bb = b.add(nb).unwrap();
    b.add(node(
        "d",
        p["d"].clone(),
        vec![input("a", bb)],
        &f.runs[3],
        false,
        0,
    ))
    .unwrap();
    b.build()
}

#[test]
fn a_code_change_reruns_the_stage_early_cutoff_spares_the_rest_and_keep_serves_the_old() {
    let f = fixture();
    let r1 = run(
        &diamond_with_code(&f, "v1"),
        &f.store,
        &cfg(false),
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(r1.count(Outcome::Executed), 3);
    let edited = diamond_with_code(&f, "v2");
    let p = plan(&edited, &f.store, "test").unwrap();
    assert_eq!(p[1].status, NodeStatus::Stale);
    assert_eq!(p[1].reasons, ["code changed: stages/b.rs"]);
    // Kept on request: fresh, served under its old key, and nothing runs.
    let keeping = f.store.clone().keeping_code_changes(true);
    let k = plan(&edited, &keeping, "test").unwrap();
    assert_eq!(k[1].status, NodeStatus::Fresh);
    assert_eq!(k[1].key, p_key(&f, "b"));
    assert!(k[1].reasons[0].starts_with("kept although its code changed (stages/b.rs)"));
    assert!(k.iter().all(|e| e.status == NodeStatus::Fresh));
    let r2 = run(&edited, &keeping, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r2.count(Outcome::Executed), 0);
    // By default b reruns; its output bits are the same, so d does not (early cutoff).
    let r3 = run(&edited, &f.store, &cfg(false), &mut Quiet).unwrap();
    assert_eq!(r3.count(Outcome::Executed), 1);
    assert_eq!(runs(&f), [1, 2, 0, 1]);
    // A parameter change is not a code change: keeping code changes does not serve it.
    let mut other = DagBuilder::new();
    let a = other
        .add(node(
            "a",
            json!({"out": "A", "x": 2}),
            vec![],
            &f.runs[0],
            false,
            0,
        ))
        .unwrap();
    let mut nb = node(
        "b",
        json!({"out": "B"}),
        vec![input("a", a)],
        &f.runs[1],
        false,
        0,
    );
    nb.code = BTreeMap::from([("stages/b.rs".to_string(), "v3".to_string())]);
    other.add(nb).unwrap();
    let o = plan(&other.build(), &keeping, "test").unwrap();
    assert_eq!(o[0].status, NodeStatus::Stale);
}

/// The key `test`'s ref records for node `id`.
fn p_key(f: &Fixture, id: &str) -> Option<Digest<NodeKeyTag>> {
    f.store.read_ref("test", id).unwrap().map(|r| r.key)
}
