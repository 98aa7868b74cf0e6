//! `upcc job`: what one Slurm job runs, exactly one node.

use std::collections::BTreeSet;
use std::time::Duration;

use upcc_engine::{plan, run as engine_run, NodeStatus, Outcome, RunConfig};

use super::context::*;
use crate::cli::{JobArgs, SpecArgs};
use crate::progress::{Progress, ProgressMode};
use upcc_model::error::{Error, Result};

/// `upcc job SPEC NODE --recipe HEX`: compute exactly one node whose inputs are computed.
pub fn job(args: &JobArgs, env: &Env) -> Result<i32> {
    let (spec_arg, node_id) = (&args.spec_and_node[0], &args.spec_and_node[1]);
    let spec_args = SpecArgs {
        spec_and_selectors: vec![spec_arg.clone()],
        set: args.set.clone(),
        json: false,
        remote: args.remote.clone(),
    };
    let threads = crate::env::threads().unwrap_or_else(default_threads).max(1);
    // A job plans with the numerics class its driver planned with, so that a node that does
    // not train (features, k-means, metrics, tables) runs on a machine without the driver's
    // device; a node that trains opens this machine's device, which must compute that class.
    let mut loaded = load(&spec_args, threads, env)?;
    let Some(i) = loaded.built.dag.index_of(node_id) else {
        return Err(Error::user(format!("the spec `{spec_arg}` has no node `{node_id}`"))
            .hint("the spec changed since the job was submitted; rerun `upcc run SPEC --executor slurm`"));
    };
    if env.numerics.is_some() && loaded.built.dag.node(i).numerics != "exact" {
        let real = env.device(false)?;
        if real.numerics() != loaded.compute.numerics() {
            return Err(Error::env(format!(
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
    let store = open_store_to_compute(&env.store, false)?;
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    let last = dag
        .index_of(node_id)
        .expect("the restricted DAG holds the node");
    let recipe = crate::slurm::recipes(&dag).swap_remove(last);
    if recipe != args.recipe {
        return Err(Error::user(format!(
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
            return Err(Error::env(format!(
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
        remote: remote_for(args.remote.as_deref(), &loaded.spec)?,
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
        Outcome::Downloaded => eprintln!(
            "upcc job: downloaded {node_id} from the remote cache ({:.1} s)",
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
        // The result is published; a record left behind only reads as a finished job.
        if let Err(e) = crate::slurm::remove_record(&store, &recipe) {
            eprintln!("upcc job: warning: cannot remove the job's record: {e}");
        }
    }
    Ok(report
        .failure_tier()
        .map_or(0, upcc_engine::Tier::exit_code))
}
