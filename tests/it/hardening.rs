//! The second hostile test's findings (E1-E10 in ../shared/reference/reliability-findings.md):
//! each refused at load with exit 2 and a message naming the field, variable or file and the
//! fix, or handled (a byte-order mark, merge keys), and no store written for a refusal.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;

use crate::bad_input::tiny_with;
use crate::util::*;

/// Run `args` against `spec_text` in a fresh directory: exit 2, every needle on stderr, and no
/// store created.
fn refused_at_load(spec_text: &str, args: &[&str], needles: &[&str]) -> Ran {
    let env = Env::new();
    env.write("bad.yaml", spec_text);
    let spec = env.path("bad.yaml").display().to_string();
    let mut full = vec!["run", spec.as_str(), "--progress", "none"];
    full.extend_from_slice(args);
    let r = env.upcc(&full);
    assert_eq!(r.code, 2, "expected exit 2: {r:?}");
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks `{n}`: {r:?}");
    }
    assert!(!env.store().exists(), "a store was created: {r:?}");
    r
}

#[test]
fn spec_names_that_would_leave_refs_are_refused() {
    let long = "n".repeat(101);
    for name in ["\"..\"", "\".\"", ".hidden", long.as_str()] {
        refused_at_load(
            &tiny_with("name: tiny", &format!("name: {name}")),
            &[],
            &["`name:", "not starting with `.`", "1 to 100"],
        );
    }
}

#[test]
fn blank_names_are_refused() {
    let spec = tiny_with("  probpair: {}", "  \"\": {kind: probpair}\n  probpair: {}");
    refused_at_load(&spec, &[], &["must not be empty"]);
}

#[test]
fn a_number_beyond_the_float_range_says_so() {
    let spec = tiny_with("corruption: 0.3", "corruption: 1e400");
    refused_at_load(&spec, &[], &["`1e400` is not a finite number"]);
}

#[test]
fn epochs_and_learning_rates_have_plausible_bounds() {
    refused_at_load(
        TINY_SPEC,
        &["--set", "train.epochs=18446744073709551615"],
        &["epochs", "1 to 100000"],
    );
    refused_at_load(
        TINY_SPEC,
        &["--set", "train.lr=1e308"],
        &["learning rate", "≤ 10"],
    );
    refused_at_load(
        TINY_SPEC,
        &["--set", "pretrain.finetune_epochs=1000000"],
        &["finetune_epochs", "100000"],
    );
}

#[test]
fn eci_folds_beyond_the_budget_are_refused_at_load() {
    let spec = tiny_with("  weighted-probpair: {}", "  eci-pp: {}")
        .replace("[probpair, weighted-probpair]", "[probpair, eci-pp]")
        .replace("budget: 300", "budget: 4");
    refused_at_load(
        &spec,
        &["--set", "eci.folds=5", "--set", "eci.warmup_epochs=1"],
        &[
            "`eci.folds` (5) exceeds the 4 constraints",
            "lower `eci.folds`",
        ],
    );
}

#[test]
fn yaml_merge_keys_are_resolved() {
    let spec = tiny_with(
        "  weighted-probpair: {}",
        "  weighted-probpair: &base {kind: probpair, train: {hidden: [16, 16], epochs: 2}}\n  short: {<<: *base}",
    )
    .replace("[probpair, weighted-probpair]", "[probpair, short]");
    let env = Env::new();
    env.write("merge.yaml", &spec);
    let spec = env.path("merge.yaml").display().to_string();
    let r = env.upcc(&["status", &spec, "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let e = env.upcc(&[
        "explain",
        &spec,
        "train/blobs/lv0.1/short/nopre/t1",
        "--json",
    ]);
    assert_eq!(e.code, 0, "{e:?}");
    let params = &e.json()["params"];
    assert_eq!(params["settings"]["epochs"], 2, "{params}");
    assert_eq!(
        params["settings"]["hidden"],
        serde_json::json!([16, 16]),
        "{params}"
    );
}

#[test]
fn explain_without_a_node_says_what_is_missing() {
    let env = Env::new();
    let r = env.upcc(&["explain", &env.spec()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("needs a node"), "{r:?}");
    assert!(r.stderr.contains("upcc status"), "{r:?}");
}

#[test]
fn invalid_environment_variables_are_named() {
    let env = Env::new();
    let spec = env.spec();
    for (var, value) in [
        ("UPCC_THREADS", "lots"),
        ("UPCC_EXECUTOR", "cloud"),
        ("UPCC_LEASE_EXPIRY_S", "soon"),
        ("UPCC_STORE_SHARED", "yes"),
    ] {
        let out = env
            .command(&env.store(), &["run", &spec, "--progress", "none"])
            .env(var, value)
            .output()
            .unwrap();
        let r = ran(out);
        assert_eq!(r.code, 2, "{var}: {r:?}");
        assert!(
            r.stderr.contains(&format!("{var}=`{value}`")),
            "{var}: {r:?}"
        );
        assert!(r.stderr.contains(&format!("unset {var}")), "{var}: {r:?}");
        assert!(!env.store().exists(), "{var}: a store was created");
    }
    // `upcc job` has no --threads and reads UPCC_THREADS itself; `status` does not read it:
    // a bad value is named all the same, never replaced by the default.
    for args in [
        vec!["status", spec.as_str()],
        vec!["job", spec.as_str(), "features/blobs", "--recipe", "r.json"],
    ] {
        let out = env
            .command(&env.store(), &args)
            .env("UPCC_THREADS", "0")
            .output()
            .unwrap();
        let r = ran(out);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains("UPCC_THREADS=`0`"), "{args:?}: {r:?}");
        assert!(!env.store().exists(), "{args:?}: a store was created");
    }
}

#[test]
fn a_non_utf8_argument_is_named() {
    let env = Env::new();
    let bad = std::ffi::OsStr::from_bytes(b"sp\xffec.yaml");
    let out = env
        .command(&env.store(), &["run"])
        .arg(bad)
        .output()
        .unwrap();
    let r = ran(out);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("is not valid UTF-8"), "{r:?}");
    assert!(r.stderr.contains("sp\u{fffd}ec.yaml"), "{r:?}");
}

#[test]
fn files_that_never_end_are_refused() {
    let env = Env::new();
    let r = env.upcc(&["run", "/dev/zero"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("not a regular file"), "{r:?}");
    // As a dataset's file: refused by the node that reads it, before reading.
    env.write(
        "zero.yaml",
        &tiny_with("data: blobs.csv", "data: /dev/zero"),
    );
    let spec = env.path("zero.yaml").display().to_string();
    let r = env.upcc(&["run", &spec, "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("/dev/zero"), "{r:?}");
    assert!(r.stderr.contains("not a regular file"), "{r:?}");
}

#[test]
fn a_csv_with_a_byte_order_mark_reads_as_without_it() {
    let env = Env::new();
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(blobs_csv(240).as_bytes());
    std::fs::write(env.path("bom.csv"), bom).unwrap();
    env.write("bom.yaml", &tiny_with("data: blobs.csv", "data: bom.csv"));
    let spec = env.path("bom.yaml").display().to_string();
    let r = env.upcc(&[
        "run",
        &spec,
        "stage=features",
        "--progress",
        "none",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    // The same matrix as the file without the mark: the features nodes' outputs are equal.
    let plain = env.upcc(&["run", &env.spec(), "stage=features", "--progress", "none"]);
    assert_eq!(plain.code, 0, "{plain:?}");
    let out = |spec: &str| {
        let e = env.upcc(&["explain", spec, "features/blobs", "--json"]);
        e.json()["manifest"]["outputs"]["features"]["digest"].clone()
    };
    assert_eq!(out(&spec), out(&env.spec()));
}

/// `upcc` under an address-space limit of `gib` GiB.
fn limited(env: &Env, gib: u64, args: &[&str]) -> Ran {
    let mut c = env.command(&env.store(), args);
    let bytes = gib << 30;
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    ran(c.output().unwrap())
}

/// A dataset of 2,000 features (a wide input makes the first layer's weights count).
fn wide_csv(rows: usize, dim: usize) -> String {
    let mut s = String::new();
    for i in 0..rows {
        let row: Vec<String> = (0..dim)
            .map(|j| format!("{}", ((i * 31 + j * 7) % 13) as f32 / 13.0))
            .collect();
        s.push_str(&format!("{},{}\n", row.join(","), i % 4));
    }
    s
}

#[test]
fn networks_that_cannot_fit_are_refused_before_anything_runs() {
    let env = Env::new();
    std::fs::write(env.path("wide.csv"), wide_csv(60, 2000)).unwrap();
    env.write("wide.yaml", &tiny_with("data: blobs.csv", "data: wide.csv"));
    let spec = env.path("wide.yaml").display().to_string();
    // 2,000 inputs × 50,000 units: 3.2 GiB of weights and Adam state, under a 2 GiB limit.
    let r = limited(
        &env,
        2,
        &[
            "run",
            &spec,
            "--progress",
            "none",
            "--set",
            "train.hidden=[50000]",
        ],
    );
    assert_eq!(r.code, 2, "{r:?}");
    for n in [
        "node `train/blobs/lv0.1/",
        "would need",
        "address-space limit",
        "lower `train.hidden` or `train.batch_size`",
    ] {
        assert!(r.stderr.contains(n), "stderr lacks `{n}`: {r:?}");
    }
    assert!(
        !env.store().exists(),
        "nothing may run or be written: {r:?}"
    );
    // Absurd sizes are refused by the settings' own check, whatever the dataset.
    let r = limited(
        &env,
        2,
        &[
            "run",
            &env.spec(),
            "--progress",
            "none",
            "--set",
            "train.hidden=[1000000]",
        ],
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("train.hidden"), "{r:?}");
    assert!(!env.store().exists());
}

#[test]
fn two_methods_of_one_kind_share_results_without_another_process() {
    let env = Env::new();
    let spec = tiny_with("  weighted-probpair: {}", "  pp2: {kind: probpair}")
        .replace("[probpair, weighted-probpair]", "[probpair, pp2]");
    env.write("twins.yaml", &spec);
    let spec = env.path("twins.yaml").display().to_string();
    let r = env.upcc(&[
        "run",
        &spec,
        "--progress",
        "none",
        "trial=1",
        "pretrain=false",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stderr.contains("by another process"), "{r:?}");
    let j = r.json();
    assert_eq!(j["computed_elsewhere"], 0, "{j}");
    // The twin's training (and what follows it, the same keys) is this run's own result.
    assert!(j["cached"].as_u64().unwrap() >= 1, "{j}");
    let twin = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "train/blobs/lv0.1/pp2/nopre/t1")
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(twin["outcome"], "cached", "{j}");
}

#[test]
fn small_messages_name_what_to_fix() {
    let env = Env::new();
    let spec = env.spec();
    // A negative grace period: named, not clap's `-- -1` tip.
    let r = env.upcc(&["gc", &spec, "--grace-minutes", "-1"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("--grace-minutes must be 0 or more"),
        "{r:?}"
    );
    // A dataset that only a `--set` creates: the problem is placed at that `--set`.
    let r = env.upcc(&["status", &spec, "--set", "datasets.e.format=csv"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("`--set datasets.e.format=csv`"), "{r:?}");
    // Aliases that expand without end: refused at once, saying what happened.
    let mut bomb = String::from("x-bomb:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let prev = format!("*a{}", i - 1);
        bomb.push_str(&format!(
            "  a{i}: &a{i} [{}]\n",
            [prev.as_str(); 10].join(", ")
        ));
    }
    env.write("bomb.yaml", &format!("{TINY_SPEC}{bomb}"));
    let r = env.upcc(&["status", &env.path("bomb.yaml").display().to_string()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("billion laughs"), "{r:?}");
}

#[test]
fn an_absurd_class_count_is_refused_at_load() {
    let spec = tiny_with(
        "embedding_dim: 4",
        "embedding_dim: 4\n    n_classes: 18446744073709551615",
    );
    refused_at_load(
        &spec,
        &[],
        &["`n_classes: 18446744073709551615` must be 1 to 1000000"],
    );
}

#[test]
fn more_classes_than_the_labels_hold_says_which_to_set() {
    let env = Env::new();
    env.write(
        "c.yaml",
        &tiny_with("embedding_dim: 4", "embedding_dim: 4\n    n_classes: 10"),
    );
    let spec = env.path("c.yaml").display().to_string();
    let r = env.upcc(&["run", &spec, "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains("`n_classes` is 10 but its labels are 0..=3; set `n_classes: 4`"),
        "{r:?}"
    );
}

/// Ctrl-C during a run says what it keeps, exits 130, and keeps it: the next run computes only
/// what was not stored.
#[test]
fn ctrl_c_says_what_it_keeps_and_keeps_it() {
    let env = Env::new();
    let spec = env.spec();
    // Training long enough to be interrupted while the first results are already stored.
    let slow = ["--set", "train.epochs=400"];
    let mut args = vec!["run", spec.as_str(), "--json", "--progress", "plain"];
    args.extend_from_slice(&slow);
    let child = env
        .command(&env.store(), &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let nodes = env.store().join("nodes");
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&nodes).map_or(0, |d| d.count()) == 0 {
        assert!(t0.elapsed().as_secs() < 120, "no result stored in 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let r = ran(child.wait_with_output().unwrap());
    assert_eq!(r.code, 130, "{r:?}");
    assert!(
        r.stderr
            .contains("interrupted (Ctrl-C): results already stored are kept"),
        "{r:?}"
    );
    let j = env.run_ok(&slow);
    assert!(j["cached"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(j["failed"], 0, "{j}");
}
