//! The CPU device: the `gemm` crate for products, rayon for large element-wise work.
//!
//! Every kernel gives the same bits whatever the number of threads: element-wise kernels are
//! split into fixed-size chunks, reductions run in a fixed order, and `gemm` splits work over
//! output tiles only (its k-loop order does not depend on threads), which a test below checks.

use rayon::prelude::*;

use crate::check;
use crate::device::{Act, CoBce, DResult, Device, DeviceError, GemmSpec, HuberL2, Ix, StudentT};
use crate::scalar::{sigmoid, softplus, Real};
use crate::science::{bayesian_confidence, huber, screen};

/// The CPU device.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// An index vector in host memory, with one more than its largest value (what
/// [`check`] holds index values against).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostIdx {
    data: Vec<u32>,
    bound: usize,
}

impl HostIdx {
    pub fn new(data: &[u32]) -> Self {
        HostIdx {
            data: data.to_vec(),
            bound: data.iter().max().map_or(0, |&m| m as usize + 1),
        }
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.data
    }
}

/// An index range as [`check`] sees it.
fn shape(i: Ix<'_, HostIdx>) -> check::IxShape {
    check::IxShape {
        off: i.off,
        len: i.len,
        buf_len: i.buf.data.len(),
        bound: i.bound.unwrap_or(i.buf.bound),
    }
}

/// The host slice an index range names.
fn ix<'a>(i: Ix<'a, HostIdx>) -> &'a [u32] {
    &i.buf.data[i.off..i.off + i.len]
}

/// Elements per chunk of element-wise kernels (fixed, so results never depend on threads).
const CHUNK: usize = 1 << 15;

fn par_zip<T: Real>(a: &mut [T], b: &[T], f: impl Fn(&mut T, T) + Sync + Send) {
    if a.len() >= 2 * CHUNK {
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(p, &q)| f(p, q)));
    } else {
        a.iter_mut().zip(b).for_each(|(p, &q)| f(p, q));
    }
}

fn par_zip3<T: Real>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(&mut T, T, T) + Sync + Send) {
    if out.len() >= 2 * CHUNK {
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK))
            .zip(b.par_chunks(CHUNK))
            .for_each(|((o, x), y)| {
                o.iter_mut()
                    .zip(x)
                    .zip(y)
                    .for_each(|((o, &x), &y)| f(o, x, y))
            });
    } else {
        out.iter_mut()
            .zip(a)
            .zip(b)
            .for_each(|((o, &x), &y)| f(o, x, y));
    }
}

/// An empty vector with room for `len` values, or `OutOfMemory` where the allocator refuses
/// (an address-space or cgroup limit): a buffer too large for this process is an error of
/// the node that asked for it, never an abort of the process.
fn reserve<T>(len: usize) -> DResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| DeviceError::OutOfMemory {
            device: "cpu".into(),
            bytes: len.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(v)
}

/// `len` copies of `value`, fallibly (see `reserve`).
fn filled<T: Clone>(len: usize, value: T) -> DResult<Vec<T>> {
    let mut v = reserve(len)?;
    v.resize(len, value);
    Ok(v)
}

/// The depth of every product `gemm` is handed (K_BLOCK values of k at most): `gemm` splits
/// a product along k into blocks whose size it derives from the L1 cache's geometry, which
/// changes the order of each sum and so the bits between CPU models. It never splits a
/// product of depth ≤ 512 (its block size is at least 512), so upcc splits longer ones itself
/// at fixed points: the bits then depend on the instruction set only, which the numerics
/// class names ([`cpu_isa`]).
pub const K_BLOCK: usize = 512;

/// The depth block in use: [`K_BLOCK`] unless [`set_k_block`] chose another.
static K_BLOCK_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(K_BLOCK);

/// Split products every `kb` terms instead of [`K_BLOCK`] (1 ≤ kb ≤ K_BLOCK) for the rest of
/// the process: a change of rounding alone, for measuring how far rounding moves a result
/// (`UPCC_TEST_K_BLOCK`). The numerics class names it (`-kb500`), so its results never share
/// keys with ordinary ones.
pub fn set_k_block(kb: usize) {
    assert!(
        (1..=K_BLOCK).contains(&kb),
        "a depth block of 1..={K_BLOCK}"
    );
    K_BLOCK_NOW.store(kb, std::sync::atomic::Ordering::Relaxed);
}

/// The depth block products are split at now (see [`set_k_block`]).
pub fn k_block() -> usize {
    K_BLOCK_NOW.load(std::sync::atomic::Ordering::Relaxed)
}

/// The instruction set `gemm` dispatches its f32/f64 kernels to on this CPU, as the numerics
/// class names it: `avx512`, `fma` (AVX2 + FMA), `neon` or `scalar`.
pub fn cpu_isa() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "fma";
        }
        "scalar"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "neon";
        }
        "scalar"
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

/// C (m×n, row-major, `c` pointing at it) (+)= A·B with A and B given by pointer and strides
/// (element (i, p) of A at `a + i·a_rs + p·a_cs`, (p, j) of B at `b + p·b_rs + j·b_cs`),
/// in depth blocks of at most [`K_BLOCK`], in order.
///
/// # Safety
/// The pointers must cover the m×k, k×n and m×n elements their strides address, and C must
/// not alias A or B.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_blocked<T: Real>(
    (m, n, k): (usize, usize, usize),
    c: *mut T,
    accumulate: bool,
    (a, a_cs, a_rs): (*const T, isize, isize),
    (b, b_cs, b_rs): (*const T, isize, isize),
    par: gemm::Parallelism,
) {
    let block = k_block();
    let mut p = 0;
    while p < k {
        let kb = block.min(k - p);
        // SAFETY: the caller's pointers cover depth k; this block is depth p..p+kb of it.
        unsafe {
            gemm::gemm(
                m,
                n,
                kb,
                c,
                1,
                n as isize,
                accumulate || p > 0,
                a.offset(p as isize * a_cs),
                a_cs,
                a_rs,
                b.offset(p as isize * b_rs),
                b_cs,
                b_rs,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                par,
            );
        }
        p += kb;
    }
}

impl Cpu {
    /// Rows `off..off+spec.m` of a transposed-stored A (k×full_m) times B into C.
    fn run_gemm_strided<T: Real>(
        spec: GemmSpec,
        a: &[T],
        off: usize,
        full_m: usize,
        b: &[T],
        c: &mut [T],
    ) {
        let GemmSpec {
            m,
            n,
            k,
            b_t,
            accumulate,
            ..
        } = spec;
        assert!(spec.a_t && off + m <= full_m && a.len() == full_m * k);
        assert_eq!(b.len(), k * n);
        assert_eq!(c.len(), m * n);
        if m == 0 || n == 0 || k == 0 {
            if k == 0 && !accumulate {
                c.fill(T::ZERO);
            }
            return;
        }
        let (b_cs, b_rs) = if b_t {
            (k as isize, 1)
        } else {
            (1, n as isize)
        };
        // SAFETY: A is k×full_m row-major; element (i, p) of the m×k view is at
        // off + i + p·full_m < a.len(). B and C are covered by the asserts.
        unsafe {
            gemm_blocked(
                (m, n, k),
                c.as_mut_ptr(),
                accumulate,
                (a.as_ptr().add(off), full_m as isize, 1),
                (b.as_ptr(), b_cs, b_rs),
                gemm::Parallelism::None,
            );
        }
    }

    fn run_gemm<T: Real>(spec: GemmSpec, a: &[T], b: &[T], c: &mut [T], parallel: bool) {
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
            return;
        }
        if k == 0 {
            if !accumulate {
                c.fill(T::ZERO);
            }
            return;
        }
        // Strides (in elements) of A as an m×k matrix and B as a k×n matrix.
        let (a_cs, a_rs) = if a_t {
            (m as isize, 1)
        } else {
            (1, k as isize)
        };
        let (b_cs, b_rs) = if b_t {
            (k as isize, 1)
        } else {
            (1, n as isize)
        };
        let par = if parallel {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: the pointers cover exactly the sizes asserted above with the given strides,
        // and C does not alias A or B (distinct slices).
        unsafe {
            gemm_blocked(
                (m, n, k),
                c.as_mut_ptr(),
                accumulate,
                (a.as_ptr(), a_cs, a_rs),
                (b.as_ptr(), b_cs, b_rs),
                par,
            );
        }
    }
}

impl<T: Real> Device<T> for Cpu {
    type Buf = Vec<T>;
    type Idx = HostIdx;
    type Scalars = Vec<f64>;

    fn name(&self) -> String {
        "cpu".into()
    }
    fn numerics(&self) -> String {
        // What changes the bits of the CPU backend: the element type and the instruction set
        // gemm's kernels use (the depth blocking is pinned, see K_BLOCK; another block, for
        // measuring, is named).
        let kb = match k_block() {
            K_BLOCK => String::new(),
            kb => format!("-kb{kb}"),
        };
        format!("cpu-{}-{}{kb}", T::DTYPE.to_lowercase(), cpu_isa())
    }
    fn concurrent_models(&self) -> bool {
        true
    }
    fn synchronize(&self) -> DResult<()> {
        Ok(())
    }

    fn zeros(&self, len: usize) -> DResult<Vec<T>> {
        filled(len, T::ZERO)
    }
    fn upload(&self, data: &[T]) -> DResult<Vec<T>> {
        let mut v = reserve::<T>(data.len())?;
        v.extend_from_slice(data);
        Ok(v)
    }
    fn to_vec(&self, buf: &Vec<T>) -> DResult<Vec<T>> {
        Ok(buf.clone())
    }
    fn len(&self, buf: &Vec<T>) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut Vec<T>, value: T) -> DResult<()> {
        buf.fill(value);
        Ok(())
    }
    fn write(&self, dst: &mut Vec<T>, src: &[T]) -> DResult<()> {
        check::write(dst.len(), src.len());
        dst.copy_from_slice(src);
        Ok(())
    }
    fn copy_range(
        &self,
        src: &Vec<T>,
        src_off: usize,
        dst: &mut Vec<T>,
        dst_off: usize,
        len: usize,
    ) -> DResult<()> {
        check::copy_range("copy_range", src.len(), src_off, dst.len(), dst_off, len);
        dst[dst_off..dst_off + len].copy_from_slice(&src[src_off..src_off + len]);
        Ok(())
    }
    fn axpy_range(
        &self,
        alpha: T,
        src: &Vec<T>,
        src_off: usize,
        dst: &mut Vec<T>,
        dst_off: usize,
        len: usize,
    ) -> DResult<()> {
        check::copy_range("axpy_range", src.len(), src_off, dst.len(), dst_off, len);
        par_zip(
            &mut dst[dst_off..dst_off + len],
            &src[src_off..src_off + len],
            |d, s| *d += alpha * s,
        );
        Ok(())
    }
    fn set_column(
        &self,
        src: &Vec<T>,
        dst: &mut Vec<T>,
        rows: usize,
        cols: usize,
        col: usize,
    ) -> DResult<()> {
        check::set_column(src.len(), dst.len(), rows, cols, col);
        for (r, &v) in src.iter().enumerate() {
            dst[r * cols + col] = v;
        }
        Ok(())
    }

    fn upload_idx(&self, data: &[u32]) -> DResult<HostIdx> {
        Ok(HostIdx::new(data))
    }
    fn idx_len(&self, idx: &HostIdx) -> usize {
        idx.data.len()
    }
    fn idx_bound(&self, idx: &HostIdx) -> usize {
        idx.bound
    }

    fn scalars(&self, len: usize) -> DResult<Vec<f64>> {
        filled(len, 0.0)
    }
    fn scalars_to_vec(&self, s: &Vec<f64>) -> DResult<Vec<f64>> {
        Ok(s.clone())
    }
    fn scalars_fill(&self, s: &mut Vec<f64>, value: f64) -> DResult<()> {
        s.fill(value);
        Ok(())
    }
    fn scalars_combine(&self, s: &mut Vec<f64>, dst: usize, terms: &[(usize, f64)]) -> DResult<()> {
        check::scalars_combine(s.len(), dst, terms);
        let v: f64 = terms.iter().map(|&(i, c)| c * s[i]).sum();
        s[dst] = v;
        Ok(())
    }
    fn scalars_accumulate(
        &self,
        src: &Vec<f64>,
        src_slot: usize,
        coef: f64,
        dst: &mut Vec<f64>,
        dst_slot: usize,
    ) -> DResult<()> {
        check::scalars_accumulate(src.len(), src_slot, dst.len(), dst_slot);
        dst[dst_slot] += coef * src[src_slot];
        Ok(())
    }
    fn scalar_to_grad(
        &self,
        s: &Vec<f64>,
        slot: usize,
        coef: f64,
        grad: &mut Vec<T>,
    ) -> DResult<()> {
        check::scalar_to_grad(s.len(), slot, grad.len());
        let v = T::from_f64(coef * s[slot]);
        grad[0] += T::ONE * v;
        Ok(())
    }

    fn gemm(&self, spec: GemmSpec, a: &Vec<T>, b: &Vec<T>, c: &mut Vec<T>) -> DResult<()> {
        check::gemm(spec, a.len(), b.len(), c.len());
        // Row-split products: two single-threaded halves beat one 2-thread product on these
        // small shapes (measured: ~1.45x → ~1.9x scaling). The split depends only on the
        // shape, and gemm's k-blocking only on k, so bits do not depend on thread count.
        if spec.m >= 128 && spec.n > 64 {
            let h = spec.m / 2;
            let (c_lo, c_hi) = c.split_at_mut(h * spec.n);
            let lo = GemmSpec { m: h, ..spec };
            let hi = GemmSpec {
                m: spec.m - h,
                ..spec
            };
            if spec.a_t {
                // A stored k×m: the two halves are column ranges of the stored matrix.
                let run = |s: GemmSpec, off: usize, c: &mut [T]| {
                    Cpu::run_gemm_strided(s, a, off, spec.m, b, c)
                };
                if rayon::current_num_threads() >= 2 {
                    rayon::join(|| run(lo, 0, c_lo), || run(hi, h, c_hi));
                } else {
                    run(lo, 0, c_lo);
                    run(hi, h, c_hi);
                }
            } else {
                let (a_lo, a_hi) = a.split_at(h * spec.k);
                if rayon::current_num_threads() >= 2 {
                    rayon::join(
                        || Cpu::run_gemm(lo, a_lo, b, c_lo, false),
                        || Cpu::run_gemm(hi, a_hi, b, c_hi, false),
                    );
                } else {
                    Cpu::run_gemm(lo, a_lo, b, c_lo, false);
                    Cpu::run_gemm(hi, a_hi, b, c_hi, false);
                }
            }
            return Ok(());
        }
        Cpu::run_gemm(spec, a, b, c, true);
        Ok(())
    }

    fn gemm2(
        &self,
        s1: GemmSpec,
        a1: &Vec<T>,
        b1: &Vec<T>,
        c1: &mut Vec<T>,
        s2: GemmSpec,
        a2: &Vec<T>,
        b2: &Vec<T>,
        c2: &mut Vec<T>,
    ) -> DResult<()> {
        check::gemm(s1, a1.len(), b1.len(), c1.len());
        check::gemm(s2, a2.len(), b2.len(), c2.len());
        if rayon::current_num_threads() >= 2 {
            // Two equal-sized single-threaded products in parallel beat two 2-thread products
            // run one after the other: no synchronisation inside either.
            rayon::join(
                || Cpu::run_gemm(s1, a1, b1, c1, false),
                || Cpu::run_gemm(s2, a2, b2, c2, false),
            );
        } else {
            Cpu::run_gemm(s1, a1, b1, c1, true);
            Cpu::run_gemm(s2, a2, b2, c2, true);
        }
        Ok(())
    }

    fn bias_act(
        &self,
        y: &mut Vec<T>,
        bias: Option<&Vec<T>>,
        rows: usize,
        cols: usize,
        act: Act,
    ) -> DResult<()> {
        check::bias_act(y.len(), bias.map(Vec::len), rows, cols);
        let apply = |row: &mut [T]| {
            if let Some(b) = bias {
                row.iter_mut().zip(b.iter()).for_each(|(v, &b)| *v += b);
            }
            match act {
                Act::Identity => {}
                Act::Relu => row.iter_mut().for_each(|v| {
                    if *v < T::ZERO {
                        *v = T::ZERO
                    }
                }),
                Act::Tanh => row.iter_mut().for_each(|v| *v = v.tanh()),
            }
        };
        if rows * cols >= 2 * CHUNK && cols > 0 {
            let rows_per = (CHUNK / cols).max(1);
            y.par_chunks_mut(rows_per * cols)
                .for_each(|chunk| chunk.chunks_mut(cols).for_each(apply));
        } else if cols > 0 {
            y.chunks_mut(cols).for_each(apply);
        }
        Ok(())
    }

    fn act_backward(&self, y: &Vec<T>, dy: &Vec<T>, dz: &mut Vec<T>, act: Act) -> DResult<()> {
        check::elementwise("act_backward", &[dy.len(), y.len(), dz.len()]);
        match act {
            Act::Identity => dz.copy_from_slice(dy),
            Act::Relu => par_zip3(dz, y, dy, |o, y, g| {
                *o = if y > T::ZERO { g } else { T::ZERO }
            }),
            Act::Tanh => par_zip3(dz, y, dy, |o, y, g| *o = g * (T::ONE - y * y)),
        }
        Ok(())
    }

    fn col_sums_acc(&self, dz: &Vec<T>, rows: usize, cols: usize, db: &mut Vec<T>) -> DResult<()> {
        check::col_sums(dz.len(), rows, cols, db.len());
        // Row by row in a fixed order (vectorises over columns), as PyTorch sums in f32.
        let mut acc = vec![T::ZERO; cols];
        for r in 0..rows {
            for (a, &v) in acc.iter_mut().zip(&dz[r * cols..(r + 1) * cols]) {
                *a += v;
            }
        }
        for (d, a) in db.iter_mut().zip(acc) {
            *d += a;
        }
        Ok(())
    }

    fn axpy(&self, alpha: T, src: &Vec<T>, dst: &mut Vec<T>) -> DResult<()> {
        check::elementwise("axpy", &[src.len(), dst.len()]);
        par_zip(dst, src, |d, s| *d += alpha * s);
        Ok(())
    }

    fn mul(&self, x: &Vec<T>, mask: &Vec<T>, y: &mut Vec<T>) -> DResult<()> {
        check::elementwise("mul", &[x.len(), mask.len(), y.len()]);
        par_zip3(y, x, mask, |o, x, m| *o = x * m);
        Ok(())
    }

    fn mul_acc(&self, dy: &Vec<T>, mask: &Vec<T>, dx: &mut Vec<T>) -> DResult<()> {
        check::elementwise("mul_acc", &[dy.len(), mask.len(), dx.len()]);
        par_zip3(dx, dy, mask, |o, g, m| *o += g * m);
        Ok(())
    }

    fn l2norm(
        &self,
        x: &Vec<T>,
        rows: usize,
        cols: usize,
        eps: T,
        y: &mut Vec<T>,
        norms: &mut Vec<T>,
    ) -> DResult<()> {
        check::rowwise("l2norm", rows, cols, &[x.len(), y.len()], &[norms.len()]);
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let ss: f64 = row.iter().map(|v| v.to_f64() * v.to_f64()).sum();
            let n = T::from_f64(ss.sqrt()).max(eps);
            norms[r] = n;
            for (o, &v) in y[r * cols..(r + 1) * cols].iter_mut().zip(row) {
                *o = v / n;
            }
        }
        Ok(())
    }

    fn l2norm_backward(
        &self,
        y: &Vec<T>,
        norms: &Vec<T>,
        eps: T,
        dy: &Vec<T>,
        rows: usize,
        cols: usize,
        dx: &mut Vec<T>,
    ) -> DResult<()> {
        check::rowwise(
            "l2norm_backward",
            rows,
            cols,
            &[y.len(), dy.len(), dx.len()],
            &[norms.len()],
        );
        for r in 0..rows {
            let yr = &y[r * cols..(r + 1) * cols];
            let gr = &dy[r * cols..(r + 1) * cols];
            let n = norms[r];
            // When the norm was clamped at eps, y = x/eps is linear in x.
            let clamped = n <= eps;
            let dot: f64 = if clamped {
                0.0
            } else {
                yr.iter()
                    .zip(gr)
                    .map(|(a, b)| a.to_f64() * b.to_f64())
                    .sum()
            };
            let dot = T::from_f64(dot);
            for ((o, &yv), &gv) in dx[r * cols..(r + 1) * cols].iter_mut().zip(yr).zip(gr) {
                *o += (gv - yv * dot) / n;
            }
        }
        Ok(())
    }

    fn pair_dot(
        &self,
        u: &Vec<T>,
        cols: usize,
        a: Ix<'_, HostIdx>,
        b: Ix<'_, HostIdx>,
        out: &mut Vec<T>,
    ) -> DResult<()> {
        check::pairs("pair_dot", u.len(), cols, shape(a), shape(b), &[out.len()]);
        let (a, b) = (ix(a), ix(b));
        for (i, (&ai, &bi)) in a.iter().zip(b).enumerate() {
            let ra = &u[ai as usize * cols..(ai as usize + 1) * cols];
            let rb = &u[bi as usize * cols..(bi as usize + 1) * cols];
            let mut s = T::ZERO;
            for (x, y) in ra.iter().zip(rb) {
                s += *x * *y;
            }
            out[i] = s;
        }
        Ok(())
    }

    fn pair_dot_backward(
        &self,
        u: &Vec<T>,
        cols: usize,
        a: Ix<'_, HostIdx>,
        b: Ix<'_, HostIdx>,
        g: &Vec<T>,
        du: &mut Vec<T>,
    ) -> DResult<()> {
        check::pairs(
            "pair_dot_backward",
            u.len(),
            cols,
            shape(a),
            shape(b),
            &[g.len()],
        );
        check::elementwise("pair_dot_backward", &[u.len(), du.len()]);
        let (a, b) = (ix(a), ix(b));
        for (i, (&ai, &bi)) in a.iter().zip(b).enumerate() {
            let (ai, bi) = (ai as usize, bi as usize);
            for c in 0..cols {
                let ua = u[ai * cols + c];
                let ub = u[bi * cols + c];
                du[ai * cols + c] += g[i] * ub;
                du[bi * cols + c] += g[i] * ua;
            }
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &Vec<T>,
        cols: usize,
        idx: Ix<'_, HostIdx>,
        out: &mut Vec<T>,
    ) -> DResult<()> {
        check::rows_indexed("gather_rows", x.len(), cols, shape(idx), out.len());
        let idx = ix(idx);
        for (o, &i) in out.chunks_mut(cols.max(1)).zip(idx) {
            o.copy_from_slice(&x[i as usize * cols..(i as usize + 1) * cols]);
        }
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        dout: &Vec<T>,
        cols: usize,
        idx: Ix<'_, HostIdx>,
        dx: &mut Vec<T>,
    ) -> DResult<()> {
        check::rows_indexed("scatter_add_rows", dx.len(), cols, shape(idx), dout.len());
        for (g, &i) in dout.chunks(cols.max(1)).zip(ix(idx)) {
            for (d, &v) in dx[i as usize * cols..(i as usize + 1) * cols]
                .iter_mut()
                .zip(g)
            {
                *d += v;
            }
        }
        Ok(())
    }

    fn probpair_bce(
        &self,
        c: &Vec<T>,
        m_raw: &Vec<T>,
        t_raw: &Vec<T>,
        y: &Vec<T>,
        w: &Vec<T>,
        denom: f64,
        dc: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::loss(
            "probpair_bce",
            &[c.len(), y.len(), w.len(), dc.len()],
            &[m_raw.len(), t_raw.len()],
            out.len(),
            slot,
            3,
        );
        let (mr, tr) = (m_raw[0], t_raw[0]);
        let (m, t) = (mr.tanh(), softplus(tr));
        let (m64, t64) = (m.to_f64(), t.to_f64());
        let mut loss = 0.0;
        let mut dm = 0.0;
        let mut dt = 0.0;
        for i in 0..c.len() {
            let l = (c[i].to_f64() - m64) / t64;
            let (yi, wi) = (y[i].to_f64(), w[i].to_f64());
            loss += wi * (softplus(l) - yi * l);
            let g = wi * (sigmoid(l) - yi) / denom; // d loss / d l_i
            dc[i] = T::from_f64(g / t64);
            dm -= g / t64;
            dt -= g * l / t64;
        }
        out[slot] = loss / denom;
        out[slot + 1] = dm * (1.0 - m64 * m64);
        out[slot + 2] = dt * sigmoid(tr.to_f64());
        Ok(())
    }

    fn pair_readout(
        &self,
        u: &Vec<T>,
        cols: usize,
        a: Ix<'_, HostIdx>,
        b: Ix<'_, HostIdx>,
        m_raw: &Vec<T>,
        t_raw: &Vec<T>,
        out: &mut Vec<T>,
    ) -> DResult<()> {
        check::pairs(
            "pair_readout",
            u.len(),
            cols,
            shape(a),
            shape(b),
            &[out.len()],
        );
        check::loss("pair_readout", &[], &[m_raw.len(), t_raw.len()], 0, 0, 0);
        let m = m_raw[0].to_f64().tanh();
        let t = softplus(t_raw[0].to_f64());
        let (a, b) = (ix(a), ix(b));
        for (i, (&ia, &ib)) in a.iter().zip(b).enumerate() {
            let (ra, rb) = (ia as usize * cols, ib as usize * cols);
            let c: f64 = (0..cols)
                .map(|k| u[ra + k].to_f64() * u[rb + k].to_f64())
                .sum();
            out[i] = T::from_f64(sigmoid((c - m) / t));
        }
        Ok(())
    }

    fn sq_error(
        &self,
        x: &Vec<T>,
        target: &Vec<T>,
        scale: f64,
        dx: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::loss(
            "sq_error",
            &[x.len(), target.len(), dx.len()],
            &[],
            out.len(),
            slot,
            1,
        );
        let s2 = T::from_f64(2.0 * scale);
        par_zip3(dx, x, target, |d, x, t| *d = s2 * (x - t));
        // Loss in fixed-size chunks, summed in order.
        let partial: Vec<f64> = x
            .par_chunks(CHUNK)
            .zip(target.par_chunks(CHUNK))
            .map(|(a, b)| {
                a.iter()
                    .zip(b)
                    .map(|(&p, &q)| (p.to_f64() - q.to_f64()).powi(2))
                    .sum::<f64>()
            })
            .collect();
        out[slot] = partial.iter().sum::<f64>() * scale;
        Ok(())
    }

    fn softmax_ce(
        &self,
        logits: &Vec<T>,
        rows: usize,
        cols: usize,
        labels: Ix<'_, HostIdx>,
        dlogits: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::softmax_ce(
            logits.len(),
            rows,
            cols,
            shape(labels),
            dlogits.len(),
            out.len(),
            slot,
        );
        let labels = ix(labels);
        let mut loss = 0.0;
        let mut correct = 0usize;
        for r in 0..rows {
            let row = &logits[r * cols..(r + 1) * cols];
            let (mut best, mut arg) = (f64::NEG_INFINITY, 0);
            for (j, v) in row.iter().enumerate() {
                if v.to_f64() > best {
                    best = v.to_f64();
                    arg = j;
                }
            }
            let z: f64 = row.iter().map(|v| (v.to_f64() - best).exp()).sum();
            let lse = best + z.ln();
            let label = labels[r] as usize;
            loss += lse - row[label].to_f64();
            if arg == label {
                correct += 1;
            }
            for (j, d) in dlogits[r * cols..(r + 1) * cols].iter_mut().enumerate() {
                let p = (row[j].to_f64() - lse).exp();
                let target = if j == label { 1.0 } else { 0.0 };
                *d = T::from_f64((p - target) / rows as f64);
            }
        }
        out[slot] = loss / rows.max(1) as f64;
        out[slot + 1] = correct as f64;
        Ok(())
    }

    fn softmax_rows(
        &self,
        logits: &Vec<T>,
        rows: usize,
        cols: usize,
        out: &mut Vec<T>,
    ) -> DResult<()> {
        check::rowwise("softmax_rows", rows, cols, &[logits.len(), out.len()], &[]);
        for r in 0..rows {
            let row = &logits[r * cols..(r + 1) * cols];
            let best = row
                .iter()
                .map(|v| v.to_f64())
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = row.iter().map(|v| (v.to_f64() - best).exp()).sum();
            for (o, v) in out[r * cols..(r + 1) * cols].iter_mut().zip(row) {
                *o = T::from_f64((v.to_f64() - best).exp() / z);
            }
        }
        Ok(())
    }

    fn huber_l2(
        &self,
        p: &Vec<T>,
        target: &Vec<T>,
        w: Option<&Vec<T>>,
        h: HuberL2,
        dp: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        let HuberL2 {
            delta,
            smooth,
            lambda,
            denom,
        } = h;
        let mut lens = vec![p.len(), target.len(), dp.len()];
        lens.extend(w.map(Vec::len));
        check::loss("huber_l2", &lens, &[], out.len(), slot, 1);
        let mut loss = 0.0;
        for i in 0..p.len() {
            let pi = p[i].to_f64();
            let r = pi - target[i].to_f64();
            let wi = w.map(|w| w[i].to_f64()).unwrap_or(1.0);
            let (h, dh) = huber(r, delta, smooth);
            loss += wi * (h + lambda * pi * pi);
            dp[i] = T::from_f64(wi * (dh + 2.0 * lambda * pi) / denom);
        }
        out[slot] = loss / denom;
        Ok(())
    }

    fn softmax_backward(
        &self,
        s: &Vec<T>,
        ds: &Vec<T>,
        rows: usize,
        cols: usize,
        dx: &mut Vec<T>,
    ) -> DResult<()> {
        check::rowwise(
            "softmax_backward",
            rows,
            cols,
            &[s.len(), ds.len(), dx.len()],
            &[],
        );
        for r in 0..rows {
            let sr = &s[r * cols..(r + 1) * cols];
            let gr = &ds[r * cols..(r + 1) * cols];
            let dot: f64 = sr
                .iter()
                .zip(gr)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum();
            for j in 0..cols {
                let v = sr[j].to_f64() * (gr[j].to_f64() - dot);
                dx[r * cols + j] += T::from_f64(v);
            }
        }
        Ok(())
    }

    fn pair_cobce(
        &self,
        q: &Vec<T>,
        shape: CoBce,
        b_raw: Option<&Vec<T>>,
        y: &Vec<T>,
        w: &Vec<T>,
        dq: &mut Vec<T>,
        db_raw: Option<&mut Vec<T>>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::pair_cobce(
            q.len(),
            shape,
            b_raw.map(Vec::len),
            y.len(),
            w.len(),
            dq.len(),
            db_raw.as_deref().map(Vec::len),
            out.len(),
            slot,
        );
        let CoBce { c, n, eps, denom } = shape;
        let bmat: Option<Vec<f64>> = b_raw.map(|b| b.iter().map(|v| sigmoid(v.to_f64())).collect());
        let mut dbm = vec![0f64; c * c];
        let mut loss = 0.0;
        for i in 0..n {
            let qa: Vec<f64> = q[i * c..(i + 1) * c].iter().map(|v| v.to_f64()).collect();
            let qb: Vec<f64> = q[(n + i) * c..(n + i + 1) * c]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            // bq = B q_b, bta = Bᵀ q_a.
            let (bq, bta): (Vec<f64>, Vec<f64>) = match &bmat {
                Some(bm) => (
                    (0..c)
                        .map(|r| (0..c).map(|k| bm[r * c + k] * qb[k]).sum())
                        .collect(),
                    (0..c)
                        .map(|k| (0..c).map(|r| bm[r * c + k] * qa[r]).sum())
                        .collect(),
                ),
                None => (qb.clone(), qa.clone()),
            };
            let p_raw: f64 = qa.iter().zip(&bq).map(|(a, b)| a * b).sum();
            let p = p_raw.clamp(eps, 1.0 - eps);
            let (yi, wi) = (y[i].to_f64(), w[i].to_f64());
            loss += -wi * (yi * p.ln() + (1.0 - yi) * (1.0 - p).ln());
            // d loss / d P (zero where the clamp is active).
            let g = if p_raw > eps && p_raw < 1.0 - eps {
                wi * (p - yi) / (p * (1.0 - p)) / denom
            } else {
                0.0
            };
            for k in 0..c {
                dq[i * c + k] += T::from_f64(g * bq[k]);
                dq[(n + i) * c + k] += T::from_f64(g * bta[k]);
            }
            if bmat.is_some() {
                for r in 0..c {
                    for k in 0..c {
                        dbm[r * c + k] += g * qa[r] * qb[k];
                    }
                }
            }
        }
        if let (Some(bm), Some(db)) = (&bmat, db_raw) {
            for j in 0..c * c {
                db[j] += T::from_f64(dbm[j] * bm[j] * (1.0 - bm[j]));
            }
        }
        out[slot] = loss / denom;
        Ok(())
    }

    fn spd_logdet_inverse(
        &self,
        m: &Vec<T>,
        c: usize,
        eps: f64,
        out: &mut Vec<f64>,
        slot: usize,
        minv: &mut Vec<T>,
    ) -> DResult<()> {
        check::spd(m.len(), c, minv.len(), out.len(), slot);
        let a: Vec<f64> = (0..c * c)
            .map(|j| m[j].to_f64() + if j / c == j % c { eps } else { 0.0 })
            .collect();
        match crate::science::cholesky_logdet_inverse(&a, c) {
            Some((logdet, inv)) => {
                out[slot] = logdet;
                for (o, v) in minv.iter_mut().zip(inv) {
                    *o = T::from_f64(v);
                }
            }
            None => {
                out[slot] = f64::NEG_INFINITY;
                minv.fill(T::ZERO);
            }
        }
        Ok(())
    }

    fn student_t(&self, z: &Vec<T>, mu: &Vec<T>, st: StudentT, q: &mut Vec<T>) -> DResult<()> {
        check::student_t("student_t", st, z.len(), mu.len(), &[q.len()], None);
        let StudentT {
            rows,
            d,
            k,
            alpha,
            e,
        } = st;
        for r in 0..rows {
            let zr = &z[r * d..(r + 1) * d];
            let t: Vec<f64> = (0..k)
                .map(|cc| {
                    let d2: f64 = zr
                        .iter()
                        .zip(&mu[cc * d..(cc + 1) * d])
                        .map(|(a, b)| (a.to_f64() - b.to_f64()).powi(2))
                        .sum();
                    (1.0 + d2 / alpha).powf(-e)
                })
                .collect();
            let sum: f64 = t.iter().sum();
            for cc in 0..k {
                q[r * k + cc] = T::from_f64(t[cc] / sum);
            }
        }
        Ok(())
    }

    fn student_t_backward(
        &self,
        z: &Vec<T>,
        mu: &Vec<T>,
        q: &Vec<T>,
        dq: &Vec<T>,
        st: StudentT,
        dz: &mut Vec<T>,
        dmu: &mut Vec<T>,
    ) -> DResult<()> {
        check::student_t(
            "student_t_backward",
            st,
            z.len(),
            mu.len(),
            &[q.len(), dq.len()],
            Some(dz.len()),
        );
        check::elementwise("student_t_backward", &[mu.len(), dmu.len()]);
        let StudentT {
            rows,
            d,
            k,
            alpha,
            e,
        } = st;
        let mut dmu64 = vec![0f64; k * d];
        for r in 0..rows {
            let zr: Vec<f64> = z[r * d..(r + 1) * d].iter().map(|v| v.to_f64()).collect();
            let qr: Vec<f64> = q[r * k..(r + 1) * k].iter().map(|v| v.to_f64()).collect();
            let gr: Vec<f64> = dq[r * k..(r + 1) * k].iter().map(|v| v.to_f64()).collect();
            let dot: f64 = qr.iter().zip(&gr).map(|(a, b)| a * b).sum();
            let mut dzr = vec![0f64; d];
            for cc in 0..k {
                let diff: Vec<f64> = (0..d).map(|j| zr[j] - mu[cc * d + j].to_f64()).collect();
                let u = 1.0 + diff.iter().map(|x| x * x).sum::<f64>() / alpha;
                // q = t/S with t = u^(−e): dL/du = (dL/dq·q-weighted) · (−e/u) · q.
                let dl_du = (gr[cc] - dot) * qr[cc] * (-e / u);
                for j in 0..d {
                    let g = dl_du * 2.0 * diff[j] / alpha;
                    dzr[j] += g;
                    dmu64[cc * d + j] -= g;
                }
            }
            for j in 0..d {
                dz[r * d + j] += T::from_f64(dzr[j]);
            }
        }
        for (o, v) in dmu.iter_mut().zip(dmu64) {
            *o += T::from_f64(v);
        }
        Ok(())
    }

    fn kl_target(
        &self,
        q: &Vec<T>,
        p: &Vec<T>,
        denom: f64,
        dq: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::loss(
            "kl_target",
            &[q.len(), p.len(), dq.len()],
            &[],
            out.len(),
            slot,
            1,
        );
        let mut loss = 0.0;
        for i in 0..q.len() {
            let (qi, pi) = (q[i].to_f64().max(1e-30), p[i].to_f64());
            if pi > 0.0 {
                loss += pi * (pi / qi).ln();
            }
            dq[i] = T::from_f64(-pi / (qi * denom));
        }
        out[slot] = loss / denom;
        Ok(())
    }

    fn spherepair_bce(
        &self,
        c: &Vec<T>,
        y: &Vec<T>,
        w: &Vec<T>,
        denom: f64,
        dc: &mut Vec<T>,
        out: &mut Vec<f64>,
        slot: usize,
    ) -> DResult<()> {
        check::loss(
            "spherepair_bce",
            &[c.len(), y.len(), w.len(), dc.len()],
            &[],
            out.len(),
            slot,
            1,
        );
        let mut loss = 0.0;
        for i in 0..c.len() {
            let ci = c[i].to_f64();
            let (yi, wi) = (y[i].to_f64(), w[i].to_f64());
            let (l, g) = crate::science::spherepair_term(ci, yi);
            loss += wi * l;
            dc[i] = T::from_f64(wi * g / denom);
        }
        out[slot] = loss / denom;
        Ok(())
    }

    fn eci_fuse(
        &self,
        y: &Vec<T>,
        delta: &Vec<T>,
        y_oof: &Vec<T>,
        xi: f64,
        gamma: f64,
        n0: f64,
        y_bc: &mut Vec<T>,
        w: &mut Vec<T>,
    ) -> DResult<()> {
        check::elementwise(
            "eci_fuse",
            &[y.len(), delta.len(), y_oof.len(), y_bc.len(), w.len()],
        );
        for i in 0..y.len() {
            let yi = y[i].to_f64();
            let (y_cor, _gap, wi) = screen(yi, delta[i].to_f64(), y_oof[i].to_f64(), xi, gamma);
            y_bc[i] = T::from_f64(bayesian_confidence(yi, y_cor, wi, n0));
            w[i] = T::from_f64(wi);
        }
        Ok(())
    }

    fn clip_grad_norm(&self, grads: &mut [&mut Vec<T>], max_norm: f64) -> DResult<()> {
        let mut total = 0.0;
        for g in grads.iter() {
            total += Device::<T>::sum_squares(self, g)?;
        }
        let norm = total.sqrt();
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            let c = T::from_f64(coef);
            for g in grads.iter_mut() {
                Device::<T>::scale(self, g, c)?;
            }
        }
        Ok(())
    }

    fn sum_squares(&self, x: &Vec<T>) -> DResult<f64> {
        let partial: Vec<f64> = x
            .par_chunks(CHUNK)
            .map(|c| c.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>())
            .collect();
        Ok(partial.iter().sum())
    }

    fn scale(&self, x: &mut Vec<T>, s: T) -> DResult<()> {
        if x.len() >= 2 * CHUNK {
            x.par_chunks_mut(CHUNK)
                .for_each(|c| c.iter_mut().for_each(|v| *v *= s));
        } else {
            x.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    fn adam(
        &self,
        p: &mut Vec<T>,
        g: &Vec<T>,
        m: &mut Vec<T>,
        v: &mut Vec<T>,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        step: u64,
    ) -> DResult<()> {
        check::elementwise("adam", &[p.len(), g.len(), m.len(), v.len()]);
        let bc1 = 1.0 - beta1.powi(step as i32);
        let bc2 = 1.0 - beta2.powi(step as i32);
        let (b1, b2) = (T::from_f64(beta1), T::from_f64(beta2));
        let (ob1, ob2) = (T::from_f64(1.0 - beta1), T::from_f64(1.0 - beta2));
        let step_size = T::from_f64(lr / bc1);
        let bc2_sqrt = T::from_f64(bc2.sqrt());
        let eps = T::from_f64(eps);
        let update = |(((p, &g), m), v): (((&mut T, &T), &mut T), &mut T)| {
            *m = b1 * *m + ob1 * g;
            *v = b2 * *v + ob2 * g * g;
            let denom = v.sqrt() / bc2_sqrt + eps;
            *p -= step_size * *m / denom;
        };
        if p.len() >= 2 * CHUNK {
            p.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK))
                .for_each(|(((p, g), m), v)| {
                    p.iter_mut()
                        .zip(g)
                        .zip(m.iter_mut())
                        .zip(v.iter_mut())
                        .for_each(update)
                });
        } else {
            p.iter_mut()
                .zip(g.iter())
                .zip(m.iter_mut())
                .zip(v.iter_mut())
                .for_each(update);
        }
        Ok(())
    }

    fn sgd_momentum(
        &self,
        p: &mut Vec<T>,
        g: &Vec<T>,
        buf: &mut Vec<T>,
        lr: f64,
        momentum: f64,
        first: bool,
    ) -> DResult<()> {
        check::elementwise("sgd_momentum", &[p.len(), g.len(), buf.len()]);
        let (mu, lr) = (T::from_f64(momentum), T::from_f64(lr));
        for ((p, &g), b) in p.iter_mut().zip(g.iter()).zip(buf.iter_mut()) {
            *b = if first { g } else { mu * *b + g };
            *p -= lr * *b;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(spec: GemmSpec, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; spec.m * spec.n];
        for i in 0..spec.m {
            for j in 0..spec.n {
                for p in 0..spec.k {
                    let av = if spec.a_t {
                        a[p * spec.m + i]
                    } else {
                        a[i * spec.k + p]
                    };
                    let bv = if spec.b_t {
                        b[j * spec.k + p]
                    } else {
                        b[p * spec.n + j]
                    };
                    c[i * spec.n + j] += av * bv;
                }
            }
        }
        c
    }

    #[test]
    fn gemm_matches_naive_for_every_layout() {
        let (m, n, k) = (7, 5, 9);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        for a_t in [false, true] {
            for b_t in [false, true] {
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    a_t,
                    b_t,
                    accumulate: true,
                };
                let mut c = vec![1.0; m * n];
                Cpu.gemm(spec, &a, &b, &mut c).unwrap();
                let expect = naive(spec, &a, &b);
                for (x, y) in c.iter().zip(&expect) {
                    assert!((x - 1.0 - y).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn gemm_bits_do_not_depend_on_thread_count() {
        // Forward (x·Wᵀ), weight-gradient (dZᵀ·X) and input-gradient (dZ·W) shapes of a layer,
        // plus a narrow layer that takes gemm's small-matrix path.
        let specs = [
            GemmSpec {
                m: 256,
                n: 500,
                k: 784,
                a_t: false,
                b_t: true,
                accumulate: false,
            },
            GemmSpec {
                m: 500,
                n: 784,
                k: 256,
                a_t: true,
                b_t: false,
                accumulate: true,
            },
            GemmSpec {
                m: 256,
                n: 784,
                k: 500,
                a_t: false,
                b_t: false,
                accumulate: true,
            },
            GemmSpec {
                m: 130,
                n: 10,
                k: 2000,
                a_t: false,
                b_t: true,
                accumulate: false,
            },
        ];
        for spec in specs {
            let a: Vec<f32> = (0..spec.m * spec.k)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..spec.k * spec.n)
                .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
                .collect();
            let c0: Vec<f32> = (0..spec.m * spec.n)
                .map(|i| (i % 13) as f32 * 0.01)
                .collect();
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    let mut c = c0.clone();
                    Cpu.gemm(spec, &a, &b, &mut c).unwrap();
                    c
                })
            };
            let one = run(1);
            assert_eq!(one, run(2), "{spec:?}");
            assert_eq!(one, run(3), "{spec:?}");
        }
    }

    /// gemm splits a product along its depth only past 512 (its block is
    /// `max(512, f(L1 cache)).min(k)`, or `k.min(512)` for small products): so the products
    /// upcc hands it, never deeper than K_BLOCK, are summed in one pass on every CPU, whatever
    /// its cache. Checked with this machine's cache sizes over plausible kernel shapes.
    #[test]
    fn gemm_never_splits_a_product_of_depth_k_block_or_less() {
        for (m, n) in [(1, 1), (7, 300), (256, 500), (1024, 2000), (5000, 10)] {
            for k in [1, 100, 511, K_BLOCK] {
                for (mr, nr) in [(8, 4), (16, 4), (16, 6), (32, 6), (48, 4), (64, 6)] {
                    let p = gemm_common::cache::kernel_params(m, n, k, mr, nr, 4);
                    assert_eq!(p.kc, k, "m {m} n {n} k {k} mr {mr} nr {nr}");
                }
            }
        }
    }

    /// Why the depth is pinned: the same product summed in other depth blocks (as gemm does
    /// on a CPU whose L1 cache gives another block size) has other bits. And upcc's products
    /// are exactly the K_BLOCK-deep pieces summed in order.
    #[test]
    fn depth_blocks_change_bits_so_upcc_fixes_them() {
        let (m, n, k) = (64, 48, 1500);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        // C = Σ over depth blocks of `block`, each one gemm call (depth ≤ 512: one pass).
        let blocked = |block: usize| {
            let mut c = vec![0f32; m * n];
            let mut p = 0;
            while p < k {
                let kb = block.min(k - p);
                // SAFETY: the offsets stay within A (m×k, row-major) and B (k×n).
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        kb,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        p > 0,
                        a.as_ptr().add(p),
                        1,
                        k as isize,
                        b.as_ptr().add(p * n),
                        1,
                        n as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
                p += kb;
            }
            c
        };
        let spec = GemmSpec {
            m,
            n,
            k,
            a_t: false,
            b_t: false,
            accumulate: false,
        };
        let mut c = vec![0f32; m * n];
        Cpu::run_gemm(spec, &a, &b, &mut c, false);
        assert_eq!(
            c,
            blocked(K_BLOCK),
            "upcc sums K_BLOCK-deep pieces in order"
        );
        assert_ne!(
            blocked(K_BLOCK),
            blocked(500),
            "another block size gives other bits"
        );
    }

    #[test]
    fn the_numerics_class_names_the_instruction_set() {
        let n = Device::<f32>::numerics(&Cpu);
        assert_eq!(n, format!("cpu-f32-{}", cpu_isa()));
        assert!(["avx512", "fma", "neon", "scalar"].contains(&cpu_isa()));
    }

    #[test]
    fn a_buffer_too_large_is_an_error_not_an_abort() {
        let dev = Cpu;
        let len = usize::MAX / 8;
        match Device::<f32>::zeros(&dev, len) {
            Err(DeviceError::OutOfMemory { device, bytes }) => {
                assert_eq!(device, "cpu");
                assert_eq!(bytes, len.saturating_mul(4));
            }
            other => panic!("expected OutOfMemory, got {:?}", other.map(|v| v.len())),
        }
        assert!(matches!(
            Device::<f32>::scalars(&dev, usize::MAX / 4),
            Err(DeviceError::OutOfMemory { .. })
        ));
        // Ordinary sizes are unaffected.
        assert_eq!(Device::<f32>::zeros(&dev, 3).unwrap(), vec![0.0; 3]);
        assert_eq!(
            Device::<f32>::upload(&dev, &[1.0, 2.0]).unwrap(),
            vec![1.0, 2.0]
        );
    }
}
