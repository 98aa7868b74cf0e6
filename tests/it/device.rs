//! Device selection: `--device auto|cpu|cuda[:N]` and `$UPCC_DEVICE`, the numerics class it
//! puts into training nodes' keys, and the device facts in provenance.

use crate::util::Env;

/// Whether this machine has an NVIDIA driver (CI machines do not).
fn driver_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists()
}

#[test]
fn auto_falls_back_to_the_cpu_with_one_info_line_when_there_is_no_gpu() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 0, "{r:?}");
    let lines = r.stderr.matches("no GPU here").count();
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
        assert_eq!(numerics, "cpu-f32");
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
    assert_eq!(r.json()["numerics"], "cpu-f32");
    let explain = |id: &str| {
        let e = env.upcc(&["--device", "cpu", "explain", &spec, id, "--json"]);
        assert_eq!(e.code, 0, "{e:?}");
        e.json()
    };
    let train = explain("train/blobs/lv0.1/probpair/nopre/t1");
    assert_eq!(train["numerics"], "cpu-f32");
    let libs = &train["manifest"]["provenance"]["libraries"];
    assert_eq!(libs["device"], "cpu", "{libs}");
    assert_eq!(libs["numerics"], "cpu-f32", "{libs}");
    assert_eq!(explain("features/blobs")["numerics"], "exact");
    assert_eq!(explain("expert/blobs/lv0.1/s0")["numerics"], "cpu-f32");
}

#[test]
fn the_device_command_shows_the_device_a_run_would_use() {
    let env = Env::new();
    let r = env.upcc(&["--device", "cpu", "device", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["device"], "cpu");
    assert_eq!(r.json()["numerics"], "cpu-f32");
    let r = env.upcc(&["device"]);
    assert_eq!(r.code, 0, "{r:?}");
    if !driver_present() {
        assert!(r.stdout.contains("numerics  cpu-f32"), "{r:?}");
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
    assert!(r.stderr.contains("computes cpu-f32"), "{r:?}");
}
