//! `upcc status`: fresh / stale (and why) / missing per node, and the time left; runs nothing.

use std::io::Write;

use serde_json::json;
use upcc_engine::{plan_with, NodeStatus, Store};

use super::context::*;
use crate::cli::SpecArgs;
use upcc_model::error::Result;
use upcc_model::selectors;

pub fn status(args: &SpecArgs, env: &Env) -> Result<i32> {
    let store_flag = &env.store;
    let loaded = load(args, default_threads(), env)?;
    let roots = selectors::roots(&loaded.selection, &loaded.built)?;
    let dag = loaded.built.dag.restrict(&roots);
    // A store that does not exist yet is empty: report everything as missing, create nothing.
    let path = store_path(store_flag);
    let store = if path.join("STORE.json").exists() {
        open_store(store_flag, false)?
    } else {
        Store::view_nonexistent(&path)
    };
    let remote = remote_for(args.remote.as_deref(), &loaded.spec)?;
    let entries = plan_with(&dag, &store, &loaded.spec.file.name, remote.as_deref())?;
    let on_remote = entries.iter().filter(|e| e.remote).count();
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
                if e.remote {
                    n["remote"] = json!(true);
                }
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
                   "slurm": {"queued": queued_jobs, "running": running_jobs, "failed": failed_jobs},
                   "remote": remote.as_ref().map(|r| json!({"url": r.describe(), "answers": on_remote, "unreachable": r.unreachable()})),
                   "nodes": nodes})
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
                (Some(h), j) => (
                    "running",
                    format!(
                        "pid {} on {} since {}{}{}",
                        h.pid,
                        h.host,
                        h.since,
                        h.heartbeat_age()
                            .map(|a| format!(", heartbeat {} s ago", a.as_secs()))
                            .unwrap_or_default(),
                        // A worker's record names the Slurm job the process runs in.
                        j.as_ref()
                            .map(|(id, _)| format!(", in slurm job {id}"))
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
                (None, None) if e.remote => (
                    status_word(e.status),
                    if why.is_empty() {
                        "on the remote: `run` downloads it".to_string()
                    } else {
                        format!("on the remote: `run` downloads it ({why})")
                    },
                ),
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
        if let Some(r) = &remote {
            let _ = writeln!(
                out,
                "remote `{}`: {}",
                r.describe(),
                match r.unreachable() {
                    Some(why) => format!("not reachable ({why})"),
                    None => format!(
                        "answers {on_remote} of the {} nodes not fresh here",
                        stale + missing
                    ),
                }
            );
        }
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
