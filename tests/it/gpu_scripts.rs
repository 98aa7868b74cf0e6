//! The GPU machine's scripts, checked where there is no GPU: `.ci/gpu-test.sh` and
//! `.ci/bench-gpu.sh` with stand-in binaries report PASS only for parts that passed, FAIL (and
//! a non-zero exit) for parts that failed or ran out of time, and print no figures from a part
//! that failed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{ran, Ran};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An executable shell script `name` in `dir` with `body`.
fn stand_in(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut c = Command::new("bash");
    c.arg(repo().join(".ci").join(name)).args(args);
    c.env_remove("OUT");
    for (k, v) in env {
        c.env(k, v);
    }
    ran(c.output().unwrap())
}

#[test]
fn gpu_test_reports_each_part_and_fails_when_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    stand_in(&bin, "upcc", "echo \"upcc $*\"");
    stand_in(&bin, "cuda_ops", "echo 'op mismatch'; exit 3");
    let work = dir.path().join("work");
    let env = [
        ("UPCC_GPU_TEST_ASSUME_GPU", "1"),
        ("UPCC_GPU_BIN", bin.to_str().unwrap()),
        ("UPCC_GPU_WORK", work.to_str().unwrap()),
    ];
    let r = script("gpu-test.sh", &["device", "ops"], &env);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("upcc --device cuda device"), "{r:?}");
    assert!(r.stdout.contains("PASS device"), "{r:?}");
    assert!(r.stdout.contains("FAIL ops (exit 3"), "{r:?}");
    assert!(r.stdout.trim_end().ends_with("gpu-test: FAILED"), "{r:?}");
    // One part that passes: exit 0.
    let r = script("gpu-test.sh", &["device"], &env);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("gpu-test: passed"), "{r:?}");
    // A part that outlives its time is stopped and counted as failed, and the summary still
    // prints.
    stand_in(&bin, "upcc", "sleep 30");
    let mut slow = env.to_vec();
    slow.push(("UPCC_PART_SECONDS", "1"));
    let r = script("gpu-test.sh", &["device"], &slow);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("FAIL device: stopped after 1 s"), "{r:?}");
    assert!(r.stdout.contains("== gpu-test summary"), "{r:?}");
    // Parts are checked before anything runs.
    let r = script("gpu-test.sh", &["opz"], &env);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stdout
            .contains("the parts are: device ops sanitize cells smoke"),
        "{r:?}"
    );
}

#[test]
fn gpu_test_keeps_one_deadline_for_the_call_and_one_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    stand_in(&bin, "upcc", "sleep 3; echo \"upcc $*\"");
    stand_in(&bin, "cuda_ops", "echo ops ran");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let work = dir.path().join("work");
    // 40 s in all: the first part gets what is left (25 s), takes 3; the next parts find too
    // little left of the deadline and are skipped, saying so, and the call fails.
    let mut c = Command::new("bash");
    c.arg(repo().join(".ci/gpu-test.sh"))
        .args(["device", "device", "ops"])
        .env("OUT", &out)
        .env("UPCC_GPU_TEST_ASSUME_GPU", "1")
        .env("UPCC_GPU_BIN", &bin)
        .env("UPCC_GPU_WORK", &work)
        .env("UPCC_GPU_DEADLINE", "40");
    let r = ran(c.output().unwrap());
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("PASS device"), "{r:?}");
    assert!(
        r.stdout
            .contains("SKIP ops: no time left (UPCC_GPU_DEADLINE=40 s)"),
        "{r:?}"
    );
    assert!(r.stdout.trim_end().ends_with("gpu-test: FAILED"), "{r:?}");
    // Everything went to one file under $OUT (the device tool returns at most 8).
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let log = std::fs::read_to_string(out.join("gpu-test.log")).unwrap();
    assert!(
        log.contains("upcc --device cuda device") && log.contains("SKIP ops"),
        "{log}"
    );
    // The sanitizer part says what is missing where there is no compute-sanitizer.
    if !Path::new("/usr/local/cuda/bin/compute-sanitizer").exists() {
        let r = script(
            "gpu-test.sh",
            &["sanitize"],
            &[
                ("UPCC_GPU_TEST_ASSUME_GPU", "1"),
                ("UPCC_GPU_BIN", bin.to_str().unwrap()),
                ("UPCC_GPU_WORK", work.to_str().unwrap()),
                ("PATH", "/usr/bin:/bin"),
            ],
        );
        assert_eq!(r.code, 1, "{r:?}");
        assert!(r.stdout.contains("compute-sanitizer not found"), "{r:?}");
    }
}

/// tests/gpu/e2e.py, the `cells` part of the GPU suite, run for real against this upcc on the
/// CPU at small sizes (UPCC_E2E_DEVICE=cpu): every command, JSON field and comparison it makes
/// works before any GPU time is spent on it; the checks only a GPU passes say SKIP.
#[test]
fn the_gpu_suites_cells_script_runs_against_this_upcc() {
    let dir = tempfile::tempdir().unwrap();
    let sets = "pretrain.hidden=[64,64,256] train.hidden=[64,64,256] expert.max_epochs=10 \
        pretrain.layerwise_epochs=5 pretrain.finetune_epochs=10 train.epochs=5 \
        methods.eci-pp.train.epochs=3 methods.eci-pp.eci.warmup_epochs=1 eci.folds=2 \
        eci.corrector_epochs=5 constraints.budget=1000";
    let out = Command::new("python3")
        .current_dir(repo())
        .arg("tests/gpu/e2e.py")
        .arg(crate::util::upcc_bin())
        .arg(dir.path())
        .arg("cells")
        .env("UPCC_E2E_DEVICE", "cpu")
        .env("UPCC_E2E_SETS", sets)
        .env("UPCC_THREADS", "2")
        .output()
        .unwrap();
    let r = ran(out);
    assert_eq!(r.code, 0, "{r:?}");
    for line in [
        "PASS cells ran",
        "PASS mean test NMI: mean Δ +0.00 over 4 cells",
        "PASS training nodes ran",
        "PASS bitwise reruns: 7/7 training nodes reproduced every byte",
        "SKIP run JSON names the GPU",
        "SKIP numerics class",
        "all cells checks passed",
    ] {
        assert!(r.stdout.contains(line), "`{line}`: {r:?}");
    }
}

#[test]
fn gpu_test_without_a_gpu_runs_nothing_and_fails() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        return;
    }
    let r = script("gpu-test.sh", &[], &[("PATH", "/usr/bin:/bin")]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("no GPU, 0 run"), "{r:?}");
}

#[test]
fn bench_gpu_prints_figures_only_for_parts_that_passed() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let failing = stand_in(
        dir.path(),
        "upcc-fails",
        "echo 'cannot use the GPU' >&2; exit 1",
    );
    let env = [
        ("UPCC_BENCH_DEVICE", "cpu"),
        ("UPCC_BIN", failing.to_str().unwrap()),
        ("UPCC_GPU_WORK", work.to_str().unwrap()),
    ];
    let r = script("bench-gpu.sh", &["2", "4"], &env);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("FAIL part 2"), "{r:?}");
    assert!(r.stdout.contains("FAIL part 4"), "{r:?}");
    assert!(
        !r.stdout.contains("wall_s"),
        "no figure from a failed part: {r:?}"
    );
    assert!(
        r.stdout.contains("cannot use the GPU"),
        "the failure's log: {r:?}"
    );
    // A upcc that succeeds: the part passes and prints its figure.
    let ok = stand_in(dir.path(), "upcc-ok", "exit 0");
    let env = [
        ("UPCC_BENCH_DEVICE", "cpu"),
        ("UPCC_BIN", ok.to_str().unwrap()),
        ("UPCC_GPU_WORK", work.to_str().unwrap()),
    ];
    let r = script("bench-gpu.sh", &["4"], &env);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("PASS part 4"), "{r:?}");
    assert!(r.stdout.contains("\"wall_s\""), "{r:?}");
    let r = script("bench-gpu.sh", &["9"], &env);
    assert_eq!(r.code, 2, "{r:?}");
}
