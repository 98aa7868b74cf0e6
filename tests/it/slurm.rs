//! The Slurm executor on a real one-node Slurm (CI starts one with `.ci/slurm.sh up` and sets
//! `UPCC_TEST_SLURM=1`; the tests then fail without it). Elsewhere they run when `sinfo`
//! answers, else say they were skipped. They share the cluster, so they run one at a time.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::util::*;

static CLUSTER: Mutex<()> = Mutex::new(());

/// Whether a Slurm cluster answers (asserted when CI says it started one).
fn slurm() -> bool {
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if std::env::var("UPCC_TEST_SLURM").is_ok_and(|v| v == "1") {
        assert!(
            up,
            "UPCC_TEST_SLURM=1 but `sinfo` does not answer (is .ci/slurm.sh up?)"
        );
    }
    if !up {
        eprintln!("skipped: no Slurm cluster (CI starts one with .ci/slurm.sh and sets UPCC_TEST_SLURM=1)");
    }
    up
}

/// The executor section the tests use (workers mode, the default): the CI node has 2 CPUs, so
/// one worker of each kind, training jobs ask for one CPU, and workers linger 2 s.
const EXECUTOR: &str = "executor:\n  slurm:\n    poll_seconds: 0.5\n    linger_seconds: 2\n    workers: {training: 1, other: 1}\n    resources:\n      training: {cpus: 1}\n      default: {mem_mb: 1500}\n";

/// The same in per-node mode (one job per node).
const EXECUTOR_PER_NODE: &str = "executor:\n  slurm:\n    mode: per-node\n    poll_seconds: 0.5\n    resources:\n      training: {cpus: 1}\n      default: {mem_mb: 1500}\n";

fn slurm_spec() -> String {
    format!("{TINY_SPEC}{EXECUTOR}")
}

/// Cancels whatever the test left queued when it ends, failed or not.
struct Cleanup<'a>(&'a Env);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let spec = self.0.spec();
        let _ = self.0.upcc(&["cancel", &spec]);
    }
}

/// Per node id, how many jobs computed it (the jobs' own `upcc job: computed NODE` and
/// `upcc worker: computed NODE` lines).
fn computed_counts(env: &Env) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(env.store().join("jobs/logs"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for l in text.lines() {
            let rest = l
                .strip_prefix("upcc job: computed ")
                .or_else(|| l.strip_prefix("upcc worker: computed "));
            if let Some(rest) = rest {
                let node = rest.split(" (").next().unwrap().to_string();
                *out.entry(node).or_insert(0) += 1;
            }
        }
    }
    out
}

fn squeue() -> Vec<(String, String, String)> {
    let o = Command::new("squeue")
        .args(["-h", "-o", "%i|%j|%T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() == 3).then(|| (f[0].to_string(), f[1].to_string(), f[2].to_string()))
        })
        .collect()
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The tables of a `run --json`, with the store's path (in figure lines) made neutral. The
/// runtime table shows wall times, which differ between any two runs: it is left out.
fn tables(r: &serde_json::Value, store: &std::path::Path) -> String {
    let mut t = r["tables"].clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("runtime");
    }
    t.to_string().replace(&store.display().to_string(), "STORE")
}

fn store_listing(store: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["objects", "nodes"] {
        let mut stack = vec![store.join(sub)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p.strip_prefix(store).unwrap().display().to_string());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_spec_through_slurm_per_node_equals_the_local_run_byte_for_byte() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &format!("{TINY_SPEC}{EXECUTOR_PER_NODE}"));
    let _c = Cleanup(&env);
    let spec = env.spec();
    let local = env.path("local");
    let l = env.upcc_store(&local, &["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(l.code, 0, "{l:?}");
    let s = env.upcc(&[
        "run",
        &spec,
        "--executor",
        "slurm",
        "--json",
        "--progress",
        "none",
    ]);
    assert_eq!(s.code, 0, "{s:?}");
    let sj = s.json();
    assert_eq!(sj["failed"], 0);
    assert_eq!(sj["done"].as_u64().unwrap() as usize, TINY_NODES, "{sj}");
    assert_eq!(tables(&sj, &env.store()), tables(&l.json(), &local));
    // The same results, bit for bit: the same node keys and the same object bytes.
    assert_eq!(store_listing(&env.store()), store_listing(&local));
    for f in store_listing(&local)
        .iter()
        .filter(|f| f.starts_with("objects/"))
    {
        assert_eq!(
            std::fs::read(local.join(f)).unwrap(),
            std::fs::read(env.store().join(f)).unwrap(),
            "{f}"
        );
    }
    // Every node was computed by exactly one job; the provenance names it.
    let counts = computed_counts(&env);
    assert_eq!(counts.len(), TINY_NODES, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    let m = manifest(&env, &spec, "train/blobs/lv0.1/probpair/pre/t1", &[]);
    assert!(
        m["provenance"]["run_id"]
            .as_str()
            .unwrap()
            .contains("-slurm"),
        "{m}"
    );
    // A second run finds everything computed and submits nothing.
    let again = env.upcc(&[
        "run",
        &spec,
        "--executor",
        "slurm",
        "--json",
        "--progress",
        "none",
    ]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.json()["submitted"], 0);
}

#[test]
fn the_smoke_spec_through_slurm_workers_equals_the_local_run_within_the_job_limit() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    let _c = Cleanup(&env);
    // The executor section from the user config file (the smoke spec has none): at most 3
    // jobs queued at once. The CI cluster's MaxJobCount (.ci/slurm.sh) is below the spec's
    // 68 nodes, so one job per node could not even be queued.
    let config = env.write(
        "config.yaml",
        &EXECUTOR.replace(
            "workers: {training: 1, other: 1}",
            "workers: {training: 2, other: 2}\n    max_jobs: 3",
        ),
    );
    let local = env.path("local");
    // The whole smoke spec (every stage, method, target and node of it) at small sizes: the
    // same nodes in seconds each instead of minutes, so CI's cold run stays inside its budget.
    let mut args = vec!["run", "smoke", "--json", "--progress", "none"];
    args.extend(SMOKE_SMALL);
    let t = Instant::now();
    let l = env.upcc_store(&local, &args);
    assert_eq!(l.code, 0, "{l:?}");
    let local_s = t.elapsed().as_secs_f64();
    let mut slurm_args = args.clone();
    slurm_args.extend(["--executor", "slurm"]);
    let t = Instant::now();
    let s = env
        .command(&env.store(), &slurm_args)
        .env("UPCC_CONFIG", &config)
        .output()
        .unwrap();
    let s = ran(s);
    assert_eq!(s.code, 0, "{s:?}");
    let sj = s.json();
    eprintln!(
        "smoke spec: local {local_s:.1} s; through Slurm {:.1} s with {} worker jobs, at most {} queued at once",
        t.elapsed().as_secs_f64(),
        sj["submitted"],
        sj["peak_queued"]
    );
    assert_eq!(sj["failed"], 0, "{sj}");
    let nodes = sj["total"].as_u64().unwrap() as usize;
    assert!(sj["peak_queued"].as_u64().unwrap() <= 3, "{sj}");
    assert!(
        (sj["submitted"].as_u64().unwrap() as usize) < nodes / 2,
        "a few jobs for many nodes: {sj}"
    );
    assert_eq!(tables(&sj, &env.store()), tables(&l.json(), &local));
    assert_eq!(store_listing(&env.store()), store_listing(&local));
    let counts = computed_counts(&env);
    assert_eq!(counts.len(), nodes, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
}

/// Per node id, `status --json`'s node objects.
fn status_nodes(env: &Env, spec: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["status", spec, "--json"];
    args.extend_from_slice(extra);
    let st = env.upcc(&args);
    assert_eq!(st.code, 0, "{st:?}");
    st.json()["nodes"].as_array().unwrap().clone()
}

#[test]
fn a_killed_worker_and_driver_lose_nothing_and_each_node_is_computed_once() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &slurm_spec());
    let _c = Cleanup(&env);
    let spec = env.spec();
    let slow = ["--set", "train.epochs=60000"];
    let mut args = vec![
        "run",
        spec.as_str(),
        "--executor",
        "slurm",
        "--progress",
        "plain",
    ];
    args.extend_from_slice(&slow);
    let mut driver = env
        .command(&env.store(), &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A training worker mid-node: cancel it (as a time limit or a preemption would end it),
    // then kill the driver.
    let (job, node) = wait_for(
        "a training worker computing a node",
        Duration::from_secs(180),
        || {
            status_nodes(&env, &spec, &slow).into_iter().find_map(|n| {
                (n["slurm"]["state"] == "running" && n["stage"] == "train").then(|| {
                    (
                        n["slurm"]["job"].as_str().unwrap().to_string(),
                        n["id"].as_str().unwrap().to_string(),
                    )
                })
            })
        },
    );
    assert!(Command::new("scancel")
        .arg(&job)
        .status()
        .unwrap()
        .success());
    driver.kill().unwrap();
    driver.wait().unwrap();
    wait_for("the cancelled job to end", Duration::from_secs(60), || {
        (!squeue().iter().any(|(id, _, _)| *id == job)).then_some(())
    });
    // The killed job published nothing; status and explain name the job and its log.
    let n = status_nodes(&env, &spec, &slow)
        .into_iter()
        .find(|n| n["id"] == node.as_str())
        .unwrap();
    assert_ne!(n["status"], "fresh", "{n}");
    assert_eq!(n["slurm"]["state"], "failed", "{n}");
    let mut ex_args = vec!["explain", spec.as_str(), node.as_str()];
    ex_args.extend_from_slice(&slow);
    let ex = env.upcc(&ex_args);
    assert!(
        ex.stdout
            .contains(&format!("slurm job {job} ended CANCELLED")),
        "{ex:?}"
    );
    assert!(ex.stdout.contains("job log"), "{ex:?}");
    // A new driver starts workers for what is left; every node ends computed exactly once
    // and the store verifies.
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let counts = computed_counts(&env);
    assert_eq!(counts.len(), TINY_NODES, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    let fresh = status_nodes(&env, &spec, &slow)
        .iter()
        .filter(|n| n["status"] == "fresh")
        .count();
    assert_eq!(fresh, TINY_NODES);
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
    assert!(
        !v.stdout.contains("quarantined") || v.stdout.contains("0 quarantined"),
        "{v:?}"
    );
}

#[test]
fn two_drivers_at_once_compute_each_node_once() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &slurm_spec());
    let _c = Cleanup(&env);
    let spec = env.spec();
    let args = [
        "run",
        spec.as_str(),
        "--executor",
        "slurm",
        "--json",
        "--progress",
        "none",
    ];
    let a = env
        .command(&env.store(), &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b = env
        .command(&env.store(), &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (a, b) = (
        ran(a.wait_with_output().unwrap()),
        ran(b.wait_with_output().unwrap()),
    );
    assert_eq!((a.code, b.code), (0, 0), "{a:?}\n{b:?}");
    let (aj, bj) = (a.json(), b.json());
    assert_eq!(aj["tables"], bj["tables"]);
    // One worker of each kind at a time across both drivers (they read each other's records).
    let submitted = aj["submitted"].as_u64().unwrap() + bj["submitted"].as_u64().unwrap();
    assert!((submitted as usize) < TINY_NODES / 2, "{aj} {bj}");
    let counts = computed_counts(&env);
    assert!(
        counts.len() == TINY_NODES && counts.values().all(|c| *c == 1),
        "{counts:?}"
    );
}

#[test]
fn a_detached_driver_runs_as_a_job_shows_in_status_and_cancels() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &slurm_spec());
    let _c = Cleanup(&env);
    let spec = env.spec();
    let slow = ["--set", "train.epochs=60000"];
    let detach = || {
        let mut a = vec![
            "run",
            spec.as_str(),
            "--executor",
            "slurm",
            "--detach",
            "--json",
            "--progress",
            "none",
        ];
        a.extend_from_slice(&slow);
        let r = env.upcc(&a);
        assert_eq!(r.code, 0, "{r:?}");
        r.json()
    };
    let first = detach();
    assert_eq!(first["new"], true, "{first}");
    // Nothing is submitted twice: a second --detach finds the driver's job.
    let second = detach();
    assert_eq!(second["new"], false, "{second}");
    assert_eq!(second["driver_job"], first["driver_job"], "{second}");
    // The driver job starts workers; status names the job computing a node.
    wait_for(
        "a node computed by a worker",
        Duration::from_secs(180),
        || {
            let text = env
                .upcc(&["status", &spec, "--set", "train.epochs=60000"])
                .stdout;
            text.lines()
                .any(|l| l.starts_with("running") && l.contains("slurm job "))
                .then_some(())
        },
    );
    // gc naming another spec keeps what the running jobs' spec reaches.
    let fresh = |env: &Env| -> Vec<String> {
        status_nodes(env, &spec, &slow)
            .iter()
            .filter(|n| n["status"] == "fresh")
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = wait_for(
        "the first nodes to finish",
        Duration::from_secs(120),
        || {
            let f = fresh(&env);
            (!f.is_empty()).then_some(f)
        },
    );
    let g = env.upcc(&["gc", "smoke", "--grace-minutes", "0"]);
    assert_eq!(g.code, 0, "{g:?}");
    assert!(g.stderr.contains("keeping what spec"), "{g:?}");
    let after = fresh(&env);
    assert!(
        before.iter().all(|id| after.contains(id)),
        "gc deleted results of running jobs' spec: {before:?} → {after:?}"
    );
    // Cancel: the driver and its workers leave the queue, and status shows no jobs.
    let mut args = vec!["cancel", spec.as_str(), "--json"];
    args.extend_from_slice(&slow);
    let c = env.upcc(&args);
    assert_eq!(c.code, 0, "{c:?}");
    assert!(c.json()["cancelled"].as_u64().unwrap() >= 2, "{c:?}");
    wait_for("the queue to drain", Duration::from_secs(60), || {
        (!squeue()
            .iter()
            .any(|(_, n, st)| n.starts_with("upcc:") && st != "COMPLETING"))
        .then_some(())
    });
    let mut args = vec!["status", spec.as_str(), "--json"];
    args.extend_from_slice(&slow);
    let st = env.upcc(&args).json();
    assert_eq!(st["slurm"]["queued"], 0, "{st}");
    assert_eq!(st["slurm"]["running"], 0, "{st}");
}

#[test]
fn the_job_plan_and_the_training_class_are_settled_before_anything_is_submitted() {
    // No cluster needed: a dry run submits nothing and creates no store.
    let env = Env::new();
    let mut args = vec!["run", "smoke", "--executor", "slurm", "--dry-run", "--json"];
    args.extend(SMOKE_SMALL);
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    let (jobs, nodes) = (j["jobs"].as_u64().unwrap(), j["nodes"].as_u64().unwrap());
    assert!(jobs > 0 && jobs < nodes / 2, "{j}");
    assert!(j["peak_queued"].as_u64().unwrap() <= 200, "{j}");
    let waves = j["waves"].as_array().unwrap();
    assert!(waves.iter().any(|w| w["kind"] == "training"), "{j}");
    assert_eq!(
        waves
            .iter()
            .map(|w| w["nodes"].as_u64().unwrap())
            .sum::<u64>(),
        nodes,
        "every node in one wave: {j}"
    );
    assert!(!env.store().exists(), "a dry run wrote the store");
    // A driver without a GPU for training jobs that get GPUs: refused with the fix.
    env.write(
        "spec.yaml",
        &format!("{TINY_SPEC}executor:\n  slurm:\n    resources:\n      training: {{gpus: 1}}\n"),
    );
    let r = env.upcc(&["run", &env.spec(), "--executor", "slurm", "--dry-run"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("executor.slurm.numerics"), "{r:?}");
    assert!(r.stderr.contains("upcc device"), "{r:?}");
    // Declared, the class plans the training nodes.
    let class = "cuda-f32-sm90-132sm-test";
    env.write(
        "spec.yaml",
        &format!("{TINY_SPEC}executor:\n  slurm:\n    numerics: {class}\n    resources:\n      training: {{gpus: 1}}\n"),
    );
    let r = env.upcc(&[
        "run",
        &env.spec(),
        "--executor",
        "slurm",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    assert_eq!(j["numerics"], class, "{j}");
    let training = j["waves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["kind"] == "training")
        .unwrap()
        .clone();
    assert_eq!(training["gpus"], 1, "{j}");
    // A training worker whose device computes another class than planned refuses to start,
    // naming the setting that fixes it.
    let r = env.upcc(&[
        "--numerics",
        class,
        "worker",
        &env.spec(),
        "--kind",
        "training",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("executor.slurm.numerics: cpu-"), "{r:?}");
    assert!(!env.store().join("jobs").exists());
}

#[test]
fn bad_executor_settings_are_refused_before_anything_is_submitted() {
    let env = Env::new();
    env.write(
        "spec.yaml",
        &format!("{TINY_SPEC}executor:\n  kind: slurmm\n  slurm:\n    resources: {{train: {{cpus: 0, time: soon}}}}\n"),
    );
    let r = env.upcc(&["run", &env.spec(), "--executor", "slurm"]);
    assert_eq!(r.code, 2, "{r:?}");
    for needle in [
        "unknown executor `slurmm`",
        "executor.slurm.resources.train.cpus",
        "is not a Slurm time limit",
    ] {
        assert!(r.stderr.contains(needle), "want `{needle}`: {}", r.stderr);
    }
    assert!(!env.store().join("jobs").exists());
    env.write("spec.yaml", TINY_SPEC);
    let r = env.upcc(&["run", &env.spec(), "--detach"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--detach"), "{r:?}");
}
