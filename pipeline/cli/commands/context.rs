//! What the subcommands share: the store and device flags (`Env`), loading a spec into a
//! DAG, the memory check before a run, provenance, and reading objects for views. A leaf:
//! it imports no subcommand.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::SystemTime;

use upcc_engine::{Digest, NodeKeyTag, NodeStatus, ProvenanceBase, Store};

use crate::cli::SpecArgs;
use upcc_model::device::{Compute, DeviceRequest};
use upcc_model::error::{Error, Result};
use upcc_model::graph::{build, Built};
use upcc_model::selectors::{self, Selection};
use upcc_model::specs::{self, Spec};

/// The store named by `--store`, else `$UPCC_STORE`, else `artifacts/`.
pub fn store_path(flag: &Option<PathBuf>) -> PathBuf {
    flag.clone()
        .or_else(crate::env::store)
        .unwrap_or_else(|| PathBuf::from("artifacts"))
}

pub(crate) fn open_store(flag: &Option<PathBuf>, create: bool) -> Result<Store> {
    open_store_with(flag, create, false)
}

/// [`open_store`] for a command that computes results (`run`, `job`, `worker`): its signing
/// key is read, or made where there is none.
pub(crate) fn open_store_to_compute(flag: &Option<PathBuf>, create: bool) -> Result<Store> {
    open_store_with(flag, create, true)
}

/// `--keep-code-changes`, for every store this process opens.
static KEEP_CODE_CHANGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Serve results whose stage code changed (`--keep-code-changes`) from every store opened.
pub fn set_keep_code_changes(keep: bool) {
    KEEP_CODE_CHANGES.store(keep, std::sync::atomic::Ordering::Relaxed);
}

fn open_store_with(flag: &Option<PathBuf>, create: bool, compute: bool) -> Result<Store> {
    let path = store_path(flag);
    let shared = crate::env::store_shared();
    let trust = crate::trust::store_trust(compute)?;
    let r = if create {
        Store::open_or_create(&path, shared)
    } else {
        Store::open_existing(&path)
    };
    r.map(|s| {
        s.with_trust(trust)
            .keeping_code_changes(KEEP_CODE_CHANGES.load(std::sync::atomic::Ordering::Relaxed))
    })
    .map_err(|e| {
        let err: Error = e.into();
        err.hint("the store is chosen by --store DIR, else $UPCC_STORE, else `artifacts/`")
    })
}

pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// What every subcommand shares: the store and device flags.
pub struct Env {
    pub store: Option<PathBuf>,
    pub device: Option<String>,
    pub gpus: Option<String>,
    /// `--numerics`: the class training nodes are planned with instead of the device's.
    pub numerics: Option<String>,
    pub verbose: u8,
    /// Whether the command trains or shows the device (`run`, `job`, `worker`, `device`): only
    /// those say on stderr that there is no GPU and training falls back to the CPU; the others
    /// (`status`, `explain`, `report`, …) compute nothing and plan quietly.
    pub announce_device: bool,
}

impl Env {
    /// The training device (`--device`, `$UPCC_DEVICE`, auto). `quiet` suppresses the
    /// fallback info line (for JSON output).
    pub fn compute(&self, quiet: bool) -> Result<std::sync::Arc<Compute>> {
        match &self.numerics {
            Some(n) => Ok(Compute::planned(&check_numerics(n)?)),
            None => self.device(quiet || !self.announce_device),
        }
    }

    /// The device this machine trains on, whatever `--numerics` plans with.
    pub fn device(&self, quiet: bool) -> Result<std::sync::Arc<Compute>> {
        let gpus = match &self.gpus {
            Some(s) => Some(upcc_model::device::parse_gpus(s)?),
            None => None,
        };
        Compute::resolve(
            DeviceRequest::from_flag(self.device.as_deref(), crate::env::device().as_deref())?,
            gpus.as_deref(),
            quiet,
        )
    }
}

/// A numerics class as `--numerics` gives it: `cpu-…` or `cuda-…`, printable, one word.
pub(crate) fn check_numerics(n: &str) -> Result<String> {
    let ok = (n.starts_with("cpu-") || n.starts_with("cuda-"))
        && n.len() <= 200
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(n.to_string())
    } else {
        Err(Error::user(format!(
            "--numerics (or $UPCC_NUMERICS) `{n}` is not a numerics class"
        ))
        .hint(format!(
            "a class looks like `{}` or `cuda-f32-sm90-…`; `upcc device` prints this machine's",
            Compute::cpu().numerics()
        )))
    }
}

/// The device a local run trains on: this machine's, which must compute the class
/// `--numerics` planned with, if given.
pub(crate) fn local_device(
    env: &Env,
    planned: &Compute,
    quiet: bool,
) -> Result<std::sync::Arc<Compute>> {
    let real = env.device(quiet)?;
    if env.numerics.is_some() && real.numerics() != planned.numerics() {
        return Err(Error::user(format!(
            "--numerics {} plans for another device class than this machine's device ({}), which computes {}",
            planned.numerics(),
            real.name(),
            real.numerics()
        ))
        .hint("drop --numerics (and $UPCC_NUMERICS) to compute here, or run where that class is computed"));
    }
    Ok(real)
}

pub(crate) struct Loaded {
    pub(crate) spec: Spec,
    pub(crate) built: Built,
    pub(crate) selection: Selection,
    pub(crate) compute: std::sync::Arc<Compute>,
}

pub(crate) fn load(args: &SpecArgs, threads: usize, env: &Env) -> Result<Loaded> {
    load_with(args, threads, env.compute(args.json)?)
}

/// [`load`] with a device already resolved.
pub(crate) fn load_with(
    args: &SpecArgs,
    threads: usize,
    compute: std::sync::Arc<Compute>,
) -> Result<Loaded> {
    let (spec_arg, selectors) = args
        .spec_and_selectors
        .split_first()
        .expect("clap requires a spec");
    let spec = specs::load(spec_arg, &args.set)?;
    note_shadowed(&spec);
    let built = build(&spec, threads, compute.clone(), &host())?;
    let selection = selectors::parse(selectors, &built)?;
    Ok(Loaded {
        spec,
        built,
        selection,
        compute,
    })
}

/// Say on stderr which `--set`s some method's own entry shadows (they change nothing for it).
pub(crate) fn note_shadowed(spec: &Spec) {
    for w in spec.shadowed_overrides() {
        eprintln!("upcc: note: {w}");
    }
}

/// Refuse, before anything runs, the nodes about to train on this machine's CPU whose
/// networks cannot fit in the memory this process may use (physical memory, `ulimit -v`, the
/// cgroup's limit): `computes()[i]` says whether node `i` of `dag` is computed by this process,
/// asked only when some node is too large (a GPU's nodes hold their networks in the GPU's
/// memory).
pub(crate) fn check_memory(
    built: &Built,
    dag: &upcc_engine::Dag,
    computes: impl FnOnce() -> Result<Vec<bool>>,
    compute: &Compute,
) -> Result<()> {
    if compute.is_gpu() {
        return Ok(());
    }
    let Some((budget, source)) = upcc_stages::check::memory_budget() else {
        return Ok(());
    };
    let large: Vec<_> = built
        .memory_needs
        .iter()
        .filter(|m| m.bytes > budget)
        .filter_map(|m| dag.index_of(&m.node).map(|i| (i, m)))
        .collect();
    if large.is_empty() {
        return Ok(());
    }
    let computes = computes()?;
    let over: Vec<_> = large
        .into_iter()
        .filter(|(i, _)| computes[*i])
        .map(|(_, m)| m)
        .collect();
    let Some(first) = over.first() else {
        return Ok(());
    };
    let others = match over.len() {
        1 => String::new(),
        2 => " (and 1 other node)".to_string(),
        n => format!(" (and {} other nodes)", n - 1),
    };
    Err(Error::user(format!(
        "node `{}`{others}: {} would need {} of memory to train, more than {source}",
        first.node,
        first.what,
        upcc_stages::check::human_bytes(first.bytes),
    ))
    .hint(format!(
        "lower `{0}.hidden` or `{0}.batch_size` (e.g. `--set {0}.batch_size=…`), or run where more memory is available",
        first.section
    )))
}

pub(crate) fn memory_default_mb() -> u64 {
    let avail = fs_err::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    let avail_mb = avail.map(|kb| kb / 1024 * 8 / 10).unwrap_or(8192);
    // Never more than this process may use (`ulimit -v`, the cgroup's limit).
    let budget_mb = upcc_stages::check::memory_budget()
        .map(|(b, _)| u64::try_from(b / (1 << 20)).unwrap_or(u64::MAX) * 8 / 10)
        .unwrap_or(u64::MAX);
    avail_mb.min(budget_mb).max(256)
}

pub(crate) fn cpu_description() -> String {
    let info = fs_err::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let avx512 = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.contains(" avx512f"));
    format!("{model}{}", if avx512 { " (avx512f)" } else { "" })
}

pub(crate) fn provenance(run_id: String, compute: &Compute) -> ProvenanceBase {
    let mut libraries: BTreeMap<String, String> = option_env!("UPCC_LIBRARIES")
        .unwrap_or("")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let info = compute.info();
    libraries.insert("device".into(), info.name.clone());
    libraries.insert("numerics".into(), info.numerics.clone());
    for (k, v) in info.facts {
        libraries.insert(format!("device.{k}"), v);
    }
    ProvenanceBase {
        tool: "upcc".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_revision: option_env!("UPCC_GIT_REVISION")
            .filter(|s| !s.is_empty())
            .map(|s| s.to_string()),
        run_id,
        user: std::env::var("USER").ok(),
        cpu: cpu_description(),
        os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        libraries,
    }
}

pub(crate) fn run_id() -> String {
    let t = upcc_engine::fsutil::rfc3339(SystemTime::now()).replace([':', '-'], "");
    match std::env::var("SLURM_JOB_ID") {
        Ok(j) if !j.is_empty() => format!("{t}-{}-slurm{j}", std::process::id()),
        _ => format!("{t}-{}", std::process::id()),
    }
}

/// Read an object a view shows; a corrupt one is quarantined with the result that produced it
/// (so the next engine pass recomputes that node) and reads as absent.
pub(crate) fn view_object(
    store: &Store,
    producer: &Digest<NodeKeyTag>,
    digest: &Digest<upcc_engine::Artifact>,
    healed: &mut bool,
) -> Result<Option<Vec<u8>>> {
    match store.read_object(digest) {
        Ok(b) => Ok(Some(b)),
        Err(
            e @ (upcc_engine::StoreError::Corrupt { .. }
            | upcc_engine::StoreError::MissingObject(_)),
        ) => {
            store.quarantine_object(digest)?;
            store.quarantine_manifest(producer)?;
            eprintln!(
                "upcc: warning: {e}; quarantined it and the result {} that produced it, which is recomputed now",
                producer.short()
            );
            *healed = true;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn status_word(s: NodeStatus) -> &'static str {
    match s {
        NodeStatus::Fresh => "fresh",
        NodeStatus::Stale => "stale",
        NodeStatus::Missing => "missing",
    }
}

/// The numerics classes of training results in the store (always including the CPU's).
pub(crate) fn numerics_classes(store: &Store) -> Result<BTreeSet<String>> {
    let mut classes = BTreeSet::from([Compute::cpu().numerics()]);
    for key in store.list_manifests()? {
        if let Ok(Some(m)) = store.read_manifest_intact(&key) {
            if m.material.numerics != "exact" {
                classes.insert(m.material.numerics.clone());
            }
        }
    }
    Ok(classes)
}

/// The remote cache of a command on `spec`: `--remote` (`flag`), else `$UPCC_REMOTE`, else the
/// spec's `remote:`, else the user config's; none by default, and none for `off`. Its warnings
/// go to stderr.
pub(crate) fn remote_for(
    flag: Option<&str>,
    spec: &Spec,
) -> Result<Option<std::sync::Arc<upcc_engine::RemoteCache>>> {
    remote_for_with(flag, spec, crate::trust::remote_trust)
}

/// [`remote_for`] with the trust `trust` gives (asked only when there is a remote).
pub(crate) fn remote_for_with(
    flag: Option<&str>,
    spec: &Spec,
    trust: impl FnOnce() -> Result<std::sync::Arc<upcc_engine::Trust>>,
) -> Result<Option<std::sync::Arc<upcc_engine::RemoteCache>>> {
    let config = crate::slurm::user_config_remote()?;
    match crate::remote::choose(flag, spec.file.remote.as_deref(), config.as_deref()) {
        None => Ok(None),
        Some((url, origin)) => crate::remote::open(&url, origin, true, trust()?).map(Some),
    }
}

/// Threads per CPU training node when --node-threads is not given: small networks scale to a
/// few threads, so a many-core machine runs several nodes side by side (README, Benchmarks).
pub const DEFAULT_NODE_THREADS: usize = 4;

/// What the model takes from the environment when it builds a DAG.
pub fn host() -> upcc_model::graph::Host {
    upcc_model::graph::Host {
        data_mirror: crate::env::data_mirror(),
    }
}
