//! Kernel gates, no GPU needed: the exact kernel source goes through NVRTC by the path
//! `Cuda::new` takes ([`compile_kernels`]), for the architectures upcc is run on (A100: sm_80,
//! H100/H200: sm_90), and the result is held against the host's kernel table.
//!
//! NVRTC is loaded at run time. Where it cannot be loaded these tests say so and pass, unless
//! `UPCC_TEST_NVRTC` is set: CI sets it (after installing NVIDIA's NVRTC and ptxas 13.0 from
//! PyPI, the toolkit of the GPU machine), so there a missing NVRTC is a failure, never a pass.
#![cfg(feature = "cuda")]

use std::collections::BTreeMap;
use std::process::Command;

use upcc_nn::cuda::{
    compile_kernels, compile_source, kernel_signatures, kernel_source, nvrtc_version,
};

/// The newest PTX ISA a CUDA 13.0 driver (the GPU machine's, 580.x) accepts.
const MAX_PTX_ISA: (u32, u32) = (9, 0);
const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

fn required() -> bool {
    std::env::var_os("UPCC_TEST_NVRTC").is_some()
}

/// Whether NVRTC loads; fails when it must (CI), else says why these tests did nothing.
fn nvrtc_here(test: &str) -> bool {
    match nvrtc_version() {
        Ok(_) => true,
        Err(why) if required() => panic!("UPCC_TEST_NVRTC is set but {why}"),
        Err(why) => {
            eprintln!("{test}: skipped, {why} (set UPCC_TEST_NVRTC=1 to make this a failure)");
            false
        }
    }
}

/// `.entry` name → its parameters' PTX types, in order.
fn entries(ptx: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim().strip_prefix(".visible .entry ") else {
            continue;
        };
        let name = rest.trim_end_matches('(').trim().to_string();
        let mut params = Vec::new();
        for l in lines.by_ref() {
            let l = l.trim();
            if l.starts_with(')') {
                break;
            }
            let ty = l
                .strip_prefix(".param ")
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("unexpected line in the parameters of {name}: {l}"));
            params.push(ty.to_string());
        }
        out.insert(name, params);
    }
    out
}

fn directive<'a>(ptx: &'a str, name: &str) -> &'a str {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} directive in the PTX"))
        .trim()
}

#[test]
fn every_kernel_compiles_and_its_ptx_parameters_are_the_host_table() {
    if !nvrtc_here("kernel gate") {
        return;
    }
    let table = kernel_signatures();
    assert!(table.len() >= 43, "{} kernels in the table", table.len());
    for arch in ARCHS {
        let k = compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.arch, arch);
        assert_eq!(
            &k.cubin[..4],
            b"\x7fELF",
            "{arch}: machine code is an ELF image"
        );
        let (maj, min) = directive(&k.ptx, ".version")
            .split_once('.')
            .map(|(a, b)| (a.parse::<u32>().unwrap(), b.parse::<u32>().unwrap()))
            .expect("a PTX version");
        assert!(
            (maj, min) <= MAX_PTX_ISA,
            "{arch}: PTX ISA {maj}.{min} is newer than a CUDA 13.0 driver accepts: this NVRTC is newer than the GPU machine's toolkit"
        );
        assert_eq!(directive(&k.ptx, ".target"), arch);
        let found = entries(&k.ptx);
        let want: BTreeMap<String, Vec<String>> = table
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.params.iter().map(|p| p.ptx_type.to_string()).collect(),
                )
            })
            .collect();
        let missing: Vec<_> = want.keys().filter(|k| !found.contains_key(*k)).collect();
        let extra: Vec<_> = found.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            missing.is_empty(),
            "{arch}: kernels the host loads but the PTX lacks: {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "{arch}: kernels defined but not in the host table: {extra:?}"
        );
        for (name, params) in &want {
            assert_eq!(&found[name], params, "{arch}: parameters of {name}");
        }
    }
    // Once per process: the second request is the same compilation.
    assert!(std::sync::Arc::ptr_eq(
        &compile_kernels("sm_90").unwrap(),
        &compile_kernels("sm_90").unwrap()
    ));
}

#[test]
fn a_kernel_that_disagrees_with_the_table_does_not_compile_and_the_log_reads_as_text() {
    if !nvrtc_here("kernel mutation") {
        return;
    }
    let src = kernel_source();
    // One parameter's type changed in the definition (f32 → f64): the generated prototype
    // makes it a compile error, never a launch with the wrong argument.
    let def = "k_fill(float* x, float v, i64 n)";
    assert!(src.contains(def), "the definition of k_fill moved");
    let err = compile_source(
        &src.replace(def, "k_fill(float* x, double v, i64 n)"),
        "sm_90",
    )
    .expect_err("a definition unlike the table must not compile");
    assert!(err.contains("k_fill"), "{err}");
    assert!(err.contains("\"C\" linkage"), "{err}");
    // The log keeps its lines and points into cuda_kernels.cu with its own line numbers.
    let line = src[..src.find(def).unwrap()]
        .lines()
        .rev()
        .take_while(|l| !l.starts_with("#line 1"))
        .count();
    assert!(
        err.contains(&format!("cuda_kernels.cu({line})")),
        "line {line}: {err}"
    );
    assert!(err.lines().count() > 2, "real line breaks: {err}");
    // A parameter too many is refused the same way.
    assert!(compile_source(
        &src.replace(def, "k_fill(float* x, float v, i64 n, int extra)"),
        "sm_90"
    )
    .is_err());
    // A virtual architecture gives no machine code, and says so.
    let virt = compile_source(&src, "compute_90").expect_err("no CUBIN for compute_90");
    assert!(virt.contains("real one"), "{virt}");
}

/// `ptxas` from NVIDIA's PyPI wheel (`$UPCC_PTXAS`, else on PATH).
fn ptxas() -> Option<String> {
    if let Some(p) = std::env::var_os("UPCC_PTXAS") {
        return Some(p.to_string_lossy().into_owned());
    }
    Command::new("ptxas")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "ptxas".into())
}

#[test]
fn ptxas_assembles_every_kernel_without_spills_or_local_memory() {
    if !nvrtc_here("ptxas gate") {
        return;
    }
    let Some(ptxas) = ptxas() else {
        assert!(
            !required(),
            "UPCC_TEST_NVRTC is set but ptxas was not found (set UPCC_PTXAS)"
        );
        eprintln!("ptxas gate: skipped, no ptxas");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let n = kernel_signatures().len();
    for arch in ARCHS {
        let k = compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join(format!("{arch}.ptx"));
        std::fs::write(&path, &k.ptx).unwrap();
        let out = Command::new(&ptxas)
            .args([&format!("-arch={arch}"), "-v", "-o"])
            .arg(dir.path().join(format!("{arch}.cubin")))
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {ptxas}: {e}"));
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas -arch={arch} failed:\n{log}");
        let compiled = log.matches("Compiling entry function").count();
        assert_eq!(
            compiled, n,
            "{arch}: ptxas assembled {compiled} of {n} kernels:\n{log}"
        );
        let props: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("bytes stack frame"))
            .collect();
        assert!(
            props.len() >= n,
            "{arch}: {} property lines:\n{log}",
            props.len()
        );
        for l in props {
            assert_eq!(
                l.trim(),
                "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                "{arch}: a kernel spills or uses local memory:\n{log}"
            );
        }
    }
}
