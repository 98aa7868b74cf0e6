//! Device selection: `--device auto|cpu|cuda[:N]` and `$UPCC_DEVICE`, the numerics class it
//! puts into training nodes' keys, and the device facts in provenance.

use crate::util::Env;

/// This machine's CPU numerics class, as `upcc device` reports it: `cpu-f32-` and the
/// instruction set gemm's kernels use here.
pub fn cpu_class(env: &Env) -> String {
    let r = env.upcc(&["--device", "cpu", "device", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let class = r.json()["numerics"].as_str().unwrap().to_string();
    let isa = class.strip_prefix("cpu-f32-").unwrap_or("");
    assert!(
        ["avx512", "fma", "neon", "scalar"].contains(&isa),
        "the CPU class names its instruction set: {class}"
    );
    class
}

/// Whether this machine has an NVIDIA driver (CI machines do not).
fn driver_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists()
}

#[test]
fn auto_falls_back_to_the_cpu_with_one_info_line_on_a_run_and_none_on_status() {
    let env = Env::new();
    let spec = env.spec();
    // A command that trains says it once; one that computes nothing (status) says nothing.
    let r = env.upcc(&["run", &spec, "stage=features", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    let lines = r.stderr.matches("no GPU here").count();
    let st = env.upcc(&["status", &spec]);
    assert_eq!(st.code, 0, "{st:?}");
    assert!(!st.stderr.contains("no GPU here"), "{st:?}");
    // The JSON says nothing on stderr and names the device and its numerics class instead.
    let j = env.upcc(&["status", &spec, "--json"]);
    assert_eq!(j.code, 0, "{j:?}");
    assert!(!j.stderr.contains("no GPU here"), "{j:?}");
    let (device, numerics) = (
        j.json()["device"].as_str().unwrap().to_string(),
        j.json()["numerics"].as_str().unwrap().to_string(),
    );
    let explained = env.upcc(&[
        "explain",
        &spec,
        "train/blobs/lv0.1/probpair/pre/t1",
        "--json",
    ]);
    assert_eq!(explained.code, 0, "{explained:?}");
    if driver_present() {
        assert_eq!(lines, 0, "{r:?}");
        assert!(numerics.starts_with("cuda-f32-sm"), "{numerics}");
        assert!(device.starts_with("cuda:"), "{device}");
    } else {
        assert_eq!(lines, 1, "exactly one info line: {r:?}");
        assert!(r.stderr.contains("computing on the CPU"), "{r:?}");
        assert_eq!(numerics, cpu_class(&env));
        assert_eq!(device, "cpu");
    }
    assert_eq!(
        explained.json()["numerics"],
        numerics,
        "status and explain plan with the same class"
    );
}

#[test]
fn an_explicit_cuda_device_without_a_driver_is_an_environment_error() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["--device", "cuda", "run", &spec, "stage=features"]);
    if driver_present() {
        assert_eq!(r.code, 0, "{r:?}");
    } else {
        assert_eq!(r.code, 1, "{r:?}");
        assert!(r.stderr.contains("no CUDA driver was found"), "{r:?}");
        assert!(
            r.stderr.contains("--device cpu"),
            "names the way out: {r:?}"
        );
        assert!(!env.store().exists(), "nothing ran, nothing was written");
    }
}

#[test]
fn unknown_devices_are_rejected_naming_the_choices() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["--device", "tpu", "status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("unknown device `tpu`") && r.stderr.contains("cuda:N"),
        "{r:?}"
    );
    let mut c = env.command(&env.store(), &["status", &spec]);
    c.env("UPCC_DEVICE", "gpu:x");
    let r = crate::util::ran(c.output().unwrap());
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("$UPCC_DEVICE"), "{r:?}");
}

#[test]
fn the_cpu_device_names_training_numerics_and_leaves_data_stages_exact() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "run",
        &spec,
        "method=probpair",
        "pretrain=false",
        "trial=1",
        "--json",
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        !r.stderr.contains("no GPU here"),
        "an explicit cpu says nothing: {r:?}"
    );
    assert_eq!(r.json()["device"], "cpu", "the run's JSON names its device");
    let class = cpu_class(&env);
    assert_eq!(r.json()["numerics"], class.as_str());
    let explain = |id: &str| {
        let e = env.upcc(&["--device", "cpu", "explain", &spec, id, "--json"]);
        assert_eq!(e.code, 0, "{e:?}");
        e.json()
    };
    let train = explain("train/blobs/lv0.1/probpair/nopre/t1");
    assert_eq!(train["numerics"], class.as_str());
    // Its parts, in words: the instruction set and the fixed depth blocking.
    let parts = train["numerics_parts"].as_array().unwrap();
    assert!(
        parts
            .iter()
            .any(|p| p.as_str().unwrap().contains("split every 512 terms")),
        "{parts:?}"
    );
    let libs = &train["manifest"]["provenance"]["libraries"];
    assert_eq!(libs["device"], "cpu", "{libs}");
    assert_eq!(libs["numerics"], class.as_str(), "{libs}");
    assert_eq!(explain("features/blobs")["numerics"], "exact");
    assert_eq!(explain("expert/blobs/lv0.1/s0")["numerics"], class.as_str());
}

/// `UPCC_TEST_K_BLOCK` (a rounding-only change of the CPU's products, for measuring how far
/// rounding moves a result) is part of the numerics class: its results never answer for
/// ordinary ones, and a value out of range is refused before anything runs.
#[test]
fn a_test_depth_block_is_its_own_numerics_class() {
    let env = Env::new();
    let spec = env.spec();
    let run = |kb: Option<&str>| {
        let mut c = env.command(
            &env.store(),
            &[
                "--device",
                "cpu",
                "run",
                &spec,
                "method=probpair",
                "pretrain=false",
                "trial=1",
                "--json",
                "--progress",
                "none",
            ],
        );
        if let Some(kb) = kb {
            c.env("UPCC_TEST_K_BLOCK", kb);
        }
        let r = crate::util::ran(c.output().unwrap());
        assert_eq!(r.code, 0, "{r:?}");
        r.json()
    };
    let node = |j: &serde_json::Value, id: &str| -> (String, String) {
        let n = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {j}"));
        (
            n["key"].as_str().unwrap().to_string(),
            n["outcome"].as_str().unwrap().to_string(),
        )
    };
    let train = "train/blobs/lv0.1/probpair/nopre/t1";
    let plain = run(None);
    let other = run(Some("500"));
    let class = plain["numerics"].as_str().unwrap().to_string();
    assert_eq!(other["numerics"], format!("{class}-kb500"));
    assert_ne!(
        node(&plain, train).0,
        node(&other, train).0,
        "another class, another key"
    );
    assert_eq!(node(&other, train).1, "executed", "computed anew: {other}");
    assert_eq!(
        node(&other, "features/blobs").1,
        "cached",
        "data stages are exact: shared"
    );
    let mut c = env.command(
        &env.store(),
        &["--device", "cpu", "explain", &spec, train, "--json"],
    );
    c.env("UPCC_TEST_K_BLOCK", "500");
    let parts = crate::util::ran(c.output().unwrap()).json()["numerics_parts"].to_string();
    assert!(
        parts.contains("split every 500 terms instead of 512"),
        "{parts}"
    );
    for bad in ["0", "513", "x"] {
        let mut c = env.command(&env.store(), &["--device", "cpu", "device"]);
        c.env("UPCC_TEST_K_BLOCK", bad);
        let r = crate::util::ran(c.output().unwrap());
        assert_eq!(r.code, 2, "{bad}: {r:?}");
        assert!(r.stderr.contains("UPCC_TEST_K_BLOCK"), "{r:?}");
    }
}

#[test]
fn the_device_command_shows_the_device_a_run_would_use() {
    let env = Env::new();
    let r = env.upcc(&["--device", "cpu", "device", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["device"], "cpu");
    let class = cpu_class(&env);
    assert_eq!(r.json()["numerics"], class.as_str());
    let r = env.upcc(&["device"]);
    assert_eq!(r.code, 0, "{r:?}");
    if !driver_present() {
        assert!(r.stdout.contains(&format!("numerics  {class}")), "{r:?}");
        assert!(
            r.stdout.contains("the instruction set gemm's kernels use"),
            "{r:?}"
        );
        assert!(r.stderr.contains("no GPU here"), "{r:?}");
    }
}

const H100: &str = "cuda-f32-sm90-132sm-cublas13.1.0-nvrtc13.0";

#[test]
fn a_slurm_job_plans_with_its_drivers_numerics_and_opens_a_device_only_to_train() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["--device", "cpu", "run", &spec, "stage=features"]);
    assert_eq!(r.code, 0, "{r:?}");
    // A node that does not train plans with the GPU class the driver used, on a machine
    // without a GPU: planning succeeds and the job gets as far as comparing recipes.
    let r = env.upcc(&[
        "--device",
        "cuda",
        "job",
        &spec,
        "features/blobs",
        "--recipe",
        "00",
        "--numerics",
        H100,
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("has recipe"), "{r:?}");
    // A training node needs this machine's device to compute the planned class.
    let r = env.upcc(&[
        "--device",
        "cpu",
        "job",
        &spec,
        "expert/blobs/lv0.1/s0",
        "--recipe",
        "00",
        "--numerics",
        H100,
    ]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("was planned for numerics class {H100}")),
        "{r:?}"
    );
    assert!(
        r.stderr.contains(&format!("computes {}", cpu_class(&env))),
        "{r:?}"
    );
}

#[test]
fn numerics_classes_of_other_cpus_give_other_keys_and_run_only_where_computed() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "run",
        &spec,
        "stage=features",
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let keys = |class: &str| {
        let r = env.upcc(&["--numerics", class, "status", &spec, "--json"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(r.json()["numerics"], class);
        let nodes = r.json()["nodes"].as_array().unwrap().clone();
        let key = |id: &str| {
            nodes
                .iter()
                .find(|n| n["id"] == id)
                .unwrap_or_else(|| panic!("no node {id}"))["key"]
                .clone()
        };
        (key("features/blobs"), key("expert/blobs/lv0.1/s0"))
    };
    // Two CPU models whose gemm kernels differ (AVX-512 and AVX2/FMA) can give different
    // bits, so their training results are filed under different keys; data stages are exact.
    let (f512, e512) = keys("cpu-f32-avx512");
    let (ffma, efma) = keys("cpu-f32-fma");
    assert_eq!(f512, ffma);
    assert!(e512.is_string() && efma.is_string());
    assert_ne!(e512, efma);
    // `run` computes a class only on a machine that computes it.
    let here = cpu_class(&env);
    let other = if here == "cpu-f32-fma" {
        "cpu-f32-avx512"
    } else {
        "cpu-f32-fma"
    };
    let r = env.upcc(&[
        "--device",
        "cpu",
        "--numerics",
        other,
        "run",
        &spec,
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains(&format!("which computes {here}")),
        "{r:?}"
    );
    let r = env.upcc(&[
        "--device",
        "cpu",
        "--numerics",
        &here,
        "run",
        &spec,
        "stage=expert",
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    // Not a class at all.
    let r = env.upcc(&["--numerics", "fast", "status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("is not a numerics class"), "{r:?}");
}
