//! The CUDA device on cudarc with dynamic loading: the binary builds and runs where no CUDA is
//! installed, and [`probe`] / [`Cuda::new`] say why when a driver or library is missing.
//!
//! Matrix products go to cuBLAS (fp32, default math mode: no TF32), everything else to the
//! kernels of `cuda_kernels.cu`, compiled once per process by NVRTC straight to machine code
//! for the GPU's architecture (a CUBIN: the driver's PTX JIT plays no part, so the bits depend
//! on the NVRTC version, which the numerics class names). Each [`Cuda`] value owns a stream and
//! a cuBLAS handle; [`Cuda::fork`] gives a training node its own pair on the same context, so
//! nodes sharing a GPU never share a handle. No kernel uses atomics: two runs on the same GPU
//! give the same bits.
//!
//! Every kernel's signature is declared once, in the [`kernels!`] table below. From it come
//! (1) a typed launcher per kernel, so the host cannot push an argument of the wrong kind,
//! (2) `extern "C"` prototypes prepended to the source NVRTC compiles, so a kernel whose
//! definition disagrees with the table does not compile, and (3) [`kernel_signatures`], which
//! the kernel gate test compares with the `.entry` parameter lists of the PTX.

use std::collections::BTreeMap;
use std::ffi::{c_int, CString};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result::CublasError, sys as blas_sys};
use cudarc::driver::sys::{CUdevice_attribute as Attr, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DriverError, LaunchArgs, LaunchConfig, PushKernelArg,
};

use crate::check;
use crate::device::{
    Act, CoBce, DResult, Device, DeviceError, DeviceInfo, GemmSpec, HuberL2, Ix, StudentT,
};

const SOURCE: &str = include_str!("cuda_kernels.cu");
/// Threads per block of element-wise kernels.
const BLOCK: u32 = 256;
/// Threads of the block reductions (`RED` in the kernel source, defined from this constant).
pub const RED: u32 = 256;
/// The largest grid a kernel may be launched with (x dimension).
const MAX_GRID: usize = (1 << 31) - 1;

/// A kernel parameter that reads a device buffer of `T` (`const T*`).
pub struct In<T>(PhantomData<T>);
/// A kernel parameter that writes (or reads and writes) a device buffer of `T` (`T*`).
pub struct Out<T>(PhantomData<T>);

/// How one kind of kernel parameter is declared in C, appears in PTX and is passed by the
/// host.
pub trait KernelArg {
    /// What the typed launcher takes.
    type Arg<'x>;
    /// The parameter's type in the generated C prototype.
    const C: &'static str;
    /// The parameter's type in a PTX `.entry` list.
    const PTX: &'static str;
    fn push<'a, 'x: 'a>(b: &mut LaunchArgs<'a>, v: &'a mut Self::Arg<'x>);
}

macro_rules! scalar_arg {
    ($t:ty, $c:literal, $ptx:literal) => {
        impl KernelArg for $t {
            type Arg<'x> = $t;
            const C: &'static str = $c;
            const PTX: &'static str = $ptx;
            fn push<'a, 'x: 'a>(b: &mut LaunchArgs<'a>, v: &'a mut $t) {
                b.arg(&*v);
            }
        }
    };
}
scalar_arg!(i64, "long long", ".u64");
scalar_arg!(i32, "int", ".u32");
scalar_arg!(f32, "float", ".f32");
scalar_arg!(f64, "double", ".f64");

macro_rules! buffer_arg {
    ($t:ty, $in_c:literal, $out_c:literal) => {
        impl KernelArg for In<$t> {
            type Arg<'x> = &'x CudaSlice<$t>;
            const C: &'static str = $in_c;
            const PTX: &'static str = ".u64";
            fn push<'a, 'x: 'a>(b: &mut LaunchArgs<'a>, v: &'a mut &'x CudaSlice<$t>) {
                b.arg(*v);
            }
        }
        impl KernelArg for Out<$t> {
            type Arg<'x> = &'x mut CudaSlice<$t>;
            const C: &'static str = $out_c;
            const PTX: &'static str = ".u64";
            fn push<'a, 'x: 'a>(b: &mut LaunchArgs<'a>, v: &'a mut &'x mut CudaSlice<$t>) {
                b.arg(&mut **v);
            }
        }
    };
}
buffer_arg!(f32, "const float*", "float*");
buffer_arg!(f64, "const double*", "double*");
buffer_arg!(u32, "const unsigned int*", "unsigned int*");

/// One parameter of a kernel, as declared in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSig {
    pub name: &'static str,
    pub c_type: &'static str,
    pub ptx_type: &'static str,
}

/// One kernel of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSig {
    pub name: &'static str,
    pub params: Vec<ParamSig>,
}

/// Declares every kernel once: the loaded functions, a typed launcher per kernel (a method of
/// [`Cuda`] named like the kernel) and the signature table.
macro_rules! kernels {
    ($( fn $name:ident ( $($p:ident : $t:ty),* $(,)? ); )*) => {
        struct Kernels { $($name: CudaFunction,)* }

        impl Kernels {
            fn load(m: &Arc<CudaModule>) -> Result<Self, DriverError> {
                Ok(Kernels { $($name: m.load_function(stringify!($name))?,)* })
            }
        }

        /// Every kernel the host launches, with its parameters, in the table's order.
        pub fn kernel_signatures() -> Vec<KernelSig> {
            vec![$(KernelSig {
                name: stringify!($name),
                params: vec![$(ParamSig {
                    name: stringify!($p),
                    c_type: <$t as KernelArg>::C,
                    ptx_type: <$t as KernelArg>::PTX,
                }),*],
            }),*]
        }

        #[allow(clippy::too_many_arguments)]
        impl Cuda {
            $(
                fn $name(
                    &self,
                    op: &'static str,
                    cfg: LaunchConfig,
                    $(mut $p: <$t as KernelArg>::Arg<'_>),*
                ) -> DResult<()> {
                    let mut launch_args = self.stream().launch_builder(&self.k().$name);
                    $(<$t as KernelArg>::push(&mut launch_args, &mut $p);)*
                    // SAFETY: the arguments have the kinds the kernel declares (the prototypes
                    // generated from this table make any other definition fail to compile),
                    // and every caller ran the op's `check` against the buffers' lengths.
                    unsafe { launch_args.launch(cfg) }
                        .map(|_| ())
                        .map_err(|e| self.err(op, e))
                }
            )*
        }
    };
}

kernels! {
    fn k_fill(x: Out<f32>, v: f32, n: i64);
    fn k_axpy_range(a: f32, src: In<f32>, so: i64, dst: Out<f32>, d0: i64, n: i64);
    fn k_set_column(src: In<f32>, dst: Out<f32>, rows: i64, cols: i64, col: i64);
    fn k_bias_act(y: Out<f32>, bias: In<f32>, has_bias: i32, rows: i64, cols: i64, act: i32);
    fn k_act_backward(y: In<f32>, dy: In<f32>, dz: Out<f32>, n: i64, act: i32);
    fn k_col_sums_acc(dz: In<f32>, rows: i64, cols: i64, db: Out<f32>);
    fn k_mul(x: In<f32>, m: In<f32>, y: Out<f32>, n: i64);
    fn k_mul_acc(dy: In<f32>, m: In<f32>, dx: Out<f32>, n: i64);
    fn k_l2norm(x: In<f32>, rows: i64, cols: i64, eps: f32, y: Out<f32>, norms: Out<f32>);
    fn k_l2norm_backward(
        y: In<f32>, norms: In<f32>, eps: f32, dy: In<f32>, rows: i64, cols: i64, dx: Out<f32>,
    );
    fn k_pair_dot(
        u: In<f32>, cols: i64, a: In<u32>, ao: i64, b: In<u32>, bo: i64, n: i64, out: Out<f32>,
    );
    fn k_pair_dot_backward_pass(
        u: In<f32>, cols: i64, dst: In<u32>, d0: i64, src: In<u32>, s0: i64, g: In<f32>,
        n: i64, du: Out<f32>,
    );
    fn k_pair_dot_backward_serial(
        u: In<f32>, cols: i64, a: In<u32>, ao: i64, b: In<u32>, bo: i64, g: In<f32>, n: i64,
        du: Out<f32>,
    );
    fn k_gather_rows(x: In<f32>, cols: i64, idx: In<u32>, off: i64, n: i64, out: Out<f32>);
    fn k_scatter_add_distinct(
        dout: In<f32>, cols: i64, idx: In<u32>, off: i64, n: i64, dx: Out<f32>,
    );
    fn k_scatter_add_serial(dout: In<f32>, cols: i64, idx: In<u32>, off: i64, n: i64, dx: Out<f32>);
    fn k_probpair_bce(
        c: In<f32>, m_raw: In<f32>, t_raw: In<f32>, y: In<f32>, w: In<f32>, n: i64, denom: f64,
        dc: Out<f32>, out: Out<f64>, slot: i64,
    );
    fn k_pair_readout(
        u: In<f32>, cols: i64, a: In<u32>, ao: i64, b: In<u32>, bo: i64, m_raw: In<f32>,
        t_raw: In<f32>, n: i64, out: Out<f32>,
    );
    fn k_sq_error_grad(x: In<f32>, t: In<f32>, s2: f32, n: i64, dx: Out<f32>);
    fn k_sq_error_loss(x: In<f32>, t: In<f32>, n: i64, scale: f64, out: Out<f64>, slot: i64);
    fn k_softmax_ce(
        logits: In<f32>, rows: i64, cols: i64, labels: In<u32>, lo: i64, dlogits: Out<f32>,
        out: Out<f64>, slot: i64,
    );
    fn k_softmax_rows(logits: In<f32>, rows: i64, cols: i64, out: Out<f32>);
    fn k_huber_l2(
        p: In<f32>, t: In<f32>, w: In<f32>, has_w: i32, n: i64, delta: f64, smooth: i32,
        lambda: f64, denom: f64, dp: Out<f32>, out: Out<f64>, slot: i64,
    );
    fn k_eci_fuse(
        y: In<f32>, delta: In<f32>, y_oof: In<f32>, n: i64, xi: f64, gamma: f64, n0: f64,
        y_bc: Out<f32>, w: Out<f32>,
    );
    fn k_sum_squares(x: In<f32>, n: i64, out: Out<f64>, slot: i64);
    fn k_clip_coef(parts: Out<f64>, count: i64, max_norm: f64);
    fn k_clip_scale(x: Out<f32>, n: i64, coef: In<f64>, slot: i64);
    fn k_scale(x: Out<f32>, n: i64, s: f32);
    fn k_adam(
        p: Out<f32>, g: In<f32>, m: Out<f32>, v: Out<f32>, n: i64, b1: f32, b2: f32, ob1: f32,
        ob2: f32, step_size: f32, bc2_sqrt: f32, eps: f32,
    );
    fn k_sgd(p: Out<f32>, g: In<f32>, buf: Out<f32>, n: i64, mu: f32, lr: f32, first: i32);
    fn k_scalars_fill(s: Out<f64>, off: i64, n: i64, v: f64);
    fn k_scalar_axpy(src: In<f64>, ss: i64, coef: f64, dst: Out<f64>, ds: i64, keep: i32);
    fn k_scalar_axpy_self(s: Out<f64>, ss: i64, coef: f64, ds: i64, keep: i32);
    fn k_scalar_to_grad(s: In<f64>, slot: i64, coef: f64, grad: Out<f32>);
    fn k_softmax_backward(s: In<f32>, ds: In<f32>, rows: i64, cols: i64, dx: Out<f32>);
    fn k_pair_cobce(
        q: In<f32>, c: i64, n: i64, b_raw: In<f32>, has_b: i32, y: In<f32>, w: In<f32>,
        eps: f64, denom: f64, dq: Out<f32>, g: Out<f64>, out: Out<f64>, slot: i64,
    );
    fn k_pair_cobce_db(q: In<f32>, c: i64, n: i64, b_raw: In<f32>, g: In<f64>, db: Out<f32>);
    fn k_spd_logdet_inverse(
        m: In<f32>, c: i64, eps: f64, out: Out<f64>, slot: i64, minv: Out<f32>,
        scratch: Out<f64>,
    );
    fn k_student_t(
        z: In<f32>, mu: In<f32>, rows: i64, d: i64, k: i64, alpha: f64, e: f64, q: Out<f32>,
    );
    fn k_student_t_backward_rows(
        z: In<f32>, mu: In<f32>, q: In<f32>, dq: In<f32>, rows: i64, d: i64, k: i64,
        alpha: f64, e: f64, dz: Out<f32>, tmp: Out<f64>,
    );
    fn k_student_t_backward_mu(
        z: In<f32>, mu: In<f32>, tmp: In<f64>, rows: i64, d: i64, k: i64, alpha: f64,
        dmu: Out<f32>,
    );
    fn k_kl_target(q: In<f32>, p: In<f32>, n: i64, denom: f64, dq: Out<f32>, out: Out<f64>, slot: i64);
    fn k_spherepair_bce(
        c: In<f32>, y: In<f32>, w: In<f32>, n: i64, denom: f64, dc: Out<f32>, out: Out<f64>,
        slot: i64,
    );
}

/// The exact text NVRTC compiles: `#define RED` and one `extern "C"` prototype per kernel of
/// the table, generated here, then `cuda_kernels.cu` (its line numbers kept by `#line`).
pub fn kernel_source() -> String {
    let mut s = String::from("// Generated by upcc's cuda.rs from its kernel table.\n");
    s.push_str(&format!("#define RED {RED}\n"));
    for k in kernel_signatures() {
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("{} {}", p.c_type, p.name))
            .collect();
        s.push_str(&format!(
            "extern \"C\" __global__ void {}({});\n",
            k.name,
            params.join(", ")
        ));
    }
    s.push_str("#line 1 \"cuda_kernels.cu\"\n");
    s.push_str(SOURCE);
    s
}

/// The kernels compiled for one architecture.
#[derive(Clone, Debug)]
pub struct CompiledKernels {
    /// `sm_90`, ...
    pub arch: String,
    /// The options NVRTC was given.
    pub options: Vec<String>,
    /// The PTX NVRTC produced on the way (for inspection: the CUBIN is what is loaded).
    pub ptx: String,
    /// Machine code for `arch`.
    pub cubin: Vec<u8>,
}

/// NVRTC's version, or why it cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(format!(
            "libnvrtc could not be loaded{}",
            library_hint("libnvrtc.so")
        ));
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// Compile the kernels for `arch` (`sm_80`, `sm_90`, ...) with NVRTC, once per process and
/// architecture: the same path [`Cuda::new`] takes. The error carries NVRTC's log, line by
/// line.
pub fn compile_kernels(arch: &str) -> Result<Arc<CompiledKernels>, String> {
    type Cache = Mutex<BTreeMap<String, Result<Arc<CompiledKernels>, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = cache.get(arch) {
        return r.clone();
    }
    let r = compile_source(&kernel_source(), arch).map(Arc::new);
    cache.insert(arch.to_string(), r.clone());
    r
}

/// Compile `source` (normally [`kernel_source`]) for `arch`, uncached: what
/// [`compile_kernels`] does, open for tests that compile a changed source.
pub fn compile_source(source: &str, arch: &str) -> Result<CompiledKernels, String> {
    use cudarc::nvrtc::{result as nv, sys as nvs};
    let (major, minor) = nvrtc_version()?;
    let src = CString::new(source).map_err(|e| format!("kernel source: {e}"))?;
    let name = CString::new("cuda_kernels.cu").expect("no NUL");
    // FMA contraction stays on (NVRTC's default, named so that a changed default cannot
    // change bits unnoticed).
    let options = vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=true".to_string(),
    ];
    let prog = nv::create_program(&src, Some(&name))
        .map_err(|e| format!("NVRTC {major}.{minor} could not create a program: {e:?}"))?;
    // Destroy the program whatever happens below.
    struct Program(nvs::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { nv::destroy_program(self.0) };
        }
    }
    let prog = Program(prog);
    // SAFETY: a live program and valid option strings.
    if let Err(e) = unsafe { nv::compile_program(prog.0, &options) } {
        // SAFETY: a live program.
        let log = unsafe { nv::get_program_log(prog.0) }
            .map(|raw| c_chars_to_string(&raw))
            .unwrap_or_default();
        return Err(format!(
            "NVRTC {major}.{minor} could not compile upcc's kernels for {arch} ({:?}, options {}):\n{}",
            e.0,
            options.join(" "),
            log.trim_end()
        ));
    }
    // SAFETY: a compiled program.
    let ptx = unsafe { nv::get_ptx(prog.0) }
        .map(|raw| c_chars_to_string(&raw))
        .map_err(|e| format!("NVRTC gave no PTX: {e:?}"))?;
    let mut size = 0usize;
    // SAFETY: writes one size.
    unsafe { nvs::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| format!("NVRTC gave no machine code for {arch}: {e:?}"))?;
    if size == 0 {
        return Err(format!(
            "NVRTC gave no machine code for `{arch}` (a virtual architecture?): name a real one such as sm_90"
        ));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds `size` bytes.
    unsafe { nvs::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| format!("NVRTC gave no machine code for {arch}: {e:?}"))?;
    Ok(CompiledKernels {
        arch: arch.to_string(),
        options,
        ptx,
        cubin,
    })
}

fn c_chars_to_string(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Where a CUDA library that did not load may be: `; found in DIR: ...` when a usual
/// directory has it, else the general advice.
fn library_hint(lib: &str) -> String {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Ok(entries) = fs_err::read_dir("/usr/local") {
        let mut cuda: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("cuda"))
            })
            .collect();
        cuda.sort();
        for c in cuda {
            dirs.push(c.join("targets/x86_64-linux/lib"));
            dirs.push(c.join("lib64"));
        }
    }
    dirs.push("/usr/local/nvidia/lib64".into());
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    let found = dirs.iter().find(|d| {
        fs_err::read_dir(d).is_ok_and(|mut es| {
            es.any(|e| {
                e.ok()
                    .and_then(|e| e.file_name().into_string().ok())
                    .is_some_and(|n| n.starts_with(lib))
            })
        })
    });
    match found {
        Some(d) => format!(
            "; it is in {}: run with LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH",
            d.display(),
            d.display()
        ),
        None => "; install the CUDA toolkit's libraries (13.x) and add their directory to LD_LIBRARY_PATH".into(),
    }
}

/// Whether the CUDA driver library can be loaded at all.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// How many CUDA devices are visible (0 without a driver or when the driver fails).
pub fn visible_devices() -> usize {
    if !driver_present() || cudarc::driver::result::init().is_err() {
        return 0;
    }
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

fn cu_name(e: &DriverError) -> String {
    format!("{:?}", e.0)
}

/// Errors after which the context cannot be used again (CUDA's "sticky" errors).
pub fn is_sticky(r: CUresult) -> bool {
    matches!(
        r,
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_ASSERT
            | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
            | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
            | CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// What a GPU is, read from the driver and the libraries without creating a context or
/// compiling anything: enough to name the numerics class (for keys) and the provenance facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub memory_bytes: usize,
    pub driver_api: i32,
    pub cublas: (i32, i32, i32),
    pub nvrtc: (i32, i32),
}

impl Probe {
    /// The real architecture the kernels are compiled for: `sm_90`, ...
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// What can change output bits on this GPU: architecture, number of multiprocessors
    /// (cuBLAS chooses its kernels by it), cuBLAS's version and NVRTC's (which makes the
    /// kernels' machine code). `cuda-f32-sm90-132sm-cublas13.1.0-nvrtc13.0`.
    pub fn numerics(&self) -> String {
        let (cm, cn) = self.compute_capability;
        let (bm, bn, bp) = self.cublas;
        let (nm, nn) = self.nvrtc;
        format!(
            "cuda-f32-sm{cm}{cn}-{}sm-cublas{bm}.{bn}.{bp}-nvrtc{nm}.{nn}",
            self.multiprocessors
        )
    }

    /// Provenance: the numerics class and the facts behind it.
    pub fn info(&self) -> DeviceInfo {
        let (cm, cn) = self.compute_capability;
        let (bm, bn, bp) = self.cublas;
        let mut facts = vec![
            ("gpu".to_string(), self.name.clone()),
            ("compute_capability".to_string(), format!("{cm}.{cn}")),
            (
                "multiprocessors".to_string(),
                self.multiprocessors.to_string(),
            ),
            (
                "gpu_memory_bytes".to_string(),
                self.memory_bytes.to_string(),
            ),
            (
                "cuda_driver_api".to_string(),
                format!(
                    "{}.{}",
                    self.driver_api / 1000,
                    (self.driver_api % 1000) / 10
                ),
            ),
            ("cublas".to_string(), format!("{bm}.{bn}.{bp}")),
            (
                "nvrtc".to_string(),
                format!("{}.{}", self.nvrtc.0, self.nvrtc.1),
            ),
        ];
        if let Ok(driver) = fs_err::read_to_string("/proc/driver/nvidia/version") {
            if let Some(line) = driver.lines().next() {
                facts.push(("nvidia_driver".into(), line.trim().to_string()));
            }
        }
        DeviceInfo {
            name: format!("cuda:{}", self.ordinal),
            numerics: self.numerics(),
            facts,
        }
    }
}

fn unavailable(ordinal: usize, message: impl Into<String>, fix: impl Into<String>) -> DeviceError {
    DeviceError::Unavailable {
        ordinal,
        message: message.into(),
        fix: fix.into(),
    }
}

fn visible_env() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
}

/// Read what GPU `ordinal` is (after `CUDA_VISIBLE_DEVICES`) and whether cuBLAS and NVRTC
/// load. [`DeviceError::NoDriver`] and [`DeviceError::NoDevice`] mean there is no GPU to use;
/// [`DeviceError::Unavailable`] means there is one but something is missing, and says what
/// to change.
pub fn probe(ordinal: usize) -> DResult<Probe> {
    use cudarc::driver::result as drv;
    if !driver_present() {
        return Err(DeviceError::NoDriver(
            "libcuda.so could not be loaded (no NVIDIA driver on this machine?)".into(),
        ));
    }
    if let Err(e) = drv::init() {
        return Err(match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE => DeviceError::NoDevice(format!(
                "the driver reports no CUDA device (CUDA_VISIBLE_DEVICES={})",
                visible_env()
            )),
            CUresult::CUDA_ERROR_STUB_LIBRARY => DeviceError::NoDriver(
                "the libcuda.so found is the CUDA toolkit's stub, not a driver".into(),
            ),
            _ => unavailable(
                ordinal,
                format!("the CUDA driver failed to start ({})", cu_name(&e)),
                "check that `nvidia-smi` works and that the driver matches its kernel module",
            ),
        });
    }
    let count = drv::device::get_count()
        .map_err(|e| {
            unavailable(
                ordinal,
                format!("cannot count devices ({})", cu_name(&e)),
                "check that `nvidia-smi` works",
            )
        })?
        .max(0) as usize;
    if count == 0 {
        return Err(DeviceError::NoDevice(format!(
            "the driver sees 0 CUDA devices (CUDA_VISIBLE_DEVICES={})",
            visible_env()
        )));
    }
    if ordinal >= count {
        return Err(unavailable(
            ordinal,
            format!(
                "{count} CUDA device(s) visible (CUDA_VISIBLE_DEVICES={})",
                visible_env()
            ),
            format!(
                "name a device below {count}: --device cuda:0 … cuda:{}",
                count - 1
            ),
        ));
    }
    let driver_err = |what: &str, e: DriverError| {
        unavailable(
            ordinal,
            format!("cannot read the device's {what} ({})", cu_name(&e)),
            "check that `nvidia-smi` works",
        )
    };
    let dev = drv::device::get(ordinal as c_int).map_err(|e| driver_err("handle", e))?;
    let name = drv::device::get_name(dev).unwrap_or_else(|_| "unknown GPU".into());
    // SAFETY: reads attributes of a valid device handle.
    let attr = |a: Attr| unsafe { drv::device::get_attribute(dev, a) };
    let major = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| driver_err("compute capability", e))?;
    let minor = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| driver_err("compute capability", e))?;
    let sms = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| driver_err("multiprocessor count", e))?;
    // SAFETY: a valid device handle.
    let memory_bytes = unsafe { drv::device::total_mem(dev) }.unwrap_or(0);
    let mut driver_api = 0i32;
    // SAFETY: writes one int.
    let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_api) };
    // SAFETY: only tries to dlopen the library.
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(unavailable(
            ordinal,
            "libcublas (CUDA's BLAS, which upcc's products run on) could not be loaded",
            library_hint("libcublas.so")
                .trim_start_matches("; ")
                .to_string(),
        ));
    }
    let mut cublas = [0i32; 3];
    for (v, p) in cublas.iter_mut().zip([
        blas_sys::libraryPropertyType::MAJOR_VERSION,
        blas_sys::libraryPropertyType::MINOR_VERSION,
        blas_sys::libraryPropertyType::PATCH_LEVEL,
    ]) {
        // SAFETY: writes one int.
        unsafe { blas_sys::cublasGetProperty(p, v) }
            .result()
            .map_err(|e| {
                unavailable(
                    ordinal,
                    format!("cuBLAS does not report its version ({e:?})"),
                    "reinstall the CUDA toolkit's cuBLAS",
                )
            })?;
    }
    let nvrtc = nvrtc_version().map_err(|m| {
        unavailable(
            ordinal,
            format!("{m} (NVRTC compiles upcc's kernels)"),
            library_hint("libnvrtc.so")
                .trim_start_matches("; ")
                .to_string(),
        )
    })?;
    Ok(Probe {
        ordinal,
        name,
        compute_capability: (major, minor),
        multiprocessors: sms,
        memory_bytes,
        driver_api,
        cublas: (cublas[0], cublas[1], cublas[2]),
        nvrtc,
    })
}

/// Let the GPU's default memory pool keep what it has mapped: with CUDA's default release
/// threshold (0) every synchronisation hands freed pool memory back to the driver, and the
/// next step's allocations map it again.
fn keep_pool_memory(ctx: &CudaContext) -> Result<(), DriverError> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pool handle of a valid device.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
    let mut keep: u64 = u64::MAX;
    // SAFETY: the release threshold is a cuuint64_t, read from `keep`.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
    }
    .result()
}

/// What every stream of one context shares.
struct Shared {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    k: Kernels,
    info: DeviceInfo,
}

/// A cuBLAS handle bound to one stream. Destroyed with its status ignored: after a sticky fault
/// `cublasDestroy` fails, and cudarc's `CudaBlas` unwraps that in its `Drop` (a panic, or an
/// abort when it happens while a panic unwinds).
struct Blas(blas_sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread; each `Inner` uses its own, on its own
// stream, one call at a time.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created by cublasCreate in `Cuda::on`, destroyed once, here. A failure means
        // the GPU is lost: there is nothing left to release.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.0) };
    }
}

/// Fields drop in this order: the handle while its stream lives, the stream's buffer, the
/// stream (which finishes its work), then the context's kernels.
struct Inner {
    blas: Blas,
    /// Passed for optional pointer arguments the kernel does not read.
    dummy: CudaSlice<f32>,
    stream: Arc<CudaStream>,
    shared: Arc<Shared>,
}

/// A CUDA GPU (one stream and one cuBLAS handle of a context).
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({})", self.inner.shared.info.name)
    }
}

/// An index vector on the GPU, with one more than its largest value (recorded at upload,
/// where the host has the values: what [`check`] holds index values against).
#[derive(Debug)]
pub struct DevIdx {
    buf: CudaSlice<u32>,
    bound: usize,
}

impl Cuda {
    /// Open CUDA device `ordinal` (after `CUDA_VISIBLE_DEVICES`): [`probe`] it, create its
    /// context, compile the kernels for its architecture (once per process) and load them.
    pub fn new(ordinal: usize) -> DResult<Cuda> {
        let probe = probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(
                ordinal,
                format!("cannot create a context ({})", cu_name(&e)),
                "check that no other process holds the GPU in exclusive mode (`nvidia-smi`)",
            )
        })?;
        // One stream per node and no buffer crosses streams: cudarc's cross-stream events
        // would only add host work per launch.
        // SAFETY: every buffer is used only on the stream that allocated it.
        unsafe { ctx.disable_event_tracking() };
        keep_pool_memory(&ctx).map_err(|e| {
            unavailable(
                ordinal,
                format!("cannot configure the GPU's memory pool ({})", cu_name(&e)),
                "check that the driver supports stream-ordered allocation (CUDA 11.2 or newer)",
            )
        })?;
        let compiled = compile_kernels(&probe.arch()).map_err(|m| {
            unavailable(
                ordinal,
                m,
                "this NVRTC cannot build upcc's kernels for this GPU: use the NVRTC of the CUDA toolkit the driver supports (13.x), or report the log above; --device cpu computes on the CPU meanwhile",
            )
        })?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
            .map_err(|e| {
                unavailable(
                    ordinal,
                    format!(
                        "the driver cannot load the kernels NVRTC {}.{} built for {} ({})",
                        probe.nvrtc.0,
                        probe.nvrtc.1,
                        probe.arch(),
                        cu_name(&e)
                    ),
                    "use an NVRTC no newer than the driver's CUDA version (nvidia-smi shows it)",
                )
            })?;
        let k = Kernels::load(&module).map_err(|e| {
            unavailable(
                ordinal,
                format!("a kernel is missing from the module ({})", cu_name(&e)),
                "this is a bug in upcc's kernel table; --device cpu computes on the CPU meanwhile",
            )
        })?;
        let shared = Arc::new(Shared {
            ordinal,
            ctx,
            k,
            info: probe.info(),
        });
        Self::on(shared)
    }

    fn on(shared: Arc<Shared>) -> DResult<Cuda> {
        let ordinal = shared.ordinal;
        let name = shared.info.name.clone();
        let fail = |what: &'static str, e: String| {
            unavailable(
                ordinal,
                format!("cannot create {what}: {e}"),
                "check free GPU memory with `nvidia-smi`",
            )
        };
        // After a sticky error every call on the context fails with it: the GPU is lost.
        let driver_fail = |what: &'static str, e: DriverError| {
            if is_sticky(e.0) {
                DeviceError::Fatal {
                    device: name.clone(),
                    op: what,
                    message: cu_name(&e),
                }
            } else {
                fail(what, cu_name(&e))
            }
        };
        let stream = shared
            .ctx
            .new_stream()
            .map_err(|e| driver_fail("a stream", e))?;
        shared
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_fail("a cuBLAS handle", e))?;
        let blas = Blas(
            cudarc::cublas::result::create_handle()
                .map_err(|e| fail("a cuBLAS handle", format!("{e:?}")))?,
        );
        // SAFETY: a live handle and a live stream of the current context.
        unsafe { cudarc::cublas::result::set_stream(blas.0, stream.cu_stream() as _) }
            .map_err(|e| fail("the cuBLAS stream", format!("{e:?}")))?;
        // fp32 products in plain fp32: no TF32 tensor-op math.
        // SAFETY: sets a mode on a live handle.
        unsafe { blas_sys::cublasSetMathMode(blas.0, blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result()
            .map_err(|e| fail("the cuBLAS math mode", format!("{e:?}")))?;
        let dummy = stream
            .alloc_zeros::<f32>(1)
            .map_err(|e| driver_fail("a buffer", e))?;
        Ok(Cuda {
            inner: Arc::new(Inner {
                blas,
                dummy,
                stream,
                shared,
            }),
        })
    }

    /// A new stream and cuBLAS handle on the same GPU (one per training node).
    pub fn fork(&self) -> DResult<Cuda> {
        Self::on(self.inner.shared.clone())
    }

    /// Provenance facts: GPU model, compute capability, driver, CUDA, cuBLAS and NVRTC versions.
    pub fn info(&self) -> DeviceInfo {
        self.inner.shared.info.clone()
    }

    /// Free and total memory of the GPU in bytes.
    pub fn memory(&self) -> DResult<(usize, usize)> {
        self.inner
            .shared
            .ctx
            .mem_get_info()
            .map_err(|e| self.err("mem_get_info", e))
    }

    fn name_(&self) -> String {
        self.inner.shared.info.name.clone()
    }

    fn err(&self, op: &'static str, e: DriverError) -> DeviceError {
        let device = self.name_();
        let message = match e.error_string() {
            Ok(s) => format!("{} ({})", cu_name(&e), s.to_string_lossy()),
            Err(_) => cu_name(&e),
        };
        if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            DeviceError::OutOfMemory { device, bytes: 0 }
        } else if is_sticky(e.0) {
            DeviceError::Fatal {
                device,
                op,
                message,
            }
        } else {
            DeviceError::Backend {
                device,
                op,
                message,
            }
        }
    }

    /// A cuBLAS failure. After a fault of the GPU, cuBLAS reports only that it failed; the
    /// stream says whether the context is lost (a sticky error), and then so does this.
    fn blas_err(&self, e: CublasError) -> DeviceError {
        match self.stream().synchronize() {
            Err(d) if is_sticky(d.0) => self.err("cublasSgemm", d),
            _ => DeviceError::Backend {
                device: self.name_(),
                op: "cublasSgemm",
                message: format!("{e:?}"),
            },
        }
    }

    fn too_large(&self, op: &'static str, what: String) -> DeviceError {
        DeviceError::Backend {
            device: self.name_(),
            op,
            message: format!("{what}: too large for one launch"),
        }
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    fn k(&self) -> &Kernels {
        &self.inner.shared.k
    }

    fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> DResult<CudaSlice<T>> {
        let s = self.stream();
        if len == 0 {
            // A zero-byte allocation is refused by some drivers (CUDA_ERROR_INVALID_VALUE, as
            // cudarc issue #194 reports for `null()`): an empty buffer owns one element instead,
            // which its drop frees like any other.
            let one = s.alloc_zeros::<T>(1).map_err(|e| self.err("alloc", e))?;
            let ptr = one.leak();
            // SAFETY: `ptr` was allocated on this stream for one element and is no longer owned
            // by anything else; a length of 0 never reads it.
            return Ok(unsafe { s.upgrade_device_ptr::<T>(ptr, 0) });
        }
        s.alloc_zeros::<T>(len)
            .map_err(|e| match self.err("alloc", e) {
                DeviceError::OutOfMemory { device, .. } => DeviceError::OutOfMemory {
                    device,
                    bytes: len * std::mem::size_of::<T>(),
                },
                other => other,
            })
    }

    /// `blocks` blocks of `threads` (x, y) threads, refused beyond the launch limits.
    fn blocks(
        &self,
        op: &'static str,
        blocks: usize,
        threads: (u32, u32),
    ) -> DResult<LaunchConfig> {
        if blocks > MAX_GRID {
            return Err(self.too_large(op, format!("{blocks} blocks")));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (threads.0, threads.1, 1),
            shared_mem_bytes: 0,
        })
    }

    /// One thread per element of `n`.
    fn grid(&self, op: &'static str, n: usize) -> DResult<LaunchConfig> {
        self.blocks(op, n.div_ceil(BLOCK as usize), (BLOCK, 1))
    }

    /// One block of `RED` threads (the single-block reductions).
    fn one_block() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (RED, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn single() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn shape(&self, i: Ix<'_, DevIdx>) -> check::IxShape {
        Device::<f32>::ix_shape(self, i)
    }
}

/// usize → i64 for kernel arguments (every size here fits: buffers are far below 2⁶³).
fn i(n: usize) -> i64 {
    n as i64
}

fn act_code(a: Act) -> i32 {
    match a {
        Act::Identity => 0,
        Act::Relu => 1,
        Act::Tanh => 2,
    }
}

impl Device<f32> for Cuda {
    type Buf = CudaSlice<f32>;
    type Idx = DevIdx;
    type Scalars = CudaSlice<f64>;

    fn name(&self) -> String {
        self.name_()
    }
    fn numerics(&self) -> String {
        self.inner.shared.info.numerics.clone()
    }
    fn concurrent_models(&self) -> bool {
        // One stream and one cuBLAS handle: models of a node queue on it in order.
        false
    }
    fn synchronize(&self) -> DResult<()> {
        self.stream()
            .synchronize()
            .map_err(|e| self.err("synchronize", e))
    }

    fn zeros(&self, len: usize) -> DResult<CudaSlice<f32>> {
        self.alloc(len)
    }
    fn upload(&self, data: &[f32]) -> DResult<CudaSlice<f32>> {
        let mut b = self.alloc(data.len())?;
        if !data.is_empty() {
            self.stream()
                .memcpy_htod(data, &mut b)
                .map_err(|e| self.err("upload", e))?;
        }
        Ok(b)
    }
    fn to_vec(&self, buf: &CudaSlice<f32>) -> DResult<Vec<f32>> {
        if buf.is_empty() {
            return Ok(vec![]);
        }
        self.stream()
            .clone_dtoh(buf)
            .map_err(|e| self.err("download", e))
    }
    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut CudaSlice<f32>, value: f32) -> DResult<()> {
        let n = buf.len();
        if n == 0 {
            return Ok(());
        }
        self.k_fill("fill", self.grid("fill", n)?, buf, value, i(n))
    }
    fn write(&self, dst: &mut CudaSlice<f32>, src: &[f32]) -> DResult<()> {
        check::write(dst.len(), src.len());
        if src.is_empty() {
            return Ok(());
        }
        self.stream()
            .memcpy_htod(src, dst)
            .map_err(|e| self.err("upload", e))
    }
    fn copy_range(
        &self,
        src: &CudaSlice<f32>,
        src_off: usize,
        dst: &mut CudaSlice<f32>,
        dst_off: usize,
        len: usize,
    ) -> DResult<()> {
        check::copy_range("copy_range", src.len(), src_off, dst.len(), dst_off, len);
        if len == 0 {
            return Ok(());
        }
        let s = src.slice(src_off..src_off + len);
        let mut d = dst.slice_mut(dst_off..dst_off + len);
        self.stream()
            .memcpy_dtod(&s, &mut d)
            .map_err(|e| self.err("copy", e))
    }
    fn axpy_range(
        &self,
        alpha: f32,
        src: &CudaSlice<f32>,
        src_off: usize,
        dst: &mut CudaSlice<f32>,
        dst_off: usize,
        len: usize,
    ) -> DResult<()> {
        check::copy_range("axpy_range", src.len(), src_off, dst.len(), dst_off, len);
        if len == 0 {
            return Ok(());
        }
        let cfg = self.grid("axpy", len)?;
        self.k_axpy_range("axpy", cfg, alpha, src, i(src_off), dst, i(dst_off), i(len))
    }
    fn set_column(
        &self,
        src: &CudaSlice<f32>,
        dst: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        col: usize,
    ) -> DResult<()> {
        check::set_column(src.len(), dst.len(), rows, cols, col);
        if rows == 0 {
            return Ok(());
        }
        let cfg = self.grid("set_column", rows)?;
        self.k_set_column("set_column", cfg, src, dst, i(rows), i(cols), i(col))
    }

    fn upload_idx(&self, data: &[u32]) -> DResult<DevIdx> {
        let mut buf = self.alloc::<u32>(data.len())?;
        if !data.is_empty() {
            self.stream()
                .memcpy_htod(data, &mut buf)
                .map_err(|e| self.err("upload", e))?;
        }
        let bound = data.iter().max().map_or(0, |&m| m as usize + 1);
        Ok(DevIdx { buf, bound })
    }
    fn idx_len(&self, idx: &DevIdx) -> usize {
        idx.buf.len()
    }
    fn idx_bound(&self, idx: &DevIdx) -> usize {
        idx.bound
    }

    fn scalars(&self, len: usize) -> DResult<CudaSlice<f64>> {
        self.alloc(len)
    }
    fn scalars_to_vec(&self, s: &CudaSlice<f64>) -> DResult<Vec<f64>> {
        if s.is_empty() {
            return Ok(vec![]);
        }
        self.stream()
            .clone_dtoh(s)
            .map_err(|e| self.err("download", e))
    }
    fn scalars_fill(&self, s: &mut CudaSlice<f64>, value: f64) -> DResult<()> {
        let n = s.len();
        if n == 0 {
            return Ok(());
        }
        let cfg = self.grid("scalars", n)?;
        self.k_scalars_fill("scalars", cfg, s, 0, i(n), value)
    }
    fn scalars_combine(
        &self,
        s: &mut CudaSlice<f64>,
        dst: usize,
        terms: &[(usize, f64)],
    ) -> DResult<()> {
        check::scalars_combine(s.len(), dst, terms);
        if terms.is_empty() {
            return self.k_scalars_fill("scalars", Self::single(), s, i(dst), 1, 0.0);
        }
        for (k, &(src, coef)) in terms.iter().enumerate() {
            let keep = i32::from(k > 0);
            self.k_scalar_axpy_self("scalars", Self::single(), s, i(src), coef, i(dst), keep)?;
        }
        Ok(())
    }
    fn scalars_accumulate(
        &self,
        src: &CudaSlice<f64>,
        src_slot: usize,
        coef: f64,
        dst: &mut CudaSlice<f64>,
        dst_slot: usize,
    ) -> DResult<()> {
        check::scalars_accumulate(src.len(), src_slot, dst.len(), dst_slot);
        let single = Self::single();
        self.k_scalar_axpy(
            "scalars",
            single,
            src,
            i(src_slot),
            coef,
            dst,
            i(dst_slot),
            1,
        )
    }
    fn scalar_to_grad(
        &self,
        s: &CudaSlice<f64>,
        slot: usize,
        coef: f64,
        grad: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::scalar_to_grad(s.len(), slot, grad.len());
        self.k_scalar_to_grad("scalars", Self::single(), s, i(slot), coef, grad)
    }

    fn gemm(
        &self,
        spec: GemmSpec,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::gemm(spec, a.len(), b.len(), c.len());
        let GemmSpec {
            m,
            n,
            k,
            a_t,
            b_t,
            accumulate,
        } = spec;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return if accumulate {
                Ok(())
            } else {
                self.fill(c, 0.0)
            };
        }
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| self.too_large("cublasSgemm", format!("dimension {v}")))
        };
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS gets B first.
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let transa = if b_t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let transb = if a_t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let (mm, nn, kk) = (dim(n)?, dim(m)?, dim(k)?);
        let lda = dim(if b_t { k } else { n })?;
        let ldb = dim(if a_t { m } else { k })?;
        let ldc = dim(n)?;
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // cuBLAS runs in the thread's current context, which cudarc binds only for its driver
        // calls: bind this handle's.
        self.inner
            .shared
            .ctx
            .bind_to_thread()
            .map_err(|e| self.err("cublasSgemm", e))?;
        let s = self.stream();
        let (bp, _b) = b.device_ptr(s);
        let (ap, _a) = a.device_ptr(s);
        let (cp, _c) = c.device_ptr_mut(s);
        // SAFETY: the shapes were checked against the buffer lengths above; the pointers are
        // live buffers of this stream; alpha and beta are host scalars (the default pointer
        // mode).
        unsafe {
            cudarc::cublas::result::sgemm(
                self.inner.blas.0,
                transa,
                transb,
                mm,
                nn,
                kk,
                &alpha,
                bp as *const f32,
                lda,
                ap as *const f32,
                ldb,
                &beta,
                cp as *mut f32,
                ldc,
            )
        }
        .map_err(|e| self.blas_err(e))
    }

    fn gemm2(
        &self,
        s1: GemmSpec,
        a1: &CudaSlice<f32>,
        b1: &CudaSlice<f32>,
        c1: &mut CudaSlice<f32>,
        s2: GemmSpec,
        a2: &CudaSlice<f32>,
        b2: &CudaSlice<f32>,
        c2: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        self.gemm(s1, a1, b1, c1)?;
        self.gemm(s2, a2, b2, c2)
    }

    fn bias_act(
        &self,
        y: &mut CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        rows: usize,
        cols: usize,
        act: Act,
    ) -> DResult<()> {
        check::bias_act(y.len(), bias.map(|b| b.len()), rows, cols);
        if bias.is_none() && act == Act::Identity || rows * cols == 0 {
            return Ok(());
        }
        let has = i32::from(bias.is_some());
        let bv = bias.unwrap_or(&self.inner.dummy);
        let cfg = self.grid("bias_act", rows * cols)?;
        self.k_bias_act("bias_act", cfg, y, bv, has, i(rows), i(cols), act_code(act))
    }
    fn act_backward(
        &self,
        y: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dz: &mut CudaSlice<f32>,
        act: Act,
    ) -> DResult<()> {
        check::elementwise("act_backward", &[dy.len(), y.len(), dz.len()]);
        let n = dy.len();
        if n == 0 {
            return Ok(());
        }
        let cfg = self.grid("act_backward", n)?;
        self.k_act_backward("act_backward", cfg, y, dy, dz, i(n), act_code(act))
    }
    fn col_sums_acc(
        &self,
        dz: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        db: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::col_sums(dz.len(), rows, cols, db.len());
        if cols == 0 {
            return Ok(());
        }
        // 32 columns per block, 8 row strides per column (the kernel assumes both).
        let cfg = self.blocks("col_sums", cols.div_ceil(32), (32, 8))?;
        self.k_col_sums_acc("col_sums", cfg, dz, i(rows), i(cols), db)
    }
    fn axpy(&self, alpha: f32, src: &CudaSlice<f32>, dst: &mut CudaSlice<f32>) -> DResult<()> {
        check::elementwise("axpy", &[src.len(), dst.len()]);
        let n = src.len();
        self.axpy_range(alpha, src, 0, dst, 0, n)
    }
    fn mul(
        &self,
        x: &CudaSlice<f32>,
        mask: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::elementwise("mul", &[x.len(), mask.len(), y.len()]);
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        self.k_mul("mul", self.grid("mul", n)?, x, mask, y, i(n))
    }
    fn mul_acc(
        &self,
        dy: &CudaSlice<f32>,
        mask: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::elementwise("mul_acc", &[dy.len(), mask.len(), dx.len()]);
        let n = dy.len();
        if n == 0 {
            return Ok(());
        }
        self.k_mul_acc("mul_acc", self.grid("mul_acc", n)?, dy, mask, dx, i(n))
    }

    fn l2norm(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        eps: f32,
        y: &mut CudaSlice<f32>,
        norms: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::rowwise("l2norm", rows, cols, &[x.len(), y.len()], &[norms.len()]);
        if rows == 0 {
            return Ok(());
        }
        // One block of RED threads per row.
        let cfg = self.blocks("l2norm", rows, (RED, 1))?;
        self.k_l2norm("l2norm", cfg, x, i(rows), i(cols), eps, y, norms)
    }
    fn l2norm_backward(
        &self,
        y: &CudaSlice<f32>,
        norms: &CudaSlice<f32>,
        eps: f32,
        dy: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::rowwise(
            "l2norm_backward",
            rows,
            cols,
            &[y.len(), dy.len(), dx.len()],
            &[norms.len()],
        );
        if rows == 0 {
            return Ok(());
        }
        let cfg = self.blocks("l2norm_backward", rows, (RED, 1))?;
        let op = "l2norm_backward";
        self.k_l2norm_backward(op, cfg, y, norms, eps, dy, i(rows), i(cols), dx)
    }

    fn pair_dot(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, DevIdx>,
        b: Ix<'_, DevIdx>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::pairs(
            "pair_dot",
            u.len(),
            cols,
            self.shape(a),
            self.shape(b),
            &[out.len()],
        );
        if a.len == 0 {
            return Ok(());
        }
        let cfg = self.grid("pair_dot", a.len)?;
        let (ab, bb) = (&a.buf.buf, &b.buf.buf);
        let (ao, bo, n) = (i(a.off), i(b.off), i(a.len));
        self.k_pair_dot("pair_dot", cfg, u, i(cols), ab, ao, bb, bo, n, out)
    }
    fn pair_dot_backward(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, DevIdx>,
        b: Ix<'_, DevIdx>,
        g: &CudaSlice<f32>,
        du: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let op = "pair_dot_backward";
        check::pairs(op, u.len(), cols, self.shape(a), self.shape(b), &[g.len()]);
        check::elementwise(op, &[u.len(), du.len()]);
        if a.len == 0 || cols == 0 {
            return Ok(());
        }
        let (ab, bb) = (&a.buf.buf, &b.buf.buf);
        let (c, ao, bo, n) = (i(cols), i(a.off), i(b.off), i(a.len));
        if a.distinct && b.distinct {
            // Two passes, each over distinct destination rows.
            let cfg = self.grid(op, a.len * cols)?;
            self.k_pair_dot_backward_pass(op, cfg, u, c, ab, ao, bb, bo, g, n, &mut *du)?;
            self.k_pair_dot_backward_pass(op, cfg, u, c, bb, bo, ab, ao, g, n, du)
        } else {
            let cfg = self.grid(op, cols)?;
            self.k_pair_dot_backward_serial(op, cfg, u, c, ab, ao, bb, bo, g, n, du)
        }
    }
    fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        cols: usize,
        idx: Ix<'_, DevIdx>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::rows_indexed("gather_rows", x.len(), cols, self.shape(idx), out.len());
        if idx.len * cols == 0 {
            return Ok(());
        }
        let cfg = self.grid("gather", idx.len * cols)?;
        let (ib, o, n) = (&idx.buf.buf, i(idx.off), i(idx.len));
        self.k_gather_rows("gather", cfg, x, i(cols), ib, o, n, out)
    }
    fn scatter_add_rows(
        &self,
        dout: &CudaSlice<f32>,
        cols: usize,
        idx: Ix<'_, DevIdx>,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let op = "scatter_add_rows";
        check::rows_indexed(op, dx.len(), cols, self.shape(idx), dout.len());
        if idx.len * cols == 0 {
            return Ok(());
        }
        let (ib, o, n, c) = (&idx.buf.buf, i(idx.off), i(idx.len), i(cols));
        if idx.distinct {
            let cfg = self.grid(op, idx.len * cols)?;
            self.k_scatter_add_distinct(op, cfg, dout, c, ib, o, n, dx)
        } else {
            let cfg = self.grid(op, cols)?;
            self.k_scatter_add_serial(op, cfg, dout, c, ib, o, n, dx)
        }
    }

    fn probpair_bce(
        &self,
        c: &CudaSlice<f32>,
        m_raw: &CudaSlice<f32>,
        t_raw: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        denom: f64,
        dc: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        let op = "probpair_bce";
        check::loss(
            op,
            &[c.len(), y.len(), w.len(), dc.len()],
            &[m_raw.len(), t_raw.len()],
            out.len(),
            slot,
            3,
        );
        let (n, sl) = (i(c.len()), i(slot));
        self.k_probpair_bce(
            op,
            Self::one_block(),
            c,
            m_raw,
            t_raw,
            y,
            w,
            n,
            denom,
            dc,
            out,
            sl,
        )
    }
    fn pair_readout(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, DevIdx>,
        b: Ix<'_, DevIdx>,
        m_raw: &CudaSlice<f32>,
        t_raw: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let op = "pair_readout";
        check::pairs(
            op,
            u.len(),
            cols,
            self.shape(a),
            self.shape(b),
            &[out.len()],
        );
        check::loss(op, &[], &[m_raw.len(), t_raw.len()], 0, 0, 0);
        if a.len == 0 {
            return Ok(());
        }
        let cfg = self.grid(op, a.len)?;
        let (ab, bb) = (&a.buf.buf, &b.buf.buf);
        let (c, ao, bo, n) = (i(cols), i(a.off), i(b.off), i(a.len));
        self.k_pair_readout(op, cfg, u, c, ab, ao, bb, bo, m_raw, t_raw, n, out)
    }
    fn sq_error(
        &self,
        x: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        scale: f64,
        dx: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        let op = "sq_error";
        check::loss(
            op,
            &[x.len(), target.len(), dx.len()],
            &[],
            out.len(),
            slot,
            1,
        );
        let n = x.len();
        let s2 = (2.0 * scale) as f32;
        if n > 0 {
            self.k_sq_error_grad(op, self.grid(op, n)?, x, target, s2, i(n), dx)?;
        }
        self.k_sq_error_loss(op, Self::one_block(), x, target, i(n), scale, out, i(slot))
    }
    fn softmax_ce(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        labels: Ix<'_, DevIdx>,
        dlogits: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::softmax_ce(
            logits.len(),
            rows,
            cols,
            self.shape(labels),
            dlogits.len(),
            out.len(),
            slot,
        );
        let (r, c, lb, lo, sl) = (i(rows), i(cols), &labels.buf.buf, i(labels.off), i(slot));
        let cfg = Self::one_block();
        self.k_softmax_ce("softmax_ce", cfg, logits, r, c, lb, lo, dlogits, out, sl)
    }
    fn softmax_rows(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::rowwise("softmax_rows", rows, cols, &[logits.len(), out.len()], &[]);
        if rows == 0 {
            return Ok(());
        }
        let cfg = self.grid("softmax_rows", rows)?;
        self.k_softmax_rows("softmax_rows", cfg, logits, i(rows), i(cols), out)
    }
    fn huber_l2(
        &self,
        p: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        w: Option<&CudaSlice<f32>>,
        h: HuberL2,
        dp: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        let HuberL2 {
            delta,
            smooth,
            lambda,
            denom,
        } = h;
        let mut lens = vec![p.len(), target.len(), dp.len()];
        lens.extend(w.map(|w| w.len()));
        check::loss("huber_l2", &lens, &[], out.len(), slot, 1);
        let (n, sl, sm) = (i(p.len()), i(slot), i32::from(smooth));
        let has_w = i32::from(w.is_some());
        let wv = w.unwrap_or(&self.inner.dummy);
        let cfg = Self::one_block();
        self.k_huber_l2(
            "huber_l2", cfg, p, target, wv, has_w, n, delta, sm, lambda, denom, dp, out, sl,
        )
    }

    fn softmax_backward(
        &self,
        s: &CudaSlice<f32>,
        ds: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let op = "softmax_backward";
        check::rowwise(op, rows, cols, &[s.len(), ds.len(), dx.len()], &[]);
        if rows == 0 {
            return Ok(());
        }
        self.k_softmax_backward(op, self.grid(op, rows)?, s, ds, i(rows), i(cols), dx)
    }

    fn pair_cobce(
        &self,
        q: &CudaSlice<f32>,
        shape: CoBce,
        b_raw: Option<&CudaSlice<f32>>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        dq: &mut CudaSlice<f32>,
        db_raw: Option<&mut CudaSlice<f32>>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::pair_cobce(
            q.len(),
            shape,
            b_raw.map(|b| b.len()),
            y.len(),
            w.len(),
            dq.len(),
            db_raw.as_deref().map(|d| d.len()),
            out.len(),
            slot,
        );
        let CoBce { c, n, eps, denom } = shape;
        let op = "pair_cobce";
        let mut g = self.alloc::<f64>(n.max(1))?;
        let (cc, nn, sl, has_b) = (i(c), i(n), i(slot), i32::from(b_raw.is_some()));
        let bv = b_raw.unwrap_or(&self.inner.dummy);
        let cfg = Self::one_block();
        self.k_pair_cobce(
            op, cfg, q, cc, nn, bv, has_b, y, w, eps, denom, dq, &mut g, out, sl,
        )?;
        if let (Some(b), Some(db)) = (b_raw, db_raw) {
            if c > 0 {
                let cfg = self.grid(op, c * c)?;
                self.k_pair_cobce_db(op, cfg, q, cc, nn, b, &g, db)?;
            }
        }
        Ok(())
    }

    fn spd_logdet_inverse(
        &self,
        m: &CudaSlice<f32>,
        c: usize,
        eps: f64,
        out: &mut CudaSlice<f64>,
        slot: usize,
        minv: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::spd(m.len(), c, minv.len(), out.len(), slot);
        let mut scratch = self.alloc::<f64>((2 * c * c).max(1))?;
        let op = "spd_logdet_inverse";
        let cfg = Self::single();
        self.k_spd_logdet_inverse(op, cfg, m, i(c), eps, out, i(slot), minv, &mut scratch)
    }

    fn student_t(
        &self,
        z: &CudaSlice<f32>,
        mu: &CudaSlice<f32>,
        st: StudentT,
        q: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        check::student_t("student_t", st, z.len(), mu.len(), &[q.len()], None);
        let StudentT {
            rows,
            d,
            k,
            alpha,
            e,
        } = st;
        if rows == 0 {
            return Ok(());
        }
        let cfg = self.grid("student_t", rows)?;
        self.k_student_t("student_t", cfg, z, mu, i(rows), i(d), i(k), alpha, e, q)
    }

    fn student_t_backward(
        &self,
        z: &CudaSlice<f32>,
        mu: &CudaSlice<f32>,
        q: &CudaSlice<f32>,
        dq: &CudaSlice<f32>,
        st: StudentT,
        dz: &mut CudaSlice<f32>,
        dmu: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let op = "student_t_backward";
        check::student_t(
            op,
            st,
            z.len(),
            mu.len(),
            &[q.len(), dq.len()],
            Some(dz.len()),
        );
        check::elementwise(op, &[mu.len(), dmu.len()]);
        let StudentT {
            rows,
            d,
            k,
            alpha,
            e,
        } = st;
        if rows == 0 {
            return Ok(());
        }
        let mut tmp = self.alloc::<f64>(rows * k)?;
        let (r, dd, kk) = (i(rows), i(d), i(k));
        let cfg = self.grid(op, rows)?;
        self.k_student_t_backward_rows(op, cfg, z, mu, q, dq, r, dd, kk, alpha, e, dz, &mut tmp)?;
        if k * d == 0 {
            return Ok(());
        }
        let cfg = self.grid(op, k * d)?;
        self.k_student_t_backward_mu(op, cfg, z, mu, &tmp, r, dd, kk, alpha, dmu)
    }

    fn kl_target(
        &self,
        q: &CudaSlice<f32>,
        p: &CudaSlice<f32>,
        denom: f64,
        dq: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        let op = "kl_target";
        check::loss(op, &[q.len(), p.len(), dq.len()], &[], out.len(), slot, 1);
        let (n, sl) = (i(q.len()), i(slot));
        self.k_kl_target(op, Self::one_block(), q, p, n, denom, dq, out, sl)
    }

    fn spherepair_bce(
        &self,
        c: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        denom: f64,
        dc: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        let op = "spherepair_bce";
        check::loss(
            op,
            &[c.len(), y.len(), w.len(), dc.len()],
            &[],
            out.len(),
            slot,
            1,
        );
        let (n, sl) = (i(c.len()), i(slot));
        self.k_spherepair_bce(op, Self::one_block(), c, y, w, n, denom, dc, out, sl)
    }

    fn eci_fuse(
        &self,
        y: &CudaSlice<f32>,
        delta: &CudaSlice<f32>,
        y_oof: &CudaSlice<f32>,
        xi: f64,
        gamma: f64,
        n0: f64,
        y_bc: &mut CudaSlice<f32>,
        w: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let n = y.len();
        check::elementwise(
            "eci_fuse",
            &[n, delta.len(), y_oof.len(), y_bc.len(), w.len()],
        );
        if n == 0 {
            return Ok(());
        }
        let cfg = self.grid("eci_fuse", n)?;
        self.k_eci_fuse(
            "eci_fuse",
            cfg,
            y,
            delta,
            y_oof,
            i(n),
            xi,
            gamma,
            n0,
            y_bc,
            w,
        )
    }

    fn clip_grad_norm(&self, grads: &mut [&mut CudaSlice<f32>], max_norm: f64) -> DResult<()> {
        let count = grads.len();
        let op = "clip_grad_norm";
        let mut parts = self.alloc::<f64>(count + 1)?;
        for (k, g) in grads.iter().enumerate() {
            self.k_sum_squares(op, Self::one_block(), g, i(g.len()), &mut parts, i(k))?;
        }
        self.k_clip_coef(op, Self::single(), &mut parts, i(count), max_norm)?;
        for g in grads.iter_mut() {
            let n = g.len();
            if n == 0 {
                continue;
            }
            let cfg = self.grid(op, n)?;
            self.k_clip_scale(op, cfg, g, i(n), &parts, i(count))?;
        }
        Ok(())
    }
    fn sum_squares(&self, x: &CudaSlice<f32>) -> DResult<f64> {
        let mut s = self.alloc::<f64>(1)?;
        let op = "sum_squares";
        self.k_sum_squares(op, Self::one_block(), x, i(x.len()), &mut s, 0)?;
        Ok(self.scalars_to_vec(&s)?[0])
    }
    fn scale(&self, x: &mut CudaSlice<f32>, s: f32) -> DResult<()> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        self.k_scale("scale", self.grid("scale", n)?, x, i(n), s)
    }
    fn adam(
        &self,
        p: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        step: u64,
    ) -> DResult<()> {
        check::elementwise("adam", &[p.len(), g.len(), m.len(), v.len()]);
        let n = p.len();
        if n == 0 {
            return Ok(());
        }
        let bc1 = 1.0 - beta1.powi(step as i32);
        let bc2 = 1.0 - beta2.powi(step as i32);
        let (b1, b2) = (beta1 as f32, beta2 as f32);
        let (ob1, ob2) = ((1.0 - beta1) as f32, (1.0 - beta2) as f32);
        let step_size = (lr / bc1) as f32;
        let bc2_sqrt = bc2.sqrt() as f32;
        let eps = eps as f32;
        let cfg = self.grid("adam", n)?;
        self.k_adam(
            "adam",
            cfg,
            p,
            g,
            m,
            v,
            i(n),
            b1,
            b2,
            ob1,
            ob2,
            step_size,
            bc2_sqrt,
            eps,
        )
    }
    fn sgd_momentum(
        &self,
        p: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        buf: &mut CudaSlice<f32>,
        lr: f64,
        momentum: f64,
        first: bool,
    ) -> DResult<()> {
        check::elementwise("sgd_momentum", &[p.len(), g.len(), buf.len()]);
        let n = p.len();
        if n == 0 {
            return Ok(());
        }
        let (mu, lr, f) = (momentum as f32, lr as f32, i32::from(first));
        self.k_sgd("sgd", self.grid("sgd", n)?, p, g, buf, i(n), mu, lr, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_errors_are_the_ones_that_poison_a_context() {
        assert!(is_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        assert!(!is_sticky(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_sticky(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn the_generated_source_declares_every_kernel_before_the_file() {
        let src = kernel_source();
        let head = &src[..src.find("#line 1").expect("a #line directive")];
        assert!(head.contains(&format!("#define RED {RED}")));
        for k in kernel_signatures() {
            assert!(
                head.contains(&format!("void {}(", k.name)),
                "{} has no prototype",
                k.name
            );
            assert!(
                SOURCE.contains(&format!("void {}(", k.name)),
                "{} is not defined in cuda_kernels.cu",
                k.name
            );
        }
        assert!(
            !SOURCE
                .lines()
                .any(|l| l.trim_start().starts_with("#define RED")),
            "RED comes from cuda.rs alone"
        );
    }

    #[test]
    fn the_numerics_class_names_what_changes_bits() {
        let p = Probe {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            memory_bytes: 85_000_000_000,
            driver_api: 13000,
            cublas: (13, 1, 0),
            nvrtc: (13, 0),
        };
        assert_eq!(p.numerics(), "cuda-f32-sm90-132sm-cublas13.1.0-nvrtc13.0");
        assert_eq!(p.arch(), "sm_90");
        let info = p.info();
        assert_eq!(info.name, "cuda:0");
        assert!(info
            .facts
            .iter()
            .any(|(k, v)| k == "cuda_driver_api" && v == "13.0"));
        let other = Probe {
            multiprocessors: 114,
            ..p.clone()
        };
        assert_ne!(other.numerics(), p.numerics(), "H100 PCIe and SXM differ");
    }
}
