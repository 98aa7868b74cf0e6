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

/// The executor section the tests use: the CI node has 2 CPUs, so training jobs ask for one.
const EXECUTOR: &str = "executor:\n  slurm:\n    poll_seconds: 0.5\n    resources:\n      training: {cpus: 1}\n      default: {mem_mb: 1500}\n";

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

/// Per node id, how many jobs computed it (the jobs' own `upcc job: computed NODE` lines).
fn computed_counts(env: &Env) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(env.store().join("jobs/logs"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("upcc job: computed ") {
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
fn a_spec_through_slurm_equals_the_local_run_byte_for_byte() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &slurm_spec());
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
fn the_smoke_spec_through_slurm_equals_the_local_run() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    let _c = Cleanup(&env);
    // The executor section from the user config file (the smoke spec has none).
    let config = env.write("config.yaml", EXECUTOR);
    let local = env.path("local");
    // The whole smoke spec (every stage, method, target and node of it) at small sizes: the
    // same nodes in seconds each instead of minutes, so CI's cold run stays inside its budget.
    let mut args = vec!["run", "smoke", "--json", "--progress", "none"];
    args.extend(SMOKE_SMALL);
    let l = env.upcc_store(&local, &args);
    assert_eq!(l.code, 0, "{l:?}");
    let mut slurm_args = args.clone();
    slurm_args.extend(["--executor", "slurm"]);
    let s = env
        .command(&env.store(), &slurm_args)
        .env("UPCC_CONFIG", &config)
        .output()
        .unwrap();
    let s = ran(s);
    assert_eq!(s.code, 0, "{s:?}");
    let sj = s.json();
    assert_eq!(sj["failed"], 0, "{sj}");
    assert_eq!(tables(&sj, &env.store()), tables(&l.json(), &local));
    assert_eq!(store_listing(&env.store()), store_listing(&local));
}

#[test]
fn a_killed_job_and_driver_lose_nothing_and_each_node_is_computed_once() {
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
        "--progress",
        "plain",
        "--set",
        "train.epochs=60000",
    ];
    let mut driver = env
        .command(&env.store(), &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A training job mid-run: cancel it (as a time limit or a preemption would end it), then
    // kill the driver.
    let (job, name) = wait_for("a running training job", Duration::from_secs(120), || {
        squeue()
            .into_iter()
            .find(|(_, n, st)| n.starts_with("upcc:train/") && st == "RUNNING")
            .map(|(id, n, _)| (id, n))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(Command::new("scancel")
        .arg(&job)
        .status()
        .unwrap()
        .success());
    driver.kill().unwrap();
    driver.wait().unwrap();
    let node = name.trim_start_matches("upcc:").to_string();
    // The killed job published nothing; status and explain say what happened to it.
    wait_for("the cancelled job to end", Duration::from_secs(60), || {
        (!squeue().iter().any(|(id, _, _)| *id == job)).then_some(())
    });
    let st = env.upcc(&["status", &spec, "--json", "--set", "train.epochs=60000"]);
    assert_eq!(st.code, 0, "{st:?}");
    let sj = st.json();
    let n = sj["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == node.as_str())
        .unwrap()
        .clone();
    assert_ne!(n["status"], "fresh", "{n}");
    assert_eq!(n["slurm"]["state"], "failed", "{n}");
    let ex = env.upcc(&["explain", &spec, &node, "--set", "train.epochs=60000"]);
    assert!(
        ex.stdout
            .contains(&format!("slurm job {job} ended CANCELLED")),
        "{ex:?}"
    );
    assert!(ex.stdout.contains("job log"), "{ex:?}");
    // A new driver re-attaches to the jobs still queued and resubmits what ended without a
    // result; every node ends computed exactly once, and the store verifies.
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let counts = computed_counts(&env);
    assert_eq!(counts.len(), TINY_NODES, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    let st = env
        .upcc(&["status", &spec, "--json", "--set", "train.epochs=60000"])
        .json();
    assert_eq!(st["fresh"].as_u64().unwrap() as usize, TINY_NODES, "{st}");
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
    assert!(
        !v.stdout.contains("quarantined") || v.stdout.contains("0 quarantined"),
        "{v:?}"
    );
}

#[test]
fn two_drivers_at_once_submit_each_node_once() {
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
    let submitted = aj["submitted"].as_u64().unwrap() + bj["submitted"].as_u64().unwrap();
    assert_eq!(
        submitted as usize, TINY_NODES,
        "one job per node overall: {aj} {bj}"
    );
    assert_eq!(aj["tables"], bj["tables"]);
    let logs = std::fs::read_dir(env.store().join("jobs/logs"))
        .unwrap()
        .count();
    assert_eq!(logs, TINY_NODES);
    let counts = computed_counts(&env);
    assert!(
        counts.len() == TINY_NODES && counts.values().all(|c| *c == 1),
        "{counts:?}"
    );
}

#[test]
fn detached_jobs_show_in_status_are_not_resubmitted_and_cancel() {
    let _g = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    if !slurm() {
        return;
    }
    let env = Env::new();
    env.write("spec.yaml", &slurm_spec());
    let _c = Cleanup(&env);
    let spec = env.spec();
    let slow = ["--set", "train.epochs=60000"];
    let detach = |extra: &[&str]| {
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
        a.extend_from_slice(extra);
        let r = env.upcc(&a);
        assert_eq!(r.code, 0, "{r:?}");
        r.json()
    };
    let first = detach(&slow);
    assert_eq!(
        first["submitted"].as_u64().unwrap() as usize,
        TINY_NODES,
        "{first}"
    );
    // Nothing is submitted twice: a second driver attaches to the queued jobs.
    let second = detach(&slow);
    assert_eq!(second["submitted"], 0, "{second}");
    assert!(second["attached"].as_u64().unwrap() > 0, "{second}");
    let mut args = vec!["status", spec.as_str(), "--json"];
    args.extend_from_slice(&slow);
    let st = env.upcc(&args).json();
    let jobs = &st["slurm"];
    assert!(
        jobs["queued"].as_u64().unwrap() + jobs["running"].as_u64().unwrap() > 0,
        "{st}"
    );
    let text = env
        .upcc(&["status", &spec, "--set", "train.epochs=60000"])
        .stdout;
    assert!(text.contains("(slurm job "), "{text}");
    // gc naming another spec keeps what the queued jobs' spec reaches (nothing is recent
    // enough to be kept for its age: --grace-minutes 0).
    let fresh = |env: &Env| -> Vec<String> {
        let mut args = vec!["status", spec.as_str(), "--json"];
        args.extend_from_slice(&slow);
        env.upcc(&args).json()["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["status"] == "fresh")
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = wait_for("the first jobs to finish", Duration::from_secs(120), || {
        let f = fresh(&env);
        (!f.is_empty()).then_some(f)
    });
    let g = env.upcc(&["gc", "smoke", "--grace-minutes", "0"]);
    assert_eq!(g.code, 0, "{g:?}");
    assert!(g.stderr.contains("keeping what spec"), "{g:?}");
    let after = fresh(&env);
    assert!(
        before.iter().all(|id| after.contains(id)),
        "gc deleted results of queued jobs' spec: {before:?} → {after:?}"
    );
    // Cancel: nothing of this spec is left in the queue, and status shows no jobs.
    let mut args = vec!["cancel", spec.as_str(), "--json"];
    args.extend_from_slice(&slow);
    let c = env.upcc(&args);
    assert_eq!(c.code, 0, "{c:?}");
    assert!(c.json()["cancelled"].as_u64().unwrap() > 0, "{c:?}");
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
