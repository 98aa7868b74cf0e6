//! A run killed at any moment leaves no partial object, `verify` passes, the next run completes.

use std::time::{Duration, Instant};

use crate::util::*;

#[test]
fn sigkill_mid_stage_leaves_no_partial_object_and_the_next_run_completes() {
    let env = Env::new();
    // SDAE pretraining on the MNIST sample takes a few seconds: kill inside it.
    let args = [
        "run",
        "smoke",
        "--progress",
        "none",
        "stage=pretrain",
        "--set",
        "pretrain.layerwise_epochs=3",
        "--set",
        "pretrain.finetune_epochs=6",
    ];
    let mut child = env
        .command(&env.store(), &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // Wait for the first node (features) to be published, then let pretraining start.
    while env.snapshot().iter().all(|(p, _)| !p.starts_with("nodes")) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "features never finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the run should have been killed while pretraining"
    );
    let published: Vec<_> = env
        .snapshot()
        .into_iter()
        .filter(|(p, _)| p.starts_with("nodes"))
        .collect();
    assert_eq!(
        published.len(),
        1,
        "only `features` was complete: {published:?}"
    );
    // Every visible object is whole: verify re-hashes everything.
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
    assert!(v.stdout.contains("store is intact"), "{v:?}");
    // The next run completes, reusing what was stored.
    let r = env.upcc(&[&args[..], &["--json"]].concat());
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    assert_eq!(ids_with(&j, "cached"), ["features/mnist5k"]);
    assert_eq!(ids_with(&j, "executed"), ["pretrain/mnist5k/s0"]);
    assert_eq!(env.upcc(&["verify"]).code, 0);
}
