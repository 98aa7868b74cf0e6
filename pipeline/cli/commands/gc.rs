//! `upcc gc SPEC...`: delete what the specs' targets no longer reach.

use std::collections::BTreeSet;
use std::time::Duration;

use upcc_engine::{plan, Digest, NodeKeyTag, NodeStatus};

use super::context::*;
use crate::cli::GcArgs;
use crate::error::{CliError, Result};
use crate::spec;

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
