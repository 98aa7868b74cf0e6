//! Defects planted on the soft GPU, each refused the way the soft GPU promises, and faults it
//! injects, each handled the way upcc's CUDA backend promises.
//!
//! Each `#[ignore]`d test below is one scenario. It runs in a child process on the soft GPU
//! (its non-ignored twin, `planted_…`/`injected_…`, starts it with the soft GPU first on
//! `LD_LIBRARY_PATH` and the fault settings it needs) and fails if what it holds is not so.
//! The planted defects bypass upcc's own host checks (`check.rs` refuses a wrong index before
//! any launch) by driving cudarc directly with upcc's compiled kernels, as a bug in a new kernel
//! or launcher would.
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use common::soft::{in_soft_gpu, run_on_soft_gpu, shown, soft_gpu_dir};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
    LaunchConfig, PushKernelArg,
};
use upcc_nn::{Cuda, Device, DeviceError, GemmSpec, Ix};

// --- the parents: each runs one scenario on the soft GPU ---------------------------------

/// Run scenario `test` on the soft GPU with `env`; its output.
fn scenario(test: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    let dir = soft_gpu_dir(test)?;
    let out = run_on_soft_gpu(&dir, Some(test), env);
    let text = shown(&out);
    let ran = text.contains("test result: ok. 1 passed");
    Some((out.status.success() && ran, text))
}

fn passes(test: &str, env: &[(&str, &str)]) {
    if let Some((ok, text)) = scenario(test, env) {
        assert!(ok, "{test} on the soft GPU:\n{text}");
    }
}

#[test]
fn planted_out_of_bounds_index() {
    passes(
        "memcheck_refuses_an_index_past_the_rows_naming_the_kernel",
        &[],
    );
}

#[test]
fn planted_read_before_synchronising_across_streams() {
    passes(
        "an_unordered_read_gets_stale_data_and_streamcheck_names_both_kernels",
        &[],
    );
}

#[test]
fn planted_host_read_of_a_pinned_buffer_before_synchronising() {
    let test = "reading_a_pinned_buffer_before_its_copy_ran_faults";
    let Some((ok, text)) = scenario(test, &[]) else {
        return;
    };
    assert!(!ok, "the early read must kill the child:\n{text}");
    assert!(
        text.contains("synchronised read: ok"),
        "the read after synchronising went through first:\n{text}"
    );
    assert!(
        text.contains("the host touched pinned memory")
            && text.contains("while a queued copy into it has not run"),
        "the fault says what was read too early:\n{text}"
    );
}

#[test]
fn planted_wrong_leading_dimension() {
    passes(
        "cublas_refuses_a_leading_dimension_that_breaks_the_blas_rules",
        &[],
    );
    passes(
        "memcheck_refuses_a_leading_dimension_that_reads_past_a",
        &[],
    );
}

#[test]
fn planted_broken_distinct_promise() {
    passes("racecheck_refuses_two_threads_writing_one_row", &[]);
}

#[test]
fn injected_lost_gpu() {
    passes(
        "a_lost_gpu_fails_every_later_op_as_fatal_and_drops_quietly",
        &[("SOFTGPU_FAULT_LAUNCH", "3")],
    );
}

#[test]
fn injected_refused_allocation() {
    passes(
        "a_refused_allocation_is_out_of_memory_and_the_gpu_goes_on",
        &[("SOFTGPU_FAIL_ALLOC", "2")],
    );
}

#[test]
fn the_memory_pool_keeps_what_it_mapped() {
    passes(
        "freed_pool_memory_stays_mapped_across_synchronisations",
        &[],
    );
}

#[test]
fn products_on_two_gpus_from_one_thread() {
    passes(
        "each_gpus_products_run_in_its_own_context",
        &[("SOFTGPU_DEVICES", "2")],
    );
}

// --- the scenarios (children) ----------------------------------------------------------

/// A context with upcc's kernels loaded, and cudarc's event tracking off, as in `Cuda::new`.
fn kernels() -> (Arc<CudaContext>, Arc<cudarc::driver::CudaModule>) {
    let probe = upcc_nn::cuda::probe(0).expect("the soft GPU");
    assert!(probe.name.contains("soft GPU"), "{probe:?}");
    let ctx = CudaContext::new(0).unwrap();
    // SAFETY: each buffer below is used on the stream that made it, or ordered explicitly.
    unsafe { ctx.disable_event_tracking() };
    let compiled = upcc_nn::cuda::compile_kernels(&probe.arch()).unwrap();
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
        .unwrap();
    (ctx, module)
}

fn one_block() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What cuGetErrorString says of an error (the soft GPU adds its report).
fn said(e: &DriverError) -> String {
    format!(
        "{:?}: {}",
        e.0,
        e.error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_out_of_bounds_index"]
fn memcheck_refuses_an_index_past_the_rows_naming_the_kernel() {
    if !in_soft_gpu("memcheck") {
        return;
    }
    let (ctx, module) = kernels();
    let s = ctx.new_stream().unwrap();
    let f = module.load_function("k_gather_rows").unwrap();
    let x = s.alloc_zeros::<f32>(37 * 4).unwrap();
    let idx = s.clone_htod(&[1u32, 40]).unwrap();
    let mut out = s.alloc_zeros::<f32>(8).unwrap();
    let (cols, off, n) = (4i64, 0i64, 2i64);
    let mut b = s.launch_builder(&f);
    b.arg(&x)
        .arg(&cols)
        .arg(&idx)
        .arg(&off)
        .arg(&n)
        .arg(&mut out);
    // SAFETY: the point of the test: row 40 of a 37-row x.
    unsafe { b.launch(one_block()) }.expect("queued: the fault shows when the work runs");
    let e = s.synchronize().expect_err("an illegal address");
    let text = said(&e);
    assert_eq!(
        e.0,
        cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        "{text}"
    );
    for part in [
        "memcheck",
        "k_gather_rows",
        "element 160 of parameter 0 (x)",
        "a 148-element allocation",
        "bytes after its end",
    ] {
        assert!(text.contains(part), "`{part}` in: {text}");
    }
    // The context is lost, as after a real GPU's fault: every later call says so.
    assert_eq!(
        s.alloc_zeros::<f32>(4).unwrap_err().0,
        cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    );
}

/// Stream A fills `buf` with 7; stream B adds `buf` into `out`, after A's fill if `order` (an
/// event), else with nothing between them. B's stream and `out`.
fn fill_then_add(
    ctx: &Arc<CudaContext>,
    module: &Arc<cudarc::driver::CudaModule>,
    order: bool,
) -> (Arc<CudaStream>, CudaSlice<f32>) {
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 300usize;
    let mut buf = a.alloc_zeros::<f32>(n).unwrap();
    let mut out = b.alloc_zeros::<f32>(n).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let fill: CudaFunction = module.load_function("k_fill").unwrap();
    let axpy: CudaFunction = module.load_function("k_axpy_range").unwrap();
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let (seven, one, zero, len) = (7.0f32, 1.0f32, 0i64, n as i64);
    let mut l = a.launch_builder(&fill);
    l.arg(&mut buf).arg(&seven).arg(&len);
    // SAFETY: sizes match the buffers.
    unsafe { l.launch(cfg) }.unwrap();
    if order {
        b.join(&a).unwrap();
    }
    let mut l = b.launch_builder(&axpy);
    l.arg(&one)
        .arg(&buf)
        .arg(&zero)
        .arg(&mut out)
        .arg(&zero)
        .arg(&len);
    // SAFETY: sizes match the buffers.
    unsafe { l.launch(cfg) }.unwrap();
    // Freeing `buf` on A would be one more unordered use: keep it for the process's life.
    Box::leak(Box::new(buf));
    (b, out)
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_read_before_synchronising_across_streams"]
fn an_unordered_read_gets_stale_data_and_streamcheck_names_both_kernels() {
    if !in_soft_gpu("streamcheck") {
        return;
    }
    let (ctx, module) = kernels();
    // Ordered by an event: B sees A's 7s, and nothing is reported.
    let (b, out) = fill_then_add(&ctx, &module, true);
    assert!(b.clone_dtoh(&out).unwrap().iter().all(|&v| v == 7.0));
    ctx.synchronize().unwrap();
    // The planted defect: B reads what A writes with nothing between them. B's work runs when
    // B is synchronised, before A's: B added the zeros that were there, not the 7s.
    let (b, out) = fill_then_add(&ctx, &module, false);
    assert!(
        b.clone_dtoh(&out).unwrap().iter().all(|&v| v == 0.0),
        "a read before the writer is synchronised gets what was there before"
    );
    // When A's fill runs, streamcheck sees a write that nothing orders against B's read.
    let e = ctx.synchronize().expect_err("a stream-order race");
    let text = said(&e);
    for part in [
        "streamcheck",
        "k_fill",
        "k_axpy_range",
        "nothing orders the two",
    ] {
        assert!(text.contains(part), "`{part}` in: {text}");
    }
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_host_read_of_a_pinned_buffer_before_synchronising"]
fn reading_a_pinned_buffer_before_its_copy_ran_faults() {
    if !in_soft_gpu("pinned") {
        return;
    }
    let (ctx, _module) = kernels();
    let s = ctx.new_stream().unwrap();
    let dev = s.clone_htod(&[3.0f32; 1024]).unwrap();
    s.synchronize().unwrap();
    let (src, _rec) = dev.device_ptr(&s);
    // SAFETY: a pinned buffer of 1024 floats, copied into from a 1024-float device buffer.
    unsafe {
        let p = cudarc::driver::result::malloc_host(4096, 0).unwrap() as *mut f32;
        let host = std::slice::from_raw_parts_mut(p, 1024);
        cudarc::driver::result::memcpy_dtoh_async(host, src, s.cu_stream()).unwrap();
        s.synchronize().unwrap();
        assert_eq!(host[1023], 3.0);
        println!("synchronised read: ok");
        cudarc::driver::result::memcpy_dtoh_async(host, src, s.cu_stream()).unwrap();
        // The planted defect: the copy is queued, not done.
        let early = std::ptr::read_volatile(&host[0]);
        println!("read {early} before synchronising: the soft GPU let it through");
    }
}

/// For cuBLAS calls made by hand (column-major): A 2×4 (8 floats), B 4×3 (12), C 2×3 (6,
/// NaN to start: with beta = 0 cuBLAS must not read it).
#[allow(clippy::type_complexity)]
fn blas_setup() -> (
    Arc<CudaContext>,
    Arc<CudaStream>,
    cudarc::cublas::sys::cublasHandle_t,
    CudaSlice<f32>,
    CudaSlice<f32>,
    CudaSlice<f32>,
) {
    let (ctx, _) = kernels();
    let s = ctx.new_stream().unwrap();
    let a = s.clone_htod(&[2.0f32; 8]).unwrap();
    let b = s.clone_htod(&[1.0f32; 12]).unwrap();
    let c = s.clone_htod(&[f32::NAN; 6]).unwrap();
    let h = cudarc::cublas::result::create_handle().unwrap();
    // SAFETY: a live handle and stream.
    unsafe { cudarc::cublas::result::set_stream(h, s.cu_stream() as _) }.unwrap();
    (ctx, s, h, a, b, c)
}

/// C = A·B (m 2, n 3, k 4) with `lda` as A's leading dimension: 2 is right, 1 breaks the BLAS
/// rule (lda ≥ m), 3 keeps the rule but makes A span 11 floats of its 8.
fn product(
    s: &Arc<CudaStream>,
    h: cudarc::cublas::sys::cublasHandle_t,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    lda: i32,
) -> Result<(), cudarc::cublas::result::CublasError> {
    use cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
    let (ap, _r1) = a.device_ptr(s);
    let (bp, _r2) = b.device_ptr(s);
    let (cp, _r3) = c.device_ptr_mut(s);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the shapes are the test's; a wrong lda is the planted defect.
    unsafe {
        cudarc::cublas::result::sgemm(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            2,
            3,
            4,
            &alpha,
            ap as *const f32,
            lda,
            bp as *const f32,
            4,
            &beta,
            cp as *mut f32,
            2,
        )
    }
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_wrong_leading_dimension"]
fn cublas_refuses_a_leading_dimension_that_breaks_the_blas_rules() {
    if !in_soft_gpu("lda") {
        return;
    }
    let (_ctx, s, h, a, b, mut c) = blas_setup();
    // Right: every entry 4·1·2 = 8, and beta = 0 never read C's NaNs.
    product(&s, h, &a, &b, &mut c, 2).unwrap();
    assert_eq!(s.clone_dtoh(&c).unwrap(), vec![8.0; 6]);
    // lda = 1 < m = 2: refused at the call.
    let e = product(&s, h, &a, &b, &mut c, 1).expect_err("lda < m");
    assert_eq!(
        e.0,
        cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE
    );
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_wrong_leading_dimension"]
fn memcheck_refuses_a_leading_dimension_that_reads_past_a() {
    if !in_soft_gpu("lda past") {
        return;
    }
    let (_ctx, s, h, a, b, mut c) = blas_setup();
    // lda = 3 keeps the rule (≥ m) but B, 8 floats, has no room for 3 × 4: cuBLAS reads past it.
    product(&s, h, &a, &b, &mut c, 3).expect("the rules hold; the fault is in the data");
    let e = s.synchronize().expect_err("an illegal address");
    let text = said(&e);
    assert!(
        text.contains("memcheck") && text.contains("cublasSgemm_v2") && text.contains("reading A"),
        "{text}"
    );
}

#[test]
#[ignore = "a soft-GPU scenario: run by planted_broken_distinct_promise"]
fn racecheck_refuses_two_threads_writing_one_row() {
    if !in_soft_gpu("racecheck") {
        return;
    }
    let (ctx, module) = kernels();
    let s = ctx.new_stream().unwrap();
    let f = module.load_function("k_scatter_add_distinct").unwrap();
    let dout = s.clone_htod(&[1.0f32; 8]).unwrap();
    // Rows 1 and 1: not distinct, though the kernel is told they are.
    let idx = s.clone_htod(&[1u32, 1]).unwrap();
    let mut dx = s.alloc_zeros::<f32>(3 * 4).unwrap();
    let (cols, off, n) = (4i64, 0i64, 2i64);
    let mut b = s.launch_builder(&f);
    b.arg(&dout)
        .arg(&cols)
        .arg(&idx)
        .arg(&off)
        .arg(&n)
        .arg(&mut dx);
    // SAFETY: in bounds; the repeated row is the planted defect.
    unsafe { b.launch(one_block()) }.unwrap();
    let e = s.synchronize().expect_err("a race");
    let text = said(&e);
    assert!(
        text.contains("racecheck") && text.contains("k_scatter_add_distinct"),
        "{text}"
    );
}

fn gemm_spec() -> GemmSpec {
    GemmSpec {
        m: 3,
        n: 2,
        k: 4,
        a_t: false,
        b_t: false,
        accumulate: false,
    }
}

#[test]
#[ignore = "a soft-GPU scenario: run by injected_lost_gpu"]
fn a_lost_gpu_fails_every_later_op_as_fatal_and_drops_quietly() {
    if !in_soft_gpu("lost GPU") {
        return;
    }
    let dev = Cuda::new(0).unwrap();
    let mut x = dev.upload(&[1.0; 12]).unwrap();
    let b = dev.upload(&[1.0; 8]).unwrap();
    let mut c = dev.zeros(6).unwrap();
    dev.fill(&mut x, 2.0).unwrap(); // launch 1
    dev.scale(&mut x, 3.0).unwrap(); // launch 2
    assert_eq!(dev.to_vec(&x).unwrap(), vec![6.0; 12]);
    dev.fill(&mut x, 1.0).unwrap(); // launch 3: SOFTGPU_FAULT_LAUNCH=3
    let e = dev.to_vec(&x).expect_err("the injected fault");
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().contains("fault injected"), "{e}");
    // Every later op fails as fatal, cuBLAS's included (it only says it failed).
    let g = dev
        .gemm(gemm_spec(), &x, &b, &mut c)
        .expect_err("cuBLAS on a lost GPU");
    assert!(
        g.is_fatal(),
        "a cuBLAS failure on a lost GPU is the loss: {g}"
    );
    assert!(dev.zeros(4).expect_err("alloc on a lost GPU").is_fatal());
    assert!(dev
        .fork()
        .expect_err("a new stream on a lost GPU")
        .is_fatal());
    // Dropping everything (cuBLAS handle included) must not panic.
    drop((x, b, c));
    drop(dev);
    println!("dropped quietly");
}

#[test]
#[ignore = "a soft-GPU scenario: run by injected_refused_allocation"]
fn a_refused_allocation_is_out_of_memory_and_the_gpu_goes_on() {
    if !in_soft_gpu("refused allocation") {
        return;
    }
    let dev = Cuda::new(0).unwrap(); // allocation 1: its spare buffer
    match dev.zeros(1000) {
        Err(DeviceError::OutOfMemory { bytes, .. }) => assert_eq!(bytes, 4000),
        other => panic!("allocation 2 refused as out of memory, got {other:?}"),
    }
    let mut x = dev
        .zeros(1000)
        .expect("not sticky: the next allocation succeeds");
    dev.fill(&mut x, 1.5).unwrap();
    assert!(dev.to_vec(&x).unwrap().iter().all(|&v| v == 1.5));
}

#[test]
#[ignore = "a soft-GPU scenario: run by the_memory_pool_keeps_what_it_mapped"]
fn freed_pool_memory_stays_mapped_across_synchronisations() {
    if !in_soft_gpu("pool") {
        return;
    }
    let dev = Cuda::new(0).unwrap();
    let (before, total) = dev.memory().unwrap();
    let big = dev.zeros(64 << 20).unwrap(); // 256 MiB
    drop(big);
    dev.synchronize().unwrap();
    let (after, _) = dev.memory().unwrap();
    assert!(
        after + (256 << 20) <= before,
        "the pool keeps the freed 256 MiB for the next step ({before} free before, {after} after, of {total})"
    );
}

#[test]
#[ignore = "a soft-GPU scenario: run by products_on_two_gpus_from_one_thread"]
fn each_gpus_products_run_in_its_own_context() {
    if !in_soft_gpu("two GPUs") {
        return;
    }
    let d0 = Cuda::new(0).unwrap();
    let d1 = Cuda::new(1).unwrap();
    let inputs = |d: &Cuda| {
        let a = d.upload(&[1.0; 12]).unwrap();
        let b = d.upload(&[2.0; 8]).unwrap();
        let c = d.zeros(6).unwrap();
        (a, b, c)
    };
    // Both GPUs' buffers first: the context current on this thread is now cuda:1's.
    let (a0, b0, mut c0) = inputs(&d0);
    let (a1, b1, mut c1) = inputs(&d1);
    // cuda:0's product must run in cuda:0's context all the same.
    d0.gemm(gemm_spec(), &a0, &b0, &mut c0).unwrap();
    d1.gemm(gemm_spec(), &a1, &b1, &mut c1).unwrap();
    d0.gemm(gemm_spec(), &a0, &b0, &mut c0).unwrap();
    assert_eq!(d0.to_vec(&c0).unwrap(), vec![8.0; 6]);
    assert_eq!(d1.to_vec(&c1).unwrap(), vec![8.0; 6]);
    let ix = d1.upload_idx(&[0, 1]).unwrap();
    let x = d1.upload(&[1.0; 8]).unwrap();
    let mut out = d1.zeros(8).unwrap();
    d1.gather_rows(&x, 4, Ix::new(&ix, 0, 2), &mut out).unwrap();
    assert_eq!(d1.to_vec(&out).unwrap(), vec![1.0; 8]);
}
