//! `gc` deletes exactly what the named specs' targets no longer reach.

use crate::util::*;

#[test]
fn gc_keeps_the_targets_of_the_named_spec_and_deletes_the_rest() {
    let env = Env::new();
    env.run_ok(&[]);
    // A variant run adds results the spec (as written) does not reach.
    env.run_ok(&["--set", "constraints.corruption=0.5"]);
    let spec = env.spec();
    let before = env.snapshot().len();
    let dry = env.upcc(&["gc", &spec, "--grace-minutes", "0", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(dry.stdout.starts_with("dry run: "), "{dry:?}");
    assert_eq!(env.snapshot().len(), before, "a dry run deletes nothing");
    // Within the grace period nothing is deleted either (a writer may be in flight).
    let recent = env.upcc(&["gc", &spec]);
    assert!(
        recent.stdout.contains("0 results and 0 objects"),
        "{recent:?}"
    );
    let r = env.upcc(&["gc", &spec, "--grace-minutes", "0"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.starts_with("0 results"), "{r:?}");
    let kept = env.upcc(&["status", &spec, "--json"]).json();
    assert_eq!(kept["fresh"], TINY_NODES);
    let gone = env
        .upcc(&[
            "status",
            &spec,
            "--json",
            "--set",
            "constraints.corruption=0.5",
        ])
        .json();
    assert_eq!(
        gone["fresh"], 3,
        "only the shared upstream nodes survive: {gone}"
    );
    assert_eq!(env.upcc(&["verify"]).code, 0);
}
