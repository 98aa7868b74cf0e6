//! Every `Device` op on CUDA against the CPU, forward and backward, and bitwise reruns on the
//! GPU (the scenarios and their tolerance are in `common/`; `parity.rs` holds the same
//! tolerance against a CPU that sums in another order, on every machine).
//!
//! These need a GPU, so they are `#[ignore]`d in the ordinary suite; `bash .ci/gpu-test.sh
//! ops` runs them with `--ignored` on a GPU machine (and fails, saying so, where there is
//! none), and [`the_cuda_tests_pass_on_the_soft_gpu`] runs them in CI on the soft GPU: the
//! same `Cuda` backend and cudarc, on a CPU implementation of the driver and cuBLAS.
#![cfg(feature = "cuda")]

mod common;

use common::soft::{run_on_soft_gpu, shown, soft_gpu_dir};
use common::{compare, compare_steps, every_op, training_step};
use upcc_nn::{Cpu, Cuda, Device};

#[test]
fn the_cuda_tests_pass_on_the_soft_gpu() {
    let Some(dir) = soft_gpu_dir("the_cuda_tests_pass_on_the_soft_gpu") else {
        return;
    };
    let out = run_on_soft_gpu(&dir, None, &[]);
    let text = shown(&out);
    assert!(out.status.success(), "{text}");
    let ran = text
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok());
    assert_eq!(ran, Some(5), "every ignored CUDA test ran: {text}");
    assert!(
        !text.contains("softgpu: "),
        "the soft GPU reported nothing: {text}"
    );
    println!("{text}");
}

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| {
        panic!(
            "a CUDA GPU (these tests run through `bash .ci/gpu-test.sh ops` on a GPU machine): {e}{}",
            e.fix().map(|f| format!("\nfix: {f}")).unwrap_or_default()
        )
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `bash .ci/gpu-test.sh ops`"]
fn every_op_on_cuda_matches_the_cpu() {
    let cpu = every_op(&Cpu);
    let gpu_o = every_op(&gpu());
    let worst = compare(&cpu, &gpu_o, "cpu vs cuda");
    println!(
        "{} op outputs and {} slot vectors agree; worst difference {:.3} of its tolerance",
        cpu.0.len(),
        cpu.1.len(),
        worst
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `bash .ci/gpu-test.sh ops`"]
fn a_training_step_on_cuda_matches_the_cpu_forward_and_backward() {
    let cpu = training_step(&Cpu);
    let gpu_o = training_step(&gpu());
    let worst = compare_steps(&cpu, &gpu_o, "cpu vs cuda");
    println!("training step: worst difference {worst:.3} of its tolerance");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `bash .ci/gpu-test.sh ops`"]
fn two_runs_on_the_gpu_give_identical_bits() {
    let dev = gpu();
    let a = every_op(&dev);
    let b = every_op(&dev.fork().unwrap());
    assert_eq!(a, b, "every op, bit for bit");
    assert_eq!(
        training_step(&dev),
        training_step(&dev),
        "training steps, bit for bit"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `bash .ci/gpu-test.sh ops`"]
fn the_device_reports_its_numerics_class_and_facts() {
    let dev = gpu();
    let n = Device::<f32>::numerics(&dev);
    assert!(n.starts_with("cuda-f32-sm"), "{n}");
    assert!(n.contains("-cublas") && n.contains("-nvrtc"), "{n}");
    let info = dev.info();
    for fact in ["gpu", "cublas", "nvrtc", "multiprocessors"] {
        assert!(
            info.facts.iter().any(|(k, _)| k == fact),
            "{fact}: {info:?}"
        );
    }
    let probe = upcc_nn::cuda::probe(0).unwrap();
    assert_eq!(
        probe.numerics(),
        n,
        "probing names the same class as opening"
    );
    println!("{info:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `bash .ci/gpu-test.sh ops`"]
#[should_panic(expected = "holds index 40 but there are only 37 rows")]
fn an_index_past_the_rows_is_refused_before_it_reaches_the_gpu() {
    let dev = gpu();
    let x = dev.zeros(37 * 4).unwrap();
    let idx = dev.upload_idx(&[1, 40]).unwrap();
    let mut out = dev.zeros(8).unwrap();
    let _ = dev.gather_rows(&x, 4, upcc_nn::Ix::new(&idx, 0, 2), &mut out);
}
