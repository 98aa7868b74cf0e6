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
