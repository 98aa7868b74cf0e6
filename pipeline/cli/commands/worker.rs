//! `upcc worker`: what one worker job of `run --executor slurm` runs (workers mode): the local
//! executor over every node of its kind that can run, round after round, until none is left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use upcc_engine::{plan, run as engine_run, NodeStatus, Observer, Outcome, RunConfig, RunEvent};

use super::context::*;
use crate::cli::{SpecArgs, WorkerArgs, WorkerKind};
use crate::progress::{Progress, ProgressMode};
use crate::slurm::workers::runnable;
use crate::slurm::JobRecord;
use upcc_model::error::{Error, Result};
use upcc_model::selectors;

/// Writes a record for each node this worker starts (so `status` names the job and its log
/// while it computes, and after the job is killed) and removes it once the node is settled.
struct Records<'a> {
    inner: Progress,
    store: &'a upcc_engine::Store,
    /// Node id → recipe.
    recipes: BTreeMap<String, String>,
    template: Option<JobRecord>,
}

impl Observer for Records<'_> {
    fn event(&mut self, event: RunEvent<'_>) {
        match event {
            RunEvent::Started { id, .. } => {
                if let (Some(t), Some(recipe)) = (&self.template, self.recipes.get(id)) {
                    let r = JobRecord {
                        node: id.to_string(),
                        recipe: recipe.clone(),
                        submitted: upcc_engine::fsutil::rfc3339(std::time::SystemTime::now()),
                        ..t.clone()
                    };
                    if let Err(e) = crate::slurm::write_node_record(self.store, &r) {
                        eprintln!("upcc worker: warning: cannot record node `{id}`: {e}");
                    }
                }
            }
            RunEvent::Finished {
                id,
                outcome: Outcome::Executed,
                seconds,
                ..
            } => {
                // As soon as it is published (what the tests count: each node once).
                eprintln!(
                    "upcc worker: computed {id} ({:.1} s)",
                    seconds.unwrap_or(0.0)
                );
                self.forget(id);
            }
            RunEvent::Finished { id, outcome, .. } if outcome != Outcome::Failed => {
                self.forget(id);
            }
            _ => {}
        }
        self.inner.event(event);
    }
}

impl Records<'_> {
    /// Remove this job's record of node `id` (it is settled).
    fn forget(&self, id: &str) {
        {
            if let (Some(_), Some(recipe)) = (&self.template, self.recipes.get(id)) {
                if let Some(r) = crate::slurm::read_record(self.store, recipe) {
                    if Some(&r.job_id) == self.template.as_ref().map(|t| &t.job_id) {
                        let _ = crate::slurm::remove_record(self.store, recipe);
                    }
                }
            }
        }
    }
}

/// `upcc worker SPEC --kind training|other`: compute every node of the kind that can run.
pub fn worker(args: &WorkerArgs, env: &Env) -> Result<i32> {
    let trains = matches!(args.kind, WorkerKind::Training);
    let spec_args = SpecArgs {
        spec_and_selectors: args.spec_and_selectors.clone(),
        set: args.set.clone(),
        json: false,
        remote: args.remote.clone(),
    };
    let threads = crate::env::threads().unwrap_or_else(default_threads).max(1);
    let mut loaded = load(&spec_args, threads.min(4), env)?;
    if trains {
        // Training workers train on this machine's device, which must compute the class the
        // driver planned with: otherwise every key the driver waits for would differ.
        let real = env.device(false)?;
        if real.numerics() != loaded.compute.numerics() {
            return Err(Error::user(format!(
                "this job's device ({}) computes numerics class {}, but the driver planned training nodes for {}",
                real.name(),
                real.numerics(),
                loaded.compute.numerics()
            ))
            .hint(format!(
                "set `executor.slurm.numerics: {}` in the spec or user config (the class of the training partition's device), or give the training workers that device (`executor.slurm.resources.training`)",
                real.numerics()
            )));
        }
        loaded = load_with(&spec_args, threads.min(4), real)?;
        loaded.compute.open()?;
    }
    // The nodes the driver's targets and selectors reach, as its DAG has them.
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = &loaded.built.dag.restrict(&roots);
    let store = open_store_to_compute(&env.store, false)?;
    let recipes: BTreeMap<String, String> = dag
        .nodes()
        .iter()
        .map(|n| n.id.clone())
        .zip(crate::slurm::recipes(dag))
        .collect();
    let template = crate::env::slurm_job_id().map(|job_id| JobRecord {
        job_id: job_id.clone(),
        node: String::new(),
        recipe: String::new(),
        spec: crate::slurm::job_spec(&args.spec_and_selectors[0]),
        sets: args.set.clone(),
        submitted: String::new(),
        user: std::env::var("USER").ok(),
        host: upcc_engine::fsutil::host_name(),
        log: args.log.replace("%j", &job_id),
        worker: None,
    });
    let cfg = RunConfig {
        spec: loaded.spec.file.name.clone(),
        threads,
        memory_mb: memory_default_mb(),
        keep_going: true,
        force: BTreeSet::new(),
        provenance: provenance(run_id(), &loaded.compute),
        poll_interval: Duration::from_millis(250),
        gpus: loaded.compute.gpu_budgets_mb(),
        remote: remote_for(args.remote.as_deref(), &loaded.spec)?,
    };
    let kind = crate::slurm::workers::kind_name(trains);
    let mut failed: BTreeSet<usize> = BTreeSet::new();
    let (mut computed, mut rounds) = (0usize, 0usize);
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        let entries = plan(dag, &store, &loaded.spec.file.name)?;
        let done: Vec<bool> = entries
            .iter()
            .map(|e| e.status == NodeStatus::Fresh)
            .collect();
        let ready = runnable(dag, &done, trains, &failed);
        if ready.is_empty() {
            // Nodes of this kind still wait for inputs that others compute: linger a while
            // rather than end and have the driver start another job for them.
            // (Not those downstream of a node that failed here: they never will be.)
            let mut dead = vec![false; dag.len()];
            for i in 0..dag.len() {
                dead[i] = failed.contains(&i) || dag.upstream(i).iter().any(|&u| dead[u]);
            }
            let waiting = (0..dag.len())
                .any(|i| !done[i] && !dead[i] && crate::slurm::workers::trains(dag, i) == trains);
            let idle = idle_since.get_or_insert_with(std::time::Instant::now);
            if waiting && idle.elapsed().as_secs_f64() < args.linger {
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
            break;
        }
        idle_since = None;
        rounds += 1;
        let failed_before = failed.len();
        let sub = dag.restrict(&ready);
        let mut obs = Records {
            inner: Progress::new(ProgressMode::Plain, sub.len()),
            store: &store,
            recipes: recipes.clone(),
            template: template.clone(),
        };
        let report = engine_run(&sub, &store, &cfg, &mut obs);
        obs.inner.done();
        let report = report?;
        let mut progressed = false;
        for n in &report.nodes {
            let i = dag
                .index_of(&n.id)
                .expect("a restricted node is in the DAG");
            match n.outcome {
                Outcome::Executed => {
                    computed += 1;
                    progressed = true;
                }
                Outcome::Downloaded | Outcome::ComputedElsewhere => progressed = true,
                Outcome::Failed => {
                    eprintln!(
                        "upcc worker: node `{}` failed: {}",
                        n.id,
                        n.error.as_deref().unwrap_or("unknown error")
                    );
                    if let Some(k) = n.key {
                        eprintln!("  log: {}", store.log_path(&k).display());
                    }
                    failed.insert(i);
                }
                _ => {}
            }
        }
        if !progressed && failed.len() == failed_before {
            // Nothing moved and nothing new failed: leave what is left to the driver.
            break;
        }
    }
    eprintln!(
        "upcc worker: {kind} worker done: {computed} nodes computed in {rounds} rounds, {} failed",
        failed.len()
    );
    Ok(if failed.is_empty() { 0 } else { 1 })
}
