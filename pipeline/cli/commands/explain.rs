//! `upcc explain SPEC NODE`: one node's key material, inputs, manifest, provenance and log.

use std::io::Write;

use serde_json::json;
use upcc_engine::{plan, NodeStatus, PlanEntry, Store};

use super::context::*;
use crate::cli::ExplainArgs;
use upcc_model::error::{Error, Result};
use upcc_model::graph::build;
use upcc_model::specs;

pub fn explain(args: &ExplainArgs, env: &Env) -> Result<i32> {
    let (store_flag, verbose) = (&env.store, env.verbose);
    let spec_arg = &args.spec;
    let Some(node_arg) = &args.node else {
        return Err(Error::user(format!(
            "`upcc explain {spec_arg}` needs a node: which node of the spec to explain"
        ))
        .hint(format!(
            "`upcc status {spec_arg}` lists the node ids; then `upcc explain {spec_arg} NODE` (a node id or a key prefix)"
        )));
    };
    let spec = specs::load(spec_arg, &args.set)?;
    let built = build(
        &spec,
        default_threads(),
        env.compute(args.json)?,
        &super::context::host(),
    )?;
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
                            Error::user(format!("no node `{node_arg}` in `{}`", spec.display));
                        if let Some(n) = upcc_model::error::nearest(
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
                    return Err(Error::user(format!(
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
                "numerics": node.numerics, "numerics_parts": upcc_model::device::describe_numerics(&node.numerics), "manifest": manifest, "log": e.key.map(|k| store.log_path(&k).display().to_string()),
                "log_text": e.key.and_then(|k| fs_err::read_to_string(store.log_path(&k)).ok()),
                "material": e.material, "code": node.code,
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
    for part in upcc_model::device::describe_numerics(&node.numerics) {
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
        if let Ok(text) = fs_err::read_to_string(&path) {
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
