//! The subcommands.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use upcc_engine::{
    plan, run as engine_run, Digest, NodeKeyTag, NodeStatus, Outcome, PlanEntry, ProvenanceBase,
    RunConfig, Store,
};

use crate::cli::{ExecutorArg, ExplainArgs, GcArgs, JobArgs, ProgressArg, RunArgs, SpecArgs};
use crate::device::{Compute, DeviceRequest};
use crate::error::{CliError, Result};
use crate::graph::{build, Built};
use crate::progress::{Progress, ProgressMode};
use crate::select::{self, Selection};
use crate::spec::TargetKind;
use crate::spec::{self, Spec};
use crate::stage::table::{render_target, TableInput, TableSource};

/// The store named by `--store`, else `$UPCC_STORE`, else `artifacts/`.
pub fn store_path(flag: &Option<PathBuf>) -> PathBuf {
    flag.clone()
        .or_else(|| std::env::var_os("UPCC_STORE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("artifacts"))
}

pub(crate) fn open_store(flag: &Option<PathBuf>, create: bool) -> Result<Store> {
    let path = store_path(flag);
    let shared = std::env::var("UPCC_STORE_SHARED").is_ok_and(|v| v == "1");
    let r = if create {
        Store::open_or_create(&path, shared)
    } else {
        Store::open_existing(&path)
    };
    r.map_err(|e| {
        let err: CliError = e.into();
        err.hint("the store is chosen by --store DIR, else $UPCC_STORE, else `artifacts/`")
    })
}

fn default_threads() -> usize {
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
}

impl Env {
    /// The training device (`--device`, `$UPCC_DEVICE`, auto). `quiet` suppresses the
    /// fallback info line (for JSON output).
    pub fn compute(&self, quiet: bool) -> Result<std::sync::Arc<Compute>> {
        match &self.numerics {
            Some(n) => Ok(Compute::planned(&check_numerics(n)?)),
            None => self.device(quiet),
        }
    }

    /// The device this machine trains on, whatever `--numerics` plans with.
    pub fn device(&self, quiet: bool) -> Result<std::sync::Arc<Compute>> {
        let gpus = match &self.gpus {
            Some(s) => Some(crate::device::parse_gpus(s)?),
            None => None,
        };
        Compute::resolve(
            DeviceRequest::from_flag(self.device.as_deref())?,
            gpus.as_deref(),
            quiet,
        )
    }
}

/// A numerics class as `--numerics` gives it: `cpu-…` or `cuda-…`, printable, one word.
fn check_numerics(n: &str) -> Result<String> {
    let ok = (n.starts_with("cpu-") || n.starts_with("cuda-"))
        && n.len() <= 200
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(n.to_string())
    } else {
        Err(CliError::user(format!(
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
fn local_device(env: &Env, planned: &Compute, quiet: bool) -> Result<std::sync::Arc<Compute>> {
    let real = env.device(quiet)?;
    if env.numerics.is_some() && real.numerics() != planned.numerics() {
        return Err(CliError::user(format!(
            "--numerics {} plans for another device class than this machine's device ({}), which computes {}",
            planned.numerics(),
            real.name(),
            real.numerics()
        ))
        .hint("drop --numerics (and $UPCC_NUMERICS) to compute here, or run where that class is computed"));
    }
    Ok(real)
}

struct Loaded {
    spec: Spec,
    built: Built,
    selection: Selection,
    compute: std::sync::Arc<Compute>,
}

fn load(args: &SpecArgs, threads: usize, env: &Env) -> Result<Loaded> {
    load_with(args, threads, env.compute(args.json)?)
}

/// [`load`] with a device already resolved.
fn load_with(args: &SpecArgs, threads: usize, compute: std::sync::Arc<Compute>) -> Result<Loaded> {
    let (spec_arg, selectors) = args
        .spec_and_selectors
        .split_first()
        .expect("clap requires a spec");
    let spec = spec::load(spec_arg, &args.set)?;
    let built = build(&spec, threads, compute.clone())?;
    let selection = select::parse(selectors, &built)?;
    Ok(Loaded {
        spec,
        built,
        selection,
        compute,
    })
}

/// Refuse, before anything runs, the nodes about to train on this machine's CPU whose
/// networks cannot fit in the memory this process may use (physical memory, `ulimit -v`, the
/// cgroup's limit): `computes()[i]` says whether node `i` of `dag` is computed by this process,
/// asked only when some node is too large (a GPU's nodes hold their networks in the GPU's
/// memory).
fn check_memory(
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
    Err(CliError::user(format!(
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

fn memory_default_mb() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
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

fn cpu_description() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
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

fn provenance(run_id: String, compute: &Compute) -> ProvenanceBase {
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

fn run_id() -> String {
    let t = upcc_engine::fsutil::rfc3339(SystemTime::now()).replace([':', '-'], "");
    match std::env::var("SLURM_JOB_ID") {
        Ok(j) if !j.is_empty() => format!("{t}-{}-slurm{j}", std::process::id()),
        _ => format!("{t}-{}", std::process::id()),
    }
}

/// What `run` shows for the targets it touched: tables rendered from whatever is fresh, and
/// where figures are.
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

/// The tables and figures of the targets touched by a run. `healed` is set when a corrupt
/// object was met (and quarantined): the caller runs the engine again and re-renders.
fn render_views(
    loaded: &Loaded,
    store: &Store,
    touched: &BTreeSet<usize>,
    healed: &mut bool,
) -> Result<Vec<(String, String)>> {
    let dag = &loaded.built.dag;
    let entries = plan(dag, store, &loaded.spec.file.name)?;
    let mut out = Vec::new();
    let mut targets: Vec<&crate::graph::TargetNodes> = loaded.built.targets.iter().collect();
    // In the order the spec declares them.
    targets.sort_by_key(|t| {
        loaded
            .spec
            .target_order
            .iter()
            .position(|n| n == &t.name)
            .unwrap_or(usize::MAX)
    });
    for t in targets {
        let involved =
            touched.contains(&t.node) || t.cells.iter().any(|c| touched.contains(&c.leaf));
        if !involved {
            continue;
        }
        if t.kind == TargetKind::Runtime {
            let r = crate::report::runtime_table(
                t,
                dag,
                &entries,
                store,
                &mut crate::report::Durations::new(),
            )?;
            out.push((t.name.clone(), r.markdown));
            continue;
        }
        if t.kind.is_figure() {
            let fresh = entries[t.node]
                .key
                .filter(|_| entries[t.node].status == NodeStatus::Fresh);
            let manifest = match fresh {
                Some(k) => store.fresh_manifest(&k)?.map(|m| (k, m)),
                None => None,
            };
            // A figure is re-hashed like everything else before it is shown.
            let manifest = match manifest {
                Some((k, m)) => {
                    let png = view_object(store, &k, &m.outputs["png"].digest, healed)?;
                    let svg = view_object(store, &k, &m.outputs["svg"].digest, healed)?;
                    (png.is_some() && svg.is_some()).then_some(m)
                }
                None => None,
            };
            let text = match manifest {
                Some(m) => format!(
                    "### {}\n\nfigure: {} (PNG), {} (SVG)\n",
                    t.layout.title,
                    store.object_path(&m.outputs["png"].digest).display(),
                    store.object_path(&m.outputs["svg"].digest).display()
                ),
                None => {
                    let done = t
                        .cells
                        .iter()
                        .filter(|c| entries[c.leaf].status == NodeStatus::Fresh)
                        .count();
                    format!("### {}\n\nfigure not drawn yet: {done} of {} cell trials have their results\n", t.layout.title, t.cells.len())
                }
            };
            out.push((t.name.clone(), text));
            continue;
        }
        let source = TableSource::of(t.kind);
        let mut found: Vec<(&TableInput, Vec<u8>)> = Vec::new();
        for (cell, input) in t.cells.iter().zip(&t.inputs) {
            let e = &entries[cell.leaf];
            if e.status != NodeStatus::Fresh {
                continue;
            }
            let key = e.key.expect("fresh nodes have keys");
            if let Some(m) = store.fresh_manifest(&key)? {
                let Some(bytes) = view_object(store, &key, &m.outputs[cell.output].digest, healed)?
                else {
                    continue;
                };
                found.push((input, bytes));
            }
        }
        let inputs: Vec<(&TableInput, &[u8])> =
            found.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        let r = render_target(source, &t.layout, &inputs, t.trials)
            .map_err(|e| CliError::env(e.to_string()))?;
        out.push((t.name.clone(), r.markdown));
    }
    Ok(out)
}

/// One report for two engine passes: a node counts as executed if either pass executed it.
fn merge_reports(
    first: upcc_engine::RunReport,
    second: upcc_engine::RunReport,
) -> upcc_engine::RunReport {
    let mut nodes = first.nodes;
    for (n, again) in nodes.iter_mut().zip(second.nodes) {
        if again.outcome != Outcome::Cached || n.outcome == Outcome::Failed {
            *n = again;
        }
    }
    upcc_engine::RunReport { nodes }
}

/// Threads per CPU training node when --node-threads is not given: small networks scale to a
/// few threads, so a many-core machine runs several nodes side by side (README, Benchmarks).
pub const DEFAULT_NODE_THREADS: usize = 4;

pub fn run(args: &RunArgs, env: &Env) -> Result<i32> {
    let store_flag = &env.store;
    let t0 = Instant::now();
    let threads = args.threads.unwrap_or_else(default_threads).max(1);
    if args.node_threads == Some(0) {
        return Err(CliError::user("--node-threads must be at least 1"));
    }
    let node_threads = args
        .node_threads
        .unwrap_or(DEFAULT_NODE_THREADS)
        .clamp(1, threads);
    let mut loaded = load(&args.spec, node_threads, env)?;
    let section = crate::slurm::executor_section(loaded.spec.file.executor.as_ref())?;
    let executor = args
        .executor
        .unwrap_or(if section.kind.as_deref() == Some("slurm") {
            ExecutorArg::Slurm
        } else {
            ExecutorArg::Local
        });
    if args.detach && executor != ExecutorArg::Slurm {
        return Err(CliError::user(
            "--detach leaves jobs running on a cluster; it applies to the Slurm executor",
        )
        .hint("add `--executor slurm`, or drop --detach"));
    }
    if executor == ExecutorArg::Local && env.numerics.is_some() {
        // Planned for a class: this machine must compute it, and then trains with its device.
        let real = local_device(env, &loaded.compute, args.spec.json)?;
        loaded = load_with(&args.spec, node_threads, real)?;
    }
    let roots = select::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    if executor == ExecutorArg::Local {
        // This process trains: a GPU that cannot be used fails the run here, before anything
        // is computed or written (the kernels are compiled now, once).
        loaded.compute.open()?;
    }
    if executor == ExecutorArg::Local {
        // Before the store is created or anything written: the nodes this run computes.
        let computes = || -> Result<Vec<bool>> {
            Ok(match open_store(store_flag, false) {
                Ok(store) if !args.force => plan(&dag, &store, &loaded.spec.file.name)?
                    .iter()
                    .map(|e| e.status != NodeStatus::Fresh)
                    .collect(),
                _ => vec![true; dag.len()],
            })
        };
        check_memory(&loaded.built, &dag, computes, &loaded.compute)?;
    }
    let store = open_store(store_flag, true)?;
    if executor == ExecutorArg::Slurm {
        return run_slurm(args, env, &loaded, &dag, &store, &section.slurm, t0);
    }
    let progress = match args.progress {
        ProgressArg::Bars => ProgressMode::Bars,
        ProgressArg::Plain => ProgressMode::Plain,
        ProgressArg::None => ProgressMode::Quiet,
        ProgressArg::Auto => {
            if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
                ProgressMode::Bars
            } else {
                ProgressMode::Plain
            }
        }
    };
    let force: BTreeSet<usize> = if args.force {
        (0..dag.len()).collect()
    } else {
        BTreeSet::new()
    };
    let cfg = RunConfig {
        spec: loaded.spec.file.name.clone(),
        threads,
        memory_mb: args.memory_mb.unwrap_or_else(memory_default_mb),
        keep_going: args.keep_going,
        force,
        provenance: provenance(run_id(), &loaded.compute),
        poll_interval: Duration::from_millis(250),
        gpus: loaded.compute.gpu_budgets_mb(),
    };
    if progress != ProgressMode::Quiet {
        eprintln!(
            "upcc: {} nodes in `{}`, store `{}`, {threads} threads ({node_threads} per training node), device {} ({})",
            dag.len(),
            loaded.spec.display,
            store.root().display(),
            loaded.compute.name(),
            loaded.compute.numerics()
        );
    }
    if progress != ProgressMode::Quiet {
        // What is left, from the times this store recorded for comparable nodes.
        let entries = plan(&dag, &store, &loaded.spec.file.name)?;
        let eta = crate::eta::estimate(&store, &dag, &entries, args.force)?;
        if eta.with_basis + eta.without_basis > 0 {
            eprintln!("upcc: {}", eta.describe());
        }
    }
    let mut ui = Progress::new(progress, dag.len());
    let first = engine_run(&dag, &store, &cfg, &mut ui);
    ui.done();
    let mut report = first?;
    // Map back to indices of the full DAG to find the targets touched.
    let touched: BTreeSet<usize> = dag
        .nodes()
        .iter()
        .filter_map(|n| loaded.built.dag.index_of(&n.id))
        .collect();
    let mut tables = Vec::new();
    for pass in 0..3 {
        let mut healed = false;
        tables = render_views(&loaded, &store, &touched, &mut healed)?;
        if !healed || pass == 2 {
            break;
        }
        // A result the views read was corrupt and is quarantined: compute it again.
        let mut ui = Progress::new(progress, dag.len());
        let again = engine_run(&dag, &store, &cfg, &mut ui);
        ui.done();
        let again = again?;
        report = merge_reports(report, again);
    }
    let (executed, cached, elsewhere, failed, skipped) = (
        report.count(Outcome::Executed),
        report.count(Outcome::Cached),
        report.count(Outcome::ComputedElsewhere),
        report.count(Outcome::Failed),
        report.count(Outcome::Skipped),
    );
    let seconds = t0.elapsed().as_secs_f64();
    if args.spec.json {
        let nodes: Vec<_> = report
            .nodes
            .iter()
            .map(|n| json!({"id": n.id, "stage": n.stage, "outcome": n.outcome, "key": n.key.map(|k| k.to_hex()), "duration_s": n.duration_s, "error": n.error}))
            .collect();
        let obj = json!({
            "executed": executed, "cached": cached + elsewhere, "computed_elsewhere": elsewhere, "failed": failed, "skipped": skipped,
            "total": report.nodes.len(), "seconds": seconds, "store": store.root().display().to_string(),
            "device": loaded.compute.name(), "numerics": loaded.compute.numerics(),
            "nodes": nodes, "tables": tables.iter().cloned().collect::<BTreeMap<_, _>>(),
        });
        println!("{obj}");
    } else {
        let mut out = std::io::stdout().lock();
        for (_, md) in &tables {
            let _ = writeln!(out, "{md}");
        }
    }
    for n in report.nodes.iter().filter(|n| n.outcome == Outcome::Failed) {
        eprintln!(
            "error: node `{}` failed: {}",
            n.id,
            n.error.as_deref().unwrap_or("unknown error")
        );
        if let Some(k) = n.key {
            eprintln!("  log: {}", store.log_path(&k).display());
        }
    }
    if executed == 0 && failed == 0 && skipped == 0 {
        eprintln!(
            "upcc: all {} nodes cached; nothing to do ({seconds:.1} s)",
            report.nodes.len()
        );
    } else {
        eprintln!(
            "upcc: {} nodes: {executed} executed, {} cached{}, {failed} failed, {skipped} skipped ({seconds:.1} s)",
            report.nodes.len(),
            cached + elsewhere,
            if elsewhere > 0 { format!(" ({elsewhere} by another process)") } else { String::new() }
        );
    }
    Ok(match report.failure_tier() {
        None => 0,
        Some(upcc_engine::Tier::User) => 2,
        Some(upcc_engine::Tier::Environment) => 1,
        Some(upcc_engine::Tier::Internal) => 3,
    })
}

fn status_word(s: NodeStatus) -> &'static str {
    match s {
        NodeStatus::Fresh => "fresh",
        NodeStatus::Stale => "stale",
        NodeStatus::Missing => "missing",
    }
}

pub fn status(args: &SpecArgs, env: &Env) -> Result<i32> {
    let store_flag = &env.store;
    let loaded = load(args, default_threads(), env)?;
    let roots = select::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    // A store that does not exist yet is empty: report everything as missing, create nothing.
    let path = store_path(store_flag);
    let store = if path.join("STORE.json").exists() {
        open_store(store_flag, false)?
    } else {
        Store::view_nonexistent(&path)
    };
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    // Nodes another process is computing right now (its lease is held; a dead holder's is not).
    let running: Vec<Option<upcc_engine::LeaseHolder>> = entries
        .iter()
        .map(|e| match (e.status, e.key) {
            (NodeStatus::Fresh, _) | (_, None) => None,
            (_, Some(k)) => store.running(&k).map(|h| {
                h.unwrap_or(upcc_engine::LeaseHolder {
                    host: "?".into(),
                    pid: 0,
                    run_id: String::new(),
                    since: "?".into(),
                    heartbeat: None,
                    heartbeat_every_s: None,
                })
            }),
        })
        .collect();
    // Slurm jobs submitted for nodes that are not fresh: queued, running or ended without a
    // result (read from squeue/sacct once for all of them).
    // A store never used with Slurm has no `jobs/`: no recipes to hash, no records to read.
    let records: Vec<Option<crate::slurm::JobRecord>> = if crate::slurm::has_jobs(&store) {
        let recipes = crate::slurm::recipes(&dag);
        entries
            .iter()
            .zip(&recipes)
            .map(|(e, r)| match e.status {
                NodeStatus::Fresh => None,
                _ => crate::slurm::read_record(&store, r),
            })
            .collect()
    } else {
        vec![None; entries.len()]
    };
    let ids: Vec<String> = records.iter().flatten().map(|r| r.job_id.clone()).collect();
    let states = if ids.is_empty() {
        std::collections::HashMap::new()
    } else {
        crate::slurm::job_states(&ids)?
    };
    let jobs: Vec<Option<(String, crate::slurm::JobState)>> = records
        .iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let st = states
                    .get(&r.job_id)
                    .cloned()
                    .unwrap_or(crate::slurm::JobState::Unknown);
                (r.job_id.clone(), st)
            })
        })
        .collect();
    let eta = crate::eta::estimate(&store, &dag, &entries, false)?;
    let count = |s: NodeStatus| entries.iter().filter(|e| e.status == s).count();
    let n_running = running.iter().filter(|r| r.is_some()).count();
    let n_jobs = |f: fn(&crate::slurm::JobState) -> bool| {
        jobs.iter().flatten().filter(|(_, s)| f(s)).count()
    };
    let (queued_jobs, running_jobs, failed_jobs) = (
        n_jobs(|s| matches!(s, crate::slurm::JobState::Queued(_))),
        n_jobs(|s| matches!(s, crate::slurm::JobState::Running)),
        n_jobs(|s| !s.alive()),
    );
    let (fresh, stale, missing) = (
        count(NodeStatus::Fresh),
        count(NodeStatus::Stale),
        count(NodeStatus::Missing),
    );
    if args.json {
        let nodes: Vec<_> = entries
            .iter()
            .zip(&running)
            .zip(&jobs)
            .map(|((e, r), j)| {
                let mut n = json!({"id": e.id, "stage": e.stage, "status": e.status, "key": e.key.map(|k| k.to_hex()), "reasons": e.reasons});
                if let Some(h) = r {
                    n["running"] = json!({"pid": h.pid, "host": h.host, "since": h.since, "run_id": h.run_id,
                        "heartbeat_age_s": h.heartbeat_age().map(|a| a.as_secs()),
                        "stalled": h.expired(&upcc_engine::LeaseTiming::from_env())});
                }
                if let Some((id, st)) = j {
                    let (state, detail) = match st {
                        crate::slurm::JobState::Queued(r) => ("queued", r.clone()),
                        crate::slurm::JobState::Running => ("running", String::new()),
                        crate::slurm::JobState::Ended(s) => ("failed", s.clone()),
                        crate::slurm::JobState::Unknown => ("failed", "gone".into()),
                    };
                    n["slurm"] = json!({"job": id, "state": state, "detail": detail});
                }
                n
            })
            .collect();
        println!(
            "{}",
            json!({"fresh": fresh, "stale": stale, "missing": missing, "running": n_running, "total": entries.len(), "estimate": eta.to_json(),
                   "device": loaded.compute.name(), "numerics": loaded.compute.numerics(),
                   "slurm": {"queued": queued_jobs, "running": running_jobs, "failed": failed_jobs}, "nodes": nodes})
        );
    } else {
        let width = entries.iter().map(|e| e.id.len()).max().unwrap_or(4).max(4);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{:<8} {:<12} {:<width$}  WHY",
            "STATUS", "STAGE", "NODE"
        );
        for ((e, r), j) in entries.iter().zip(&running).zip(&jobs) {
            let why = if e.reasons.len() > 2 {
                format!(
                    "{}; … (+{} more)",
                    e.reasons[..2].join("; "),
                    e.reasons.len() - 2
                )
            } else {
                e.reasons.join("; ")
            };
            let (word, why) = match (r, j) {
                (Some(h), _) if h.expired(&upcc_engine::LeaseTiming::from_env()) => (
                    "stalled",
                    format!(
                        "pid {} on {} holds its lease but has not beaten for {} s; the next run takes it over",
                        h.pid,
                        h.host,
                        h.heartbeat_age().map(|a| a.as_secs()).unwrap_or(0)
                    ),
                ),
                (Some(h), _) => (
                    "running",
                    format!(
                        "pid {} on {} since {}{}",
                        h.pid,
                        h.host,
                        h.since,
                        h.heartbeat_age()
                            .map(|a| format!(", heartbeat {} s ago", a.as_secs()))
                            .unwrap_or_default()
                    ),
                ),
                (None, Some((id, st))) => match st {
                    crate::slurm::JobState::Queued(_) => ("queued", st.describe(id)),
                    crate::slurm::JobState::Running => ("running", st.describe(id)),
                    _ => (
                        "failed",
                        format!("{}; `upcc explain` shows its log", st.describe(id)),
                    ),
                },
                (None, None) => (status_word(e.status), why),
            };
            let _ = writeln!(out, "{word:<8} {:<12} {:<width$}  {why}", e.stage, e.id);
        }
        let _ = writeln!(
            out,
            "\n{} nodes: {fresh} fresh, {stale} stale, {missing} missing{}",
            entries.len(),
            if n_running > 0 {
                format!(" ({n_running} of them running now)")
            } else {
                String::new()
            }
        );
        if !ids.is_empty() {
            let _ = writeln!(
                out,
                "slurm jobs: {queued_jobs} queued, {running_jobs} running, {failed_jobs} ended without a result"
            );
        }
        if stale + missing > 0 {
            let _ = writeln!(out, "{}", eta.describe());
        }
    }
    Ok(0)
}

pub fn explain(args: &ExplainArgs, env: &Env) -> Result<i32> {
    let (store_flag, verbose) = (&env.store, env.verbose);
    let spec_arg = &args.spec;
    let Some(node_arg) = &args.node else {
        return Err(CliError::user(format!(
            "`upcc explain {spec_arg}` needs a node: which node of the spec to explain"
        ))
        .hint(format!(
            "`upcc status {spec_arg}` lists the node ids; then `upcc explain {spec_arg} NODE` (a node id or a key prefix)"
        )));
    };
    let spec = spec::load(spec_arg, &args.set)?;
    let built = build(&spec, default_threads(), env.compute(args.json)?)?;
    let dag = &built.dag;
    let path = store_path(store_flag);
    let store = if path.join("STORE.json").exists() {
        open_store(store_flag, false)?
    } else {
        Store::view_nonexistent(&path)
    };
    let index = match dag.index_of(node_arg) {
        Some(i) => i,
        None => {
            let matches: Vec<usize> = (0..dag.len())
                .filter(|&i| dag.node(i).id.contains(node_arg.as_str()))
                .collect();
            match matches.len() {
                1 => matches[0],
                0 => {
                    // A key prefix?
                    let entries = plan(dag, &store, &spec.file.name)?;
                    let by_key: Vec<usize> = entries
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| {
                            e.key.is_some_and(|k| {
                                node_arg.len() >= 6 && k.to_hex().starts_with(node_arg.as_str())
                            })
                        })
                        .map(|(i, _)| i)
                        .collect();
                    if by_key.len() == 1 {
                        by_key[0]
                    } else {
                        let mut e =
                            CliError::user(format!("no node `{node_arg}` in `{}`", spec.display));
                        if let Some(n) = crate::error::nearest(
                            node_arg,
                            dag.nodes().iter().map(|n| n.id.as_str()),
                        ) {
                            e = e.hint(format!("did you mean `{n}`?"));
                        }
                        return Err(e.hint("`upcc status SPEC` lists the node ids"));
                    }
                }
                _ => {
                    let list: Vec<&str> = matches
                        .iter()
                        .take(8)
                        .map(|&i| dag.node(i).id.as_str())
                        .collect();
                    return Err(CliError::user(format!(
                        "`{node_arg}` matches {} nodes",
                        matches.len()
                    ))
                    .hint(format!(
                        "be more specific, e.g. one of: {}",
                        list.join(", ")
                    )));
                }
            }
        }
    };
    let sub = dag.restrict(&[index]);
    let entries = plan(&sub, &store, &spec.file.name)?;
    let e: &PlanEntry = entries.last().expect("the node itself");
    let node = sub.node(sub.len() - 1);
    let manifest = match e.key {
        Some(k) => store.read_manifest(&k)?,
        None => None,
    };
    let previous = store.read_ref(&spec.file.name, &node.id)?;
    let inputs: Vec<serde_json::Value> = node
        .inputs
        .iter()
        .map(|(name, inp)| match inp {
            upcc_engine::InputDef::Node { node: up, output } => json!({"name": name, "from": sub.node(up.0).id, "output": output, "status": status_word(entries[up.0].status)}),
            upcc_engine::InputDef::Source(s) => json!({"name": name, "source": s.display()}),
        })
        .collect();
    if args.json {
        println!(
            "{}",
            json!({
                "id": node.id, "stage": node.stage, "stage_version": node.stage_version, "status": e.status,
                "key": e.key.map(|k| k.to_hex()), "reasons": e.reasons, "inputs": inputs, "params": node.params,
                "numerics": node.numerics, "numerics_parts": crate::device::describe_numerics(&node.numerics), "manifest": manifest, "log": e.key.map(|k| store.log_path(&k).display().to_string()),
                "log_text": e.key.and_then(|k| std::fs::read_to_string(store.log_path(&k)).ok()),
            })
        );
        return Ok(0);
    }
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "node      {}", node.id);
    let _ = writeln!(
        o,
        "stage     {} (version {}), numerics {}",
        node.stage, node.stage_version, node.numerics
    );
    for part in crate::device::describe_numerics(&node.numerics) {
        let _ = writeln!(o, "          {part}");
    }
    let _ = writeln!(o, "status    {}", status_word(e.status));
    if let Some(k) = e.key {
        let _ = writeln!(o, "key       {k}");
    }
    for r in &e.reasons {
        let _ = writeln!(o, "why       {r}");
    }
    if let Some(p) = &previous {
        if Some(p.key) != e.key {
            let _ = writeln!(o, "previous  {} (last computed key of this node)", p.key);
        }
    }
    let _ = writeln!(o, "inputs");
    for i in &inputs {
        match (i.get("from"), i.get("source")) {
            (Some(from), _) => {
                let _ = writeln!(
                    o,
                    "  {:<12} ← {} [{}] ({})",
                    i["name"].as_str().unwrap_or(""),
                    from.as_str().unwrap_or(""),
                    i["output"].as_str().unwrap_or(""),
                    i["status"].as_str().unwrap_or("")
                );
            }
            (_, Some(src)) => {
                let _ = writeln!(
                    o,
                    "  {:<12} ← file {}",
                    i["name"].as_str().unwrap_or(""),
                    src.as_str().unwrap_or("")
                );
            }
            _ => {}
        }
    }
    let _ = writeln!(
        o,
        "params    {}",
        serde_json::to_string_pretty(&node.params)
            .unwrap_or_default()
            .replace('\n', "\n          ")
    );
    match &manifest {
        Some(m) => {
            let _ = writeln!(o, "outputs");
            for (name, out) in &m.outputs {
                let _ = writeln!(
                    o,
                    "  {:<12} {}  {:>10} bytes  {}  {}",
                    name,
                    out.digest.short(),
                    out.bytes,
                    out.media_type,
                    store.object_path(&out.digest).display()
                );
            }
            let _ = writeln!(o, "summary   {}", m.summary);
            let p = &m.provenance;
            let _ = writeln!(
                o,
                "computed  {} → {} ({:.1} s) on {} by {} (pid {}, run {})",
                p.started_at,
                p.finished_at,
                p.duration_s,
                p.host,
                p.user.as_deref().unwrap_or("?"),
                p.pid,
                p.run_id
            );
            let _ = writeln!(
                o,
                "          {} {} (git {}), {} threads, {}, {}",
                p.tool,
                p.tool_version,
                p.git_revision.as_deref().unwrap_or("unknown"),
                p.threads,
                p.cpu,
                p.os
            );
            if let Some(rss) = p.process_peak_rss_bytes {
                let _ = writeln!(
                    o,
                    "          process peak RSS {:.1} MiB",
                    rss as f64 / 1048576.0
                );
            }
            for (k, v) in p.libraries.iter().filter(|(k, _)| k.starts_with("device")) {
                let _ = writeln!(o, "          {k} {v}");
            }
        }
        None => {
            let _ = writeln!(o, "outputs   (not computed for this key)");
        }
    }
    // A Slurm job submitted for this key: its state and the end of its output.
    if let Some(r) = Some(())
        .filter(|_| e.status != NodeStatus::Fresh && crate::slurm::has_jobs(&store))
        .and_then(|_| crate::slurm::recipes(&sub).pop())
        .and_then(|recipe| crate::slurm::read_record(&store, &recipe))
    {
        let state = crate::slurm::job_states(std::slice::from_ref(&r.job_id))
            .ok()
            .and_then(|s| s.get(&r.job_id).cloned())
            .map(|s| s.describe(&r.job_id))
            .unwrap_or_else(|| format!("slurm job {} (squeue unavailable)", r.job_id));
        let _ = writeln!(
            o,
            "slurm     {state}; submitted {} by {} on {}",
            r.submitted,
            r.user.as_deref().unwrap_or("?"),
            r.host
        );
        let _ = writeln!(o, "job log   {}", r.log);
        if let Some(tail) = crate::slurm::log_tail(&r, if verbose >= 1 { 10_000 } else { 20 }) {
            for l in tail.lines() {
                let _ = writeln!(o, "  | {l}");
            }
        }
    }
    // The node's log (of its last execution under this key, a failed one included).
    if let Some(k) = e.key {
        let path = store.log_path(&k);
        if let Ok(text) = std::fs::read_to_string(&path) {
            let lines: Vec<&str> = text.lines().collect();
            let keep = if verbose >= 1 { lines.len() } else { 40 };
            let _ = writeln!(o, "log       {}", path.display());
            if lines.len() > keep {
                let _ = writeln!(
                    o,
                    "          … {} earlier lines (-v shows all)",
                    lines.len() - keep
                );
            }
            for l in &lines[lines.len().saturating_sub(keep)..] {
                let _ = writeln!(o, "  | {l}");
            }
        }
    }
    if verbose >= 1 {
        match &e.material {
            Some(m) => {
                let _ = writeln!(
                    o,
                    "key material (canonical JSON hashed for the key):\n{}",
                    m.canonical_json().unwrap_or_default()
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "key material: not known until the upstream nodes have run"
                );
            }
        }
    }
    Ok(0)
}

pub fn verify(store_flag: &Option<PathBuf>) -> Result<i32> {
    let store = open_store(store_flag, false)?;
    let report = store.verify(|_, _| {})?;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(
        o,
        "checked {} objects, {} manifests and {} refs in `{}`",
        report.objects_checked,
        report.manifests_checked,
        report.refs_checked,
        store.root().display()
    );
    for d in &report.corrupt_objects {
        let _ = writeln!(o, "corrupt object {d}: quarantined");
    }
    for k in &report.manifests_quarantined {
        let _ = writeln!(
            o,
            "result {k} is unreadable, misfiled or lost an output: quarantined (it will be recomputed)"
        );
    }
    for r in &report.refs_quarantined {
        let _ = writeln!(o, "ref {r} is unreadable: quarantined");
    }
    for m in &report.misplaced_moved {
        let _ = writeln!(
            o,
            "{m} was of the wrong kind (a file where a folder belongs, or a folder where a file does): moved to quarantine"
        );
    }
    if report.stale_temp_files_removed > 0 {
        let _ = writeln!(
            o,
            "removed {} temporary files left by interrupted runs",
            report.stale_temp_files_removed
        );
    }
    if report.is_clean() {
        let _ = writeln!(o, "store is intact");
        Ok(0)
    } else {
        eprintln!("error: the store had corrupt data; it was quarantined under `{}` and will be recomputed by the next run", store.root().join("quarantine").display());
        Ok(1)
    }
}

pub fn gc(args: &GcArgs, env: &Env) -> Result<i32> {
    let grace_minutes = u64::try_from(args.grace_minutes).map_err(|_| {
        CliError::user(format!(
            "--grace-minutes must be 0 or more, got {}",
            args.grace_minutes
        ))
        .hint("0 keeps nothing for being recent; the default 60 keeps what was written in the last hour")
    })?;
    let store = open_store(&env.store, false)?;
    let mut keep: BTreeSet<Digest<NodeKeyTag>> = BTreeSet::new();
    // Results of every device class in the store are kept, not only this machine's: a `gc` on
    // a login node without a GPU must not delete what the GPU nodes computed.
    let classes = numerics_classes(&store)?;
    // Slurm jobs that may still run read what their specs reach: keep that too.
    let mut specs: Vec<(String, Vec<String>)> =
        args.specs.iter().map(|s| (s.clone(), vec![])).collect();
    for r in crate::slurm::live_records(&store)? {
        if !specs
            .iter()
            .any(|(s, sets)| *s == r.spec && *sets == r.sets)
        {
            eprintln!(
                "upcc: keeping what spec `{}` reaches: its slurm job {} (node `{}`) is queued or running",
                r.spec, r.job_id, r.node
            );
            specs.push((r.spec.clone(), r.sets.clone()));
        }
    }
    for (s, sets) in &specs {
        let spec = spec::load(s, sets).map_err(|e| {
            e.hint("gc keeps what the specs of queued or running slurm jobs reach; wait for them or `upcc cancel` them first")
        })?;
        for class in &classes {
            let built = crate::graph::build_for_numerics(&spec, class)?;
            for e in plan(&built.dag, &store, &spec.file.name)? {
                if e.status == NodeStatus::Fresh {
                    keep.insert(e.key.expect("fresh nodes have keys"));
                }
            }
        }
    }
    let r = store.gc(&keep, Duration::from_secs(grace_minutes * 60), args.dry_run)?;
    println!(
        "{}{} results and {} objects ({:.1} MiB) {}; kept {} results ({} only because they are recent) and {} objects",
        if args.dry_run { "dry run: " } else { "" },
        r.manifests_deleted,
        r.objects_deleted,
        r.bytes_freed as f64 / 1048576.0,
        if args.dry_run { "would be deleted" } else { "deleted" },
        r.manifests_kept,
        r.kept_because_recent,
        r.objects_kept
    );
    Ok(0)
}

/// The numerics classes of training results in the store (always including the CPU's).
fn numerics_classes(store: &Store) -> Result<BTreeSet<String>> {
    let mut classes = BTreeSet::from([Compute::cpu().numerics()]);
    for key in store.list_manifests()? {
        if let Ok(Some(m)) = store.read_manifest(&key) {
            if m.material.numerics != "exact" {
                classes.insert(m.material.numerics.clone());
            }
        }
    }
    Ok(classes)
}

/// `run --executor slurm`: submit a job per node to compute (reusing queued or running ones),
/// then follow them until every node is done or failed, unless `--detach`.
fn run_slurm(
    args: &RunArgs,
    env: &Env,
    loaded: &Loaded,
    dag: &upcc_engine::Dag,
    store: &Store,
    settings: &crate::slurm::SlurmSettings,
    t0: Instant,
) -> Result<i32> {
    if args.force {
        return Err(CliError::user(
            "--force recomputes fresh results on this machine; the Slurm executor submits only what is not computed",
        )
        .hint("run the determinism check locally (`--executor local --force`) on the cell you want"));
    }
    let quiet = args.spec.json || matches!(args.progress, ProgressArg::None);
    let device = Some(
        if loaded.compute.is_gpu() {
            "cuda"
        } else {
            "cpu"
        }
        .to_string(),
    );
    let inv = crate::slurm::Invocation::new(
        &args.spec.spec_and_selectors[0],
        &args.spec.set,
        store.root(),
        device,
        env.gpus.clone(),
        loaded.compute.numerics(),
    );
    let sub = crate::slurm::submit(
        dag,
        &loaded.spec.file.name,
        store,
        settings,
        &inv,
        loaded.compute.is_gpu(),
    )?;
    if !quiet {
        eprintln!(
            "upcc: slurm: {} of {} nodes to compute: {} jobs submitted, {} already queued or running (store `{}`)",
            sub.jobs.len(),
            dag.len(),
            sub.new,
            sub.attached,
            store.root().display()
        );
    }
    let spec_arg = &args.spec.spec_and_selectors[0];
    if args.detach {
        let msg = format!(
            "upcc: detached; `upcc status {spec_arg}` shows the jobs, `upcc run {spec_arg} --executor slurm` re-attaches, `upcc cancel {spec_arg}` cancels them"
        );
        if args.spec.json {
            println!(
                "{}",
                json!({"executor": "slurm", "detached": true, "submitted": sub.new, "attached": sub.attached,
                       "jobs": sub.jobs.iter().map(|(i, id)| (dag.node(*i).id.clone(), id.clone())).collect::<BTreeMap<_, _>>()})
            );
        }
        eprintln!("{msg}");
        return Ok(0);
    }
    let poll = Duration::from_secs_f64(settings.poll_seconds.unwrap_or(5.0));
    let outcome = crate::slurm::attach(dag, &loaded.spec.file.name, &sub.jobs, store, poll, quiet)?;
    let touched: BTreeSet<usize> = dag
        .nodes()
        .iter()
        .filter_map(|n| loaded.built.dag.index_of(&n.id))
        .collect();
    let mut healed = false;
    let tables = render_views(loaded, store, &touched, &mut healed)?;
    let seconds = t0.elapsed().as_secs_f64();
    if args.spec.json {
        let failed: Vec<_> = outcome
            .failed
            .iter()
            .map(|(i, why)| json!({"id": dag.node(*i).id, "error": why}))
            .collect();
        println!(
            "{}",
            json!({"executor": "slurm", "submitted": sub.new, "attached": sub.attached, "done": outcome.done.len(),
                   "failed": outcome.failed.len(), "failures": failed, "total": dag.len(), "seconds": seconds,
                   "store": store.root().display().to_string(), "tables": tables.iter().cloned().collect::<BTreeMap<_, _>>()})
        );
    } else {
        let mut out = std::io::stdout().lock();
        for (_, md) in &tables {
            let _ = writeln!(out, "{md}");
        }
    }
    for (i, why) in &outcome.failed {
        eprintln!("error: node `{}`: {why}", dag.node(*i).id);
        if let Some(r) = crate::slurm::read_record(store, &sub.recipes[*i]) {
            eprintln!("  job log: {}", r.log);
        }
    }
    if healed {
        eprintln!("upcc: warning: corrupt results were quarantined while reading; run again to recompute them");
    }
    eprintln!(
        "upcc: {} nodes: {} computed by Slurm jobs, {} failed ({seconds:.1} s)",
        dag.len(),
        outcome.done.len(),
        outcome.failed.len()
    );
    Ok(if outcome.failed.is_empty() && !healed {
        0
    } else {
        1
    })
}

/// `upcc job SPEC NODE --key HEX`: compute exactly one node whose inputs are computed.
/// `upcc device`: the device a run would train on, opened as a run opens it.
pub fn device(args: &crate::cli::DeviceArgs, env: &Env) -> Result<i32> {
    let compute = env.device(args.json)?;
    let t0 = Instant::now();
    compute.open()?;
    let opened_s = t0.elapsed().as_secs_f64();
    let info = compute.info();
    if args.json {
        let facts: BTreeMap<_, _> = info.facts.iter().cloned().collect();
        println!(
            "{}",
            json!({"device": compute.name(), "numerics": compute.numerics(), "numerics_parts": crate::device::describe_numerics(&compute.numerics()), "facts": facts, "open_seconds": opened_s})
        );
    } else {
        let mut rows = vec![
            ("device".to_string(), compute.name()),
            (
                "numerics".to_string(),
                format!("{} (part of every training node's key)", compute.numerics()),
            ),
        ];
        rows.extend(
            crate::device::describe_numerics(&compute.numerics())
                .into_iter()
                .map(|p| ("  part".to_string(), p)),
        );
        rows.extend(info.facts.iter().cloned());
        if compute.is_gpu() {
            rows.push((
                "ready".into(),
                format!("kernels compiled and loaded in {opened_s:.2} s"),
            ));
        }
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = std::io::stdout().lock();
        for (k, v) in rows {
            let _ = writeln!(out, "{k:<w$}  {v}");
        }
    }
    Ok(0)
}

pub fn job(args: &JobArgs, env: &Env) -> Result<i32> {
    let (spec_arg, node_id) = (&args.spec_and_node[0], &args.spec_and_node[1]);
    let spec_args = SpecArgs {
        spec_and_selectors: vec![spec_arg.clone()],
        set: args.set.clone(),
        json: false,
    };
    let threads = std::env::var("UPCC_THREADS")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or_else(default_threads)
        .max(1);
    // A job plans with the numerics class its driver planned with, so that a node that does
    // not train (features, k-means, metrics, tables) runs on a machine without the driver's
    // device; a node that trains opens this machine's device, which must compute that class.
    let mut loaded = load(&spec_args, threads, env)?;
    let Some(i) = loaded.built.dag.index_of(node_id) else {
        return Err(CliError::user(format!("the spec `{spec_arg}` has no node `{node_id}`"))
            .hint("the spec changed since the job was submitted; rerun `upcc run SPEC --executor slurm`"));
    };
    if env.numerics.is_some() && loaded.built.dag.node(i).numerics != "exact" {
        let real = env.device(false)?;
        if real.numerics() != loaded.compute.numerics() {
            return Err(CliError::env(format!(
                "node `{node_id}` was planned for numerics class {} but this machine's device ({}) computes {}",
                loaded.compute.numerics(),
                real.name(),
                real.numerics()
            ))
            .hint("run the spec's training jobs on nodes with the device the driver planned for (the `training` resources of `executor.slurm`)"));
        }
        loaded = load_with(&spec_args, threads, real)?;
    }
    let dag = loaded.built.dag.restrict(&[i]);
    let store = open_store(&env.store, false)?;
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    let last = dag
        .index_of(node_id)
        .expect("the restricted DAG holds the node");
    let recipe = crate::slurm::recipes(&dag).swap_remove(last);
    if recipe != args.recipe {
        return Err(CliError::user(format!(
            "node `{node_id}` has recipe {} under the spec now, but the job was submitted for {}",
            &recipe[..12],
            &args.recipe[..args.recipe.len().min(12)]
        ))
        .hint("the spec, its parameters or upcc changed since the submission; rerun `upcc run SPEC --executor slurm`"));
    }
    let computes = || {
        Ok((0..dag.len())
            .map(|j| j == last && entries[j].status != NodeStatus::Fresh)
            .collect())
    };
    check_memory(&loaded.built, &dag, computes, &loaded.compute)?;
    if entries[last].status != NodeStatus::Fresh && dag.node(last).resources.gpu_memory_mb > 0 {
        // This job trains on the GPU: one that cannot be used fails it before it computes.
        loaded.compute.open()?;
    }
    for (j, e) in entries.iter().enumerate() {
        if j != last && e.status != NodeStatus::Fresh {
            return Err(CliError::env(format!(
                "input node `{}` of `{node_id}` is not computed ({})",
                e.id,
                status_word(e.status)
            ))
            .hint("its job failed or was cancelled; `upcc status` shows it"));
        }
    }
    let cfg = RunConfig {
        spec: loaded.spec.file.name.clone(),
        threads,
        memory_mb: memory_default_mb(),
        keep_going: false,
        force: BTreeSet::new(),
        provenance: provenance(run_id(), &loaded.compute),
        poll_interval: Duration::from_millis(250),
        gpus: loaded.compute.gpu_budgets_mb(),
    };
    let mut ui = Progress::new(ProgressMode::Plain, dag.len());
    let report = engine_run(&dag, &store, &cfg, &mut ui);
    ui.done();
    let report = report?;
    let n = &report.nodes[last];
    match n.outcome {
        Outcome::Executed => eprintln!(
            "upcc job: computed {node_id} ({:.1} s)",
            n.duration_s.unwrap_or(0.0)
        ),
        Outcome::Failed => {
            eprintln!(
                "upcc job: node `{node_id}` failed: {}",
                n.error.as_deref().unwrap_or("unknown error")
            );
            if let Some(k) = n.key {
                eprintln!("  log: {}", store.log_path(&k).display());
            }
        }
        _ => eprintln!("upcc job: {node_id} was already computed"),
    }
    if n.outcome != Outcome::Failed {
        crate::slurm::remove_record(&store, &recipe);
    }
    Ok(match report.failure_tier() {
        None => 0,
        Some(upcc_engine::Tier::User) => 2,
        Some(upcc_engine::Tier::Environment) => 1,
        Some(upcc_engine::Tier::Internal) => 3,
    })
}

/// `upcc cancel SPEC [SELECTOR…]`: cancel the Slurm jobs of the selected stale nodes.
pub fn cancel(args: &SpecArgs, env: &Env) -> Result<i32> {
    let loaded = load(args, 1, env)?;
    let roots = select::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    let store = open_store(&env.store, false)?;
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    let (cancelled, records) = crate::slurm::cancel(&dag, &entries, &store)?;
    if args.json {
        println!("{}", json!({"cancelled": cancelled, "records": records}));
    }
    eprintln!(
        "upcc: cancelled {cancelled} queued or running slurm jobs ({records} job records of this spec's stale nodes cleared)"
    );
    Ok(0)
}
