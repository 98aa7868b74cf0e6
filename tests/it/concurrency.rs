//! Two `upcc run` processes on one store compute every node once and agree on every result.

use crate::util::*;

#[test]
fn two_processes_on_one_store_compute_each_node_once() {
    let env = Env::new();
    let spec = env.spec();
    let args = [
        "run",
        spec.as_str(),
        "--json",
        "--progress",
        "none",
        "--set",
        "train.epochs=20",
    ];
    let a = env
        .command(&env.store(), &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b = env
        .command(&env.store(), &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ra = ran(a.wait_with_output().unwrap());
    let rb = ran(b.wait_with_output().unwrap());
    assert_eq!(ra.code, 0, "{ra:?}");
    assert_eq!(rb.code, 0, "{rb:?}");
    let (ja, jb) = (ra.json(), rb.json());
    // Every node was executed by exactly one of the two.
    let mut executed = ids_with(&ja, "executed");
    let eb = ids_with(&jb, "executed");
    for id in &eb {
        assert!(!executed.contains(id), "`{id}` was computed twice");
    }
    executed.extend(eb);
    assert_eq!(executed.len(), TINY_NODES, "a: {ja}\nb: {jb}");
    // Both saw the same results.
    assert_eq!(keys(&ja), keys(&jb));
    assert_eq!(ja["tables"], jb["tables"]);
    let s = env
        .upcc(&["status", &spec, "--json", "--set", "train.epochs=20"])
        .json();
    assert_eq!(s["fresh"], TINY_NODES);
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
