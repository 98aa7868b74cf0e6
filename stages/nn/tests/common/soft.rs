//! Running CUDA tests on the soft GPU (`stages/nn/soft-gpu`, built by `bash .ci/soft-gpu.sh
//! DIR`): a CPU implementation of the CUDA driver and cuBLAS that cudarc loads like NVIDIA's.
//!
//! The dynamic loader reads `LD_LIBRARY_PATH` when a process starts, so a test that needs the
//! soft GPU runs the `#[ignore]`d tests of its own binary in a child process with `DIR` first on
//! that path. `$UPCC_TEST_SOFTGPU` names `DIR`; without it these tests say so and pass, unless
//! `UPCC_TEST_NVRTC` is set (CI sets both): there a missing soft GPU is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The environment variable a child run on the soft GPU carries, so its tests know where
/// they are.
pub const IN_SOFT_GPU: &str = "UPCC_IN_SOFTGPU";

/// The soft GPU to test on, checked to be built from this `cuda_kernels.cu`; `None` (after
/// saying why) where there is none and none is required.
pub fn soft_gpu_dir(test: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("UPCC_TEST_SOFTGPU").map(PathBuf::from) else {
        if std::env::var_os("UPCC_TEST_NVRTC").is_some() {
            panic!("UPCC_TEST_NVRTC is set (CI) but UPCC_TEST_SOFTGPU is not: build one with `bash .ci/soft-gpu.sh DIR` and set UPCC_TEST_SOFTGPU=DIR");
        }
        eprintln!(
            "{test}: skipped, no soft GPU (build one with `bash .ci/soft-gpu.sh DIR`, then set UPCC_TEST_SOFTGPU=DIR)"
        );
        return None;
    };
    let built = std::fs::read(dir.join("kernel-source.cu")).unwrap_or_else(|e| {
        panic!(
            "UPCC_TEST_SOFTGPU={}: not a soft GPU build ({e}); build one with `bash .ci/soft-gpu.sh DIR`",
            dir.display()
        )
    });
    assert!(
        built == include_bytes!("../../src/cuda_kernels.cu"),
        "the soft GPU in {} was built from another cuda_kernels.cu: rebuild it with `bash .ci/soft-gpu.sh {}`",
        dir.display(),
        dir.display()
    );
    Some(dir)
}

/// Run this test binary's ignored test `test` (all of them when `None`) in a child process on
/// the soft GPU in `dir`, with `env` set (and no other `SOFTGPU_*` setting inherited).
pub fn run_on_soft_gpu(dir: &Path, test: Option<&str>, env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--test-threads=1", "--nocapture"]);
    if let Some(t) = test {
        cmd.args([t, "--exact"]);
    }
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", path).env(IN_SOFT_GPU, "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("SOFTGPU_") || k == "CUDA_LAUNCH_BLOCKING" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("the test binary runs")
}

/// The child's output, for assertion messages.
pub fn shown(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether this process runs on the soft GPU (a child started by [`run_on_soft_gpu`]). The
/// planted-defect tests hold the soft GPU's own reports, which a real GPU does not give: they
/// do nothing elsewhere.
pub fn in_soft_gpu(test: &str) -> bool {
    let here = std::env::var_os(IN_SOFT_GPU).is_some();
    if !here {
        eprintln!("{test}: runs on the soft GPU only (through its non-ignored parent test)");
    }
    here
}
