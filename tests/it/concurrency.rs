//! Two `upcc run` processes on one store compute every node once and agree on every result.

use crate::util::*;

/// The first process is seen computing a node before the second starts, so the two run at the
/// same time by construction; both then compute nodes (the second takes the ones the first has
/// not leased), none twice, and they agree on every result.
#[test]
fn two_processes_on_one_store_compute_each_node_once() {
    let env = Env::new();
    let spec = env.spec();
    let set = ["--set", "train.epochs=2000"];
    let mut args = vec!["run", spec.as_str(), "--json", "--progress", "none"];
    args.extend(set);
    let spawn = || {
        env.command(&env.store(), &args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = spawn();
    let a_pid = a.id() as u64;
    let mut status = vec!["status", spec.as_str(), "--json"];
    status.extend(set);
    let mut running = false;
    for _ in 0..600 {
        let s = env.upcc(&status);
        if s.code == 0
            && s.json()["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["stage"] == "train" && n["running"]["pid"].as_u64() == Some(a_pid))
        {
            running = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(running, "the first process was never seen training");
    let b = spawn();
    let ra = ran(a.wait_with_output().unwrap());
    let rb = ran(b.wait_with_output().unwrap());
    assert_eq!(ra.code, 0, "{ra:?}");
    assert_eq!(rb.code, 0, "{rb:?}");
    let (ja, jb) = (ra.json(), rb.json());
    // Every node was executed by exactly one of the two, and each executed some.
    let mut executed = ids_with(&ja, "executed");
    let eb = ids_with(&jb, "executed");
    assert!(
        !executed.is_empty() && !eb.is_empty(),
        "both processes computed nodes: a executed {}, b {}",
        executed.len(),
        eb.len()
    );
    for id in &eb {
        assert!(!executed.contains(id), "`{id}` was computed twice");
    }
    executed.extend(eb);
    assert_eq!(executed.len(), TINY_NODES, "a: {ja}\nb: {jb}");
    // Both saw the same results.
    assert_eq!(keys(&ja), keys(&jb));
    assert_eq!(ja["tables"], jb["tables"]);
    let mut status = vec!["status", spec.as_str(), "--json"];
    status.extend(set);
    assert_eq!(env.upcc(&status).json()["fresh"], TINY_NODES);
}

#[test]
fn status_shows_nodes_another_process_is_computing_and_forgets_dead_ones() {
    let env = Env::new();
    let spec = env.spec();
    let set = ["--set", "train.epochs=3000"];
    let mut args = vec![
        "run",
        spec.as_str(),
        "method=probpair",
        "pretrain=false",
        "trial=1",
    ];
    args.extend(set);
    let mut child = env
        .command(&env.store(), &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as u64;
    // Wait until the long training node shows as running, with the child's pid.
    let mut seen = None;
    for _ in 0..300 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut a = vec!["status", spec.as_str(), "--json"];
        a.extend(set);
        let s = env.upcc(&a);
        if s.code != 0 {
            continue;
        }
        let j = s.json();
        if let Some(n) = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["running"].is_object())
        {
            seen = Some((
                n["id"].as_str().unwrap().to_string(),
                n["running"].clone(),
                j["running"].clone(),
            ));
            break;
        }
    }
    let (id, running, count) = seen.expect("a node showed as running");
    assert_eq!(id, "train/blobs/lv0.1/probpair/nopre/t1");
    assert_eq!(running["pid"].as_u64(), Some(pid), "{running}");
    assert_eq!(count, 1);
    let mut a = vec!["status", spec.as_str()];
    a.extend(set);
    let text = env.upcc(&a);
    assert!(
        text.stdout.contains("running  train") && text.stdout.contains(&format!("pid {pid}")),
        "{text:?}"
    );
    // Killed: its lease record stays in the lock file, but the node is no longer running.
    child.kill().unwrap();
    child.wait().unwrap();
    let mut a = vec!["status", spec.as_str(), "--json"];
    a.extend(set);
    let j = env.upcc(&a).json();
    assert_eq!(j["running"], 0, "{j}");
}

/// A holder that stops beating while its lock stays held (SIGSTOP stands in for a crashed NFS
/// client whose lock the server keeps) is taken over once its heartbeat expires, and the run
/// completes; `status` calls it stalled meanwhile.
#[test]
fn a_stalled_holder_is_taken_over_after_its_heartbeat_expires() {
    let env = Env::new();
    let spec = env.spec();
    let set = ["--set", "train.epochs=20000"];
    let mut args = vec![
        "run",
        spec.as_str(),
        "method=probpair",
        "trial=1",
        "--progress",
        "none",
    ];
    args.extend_from_slice(&set);
    let mut a = env
        .command(&env.store(), &args)
        .env("UPCC_LEASE_HEARTBEAT_S", "0.5")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = |expiry: &str| -> serde_json::Value {
        let mut s = vec![
            "status",
            spec.as_str(),
            "method=probpair",
            "trial=1",
            "--json",
        ];
        s.extend_from_slice(&set);
        let out = env
            .command(&env.store(), &s)
            .env("UPCC_LEASE_EXPIRY_S", expiry)
            .output()
            .unwrap();
        ran(out).json()
    };
    let t0 = std::time::Instant::now();
    let training = loop {
        let s = status("2");
        let running: Vec<String> = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["stage"] == "train" && n.get("running").is_some())
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect();
        if !running.is_empty() {
            break running;
        }
        assert!(
            t0.elapsed().as_secs() < 120,
            "no training node started: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let s = status("2");
    let stalled = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == training[0].as_str())
        .unwrap()
        .clone();
    assert_eq!(stalled["running"]["stalled"], true, "{stalled}");
    // With the default expiry (10 minutes) it is still the holder's.
    assert_eq!(
        status("600")["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == training[0].as_str())
            .unwrap()["running"]["stalled"],
        false
    );
    let mut b_args = args.clone();
    b_args.extend(["--json"]);
    let b = env
        .command(&env.store(), &b_args)
        .env("UPCC_LEASE_EXPIRY_S", "2")
        .env("UPCC_LEASE_HEARTBEAT_S", "0.5")
        .output()
        .unwrap();
    let b = ran(b);
    a.kill().unwrap();
    a.wait().unwrap();
    assert_eq!(b.code, 0, "{b:?}");
    let executed = ids_with(&b.json(), "executed");
    for id in &training {
        assert!(
            executed.contains(id),
            "`{id}` was taken over and computed: {executed:?}"
        );
    }
    let s = status("2");
    assert_eq!(s["missing"], 0, "{s}");
    assert_eq!(s["stale"], 0, "{s}");
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
}
