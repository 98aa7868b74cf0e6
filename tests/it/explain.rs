//! `explain` shows a node's log itself; `-vv` shows key material as the help promises.

use crate::util::*;

#[test]
fn explain_prints_the_log_of_a_computed_and_of_a_failed_node() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let r = env.upcc(&["explain", &spec, "train/blobs/lv0.1/probpair/pre/t1"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("  | [") && r.stdout.contains("stage train v"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("final loss"),
        "the stage's own log lines: {r:?}"
    );
    let j = env
        .upcc(&[
            "explain",
            &spec,
            "train/blobs/lv0.1/probpair/pre/t1",
            "--json",
        ])
        .json();
    assert!(
        j["log_text"].as_str().unwrap().contains("final loss"),
        "{j}"
    );
    // A failed node (more distinct pairs than the training rows give): its log says why,
    // and explain shows it.
    let bad = ["--set", "constraints.budget=100000"];
    let mut args = vec![
        "run",
        spec.as_str(),
        "method=probpair",
        "pretrain=false",
        "trial=1",
        "--progress",
        "none",
    ];
    args.extend(bad);
    let failed = env.upcc(&args);
    assert_eq!(failed.code, 2, "{failed:?}");
    let mut ex = vec!["explain", spec.as_str(), "constraints/blobs/lv0.1/t1"];
    ex.extend(bad);
    let r = env.upcc(&ex);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("FAILED") && r.stdout.contains("lower the budget"),
        "{r:?}"
    );
}

#[test]
fn very_verbose_runs_print_key_material() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["-vv", "run", &spec, "stage=features", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("key material") && r.stderr.contains("stage_version"),
        "{r:?}"
    );
}
