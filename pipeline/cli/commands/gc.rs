//! `upcc gc SPEC...`: delete what the specs' targets no longer reach.

use std::collections::BTreeSet;
use std::time::Duration;

use upcc_engine::{plan_with, Digest, NodeKeyTag, NodeStatus};

use super::context::*;
use crate::cli::GcArgs;
use upcc_model::error::{Error, Result};
use upcc_model::specs;

pub fn gc(args: &GcArgs, env: &Env) -> Result<i32> {
    let grace_minutes = u64::try_from(args.grace_minutes).map_err(|_| {
        Error::user(format!(
            "--grace-minutes must be 0 or more, got {}",
            args.grace_minutes
        ))
        .hint("0 keeps nothing for being recent; the default 60 keeps what was written in the last hour")
    })?;
    // What to keep is decided on every intact result, whoever signed it: a result this user
    // does not trust (a colleague's in a shared store or bucket) is not served to them, but it
    // is not garbage either, and the keys below it are found through it as through one's own.
    let keep_every_signer = || {
        std::sync::Arc::new(upcc_engine::Trust::new(
            upcc_engine::Policy::Any,
            vec![],
            None,
            String::new(),
        ))
    };
    // And a node's last result is kept whatever code computed it (a colleague's build of
    // other code, in a shared store): only results superseded by one computed under the
    // current code, or no longer reached at all, are garbage.
    let store = open_store(&env.store, false)?
        .with_trust(keep_every_signer())
        .keeping_code_changes(true);
    // `--remote [URL]`: the remote is collected too, with the same roots; never without it.
    let remote = match &args.remote {
        None => None,
        Some(url) => {
            let first = specs::load(&args.specs[0], &[])?;
            let flag = Some(url.as_str()).filter(|u| !u.is_empty());
            match remote_for_with(flag, &first, || Ok(keep_every_signer()))? {
                Some(r) => Some(r),
                None => return Err(super::push::no_remote("gc --remote")),
            }
        }
    };
    let mut keep: BTreeSet<Digest<NodeKeyTag>> = BTreeSet::new();
    // The material each reached node has under this build (per device class and spec).
    let mut current: std::collections::HashMap<String, Vec<upcc_engine::KeyMaterial>> =
        std::collections::HashMap::new();
    // Results of every device class in the store are kept, not only this machine's: a `gc` on
    // a login node without a GPU must not delete what the GPU nodes computed.
    let mut classes = numerics_classes(&store)?;
    if let Some(r) = &remote {
        // And of every class on the remote (a GPU cluster's results, pushed from elsewhere).
        classes.extend(remote_classes(r)?);
    }
    // Slurm jobs that may still run read what their specs reach: keep that too.
    let mut specs: Vec<(String, Vec<String>)> =
        args.specs.iter().map(|s| (s.clone(), vec![])).collect();
    if !args.set.is_empty() {
        specs.extend(args.specs.iter().map(|s| (s.clone(), args.set.clone())));
    }
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
        let spec = specs::load(s, sets).map_err(|e| {
            e.hint("gc keeps what the specs of queued or running slurm jobs reach; wait for them or `upcc cancel` them first")
        })?;
        for class in &classes {
            let built =
                upcc_model::graph::build_for_numerics(&spec, class, &super::context::host())?;
            // With a remote, the keys of nodes below a result that is only on the remote
            // come from its manifest (as `status` finds them).
            for e in plan_with(&built.dag, &store, &spec.file.name, remote.as_deref())? {
                if e.status == NodeStatus::Fresh || e.remote {
                    keep.insert(e.key.expect("fresh and remote nodes have keys"));
                }
                if let Some(m) = e.material {
                    current.entry(e.id).or_default().push(m);
                }
            }
        }
    }
    // A result of a reached node computed by other code (a colleague's build, in a shared
    // store) is not garbage: every manifest whose material differs from a reached node's only
    // in the stage's code digests is kept too.
    for key in store.list_manifests()? {
        if keep.contains(&key) {
            continue;
        }
        let Ok(Some(m)) = store.read_manifest_intact(&key) else {
            continue;
        };
        let code_only = |now: &upcc_engine::KeyMaterial| {
            upcc_engine::key::code_changes(&m.material, now).is_some()
        };
        if current
            .get(&m.node_id)
            .is_some_and(|mats| mats.iter().any(code_only))
        {
            keep.insert(key);
        }
    }
    let r = store.gc(&keep, Duration::from_secs(grace_minutes * 60), args.dry_run)?;
    println!("{}", describe(&r, args.dry_run));
    if args.dry_run {
        print!("{}", list_results(&r, grace_minutes));
    }
    if let Some(remote) = &remote {
        if let Some(why) = remote.unreachable() {
            return Err(Error::env(format!(
                "remote `{}` could not be read, so nothing was deleted from it: {why}",
                remote.describe()
            )));
        }
        let r = remote
            .gc(&keep, Duration::from_secs(grace_minutes * 60), args.dry_run)
            .map_err(|e| {
                Error::env(format!(
                    "gc of remote `{}` stopped: {e}",
                    remote.describe()
                ))
                .hint("what was deleted is gone, the rest is intact (results first, then unreferenced objects); run it again when the remote answers")
            })?;
        println!(
            "remote `{}`: {}",
            remote.describe(),
            describe(&r, args.dry_run)
        );
    }
    Ok(0)
}

/// A dry run's list: each result it would delete, and each kept only for being recent (which
/// a gc after the grace deletes), by node id, oldest first.
fn list_results(r: &upcc_engine::store::GcReport, grace_minutes: u64) -> String {
    let line = |g: &upcc_engine::store::GcResult| {
        let when = g
            .written
            .map(upcc_engine::fsutil::rfc3339)
            .unwrap_or_else(|| "?".into());
        format!("  {}  (key {}, written {when})\n", g.node_id, g.key.short())
    };
    let sorted = |v: &[upcc_engine::store::GcResult]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| (a.written, &a.node_id).cmp(&(b.written, &b.node_id)));
        v
    };
    let mut out = String::new();
    if !r.results_deleted.is_empty() {
        out.push_str("would delete (results of a `run --set …` are kept by `gc SPEC --set …`):\n");
        for g in sorted(&r.results_deleted) {
            out.push_str(&line(&g));
        }
    }
    if !r.results_kept_recent.is_empty() {
        out.push_str(&format!(
            "kept only because written in the last {grace_minutes} minutes (a later gc deletes them):\n"
        ));
        for g in sorted(&r.results_kept_recent) {
            out.push_str(&line(&g));
        }
    }
    out
}

/// One line of what a gc did (or would do).
fn describe(r: &upcc_engine::store::GcReport, dry_run: bool) -> String {
    format!(
        "{}{} results and {} objects ({:.1} MiB) {}; kept {} results ({} only because they are recent) and {} objects",
        if dry_run { "dry run: " } else { "" },
        r.manifests_deleted,
        r.objects_deleted,
        r.bytes_freed as f64 / 1048576.0,
        if dry_run { "would be deleted" } else { "deleted" },
        r.manifests_kept,
        r.kept_because_recent,
        r.objects_kept
    ) + &if r.skipped.is_empty() {
        String::new()
    } else {
        format!(
            "; skipped {} that {} not upcc's (never deleted: {}{})",
            if r.skipped.len() == 1 { "1 entry".to_string() } else { format!("{} entries", r.skipped.len()) },
            if r.skipped.len() == 1 { "is" } else { "are" },
            r.skipped.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if r.skipped.len() > 3 { ", …" } else { "" }
        )
    } + &if r.raced_results_removed > 0 {
        format!(
            "; {} results published during the deletions listed a deleted object and were removed too (computed again when asked)",
            r.raced_results_removed
        )
    } else {
        String::new()
    }
}

/// The numerics classes of the training results on the remote (every manifest read once).
fn remote_classes(remote: &upcc_engine::RemoteCache) -> Result<BTreeSet<String>> {
    let keys = remote.list_keys().map_err(|e| {
        Error::env(format!("cannot list remote `{}`: {e}", remote.describe()))
            .hint("nothing was deleted; run it again when the remote answers")
    })?;
    Ok(keys
        .iter()
        .filter_map(|k| remote.manifest(k))
        .map(|m| m.material.numerics)
        .filter(|n| n != "exact")
        .collect())
}
