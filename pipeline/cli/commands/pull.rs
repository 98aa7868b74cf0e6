//! `upcc pull SPEC [selectors]`: download from the remote cache the selected nodes' results
//! this store lacks; computes nothing. Each download is verified (manifest, then every object
//! against its digest) before it is published here.

use serde_json::json;
use upcc_engine::{plan_with, NodeStatus};

use super::context::*;
use super::push::no_remote;
use crate::cli::SpecArgs;
use upcc_model::error::{Error, Result};
use upcc_model::selectors;

/// What [`pull_into`] did.
pub(crate) struct Pulled {
    pub pulled: usize,
    pub fresh: usize,
    pub absent: usize,
    pub refused: usize,
}

/// Download into `store` every node of `dag` the remote holds and the store lacks, in
/// dependency order (the keys of nodes below a remote result come from its manifest, as in
/// `status`); their objects come down together, eight at a time.
pub(crate) fn pull_into(
    dag: &upcc_engine::Dag,
    store: &upcc_engine::Store,
    spec_name: &str,
    remote: &std::sync::Arc<upcc_engine::RemoteCache>,
) -> Result<Pulled> {
    let entries = plan_with(dag, store, spec_name, Some(remote))?;
    let keys: Vec<_> = entries
        .iter()
        .filter(|e| e.remote && e.status != NodeStatus::Fresh)
        .filter_map(|e| e.key)
        .collect();
    let prefetch = remote.prefetch(store, &keys, upcc_engine::remote::DOWNLOADS_AT_ONCE);
    let mut p = Pulled {
        pulled: 0,
        fresh: 0,
        absent: 0,
        refused: 0,
    };
    for (i, e) in entries.iter().enumerate() {
        if e.status == NodeStatus::Fresh {
            p.fresh += 1;
            continue;
        }
        let (Some(key), Some(material), true) = (e.key, &e.material, e.remote) else {
            p.absent += 1;
            continue;
        };
        match remote.fetch(store, &key)? {
            Some(_) => {
                p.pulled += 1;
                store.write_ref(
                    spec_name,
                    &upcc_engine::RefRecord {
                        node_id: dag.node(i).id.clone(),
                        key,
                        material: material.clone(),
                    },
                )?;
            }
            None => p.refused += 1,
        }
        if remote.unreachable().is_some() {
            break;
        }
    }
    prefetch.finish();
    Ok(p)
}

pub fn pull(args: &SpecArgs, env: &Env) -> Result<i32> {
    let loaded = load(args, default_threads(), env)?;
    let Some(remote) = remote_for(args.remote.as_deref(), &loaded.spec)? else {
        return Err(no_remote("pull"));
    };
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    let store = open_store(&env.store, true)?;
    let Pulled {
        pulled,
        fresh,
        absent,
        refused,
    } = pull_into(&dag, &store, &loaded.spec.file.name, &remote)?;
    let stats = remote.stats();
    if args.json {
        println!(
            "{}",
            json!({"remote": remote.describe(), "downloaded": pulled, "fresh": fresh,
                   "not_on_remote": absent, "refused": refused,
                   "objects_downloaded": stats.objects_downloaded, "bytes_downloaded": stats.bytes_downloaded,
                   "unreachable": remote.unreachable(), "warnings": remote.warnings()})
        );
    }
    eprintln!(
        "upcc: pull from `{}`: {pulled} results downloaded ({} objects, {:.1} MiB), {fresh} already here, {absent} not on the remote, {refused} refused",
        remote.describe(),
        stats.objects_downloaded,
        stats.bytes_downloaded as f64 / 1048576.0
    );
    if let Some(why) = remote.unreachable() {
        return Err(
            Error::env(format!("pull from `{}` stopped: {why}", remote.describe()))
                .hint("what was downloaded stays; run `upcc pull` again when the remote answers"),
        );
    }
    Ok(if refused > 0 { 1 } else { 0 })
}
