//! `upcc cancel`: cancel the Slurm jobs of a spec: its driver and worker jobs, and the
//! jobs of its stale nodes.

use serde_json::json;
use upcc_engine::plan;

use super::context::*;
use crate::cli::SpecArgs;
use upcc_model::error::Result;
use upcc_model::selectors;

/// `upcc cancel SPEC [SELECTOR…]`: cancel the Slurm jobs of the selected stale nodes.
pub fn cancel(args: &SpecArgs, env: &Env) -> Result<i32> {
    let loaded = load(args, 1, env)?;
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    let store = open_store(&env.store, false)?;
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    // The driver and workers first (a driver left running would submit again), then the
    // nodes' own jobs.
    let workers = crate::slurm::workers::cancel_workers(
        &store,
        &crate::slurm::job_spec(&args.spec_and_selectors[0]),
        &args.set,
        true,
    )?;
    let (cancelled, records) = crate::slurm::cancel(&dag, &entries, &store, &workers)?;
    let cancelled = cancelled + workers.len();
    if args.json {
        println!("{}", json!({"cancelled": cancelled, "records": records}));
    }
    eprintln!(
        "upcc: cancelled {cancelled} queued or running slurm jobs ({records} job records of this spec's stale nodes cleared)"
    );
    Ok(0)
}
