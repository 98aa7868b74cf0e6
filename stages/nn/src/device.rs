//! The device boundary: every numeric kernel the training code uses, behind one fallible trait.
//!
//! Training code (graph, layers, optimisers, the stages) holds a device *value* and only calls
//! [`Device`] methods, so the same code runs on [`Cpu`](crate::Cpu) and, with the `cuda`
//! feature, on [`Cuda`](crate::Cuda). Every method returns a [`DResult`]: a GPU backend can run
//! out of memory or fail a launch, and the caller decides what that means (a failed node, not a
//! panic). Shape mismatches are programming errors and stay assertions.
//!
//! Data lives on the device: tensors ([`Device::Buf`], element type `T`), index vectors
//! ([`Device::Idx`], `u32`, for gathers and pairs) and loss accumulators ([`Device::Scalars`],
//! `f64` slots), so a training epoch uploads its batch orders once and reads its losses back
//! once, and nothing in between waits on the host.
//!
//! Determinism: every kernel gives the same bits on every run on the same device class. The
//! CPU's element-wise kernels split work into fixed-size chunks and reduce in a fixed order;
//! `gemm` splits over output tiles only. A GPU backend must avoid order-dependent atomics.

use crate::check::IxShape;
use crate::scalar::Real;

/// Activation fused into a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Identity,
    Relu,
    Tanh,
}

/// Shape and layout of one matrix product `C (+)= A·B` with row-major storage.
/// `a_t` means A is stored transposed (k×m), `b_t` that B is stored transposed (n×k).
#[derive(Clone, Copy, Debug)]
pub struct GemmSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_t: bool,
    pub b_t: bool,
    /// Add into C instead of overwriting it.
    pub accumulate: bool,
}

/// A failure of the device itself (never of the data): the caller turns it into a failed node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// No CUDA driver library could be loaded.
    #[error("no CUDA driver was found: {0}")]
    NoDriver(String),
    /// A driver is there but sees no device (`CUDA_VISIBLE_DEVICES` empty, no GPU, a stub
    /// driver library).
    #[error("no CUDA device is visible: {0}")]
    NoDevice(String),
    /// A device is visible but the backend cannot use it (a library missing, the kernels not
    /// compiling or loading). `fix` says what to change.
    #[error("CUDA device {ordinal} is not available: {message}")]
    Unavailable {
        ordinal: usize,
        message: String,
        fix: String,
    },
    /// An allocation did not fit.
    #[error("{device}: out of memory allocating {bytes} bytes")]
    OutOfMemory { device: String, bytes: usize },
    /// Any other backend failure (launch, copy, library call).
    #[error("{device}: {op} failed: {message}")]
    Backend {
        device: String,
        op: &'static str,
        message: String,
    },
    /// A sticky failure of the device's context (an illegal address, a failed launch): every
    /// later call on that context fails too, so nothing more may be scheduled onto the device
    /// in this process.
    #[error("{device}: {op} failed and the GPU cannot be used again in this process: {message}")]
    Fatal {
        device: String,
        op: &'static str,
        message: String,
    },
    /// The binary has no CUDA backend.
    #[error("this upcc was built without CUDA support (cargo feature `cuda`)")]
    NotBuilt,
}

impl DeviceError {
    /// Whether the device that raised it is lost for the rest of the process.
    pub fn is_fatal(&self) -> bool {
        matches!(self, DeviceError::Fatal { .. })
    }

    /// What the user can change, where the error says (a library path, `--device cpu`).
    pub fn fix(&self) -> Option<&str> {
        match self {
            DeviceError::Unavailable { fix, .. } => Some(fix),
            _ => None,
        }
    }
}

pub type DResult<T> = Result<T, DeviceError>;

/// A range of an index vector on the device: `len` entries from `off`. `distinct` promises
/// that no index repeats within the range, which lets a GPU scatter without ordering concerns.
#[derive(Debug)]
pub struct Ix<'a, I> {
    pub buf: &'a I,
    pub off: usize,
    pub len: usize,
    pub distinct: bool,
    /// One more than the largest value in this range, when the caller knows it (an iota
    /// range); otherwise the checks use the whole buffer's.
    pub bound: Option<usize>,
}

impl<I> Clone for Ix<'_, I> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I> Copy for Ix<'_, I> {}

impl<'a, I> Ix<'a, I> {
    pub fn new(buf: &'a I, off: usize, len: usize) -> Self {
        Ix {
            buf,
            off,
            len,
            distinct: false,
            bound: None,
        }
    }

    /// A range whose indices are all different (the caller guarantees it).
    pub fn distinct(buf: &'a I, off: usize, len: usize) -> Self {
        Ix {
            buf,
            off,
            len,
            distinct: true,
            bound: None,
        }
    }

    /// A range of a buffer holding 0, 1, 2, … at its positions: its values are
    /// `off..off + len`, all different.
    pub fn iota(buf: &'a I, off: usize, len: usize) -> Self {
        Ix {
            buf,
            off,
            len,
            distinct: true,
            bound: Some(off + len),
        }
    }
}

/// Facts about a device that go into provenance (never into keys, except through `numerics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `cpu`, `cuda:0`, ...
    pub name: String,
    /// What can change output bits: backend, precision and, for CUDA, the architecture.
    pub numerics: String,
    /// Human-readable facts: GPU model, driver, CUDA and cuBLAS versions, memory.
    pub facts: Vec<(String, String)>,
}

/// Constants of [`Device::huber_l2`]: the Huber transition δ (smooth-L1 form with `smooth`),
/// the L2 weight λ and the denominator of the mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HuberL2 {
    pub delta: f64,
    pub smooth: bool,
    pub lambda: f64,
    pub denom: f64,
}

/// Shape and constants of [`Device::pair_cobce`]: c clusters, n pairs, the clamp ε and the
/// denominator of the mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoBce {
    pub c: usize,
    pub n: usize,
    pub eps: f64,
    pub denom: f64,
}

/// Shape and kernel of [`Device::student_t`]: rows × d embeddings against k × d centres,
/// degrees of freedom α and exponent e.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StudentT {
    pub rows: usize,
    pub d: usize,
    pub k: usize,
    pub alpha: f64,
    pub e: f64,
}

/// Every kernel of the numeric layer.
///
/// Buffers are row-major. "Slots" index a [`Device::Scalars`] vector of f64 values (losses and
/// their statistics), so per-batch values accumulate on the device.
pub trait Device<T: Real>: Clone + Send + Sync + 'static {
    type Buf: Send + Sync + std::fmt::Debug;
    type Idx: Send + Sync + std::fmt::Debug;
    type Scalars: Send + Sync + std::fmt::Debug;

    /// `cpu`, `cuda:0`, ...
    fn name(&self) -> String;
    /// The numerics class (part of node keys): `cpu-f32-avx512`, `cuda-f32-sm90-132sm-…`, ...
    fn numerics(&self) -> String;
    /// Whether independent models may be trained from several host threads at once.
    fn concurrent_models(&self) -> bool;
    /// Wait until queued work is done (timing; a no-op on the CPU).
    fn synchronize(&self) -> DResult<()>;

    // ---- memory -------------------------------------------------------------------------
    fn zeros(&self, len: usize) -> DResult<Self::Buf>;
    fn upload(&self, data: &[T]) -> DResult<Self::Buf>;
    fn to_vec(&self, buf: &Self::Buf) -> DResult<Vec<T>>;
    fn len(&self, buf: &Self::Buf) -> usize;
    fn fill(&self, buf: &mut Self::Buf, value: T) -> DResult<()>;
    /// Copy host data into an existing buffer of the same length.
    fn write(&self, dst: &mut Self::Buf, src: &[T]) -> DResult<()>;
    /// dst[dst_off..dst_off+len] = src[src_off..src_off+len].
    fn copy_range(
        &self,
        src: &Self::Buf,
        src_off: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        len: usize,
    ) -> DResult<()>;
    /// dst[dst_off..][..len] += alpha·src[src_off..][..len].
    fn axpy_range(
        &self,
        alpha: T,
        src: &Self::Buf,
        src_off: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        len: usize,
    ) -> DResult<()>;
    /// Column `col` of a rows×cols matrix := src (rows values).
    fn set_column(
        &self,
        src: &Self::Buf,
        dst: &mut Self::Buf,
        rows: usize,
        cols: usize,
        col: usize,
    ) -> DResult<()>;

    fn upload_idx(&self, data: &[u32]) -> DResult<Self::Idx>;
    fn idx_len(&self, idx: &Self::Idx) -> usize;
    /// One more than the largest index of the buffer (0 when empty), recorded at upload: what
    /// [`crate::check`] holds index values against.
    fn idx_bound(&self, idx: &Self::Idx) -> usize;
    /// An index range as [`crate::check`] sees it.
    fn ix_shape(&self, i: Ix<'_, Self::Idx>) -> IxShape {
        IxShape {
            off: i.off,
            len: i.len,
            buf_len: self.idx_len(i.buf),
            bound: i.bound.unwrap_or_else(|| self.idx_bound(i.buf)),
        }
    }

    /// `len` zeroed f64 slots.
    fn scalars(&self, len: usize) -> DResult<Self::Scalars>;
    fn scalars_to_vec(&self, s: &Self::Scalars) -> DResult<Vec<f64>>;
    fn scalars_fill(&self, s: &mut Self::Scalars, value: f64) -> DResult<()>;
    /// s[dst] = Σ coef·s[src] over `terms` (summed in order from 0).
    fn scalars_combine(
        &self,
        s: &mut Self::Scalars,
        dst: usize,
        terms: &[(usize, f64)],
    ) -> DResult<()>;
    /// dst[dst_slot] += coef·src[src_slot].
    fn scalars_accumulate(
        &self,
        src: &Self::Scalars,
        src_slot: usize,
        coef: f64,
        dst: &mut Self::Scalars,
        dst_slot: usize,
    ) -> DResult<()>;
    /// grad[0] += T(coef·s[slot]) (gradients of 1×1 parameters computed by a loss kernel).
    fn scalar_to_grad(
        &self,
        s: &Self::Scalars,
        slot: usize,
        coef: f64,
        grad: &mut Self::Buf,
    ) -> DResult<()>;

    // ---- dense layers -------------------------------------------------------------------
    /// C (+)= A·B.
    fn gemm(&self, spec: GemmSpec, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> DResult<()>;
    /// Two independent products, run concurrently where that is faster (weight and input
    /// gradients of one layer).
    fn gemm2(
        &self,
        s1: GemmSpec,
        a1: &Self::Buf,
        b1: &Self::Buf,
        c1: &mut Self::Buf,
        s2: GemmSpec,
        a2: &Self::Buf,
        b2: &Self::Buf,
        c2: &mut Self::Buf,
    ) -> DResult<()>;
    /// y[r, :] = act(y[r, :] + bias) for a rows×cols matrix.
    fn bias_act(
        &self,
        y: &mut Self::Buf,
        bias: Option<&Self::Buf>,
        rows: usize,
        cols: usize,
        act: Act,
    ) -> DResult<()>;
    /// dz = dy ⊙ act'(y), from the activation's output y.
    fn act_backward(
        &self,
        y: &Self::Buf,
        dy: &Self::Buf,
        dz: &mut Self::Buf,
        act: Act,
    ) -> DResult<()>;
    /// db += column sums of dz (rows×cols).
    fn col_sums_acc(
        &self,
        dz: &Self::Buf,
        rows: usize,
        cols: usize,
        db: &mut Self::Buf,
    ) -> DResult<()>;
    /// dst += alpha·src.
    fn axpy(&self, alpha: T, src: &Self::Buf, dst: &mut Self::Buf) -> DResult<()>;
    /// y = x ⊙ mask.
    fn mul(&self, x: &Self::Buf, mask: &Self::Buf, y: &mut Self::Buf) -> DResult<()>;
    /// dx += dy ⊙ mask.
    fn mul_acc(&self, dy: &Self::Buf, mask: &Self::Buf, dx: &mut Self::Buf) -> DResult<()>;

    /// y = x / max(‖x_r‖, eps) row-wise; norms gets max(‖x_r‖, eps).
    fn l2norm(
        &self,
        x: &Self::Buf,
        rows: usize,
        cols: usize,
        eps: T,
        y: &mut Self::Buf,
        norms: &mut Self::Buf,
    ) -> DResult<()>;
    /// dx += (dy − y (y·dy)) / norm row-wise; rows whose norm was clamped at eps are linear.
    fn l2norm_backward(
        &self,
        y: &Self::Buf,
        norms: &Self::Buf,
        eps: T,
        dy: &Self::Buf,
        rows: usize,
        cols: usize,
        dx: &mut Self::Buf,
    ) -> DResult<()>;

    // ---- indexing -----------------------------------------------------------------------
    /// out[i] = ⟨u[a_i], u[b_i]⟩ (accumulated in T).
    fn pair_dot(
        &self,
        u: &Self::Buf,
        cols: usize,
        a: Ix<'_, Self::Idx>,
        b: Ix<'_, Self::Idx>,
        out: &mut Self::Buf,
    ) -> DResult<()>;
    /// du[a_i] += g_i u[b_i]; du[b_i] += g_i u[a_i], pairs in order.
    fn pair_dot_backward(
        &self,
        u: &Self::Buf,
        cols: usize,
        a: Ix<'_, Self::Idx>,
        b: Ix<'_, Self::Idx>,
        g: &Self::Buf,
        du: &mut Self::Buf,
    ) -> DResult<()>;
    /// out = x[idx, :].
    fn gather_rows(
        &self,
        x: &Self::Buf,
        cols: usize,
        idx: Ix<'_, Self::Idx>,
        out: &mut Self::Buf,
    ) -> DResult<()>;
    /// dx[idx_i, :] += dout[i, :], rows in order.
    fn scatter_add_rows(
        &self,
        dout: &Self::Buf,
        cols: usize,
        idx: Ix<'_, Self::Idx>,
        dx: &mut Self::Buf,
    ) -> DResult<()>;

    // ---- losses (value into a slot, input gradient into a buffer) -----------------------
    /// Fused ProbPair readout and weighted BCE with m = tanh(m̃), T = softplus(T̃) read from
    /// the 1×1 parameter buffers: loss = (1/denom) Σ w_i [softplus(l_i) − y_i l_i],
    /// l_i = (c_i − m)/T. Writes d loss/d c_i into `dc`, the loss into `out[slot]` and
    /// d loss/d m̃, d loss/d T̃ into `out[slot + 1]`, `out[slot + 2]`.
    fn probpair_bce(
        &self,
        c: &Self::Buf,
        m_raw: &Self::Buf,
        t_raw: &Self::Buf,
        y: &Self::Buf,
        w: &Self::Buf,
        denom: f64,
        dc: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;
    /// Pair beliefs of embeddings: out_i = σ((⟨u[a_i], u[b_i]⟩ − m)/T) with the dot, m = tanh(m̃)
    /// and T = softplus(T̃) in f64 (the read-out used for predictions, no gradients).
    fn pair_readout(
        &self,
        u: &Self::Buf,
        cols: usize,
        a: Ix<'_, Self::Idx>,
        b: Ix<'_, Self::Idx>,
        m_raw: &Self::Buf,
        t_raw: &Self::Buf,
        out: &mut Self::Buf,
    ) -> DResult<()>;
    /// out[slot] = scale · Σ (x − target)²; dx = 2·scale·(x − target).
    fn sq_error(
        &self,
        x: &Self::Buf,
        target: &Self::Buf,
        scale: f64,
        dx: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;
    /// Mean softmax cross-entropy of logits (rows×cols) against labels into `out[slot]`, the
    /// number of correct argmax predictions into `out[slot + 1]`; dlogits = (p − onehot)/rows.
    fn softmax_ce(
        &self,
        logits: &Self::Buf,
        rows: usize,
        cols: usize,
        labels: Ix<'_, Self::Idx>,
        dlogits: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;
    /// Row-wise softmax (for predictions).
    fn softmax_rows(
        &self,
        logits: &Self::Buf,
        rows: usize,
        cols: usize,
        out: &mut Self::Buf,
    ) -> DResult<()>;
    /// out[slot] = (1/denom) Σ w_i [huber_δ(p_i − t_i) + λ p_i²]; dp written. With `smooth`,
    /// huber is the smooth-L1 form (½r²/δ inside, |r| − ½δ outside) instead of ½r² / δ(|r| − ½δ).
    fn huber_l2(
        &self,
        p: &Self::Buf,
        target: &Self::Buf,
        w: Option<&Self::Buf>,
        h: HuberL2,
        dp: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;

    /// dx += s ⊙ (ds − ⟨ds_r, s_r⟩) row-wise, from the softmax output s (rows×cols).
    fn softmax_backward(
        &self,
        s: &Self::Buf,
        ds: &Self::Buf,
        rows: usize,
        cols: usize,
        dx: &mut Self::Buf,
    ) -> DResult<()>;

    // ---- deep-clustering baselines ------------------------------------------------------
    /// Co-assignment BCE of the pairs (i, n + i), i < n, of the rows of q (soft assignments,
    /// ≥ 2n × c): P_i = q_iᵀ B q_{n+i} with B = σ(B′) from `b_raw` (c×c), or B = I without it;
    /// P clamped to [eps, 1 − eps]; loss = (1/denom) Σ w_i BCE(y_i, P_i) into `out[slot]`.
    /// dq (rows 0..2n) and dB′ are *added* to.
    fn pair_cobce(
        &self,
        q: &Self::Buf,
        shape: CoBce,
        b_raw: Option<&Self::Buf>,
        y: &Self::Buf,
        w: &Self::Buf,
        dq: &mut Self::Buf,
        db_raw: Option<&mut Self::Buf>,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;
    /// For a symmetric positive definite c×c matrix m + eps·I: log det into `out[slot]` (f64,
    /// by Cholesky) and the inverse into `minv`. A matrix that is not positive definite gives
    /// −inf and a zero inverse (no gradient).
    fn spd_logdet_inverse(
        &self,
        m: &Self::Buf,
        c: usize,
        eps: f64,
        out: &mut Self::Scalars,
        slot: usize,
        minv: &mut Self::Buf,
    ) -> DResult<()>;
    /// Student-t soft assignments of rows of z (rows×d) to centres mu (k×d):
    /// q_jc ∝ (1 + ‖z_j − μ_c‖²/α)^(−e), rows normalised to 1.
    fn student_t(
        &self,
        z: &Self::Buf,
        mu: &Self::Buf,
        st: StudentT,
        q: &mut Self::Buf,
    ) -> DResult<()>;
    /// Backward of [`Device::student_t`] from its output q and dq: dz and dmu are added to.
    fn student_t_backward(
        &self,
        z: &Self::Buf,
        mu: &Self::Buf,
        q: &Self::Buf,
        dq: &Self::Buf,
        st: StudentT,
        dz: &mut Self::Buf,
        dmu: &mut Self::Buf,
    ) -> DResult<()>;
    /// KL(P ‖ Q) of a fixed target p against q (rows×cols), summed over columns and divided by
    /// `denom`, into `out[slot]`; dq = −p/(q·denom) written.
    fn kl_target(
        &self,
        q: &Self::Buf,
        p: &Self::Buf,
        denom: f64,
        dq: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;
    /// Soft SpherePair BCE on pair cosines c: s⁺ = (c + 1)/2, s⁻ = c²,
    /// loss = −(1/denom) Σ w_i [y_i log s⁺_i + (1 − y_i) log(1 − s⁻_i)] (logs floored at −100,
    /// as PyTorch's BCE) into `out[slot]`; dc written.
    fn spherepair_bce(
        &self,
        c: &Self::Buf,
        y: &Self::Buf,
        w: &Self::Buf,
        denom: f64,
        dc: &mut Self::Buf,
        out: &mut Self::Scalars,
        slot: usize,
    ) -> DResult<()>;

    // ---- ECI-PP ------------------------------------------------------------------------
    /// Screening and Bayesian-confidence fusion (Eqs. 10–11) in f64 per constraint:
    /// y_cor = softclip_ξ(y + Δ̂), gap = |softclip_ξ(ŷ_oof) − y_cor|, w = (1 − gap)^γ,
    /// y_BC = (y + n0·w·y_cor)/(1 + n0·w).
    fn eci_fuse(
        &self,
        y: &Self::Buf,
        delta: &Self::Buf,
        y_oof: &Self::Buf,
        xi: f64,
        gamma: f64,
        n0: f64,
        y_bc: &mut Self::Buf,
        w: &mut Self::Buf,
    ) -> DResult<()>;

    // ---- optimisation -------------------------------------------------------------------
    /// PyTorch's `clip_grad_norm_` over all `grads` at once: the global norm is one f64
    /// reduction (buffers in order), and every gradient is scaled by max/(norm + 1e-6) when that
    /// is below 1. Nothing is read back to the host.
    fn clip_grad_norm(&self, grads: &mut [&mut Self::Buf], max_norm: f64) -> DResult<()>;
    /// Σ x² (f64 accumulation, fixed order), read back.
    fn sum_squares(&self, x: &Self::Buf) -> DResult<f64>;
    /// x *= s.
    fn scale(&self, x: &mut Self::Buf, s: T) -> DResult<()>;
    /// One Adam update (PyTorch semantics; `step` counts from 1).
    fn adam(
        &self,
        p: &mut Self::Buf,
        g: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        step: u64,
    ) -> DResult<()>;
    /// One SGD-with-momentum update (PyTorch semantics: buf = μ·buf + g, p −= lr·buf; plain SGD
    /// when μ = 0).
    fn sgd_momentum(
        &self,
        p: &mut Self::Buf,
        g: &Self::Buf,
        buf: &mut Self::Buf,
        lr: f64,
        momentum: f64,
        first: bool,
    ) -> DResult<()>;
}
