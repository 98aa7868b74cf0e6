//! The CUDA device on cudarc with dynamic loading: the binary builds and runs where no CUDA is
//! installed, and [`Cuda::new`] says why when a driver or library is missing.
//!
//! Matrix products go to cuBLAS (fp32, default math mode: no TF32), everything else to the
//! kernels of `cuda_kernels.cu`, compiled once per process by NVRTC. Each [`Cuda`] value owns a
//! stream and a cuBLAS handle; [`Cuda::fork`] gives a training node its own pair on the same
//! context, so nodes sharing a GPU never share a handle. No kernel uses atomics: two runs on the
//! same GPU give the same bits.

use std::sync::{Arc, OnceLock};

use cudarc::cublas::{sys as blas_sys, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, LaunchConfig,
    PushKernelArg,
};

use crate::device::{
    Act, CoBce, DResult, Device, DeviceError, DeviceInfo, GemmSpec, HuberL2, Ix, StudentT,
};

const SOURCE: &str = include_str!("cuda_kernels.cu");
/// Threads per block of element-wise kernels.
const BLOCK: u32 = 256;
/// Threads of the single-block reductions (`RED` in the kernel source).
const RED: u32 = 256;

type I64 = i64;

macro_rules! kernels {
    ($($name:ident),* $(,)?) => {
        struct Kernels { $($name: CudaFunction,)* }
        impl Kernels {
            fn load(m: &Arc<CudaModule>) -> Result<Self, DriverError> {
                Ok(Kernels { $($name: m.load_function(stringify!($name))?,)* })
            }
        }
    };
}

kernels!(
    k_fill,
    k_axpy_range,
    k_set_column,
    k_bias_act,
    k_act_backward,
    k_col_sums_acc,
    k_mul,
    k_mul_acc,
    k_l2norm,
    k_l2norm_backward,
    k_pair_dot,
    k_pair_dot_backward_pass,
    k_pair_dot_backward_serial,
    k_gather_rows,
    k_scatter_add_distinct,
    k_scatter_add_serial,
    k_probpair_bce,
    k_pair_readout,
    k_sq_error_grad,
    k_sq_error_loss,
    k_softmax_ce,
    k_softmax_rows,
    k_huber_l2,
    k_eci_fuse,
    k_sum_squares,
    k_clip_coef,
    k_clip_scale,
    k_scale,
    k_adam,
    k_sgd,
    k_scalars_fill,
    k_scalar_axpy,
    k_scalar_axpy_self,
    k_scalar_to_grad,
    k_softmax_backward,
    k_pair_cobce,
    k_pair_cobce_db,
    k_spd_logdet_inverse,
    k_student_t,
    k_student_t_backward_rows,
    k_student_t_backward_mu,
    k_kl_target,
    k_spherepair_bce,
);

/// What every stream of one context shares.
struct Shared {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    k: Kernels,
    info: DeviceInfo,
}

struct Inner {
    shared: Arc<Shared>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// Passed for optional pointer arguments the kernel does not read.
    dummy: CudaSlice<f32>,
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

/// The PTX of the kernels, compiled once per process.
fn ptx() -> Result<String, String> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        cudarc::nvrtc::compile_ptx(SOURCE)
            .map(|p| p.to_src())
            .map_err(|e| format!("NVRTC could not compile upcc's kernels: {e:?}"))
    })
    .clone()
}

fn unavailable(ordinal: usize, message: impl Into<String>) -> DeviceError {
    DeviceError::Unavailable {
        ordinal,
        message: message.into(),
    }
}

/// Whether the CUDA driver library can be loaded at all.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// How many CUDA devices are visible (0 without a driver).
pub fn visible_devices() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

impl Cuda {
    /// Open CUDA device `ordinal` (after `CUDA_VISIBLE_DEVICES`). Fails with
    /// [`DeviceError::NoDriver`] when no driver library loads, and with
    /// [`DeviceError::Unavailable`] when the device, cuBLAS or NVRTC is missing.
    pub fn new(ordinal: usize) -> DResult<Cuda> {
        if !driver_present() {
            return Err(DeviceError::NoDriver(
                "libcuda.so could not be loaded (no NVIDIA driver on this machine?)".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| unavailable(ordinal, format!("the driver failed to start: {e:?}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(
                ordinal,
                format!(
                    "{count} CUDA device(s) visible (CUDA_VISIBLE_DEVICES={})",
                    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
                ),
            ));
        }
        // SAFETY: only try to dlopen the libraries.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(unavailable(
                ordinal,
                "libcublas could not be loaded; add the CUDA library directory to LD_LIBRARY_PATH",
            ));
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(unavailable(
                ordinal,
                "libnvrtc could not be loaded; add the CUDA library directory to LD_LIBRARY_PATH",
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unavailable(ordinal, format!("cannot create a context: {e:?}")))?;
        // One stream per node and no buffer crosses streams: cudarc's cross-stream events
        // would only add host work per launch.
        // SAFETY: every buffer is used only on the stream that allocated it.
        unsafe { ctx.disable_event_tracking() };
        let ptx = ptx().map_err(|m| unavailable(ordinal, m))?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| unavailable(ordinal, format!("cannot load the kernels: {e:?}")))?;
        let k = Kernels::load(&module)
            .map_err(|e| unavailable(ordinal, format!("cannot load the kernels: {e:?}")))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| unavailable(ordinal, format!("{e:?}")))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let mut facts = vec![
            ("gpu".to_string(), name.clone()),
            ("compute_capability".to_string(), format!("{major}.{minor}")),
        ];
        if let Ok(mem) = ctx.total_mem() {
            facts.push(("gpu_memory_bytes".into(), mem.to_string()));
        }
        let mut v = 0i32;
        // SAFETY: writes one int.
        if unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            == cudarc::driver::sys::CUresult::CUDA_SUCCESS
        {
            facts.push((
                "cuda_driver_api".into(),
                format!("{}.{}", v / 1000, (v % 1000) / 10),
            ));
        }
        if let Ok(driver) = std::fs::read_to_string("/proc/driver/nvidia/version") {
            if let Some(line) = driver.lines().next() {
                facts.push(("nvidia_driver".into(), line.trim().to_string()));
            }
        }
        let shared = Arc::new(Shared {
            ordinal,
            ctx,
            k,
            info: DeviceInfo {
                name: format!("cuda:{ordinal}"),
                numerics: format!("cuda-f32-sm{major}{minor}"),
                facts,
            },
        });
        let mut c = Self::on(shared)?;
        let mut bv = 0i32;
        // SAFETY: writes one int through a live handle.
        if unsafe { blas_sys::cublasGetVersion_v2(*c.inner.blas.handle(), &mut bv) }
            == blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        {
            let inner = Arc::get_mut(&mut c.inner).expect("fresh");
            let shared = Arc::get_mut(&mut inner.shared);
            if let Some(s) = shared {
                s.info.facts.push((
                    "cublas".into(),
                    format!("{}.{}.{}", bv / 10000, (bv % 10000) / 100, bv % 100),
                ));
            }
        }
        Ok(c)
    }

    fn on(shared: Arc<Shared>) -> DResult<Cuda> {
        let ordinal = shared.ordinal;
        let stream = shared
            .ctx
            .new_stream()
            .map_err(|e| unavailable(ordinal, format!("cannot create a stream: {e:?}")))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| unavailable(ordinal, format!("cannot create a cuBLAS handle: {e:?}")))?;
        // fp32 products in plain fp32: no TF32 tensor-op math.
        // SAFETY: sets a mode on a live handle.
        unsafe {
            blas_sys::cublasSetMathMode(*blas.handle(), blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
        }
        .result()
        .map_err(|e| unavailable(ordinal, format!("cannot set the cuBLAS math mode: {e:?}")))?;
        let dummy = stream
            .alloc_zeros::<f32>(1)
            .map_err(|e| unavailable(ordinal, format!("cannot allocate: {e:?}")))?;
        Ok(Cuda {
            inner: Arc::new(Inner {
                shared,
                stream,
                blas,
                dummy,
            }),
        })
    }

    /// A new stream and cuBLAS handle on the same GPU (one per training node).
    pub fn fork(&self) -> DResult<Cuda> {
        Self::on(self.inner.shared.clone())
    }

    /// Provenance facts: GPU model, compute capability, driver, CUDA and cuBLAS versions.
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
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return DeviceError::OutOfMemory {
                device: self.name_(),
                bytes: 0,
            };
        }
        DeviceError::Backend {
            device: self.name_(),
            op,
            message: format!("{e:?}"),
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
            return s.null().map_err(|e| self.err("alloc", e));
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

    fn grid(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((n as u32).div_ceil(BLOCK).max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

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
}

/// Launch `$f` with `$cfg` and the listed arguments (references), mapping errors.
macro_rules! launch {
    ($self:expr, $op:literal, $f:ident, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let mut b = $self.stream().launch_builder(&$self.k().$f);
        $( b.arg($arg); )*
        // SAFETY: every kernel checks its bounds against the lengths passed with the buffers,
        // and the callers assert those lengths match the buffers.
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(|e| $self.err($op, e))
    }};
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
    type Idx = CudaSlice<u32>;
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
        let n = buf.len() as I64;
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "fill",
            k_fill,
            Self::grid(n as usize),
            [buf, &value, &n]
        )
    }
    fn write(&self, dst: &mut CudaSlice<f32>, src: &[f32]) -> DResult<()> {
        assert_eq!(dst.len(), src.len(), "write: length mismatch");
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
        assert!(src_off + len <= src.len() && dst_off + len <= dst.len());
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
        assert!(src_off + len <= src.len() && dst_off + len <= dst.len());
        if len == 0 {
            return Ok(());
        }
        let (so, d0, n) = (src_off as I64, dst_off as I64, len as I64);
        launch!(
            self,
            "axpy",
            k_axpy_range,
            Self::grid(len),
            [&alpha, src, &so, dst, &d0, &n]
        )
    }
    fn set_column(
        &self,
        src: &CudaSlice<f32>,
        dst: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        col: usize,
    ) -> DResult<()> {
        assert!(col < cols && src.len() == rows && dst.len() == rows * cols);
        if rows == 0 {
            return Ok(());
        }
        let (r, c, k) = (rows as I64, cols as I64, col as I64);
        launch!(
            self,
            "set_column",
            k_set_column,
            Self::grid(rows),
            [src, dst, &r, &c, &k]
        )
    }

    fn upload_idx(&self, data: &[u32]) -> DResult<CudaSlice<u32>> {
        let mut b = self.alloc::<u32>(data.len())?;
        if !data.is_empty() {
            self.stream()
                .memcpy_htod(data, &mut b)
                .map_err(|e| self.err("upload", e))?;
        }
        Ok(b)
    }
    fn idx_len(&self, idx: &CudaSlice<u32>) -> usize {
        idx.len()
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
        let n = s.len() as I64;
        if n == 0 {
            return Ok(());
        }
        let off: I64 = 0;
        launch!(
            self,
            "scalars",
            k_scalars_fill,
            Self::grid(n as usize),
            [s, &off, &n, &value]
        )
    }
    fn scalars_combine(
        &self,
        s: &mut CudaSlice<f64>,
        dst: usize,
        terms: &[(usize, f64)],
    ) -> DResult<()> {
        let d = dst as I64;
        if terms.is_empty() {
            let (one, zero) = (1 as I64, 0.0f64);
            return launch!(
                self,
                "scalars",
                k_scalars_fill,
                Self::single(),
                [s, &d, &one, &zero]
            );
        }
        for (i, &(src, coef)) in terms.iter().enumerate() {
            let (ss, keep) = (src as I64, i32::from(i > 0));
            launch!(
                self,
                "scalars",
                k_scalar_axpy_self,
                Self::single(),
                [&mut *s, &ss, &coef, &d, &keep]
            )?;
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
        let (ss, ds, keep) = (src_slot as I64, dst_slot as I64, 1i32);
        launch!(
            self,
            "scalars",
            k_scalar_axpy,
            Self::single(),
            [src, &ss, &coef, dst, &ds, &keep]
        )
    }
    fn scalar_to_grad(
        &self,
        s: &CudaSlice<f64>,
        slot: usize,
        coef: f64,
        grad: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let sl = slot as I64;
        launch!(
            self,
            "scalars",
            k_scalar_to_grad,
            Self::single(),
            [s, &sl, &coef, grad]
        )
    }

    fn gemm(
        &self,
        spec: GemmSpec,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let GemmSpec {
            m,
            n,
            k,
            a_t,
            b_t,
            accumulate,
        } = spec;
        assert_eq!(
            a.len(),
            m * k,
            "gemm: A has {} elements, expected {m}×{k}",
            a.len()
        );
        assert_eq!(
            b.len(),
            k * n,
            "gemm: B has {} elements, expected {k}×{n}",
            b.len()
        );
        assert_eq!(
            c.len(),
            m * n,
            "gemm: C has {} elements, expected {m}×{n}",
            c.len()
        );
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
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS gets B first.
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let cfg = GemmConfig {
            transa: if b_t { CUBLAS_OP_T } else { CUBLAS_OP_N },
            transb: if a_t { CUBLAS_OP_T } else { CUBLAS_OP_N },
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: if b_t { k } else { n } as i32,
            ldb: if a_t { m } else { k } as i32,
            beta: if accumulate { 1.0f32 } else { 0.0 },
            ldc: n as i32,
        };
        // SAFETY: the shapes were asserted against the buffer lengths above.
        unsafe { self.inner.blas.gemm(cfg, b, a, c) }.map_err(|e| DeviceError::Backend {
            device: self.name_(),
            op: "cublasSgemm",
            message: format!("{e:?}"),
        })
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
        assert_eq!(y.len(), rows * cols);
        if bias.is_none() && act == Act::Identity || rows * cols == 0 {
            return Ok(());
        }
        let (r, c, a, has) = (
            rows as I64,
            cols as I64,
            act_code(act),
            i32::from(bias.is_some()),
        );
        let bv = bias.unwrap_or(&self.inner.dummy);
        launch!(
            self,
            "bias_act",
            k_bias_act,
            Self::grid(rows * cols),
            [y, bv, &has, &r, &c, &a]
        )
    }
    fn act_backward(
        &self,
        y: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dz: &mut CudaSlice<f32>,
        act: Act,
    ) -> DResult<()> {
        assert!(y.len() == dy.len() && dz.len() == dy.len());
        let n = dy.len() as I64;
        if n == 0 {
            return Ok(());
        }
        let a = act_code(act);
        launch!(
            self,
            "act_backward",
            k_act_backward,
            Self::grid(n as usize),
            [y, dy, dz, &n, &a]
        )
    }
    fn col_sums_acc(
        &self,
        dz: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        db: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(dz.len() == rows * cols && db.len() == cols);
        if cols == 0 {
            return Ok(());
        }
        let (r, c) = (rows as I64, cols as I64);
        let cfg = LaunchConfig {
            grid_dim: ((cols as u32).div_ceil(32), 1, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "col_sums", k_col_sums_acc, cfg, [dz, &r, &c, db])
    }
    fn axpy(&self, alpha: f32, src: &CudaSlice<f32>, dst: &mut CudaSlice<f32>) -> DResult<()> {
        assert_eq!(src.len(), dst.len());
        let n = src.len();
        self.axpy_range(alpha, src, 0, dst, 0, n)
    }
    fn mul(
        &self,
        x: &CudaSlice<f32>,
        mask: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(x.len() == mask.len() && y.len() == x.len());
        let n = x.len() as I64;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "mul", k_mul, Self::grid(n as usize), [x, mask, y, &n])
    }
    fn mul_acc(
        &self,
        dy: &CudaSlice<f32>,
        mask: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(dy.len() == mask.len() && dx.len() == dy.len());
        let n = dy.len() as I64;
        if n == 0 {
            return Ok(());
        }
        launch!(
            self,
            "mul_acc",
            k_mul_acc,
            Self::grid(n as usize),
            [dy, mask, dx, &n]
        )
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
        assert!(x.len() == rows * cols && y.len() == x.len() && norms.len() == rows);
        if rows == 0 {
            return Ok(());
        }
        let (r, c) = (rows as I64, cols as I64);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (RED, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "l2norm", k_l2norm, cfg, [x, &r, &c, &eps, y, norms])
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
        assert!(y.len() == rows * cols && dy.len() == y.len() && dx.len() == y.len());
        if rows == 0 {
            return Ok(());
        }
        let (r, c) = (rows as I64, cols as I64);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (RED, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            "l2norm_backward",
            k_l2norm_backward,
            cfg,
            [y, norms, &eps, dy, &r, &c, dx]
        )
    }

    fn pair_dot(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, CudaSlice<u32>>,
        b: Ix<'_, CudaSlice<u32>>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(a.len == b.len && out.len() == a.len);
        assert!(a.off + a.len <= a.buf.len() && b.off + b.len <= b.buf.len());
        if a.len == 0 {
            return Ok(());
        }
        let (c, ao, bo, n) = (cols as I64, a.off as I64, b.off as I64, a.len as I64);
        launch!(
            self,
            "pair_dot",
            k_pair_dot,
            Self::grid(a.len),
            [u, &c, a.buf, &ao, b.buf, &bo, &n, out]
        )
    }
    fn pair_dot_backward(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, CudaSlice<u32>>,
        b: Ix<'_, CudaSlice<u32>>,
        g: &CudaSlice<f32>,
        du: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(a.len == b.len && g.len() == a.len && du.len() == u.len());
        if a.len == 0 || cols == 0 {
            return Ok(());
        }
        let (c, ao, bo, n) = (cols as I64, a.off as I64, b.off as I64, a.len as I64);
        if a.distinct && b.distinct {
            // Two passes, each over distinct destination rows.
            launch!(
                self,
                "pair_dot_backward",
                k_pair_dot_backward_pass,
                Self::grid(a.len * cols),
                [u, &c, a.buf, &ao, b.buf, &bo, g, &n, &mut *du]
            )?;
            launch!(
                self,
                "pair_dot_backward",
                k_pair_dot_backward_pass,
                Self::grid(a.len * cols),
                [u, &c, b.buf, &bo, a.buf, &ao, g, &n, du]
            )
        } else {
            launch!(
                self,
                "pair_dot_backward",
                k_pair_dot_backward_serial,
                Self::grid(cols),
                [u, &c, a.buf, &ao, b.buf, &bo, g, &n, du]
            )
        }
    }
    fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        cols: usize,
        idx: Ix<'_, CudaSlice<u32>>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert_eq!(out.len(), idx.len * cols);
        assert!(idx.off + idx.len <= idx.buf.len());
        if idx.len * cols == 0 {
            return Ok(());
        }
        let (c, o, n) = (cols as I64, idx.off as I64, idx.len as I64);
        launch!(
            self,
            "gather",
            k_gather_rows,
            Self::grid(idx.len * cols),
            [x, &c, idx.buf, &o, &n, out]
        )
    }
    fn scatter_add_rows(
        &self,
        dout: &CudaSlice<f32>,
        cols: usize,
        idx: Ix<'_, CudaSlice<u32>>,
        dx: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert_eq!(dout.len(), idx.len * cols);
        if idx.len * cols == 0 {
            return Ok(());
        }
        let (c, o, n) = (cols as I64, idx.off as I64, idx.len as I64);
        if idx.distinct {
            launch!(
                self,
                "scatter",
                k_scatter_add_distinct,
                Self::grid(idx.len * cols),
                [dout, &c, idx.buf, &o, &n, dx]
            )
        } else {
            launch!(
                self,
                "scatter",
                k_scatter_add_serial,
                Self::grid(cols),
                [dout, &c, idx.buf, &o, &n, dx]
            )
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
        assert!(y.len() == c.len() && w.len() == c.len() && dc.len() == c.len());
        let (n, sl) = (c.len() as I64, slot as I64);
        launch!(
            self,
            "probpair_bce",
            k_probpair_bce,
            Self::one_block(),
            [c, m_raw, t_raw, y, w, &n, &denom, dc, out, &sl]
        )
    }
    fn pair_readout(
        &self,
        u: &CudaSlice<f32>,
        cols: usize,
        a: Ix<'_, CudaSlice<u32>>,
        b: Ix<'_, CudaSlice<u32>>,
        m_raw: &CudaSlice<f32>,
        t_raw: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(a.len == b.len && out.len() == a.len);
        if a.len == 0 {
            return Ok(());
        }
        let (c, ao, bo, n) = (cols as I64, a.off as I64, b.off as I64, a.len as I64);
        launch!(
            self,
            "pair_readout",
            k_pair_readout,
            Self::grid(a.len),
            [u, &c, a.buf, &ao, b.buf, &bo, m_raw, t_raw, &n, out]
        )
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
        assert!(x.len() == target.len() && dx.len() == x.len());
        let (n, sl) = (x.len() as I64, slot as I64);
        let s2 = (2.0 * scale) as f32;
        if n > 0 {
            launch!(
                self,
                "sq_error",
                k_sq_error_grad,
                Self::grid(n as usize),
                [x, target, &s2, &n, dx]
            )?;
        }
        launch!(
            self,
            "sq_error",
            k_sq_error_loss,
            Self::one_block(),
            [x, target, &n, &scale, out, &sl]
        )
    }
    fn softmax_ce(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        labels: Ix<'_, CudaSlice<u32>>,
        dlogits: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f64>,
        slot: usize,
    ) -> DResult<()> {
        assert!(logits.len() == rows * cols && dlogits.len() == logits.len() && labels.len == rows);
        let (r, c, lo, sl) = (rows as I64, cols as I64, labels.off as I64, slot as I64);
        launch!(
            self,
            "softmax_ce",
            k_softmax_ce,
            Self::one_block(),
            [logits, &r, &c, labels.buf, &lo, dlogits, out, &sl]
        )
    }
    fn softmax_rows(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        assert!(logits.len() == rows * cols && out.len() == logits.len());
        if rows == 0 {
            return Ok(());
        }
        let (r, c) = (rows as I64, cols as I64);
        launch!(
            self,
            "softmax_rows",
            k_softmax_rows,
            Self::grid(rows),
            [logits, &r, &c, out]
        )
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
        assert!(p.len() == target.len() && dp.len() == p.len());
        let (n, sl, sm) = (p.len() as I64, slot as I64, i32::from(smooth));
        let has_w = i32::from(w.is_some());
        let wv = w.unwrap_or(&self.inner.dummy);
        launch!(
            self,
            "huber_l2",
            k_huber_l2,
            Self::one_block(),
            [p, target, wv, &has_w, &n, &delta, &sm, &lambda, &denom, dp, out, &sl]
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
        assert!(s.len() == rows * cols && ds.len() == s.len() && dx.len() == s.len());
        if rows == 0 {
            return Ok(());
        }
        let (r, c) = (rows as I64, cols as I64);
        launch!(
            self,
            "softmax_backward",
            k_softmax_backward,
            Self::grid(rows),
            [s, ds, &r, &c, dx]
        )
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
        let CoBce { c, n, eps, denom } = shape;
        assert!(q.len() >= 2 * n * c && y.len() == n && w.len() == n && dq.len() == q.len());
        let mut g = self.alloc::<f64>(n.max(1))?;
        let (cc, nn, sl, has_b) = (c as I64, n as I64, slot as I64, i32::from(b_raw.is_some()));
        let bv = b_raw.unwrap_or(&self.inner.dummy);
        launch!(
            self,
            "pair_cobce",
            k_pair_cobce,
            Self::one_block(),
            [q, &cc, &nn, bv, &has_b, y, w, &eps, &denom, &mut *dq, &mut g, out, &sl]
        )?;
        if let (Some(b), Some(db)) = (b_raw, db_raw) {
            if c > 0 {
                launch!(
                    self,
                    "pair_cobce",
                    k_pair_cobce_db,
                    Self::grid(c * c),
                    [q, &cc, &nn, b, &g, db]
                )?;
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
        assert!(m.len() == c * c && minv.len() == c * c);
        let mut scratch = self.alloc::<f64>((2 * c * c).max(1))?;
        let (cc, sl) = (c as I64, slot as I64);
        launch!(
            self,
            "spd_logdet_inverse",
            k_spd_logdet_inverse,
            Self::single(),
            [m, &cc, &eps, out, &sl, minv, &mut scratch]
        )
    }

    fn student_t(
        &self,
        z: &CudaSlice<f32>,
        mu: &CudaSlice<f32>,
        st: StudentT,
        q: &mut CudaSlice<f32>,
    ) -> DResult<()> {
        let StudentT {
            rows,
            d,
            k,
            alpha,
            e,
        } = st;
        assert!(z.len() == rows * d && mu.len() == k * d && q.len() == rows * k);
        if rows == 0 {
            return Ok(());
        }
        let (r, dd, kk) = (rows as I64, d as I64, k as I64);
        launch!(
            self,
            "student_t",
            k_student_t,
            Self::grid(rows),
            [z, mu, &r, &dd, &kk, &alpha, &e, q]
        )
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
        let (r, dd, kk) = (rows as I64, d as I64, k as I64);
        launch!(
            self,
            "student_t_backward",
            k_student_t_backward_rows,
            Self::grid(rows),
            [z, mu, q, dq, &r, &dd, &kk, &alpha, &e, dz, &mut tmp]
        )?;
        launch!(
            self,
            "student_t_backward",
            k_student_t_backward_mu,
            Self::grid(k * d),
            [z, mu, &tmp, &r, &dd, &kk, &alpha, dmu]
        )
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
        assert!(q.len() == p.len() && dq.len() == q.len());
        let (n, sl) = (q.len() as I64, slot as I64);
        launch!(
            self,
            "kl_target",
            k_kl_target,
            Self::one_block(),
            [q, p, &n, &denom, dq, out, &sl]
        )
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
        assert!(y.len() == c.len() && w.len() == c.len() && dc.len() == c.len());
        let (n, sl) = (c.len() as I64, slot as I64);
        launch!(
            self,
            "spherepair_bce",
            k_spherepair_bce,
            Self::one_block(),
            [c, y, w, &n, &denom, dc, out, &sl]
        )
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
        assert!(delta.len() == n && y_oof.len() == n && y_bc.len() == n && w.len() == n);
        if n == 0 {
            return Ok(());
        }
        let nn = n as I64;
        launch!(
            self,
            "eci_fuse",
            k_eci_fuse,
            Self::grid(n),
            [y, delta, y_oof, &nn, &xi, &gamma, &n0, y_bc, w]
        )
    }

    fn clip_grad_norm(&self, grads: &mut [&mut CudaSlice<f32>], max_norm: f64) -> DResult<()> {
        let count = grads.len();
        let mut parts = self.alloc::<f64>(count + 1)?;
        for (i, g) in grads.iter().enumerate() {
            let (n, sl) = (g.len() as I64, i as I64);
            launch!(
                self,
                "clip_grad_norm",
                k_sum_squares,
                Self::one_block(),
                [&**g, &n, &mut parts, &sl]
            )?;
        }
        let c = count as I64;
        launch!(
            self,
            "clip_grad_norm",
            k_clip_coef,
            Self::single(),
            [&mut parts, &c, &max_norm]
        )?;
        for g in grads.iter_mut() {
            let n = g.len() as I64;
            if n == 0 {
                continue;
            }
            launch!(
                self,
                "clip_grad_norm",
                k_clip_scale,
                Self::grid(n as usize),
                [&mut **g, &n, &parts, &c]
            )?;
        }
        Ok(())
    }
    fn sum_squares(&self, x: &CudaSlice<f32>) -> DResult<f64> {
        let mut s = self.alloc::<f64>(1)?;
        let (n, sl) = (x.len() as I64, 0 as I64);
        launch!(
            self,
            "sum_squares",
            k_sum_squares,
            Self::one_block(),
            [x, &n, &mut s, &sl]
        )?;
        Ok(self.scalars_to_vec(&s)?[0])
    }
    fn scale(&self, x: &mut CudaSlice<f32>, s: f32) -> DResult<()> {
        let n = x.len() as I64;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "scale", k_scale, Self::grid(n as usize), [x, &n, &s])
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
        let n = p.len() as I64;
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
        launch!(
            self,
            "adam",
            k_adam,
            Self::grid(n as usize),
            [p, g, m, v, &n, &b1, &b2, &ob1, &ob2, &step_size, &bc2_sqrt, &eps]
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
        let n = p.len() as I64;
        if n == 0 {
            return Ok(());
        }
        let (mu, lr, f) = (momentum as f32, lr as f32, i32::from(first));
        launch!(
            self,
            "sgd",
            k_sgd,
            Self::grid(n as usize),
            [p, g, buf, &n, &mu, &lr, &f]
        )
    }
}
