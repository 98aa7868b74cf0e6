//! `upcc push SPEC [selectors]`: upload the selected nodes' results in this store to the
//! remote cache (objects first, the manifest last, created only where the remote has none).

use serde_json::json;
use upcc_engine::{plan, NodeStatus, Uploaded};

use super::context::*;
use crate::cli::SpecArgs;
use upcc_model::error::{Error, Result};
use upcc_model::selectors;

pub fn push(args: &SpecArgs, env: &Env) -> Result<i32> {
    let loaded = load(args, default_threads(), env)?;
    let Some(remote) = remote_for(args.remote.as_deref(), &loaded.spec)? else {
        return Err(no_remote("push"));
    };
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    let store = open_store(&env.store, false)?;
    let entries = plan(&dag, &store, &loaded.spec.file.name)?;
    let (mut published, mut there, mut not_here) = (0usize, 0usize, 0usize);
    let fresh: Vec<_> = entries
        .iter()
        .filter(|e| e.status == NodeStatus::Fresh)
        .collect();
    not_here += entries.len() - fresh.len();
    for (n, e) in fresh.iter().enumerate() {
        let key = e.key.expect("fresh nodes have keys");
        let Some(m) = store.fresh_manifest(&key)? else {
            not_here += 1;
            continue;
        };
        match remote.upload(&store, &m)? {
            Uploaded::Published => published += 1,
            Uploaded::AlreadyThere => there += 1,
            Uploaded::Unreachable => break,
        }
        if !args.json && (n + 1) % 50 == 0 {
            eprintln!("upcc: push: {} of {} results checked", n + 1, fresh.len());
        }
    }
    let stats = remote.stats();
    if args.json {
        println!(
            "{}",
            json!({"remote": remote.describe(), "uploaded": published, "already_there": there,
                   "not_in_store": not_here, "objects_uploaded": stats.objects_uploaded,
                   "bytes_uploaded": stats.bytes_uploaded, "unreachable": remote.unreachable(),
                   "warnings": remote.warnings()})
        );
    }
    eprintln!(
        "upcc: push to `{}`: {published} results uploaded ({} objects, {:.1} MiB), {there} already there, {not_here} of the {} selected nodes not computed in this store",
        remote.describe(),
        stats.objects_uploaded,
        stats.bytes_uploaded as f64 / 1048576.0,
        entries.len()
    );
    match remote.unreachable() {
        Some(why) => Err(
            Error::env(format!("push to `{}` stopped: {why}", remote.describe()))
                .hint("what was uploaded stays; run `upcc push` again when the remote answers"),
        ),
        None => Ok(0),
    }
}

/// The error of a verb that needs a remote and has none.
pub(crate) fn no_remote(verb: &str) -> Error {
    Error::user(format!("`upcc {verb}` needs a remote cache, and none is named"))
        .hint("name one with --remote URL, $UPCC_REMOTE, or `remote:` in the spec or the user config (s3://BUCKET/PREFIX, gs://…, az://…, file:///PATH)")
}
