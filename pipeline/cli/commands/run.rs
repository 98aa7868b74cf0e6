//! `upcc run`: compute the stale nodes of a spec's targets, here or through Slurm, and show
//! the tables they touched.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::json;
use upcc_engine::{plan, run as engine_run, NodeStatus, Outcome, RunConfig, Store};
use upcc_model::device::Compute;

use super::context::*;
use crate::cli::{ExecutorArg, ProgressArg, RunArgs};
use crate::progress::{Progress, ProgressMode};
use upcc_model::error::{Error, Result};
use upcc_model::selectors;
use upcc_model::targets::runtime::{runtime_table, Durations};
use upcc_model::targets::table::render_target;
use upcc_model::targets::{TableInput, View};

/// What `run` shows for the targets it touched: tables rendered from whatever is fresh, and
/// where figures are.
/// The tables and figures of the targets touched by a run. `healed` is set when a corrupt
/// object was met (and quarantined): the caller runs the engine again and re-renders.
pub(crate) fn render_views(
    loaded: &Loaded,
    store: &Store,
    touched: &BTreeSet<usize>,
    healed: &mut bool,
) -> Result<Vec<(String, String)>> {
    let dag = &loaded.built.dag;
    let entries = plan(dag, store, &loaded.spec.file.name)?;
    let mut out = Vec::new();
    let mut targets: Vec<&upcc_model::targets::TargetNodes> = loaded.built.targets.iter().collect();
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
        if t.kind.view() == View::Runtime {
            let r = runtime_table(t, dag, &entries, store, &mut Durations::new())?;
            out.push((t.name.clone(), r.markdown));
            continue;
        }
        if t.kind.view() == View::Figure {
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
        let source = t.kind.table_source();
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
            .map_err(|e| Error::env(e.to_string()))?;
        out.push((t.name.clone(), r.markdown));
    }
    Ok(out)
}

/// One report for two engine passes: a node counts as executed if either pass executed it.
pub(crate) fn merge_reports(
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

pub fn run(args: &RunArgs, env: &Env) -> Result<i32> {
    let store_flag = &env.store;
    let t0 = Instant::now();
    let threads = args.threads.unwrap_or_else(default_threads).max(1);
    if args.node_threads == Some(0) {
        return Err(Error::user("--node-threads must be at least 1"));
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
        return Err(Error::user(
            "--detach leaves jobs running on a cluster; it applies to the Slurm executor",
        )
        .hint("add `--executor slurm`, or drop --detach"));
    }
    if args.dry_run && executor != ExecutorArg::Slurm {
        return Err(Error::user(
            "--dry-run prints the Slurm executor's job plan; it applies to `--executor slurm`",
        )
        .hint("`upcc status SPEC` shows what a local run would compute"));
    }
    if executor == ExecutorArg::Slurm && env.numerics.is_none() {
        if let Some(n) = &section.slurm.numerics {
            // The training partition's class, declared: plan for it, whatever this machine has.
            let n = check_numerics(n).map_err(|e| {
                e.hint("`executor.slurm.numerics` names the class `upcc device` prints on a node of the training partition")
            })?;
            loaded = load_with(&args.spec, node_threads, Compute::planned(&n))?;
        } else if !loaded.compute.is_gpu()
            && section
                .slurm
                .resources_for("train", true, 0, false)
                .gpus
                .is_some_and(|g| g > 0)
        {
            return Err(Error::user(
                "the Slurm executor's training jobs get GPUs (`executor.slurm.resources`), but this machine has none to tell their numerics class, and the keys the driver waits for depend on it",
            )
            .hint("run `upcc device` on a node of the GPU partition (`srun --gres=gpu:1 upcc device`) and set `executor.slurm.numerics: CLASS` (or pass --numerics CLASS)"));
        }
    }
    if executor == ExecutorArg::Local && env.numerics.is_some() {
        // Planned for a class: this machine must compute it, and then trains with its device.
        let real = local_device(env, &loaded.compute, args.spec.json)?;
        loaded = load_with(&args.spec, node_threads, real)?;
    }
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    if executor == ExecutorArg::Local {
        // This process trains: a GPU that cannot be used fails the run here, before anything
        // is computed or written (the kernels are compiled now, once).
        loaded.compute.open()?;
    }
    // The remote is checked (its URL, its credentials' settings) before anything is written.
    let remote = remote_for(args.spec.remote.as_deref(), &loaded.spec)?;
    if executor == ExecutorArg::Local {
        // Before the store is created or anything written: the nodes this run computes (not
        // those the remote cache answers).
        let computes = || -> Result<Vec<bool>> {
            if args.force {
                return Ok(vec![true; dag.len()]);
            }
            let store = open_store(store_flag, false)
                .unwrap_or_else(|_| Store::view_nonexistent(&store_path(store_flag)));
            Ok(
                upcc_engine::plan_with(&dag, &store, &loaded.spec.file.name, remote.as_deref())?
                    .iter()
                    .map(|e| e.status != NodeStatus::Fresh && !e.remote)
                    .collect(),
            )
        };
        check_memory(&loaded.built, &dag, computes, &loaded.compute)?;
    }
    if args.dry_run {
        // A plan only: nothing is created, downloaded or submitted.
        let store = open_store(store_flag, false)
            .unwrap_or_else(|_| Store::view_nonexistent(&store_path(store_flag)));
        return run_slurm(args, env, &loaded, &dag, &store, &section.slurm, t0);
    }
    let store = open_store_to_compute(store_flag, true)?;
    if executor == ExecutorArg::Slurm {
        if let Some(r) = &remote {
            // What the remote holds is downloaded here, not submitted as jobs.
            let p = super::pull::pull_into(&dag, &store, &loaded.spec.file.name, r)?;
            if p.pulled > 0 && !args.spec.json {
                eprintln!(
                    "upcc: {} nodes downloaded from the remote cache `{}`",
                    p.pulled,
                    r.describe()
                );
            }
        }
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
        remote: remote.clone(),
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
        if let Some(r) = &remote {
            eprintln!(
                "upcc: remote cache `{}`: results it holds are downloaded, results computed here are uploaded",
                r.describe()
            );
        }
    }
    if progress != ProgressMode::Quiet {
        // What is left, from the times this store recorded for comparable nodes.
        let asked = remote.as_deref().filter(|_| !args.force);
        let entries = upcc_engine::plan_with(&dag, &store, &loaded.spec.file.name, asked)?;
        let on_remote = entries.iter().filter(|e| e.remote).count();
        if on_remote > 0 {
            eprintln!("upcc: {on_remote} nodes are downloaded from the remote cache");
        }
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
    let downloaded = report.count(Outcome::Downloaded);
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
            .map(|n| {
                let mut j = json!({"id": n.id, "stage": n.stage, "outcome": n.outcome, "key": n.key.map(|k| k.to_hex()), "duration_s": n.duration_s, "error": n.error});
                if let Some(d) = &n.error_detail {
                    j["error_detail"] = d.clone();
                }
                j
            })
            .collect();
        let obj = json!({
            "executed": executed, "cached": cached + elsewhere, "computed_elsewhere": elsewhere, "downloaded": downloaded, "failed": failed, "skipped": skipped,
            "remote": remote.as_ref().map(|r| json!({"url": r.describe(), "stats": r.stats(), "unreachable": r.unreachable(), "warnings": r.warnings()})),
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
    if executed == 0 && failed == 0 && skipped == 0 && downloaded == 0 {
        eprintln!(
            "upcc: all {} nodes cached; nothing to do ({seconds:.1} s)",
            report.nodes.len()
        );
    } else {
        eprintln!(
            "upcc: {} nodes: {executed} executed, {}{} cached{}, {failed} failed, {skipped} skipped ({seconds:.1} s)",
            report.nodes.len(),
            if downloaded > 0 { format!("{downloaded} downloaded from the remote, ") } else { String::new() },
            cached + elsewhere,
            if elsewhere > 0 { format!(" ({elsewhere} by another process)") } else { String::new() }
        );
    }
    if let Some(r) = &remote {
        let s = r.stats();
        if s.nodes_uploaded + s.nodes_downloaded + s.refused + s.untrusted > 0
            || r.unreachable().is_some()
        {
            eprintln!(
                "upcc: remote `{}`: {} results downloaded ({:.1} MiB), {} uploaded ({:.1} MiB){}{}{}",
                r.describe(),
                s.nodes_downloaded,
                s.bytes_downloaded as f64 / 1048576.0,
                s.nodes_uploaded,
                s.bytes_uploaded as f64 / 1048576.0,
                if s.refused > 0 {
                    format!(", {} refused as corrupt or incomplete", s.refused)
                } else {
                    String::new()
                },
                if s.untrusted > 0 {
                    format!(", {} not served (signer not trusted)", s.untrusted)
                } else {
                    String::new()
                },
                if r.unreachable().is_some() {
                    "; unreachable during the run (`upcc push` uploads what it missed)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(report
        .failure_tier()
        .map_or(0, upcc_engine::Tier::exit_code))
}

/// `run --executor slurm`: submit a job per node to compute (reusing queued or running ones),
/// then follow them until every node is done or failed, unless `--detach`.
pub(crate) fn run_slurm(
    args: &RunArgs,
    env: &Env,
    loaded: &Loaded,
    dag: &upcc_engine::Dag,
    store: &Store,
    settings: &crate::slurm::SlurmSettings,
    t0: Instant,
) -> Result<i32> {
    if args.force {
        return Err(Error::user(
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
    let mut inv = crate::slurm::Invocation::new(
        &args.spec.spec_and_selectors[0],
        &args.spec.set,
        store.root(),
        device,
        env.gpus.clone(),
        loaded.compute.numerics(),
    );
    inv.remote = args.spec.remote.clone();
    inv.selectors = args.spec.spec_and_selectors[1..].to_vec();
    if settings.mode == crate::slurm::SlurmMode::Workers {
        return run_workers(args, loaded, dag, store, settings, &inv, t0);
    }
    let todo = upcc_engine::plan(dag, store, &loaded.spec.file.name)?
        .iter()
        .filter(|e| e.status != NodeStatus::Fresh)
        .count();
    if args.dry_run {
        print_plan_per_node(args.spec.json, todo, dag.len());
        return Ok(0);
    }
    if todo > settings.max_jobs() {
        return Err(Error::user(format!(
            "per-node mode would queue {todo} jobs at once, over `executor.slurm.max_jobs` ({})",
            settings.max_jobs()
        ))
        .hint("use `executor.slurm.mode: workers` (the default), which needs a few jobs, or select fewer nodes"));
    }
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
        let words = std::slice::from_ref(spec_arg);
        let sets = &args.spec.set;
        let with_slurm = [spec_arg.clone(), "--executor".into(), "slurm".into()];
        let msg = format!(
            "upcc: detached; `{}` shows the jobs, `{}` re-attaches, `{}` cancels them",
            super::results::command("status", &env.store, words, sets),
            super::results::command("run", &env.store, &with_slurm, sets),
            super::results::command("cancel", &env.store, words, sets),
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
    let (tables, healed) = render_slurm_views(loaded, dag, store)?;
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

fn print_plan_per_node(json: bool, todo: usize, total: usize) {
    if json {
        println!(
            "{}",
            json!({"executor": "slurm", "mode": "per-node", "jobs": todo, "peak_queued": todo, "nodes": todo, "total": total})
        );
    } else {
        println!("slurm plan (per-node): {todo} jobs, one per node to compute, all queued at once ({total} nodes in all)");
    }
}

/// `run --executor slurm` in workers mode: keep a few worker jobs alive until every node is
/// computed (or failed), or with `--detach` submit the driver itself as a job; `--dry-run`
/// prints the job plan.
fn run_workers(
    args: &RunArgs,
    loaded: &Loaded,
    dag: &upcc_engine::Dag,
    store: &Store,
    settings: &crate::slurm::SlurmSettings,
    inv: &crate::slurm::Invocation,
    t0: Instant,
) -> Result<i32> {
    use crate::slurm::workers;
    let quiet = args.spec.json || matches!(args.progress, ProgressArg::None);
    let spec_arg = &args.spec.spec_and_selectors[0];
    let gpu = loaded.compute.is_gpu();
    let entries = upcc_engine::plan(dag, store, &loaded.spec.file.name)?;
    let done: Vec<bool> = entries
        .iter()
        .map(|e| e.status == NodeStatus::Fresh)
        .collect();
    let todo = done.iter().filter(|d| !**d).count();
    if args.dry_run {
        let history = crate::eta::History::read(store)?;
        let plan = workers::job_plan(dag, &done, settings, gpu, &history);
        let jobs: usize = plan.iter().map(|p| p.jobs).sum();
        let peak = plan
            .iter()
            .fold(BTreeMap::<usize, usize>::new(), |mut m, p| {
                *m.entry(p.wave).or_default() += p.jobs;
                m
            })
            .into_values()
            .max()
            .unwrap_or(0);
        if args.spec.json {
            println!(
                "{}",
                json!({"executor": "slurm", "mode": "workers", "jobs": jobs, "peak_queued": peak, "nodes": todo,
                       "total": dag.len(), "max_jobs": settings.max_jobs(), "numerics": loaded.compute.numerics(), "waves": plan})
            );
        } else {
            println!(
                "slurm plan (workers): {jobs} jobs for {todo} nodes to compute ({} in all), at most {peak} queued at once (limit {}); training nodes planned for {}",
                dag.len(),
                settings.max_jobs(),
                loaded.compute.numerics()
            );
            println!(
                "{:>4}  {:<8}  {:>4}  {:>6}  {:>4}  {:>8}  {:>4}  {:<11}  partition",
                "wave", "kind", "jobs", "nodes", "cpus", "mem MB", "gpus", "time"
            );
            for p in &plan {
                println!(
                    "{:>4}  {:<8}  {:>4}  {:>6}  {:>4}  {:>8}  {:>4}  {:<11}  {}",
                    p.wave,
                    p.kind,
                    p.jobs,
                    p.nodes,
                    p.cpus,
                    p.mem_mb,
                    p.gpus,
                    p.time,
                    p.partition.as_deref().unwrap_or("(default)")
                );
            }
            println!("(a wave's workers start when the results they need are in; workers that end early are replaced while nodes remain)");
        }
        return Ok(0);
    }
    if args.detach {
        let (id, new) = workers::submit_driver(store, settings, inv)?;
        if args.spec.json {
            println!(
                "{}",
                json!({"executor": "slurm", "mode": "workers", "detached": true, "driver_job": id, "new": new, "nodes": todo})
            );
        }
        eprintln!(
            "upcc: slurm: {} driver job {id} for {todo} nodes to compute; `upcc status {spec_arg}` shows the nodes, `upcc cancel {spec_arg}` cancels the jobs",
            if new { "submitted" } else { "already queued or running:" }
        );
        return Ok(0);
    }
    if !quiet {
        eprintln!(
            "upcc: slurm: {todo} of {} nodes to compute with worker jobs (store `{}`)",
            dag.len(),
            store.root().display()
        );
    }
    let poll = Duration::from_secs_f64(settings.poll_seconds.unwrap_or(5.0));
    let driven = workers::drive(
        dag,
        &loaded.spec.file.name,
        store,
        settings,
        inv,
        gpu,
        poll,
        quiet,
    )?;
    let (tables, healed) = render_slurm_views(loaded, dag, store)?;
    let seconds = t0.elapsed().as_secs_f64();
    let recipes = crate::slurm::recipes(dag);
    if args.spec.json {
        let failed: Vec<_> = driven
            .failed
            .iter()
            .map(|(i, why)| {
                let log = crate::slurm::read_record(store, &recipes[*i]).map(|r| r.log);
                json!({"id": dag.node(*i).id, "error": why, "log": log})
            })
            .collect();
        println!(
            "{}",
            json!({"executor": "slurm", "mode": "workers", "submitted": driven.submitted, "peak_queued": driven.peak_queued,
                   "computed": todo - driven.failed.len(), "failed": driven.failed.len(), "failures": failed,
                   "total": dag.len(), "seconds": seconds, "store": store.root().display().to_string(),
                   "tables": tables.iter().cloned().collect::<BTreeMap<_, _>>()})
        );
    } else {
        let mut out = std::io::stdout().lock();
        for (_, md) in &tables {
            let _ = writeln!(out, "{md}");
        }
    }
    for (i, why) in &driven.failed {
        eprintln!("error: node `{}`: {why}", dag.node(*i).id);
        if let Some(r) = crate::slurm::read_record(store, &recipes[*i]) {
            eprintln!("  job log: {} (slurm job {})", r.log, r.job_id);
        }
    }
    if healed {
        eprintln!("upcc: warning: corrupt results were quarantined while reading; run again to recompute them");
    }
    eprintln!(
        "upcc: {} nodes: {} computed by {} worker jobs (at most {} queued at once), {} failed ({seconds:.1} s)",
        dag.len(),
        todo - driven.failed.len(),
        driven.submitted,
        driven.peak_queued,
        driven.failed.len()
    );
    Ok(if driven.failed.is_empty() && !healed {
        0
    } else {
        1
    })
}

/// The views of the targets a Slurm run touched, from the store (and whether corrupt results
/// were quarantined while reading them).
fn render_slurm_views(
    loaded: &Loaded,
    dag: &upcc_engine::Dag,
    store: &Store,
) -> Result<(Vec<(String, String)>, bool)> {
    let touched: BTreeSet<usize> = dag
        .nodes()
        .iter()
        .filter_map(|n| loaded.built.dag.index_of(&n.id))
        .collect();
    let mut healed = false;
    let tables = render_views(loaded, store, &touched, &mut healed)?;
    Ok((tables, healed))
}
