//! The tape: a forward pass records [`Op`]s; [`Graph::backward`] walks them in reverse and
//! accumulates gradients into the parameters.
//!
//! Everything stays on the device: tensor values and gradients are device buffers, losses are
//! f64 slots of a device-side scalar vector (read back only when asked, see
//! [`Graph::accumulate`]), and index vectors for gathers and pairs are device buffers.
//! Buffers are pooled by size and reused across steps (`reset`), so a training step does not
//! allocate once the first step has run.

use std::collections::HashMap;

use crate::device::{Act, CoBce, DResult, Device, GemmSpec, HuberL2, Ix, StudentT};
use crate::params::{ParamId, Params};
use crate::scalar::Real;

/// A value in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Var(usize);

/// Loss slots a step may use (losses, their statistics and readout gradients).
const SCALAR_SLOTS: usize = 256;

/// Where an op's indices live.
enum Indices<I> {
    /// An index buffer uploaded for this op.
    Owned(I),
    /// A range of the graph's 0, 1, 2, … vector.
    Iota { off: usize, len: usize },
}

enum Op<T: Real, D: Device<T>> {
    Input,
    Linear {
        x: Var,
        w: ParamId,
        b: Option<ParamId>,
        act: Act,
    },
    Mask {
        x: Var,
        mask: D::Buf,
    },
    L2Norm {
        x: Var,
        norms: D::Buf,
        eps: T,
    },
    PairDot {
        u: Var,
        a: Indices<D::Idx>,
        b: Indices<D::Idx>,
    },
    Gather {
        x: Var,
        idx: Indices<D::Idx>,
    },
    /// Scalar ops: the gradient w.r.t. the tensor input is computed in the forward pass
    /// (`d`), scaled by the upstream scalar gradient in backward.
    ProbPair {
        c: Var,
        m: ParamId,
        t: ParamId,
        d: D::Buf,
    },
    SqError {
        x: Var,
        d: D::Buf,
    },
    SoftmaxCe {
        logits: Var,
        d: D::Buf,
    },
    Huber {
        p: Var,
        d: D::Buf,
    },
    Sum {
        terms: Vec<(Var, f64)>,
    },
    Softmax {
        x: Var,
    },
    /// Pair co-assignment BCE: gradients w.r.t. q (whole buffer) and B′ from the forward pass.
    PairCoBce {
        q: Var,
        d: D::Buf,
        b: Option<(ParamId, D::Buf)>,
    },
    LogdetGram {
        x: Var,
        minv: D::Buf,
    },
    StudentT {
        z: Var,
        mu: ParamId,
        alpha: f64,
        e: f64,
    },
    KlTarget {
        q: Var,
        d: D::Buf,
    },
}

struct Node<T: Real, D: Device<T>> {
    rows: usize,
    cols: usize,
    value: Option<D::Buf>,
    /// Slot of a scalar node's value (losses) in the graph's scalar vector.
    slot: usize,
    grad: Option<D::Buf>,
    /// Upstream gradient of a scalar node: products of the constant coefficients of `sum`, so
    /// it is known on the host without reading anything back.
    scalar_grad: f64,
    needs_grad: bool,
    op: Op<T, D>,
}

fn val<T: Real, D: Device<T>>(nodes: &[Node<T, D>], v: Var) -> &D::Buf {
    nodes[v.0].value.as_ref().expect("tensor node has a value")
}

/// A recorded computation on device `D`.
pub struct Graph<T: Real, D: Device<T>> {
    dev: D,
    nodes: Vec<Node<T, D>>,
    pool: HashMap<usize, Vec<D::Buf>>,
    scalars: D::Scalars,
    next_slot: usize,
    iota: D::Idx,
}

impl<T: Real, D: Device<T>> Graph<T, D> {
    pub fn new(dev: &D) -> DResult<Self> {
        Ok(Graph {
            scalars: dev.scalars(SCALAR_SLOTS)?,
            iota: dev.upload_idx(&[])?,
            dev: dev.clone(),
            nodes: Vec::new(),
            pool: HashMap::new(),
            next_slot: 0,
        })
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Forget the recorded ops, keeping their buffers for the next step.
    pub fn reset(&mut self) {
        self.next_slot = 0;
        let nodes = std::mem::take(&mut self.nodes);
        for n in nodes {
            if let Some(v) = n.value {
                self.give(v);
            }
            if let Some(g) = n.grad {
                self.give(g);
            }
            match n.op {
                Op::Mask { mask, .. } => self.give(mask),
                Op::L2Norm { norms, .. } => self.give(norms),
                Op::ProbPair { d, .. }
                | Op::SqError { d, .. }
                | Op::SoftmaxCe { d, .. }
                | Op::Huber { d, .. }
                | Op::KlTarget { d, .. } => self.give(d),
                Op::PairCoBce { d, b, .. } => {
                    self.give(d);
                    if let Some((_, db)) = b {
                        self.give(db);
                    }
                }
                Op::LogdetGram { minv, .. } => self.give(minv),
                _ => {}
            }
        }
    }

    fn give(&mut self, buf: D::Buf) {
        let len = self.dev.len(&buf);
        self.pool.entry(len).or_default().push(buf);
    }

    /// A buffer of `len` elements with unspecified contents (callers overwrite it).
    fn take(&mut self, len: usize) -> DResult<D::Buf> {
        match self.pool.get_mut(&len).and_then(|v| v.pop()) {
            Some(b) => Ok(b),
            None => self.dev.zeros(len),
        }
    }

    fn take_zeroed(&mut self, len: usize) -> DResult<D::Buf> {
        let mut b = self.take(len)?;
        self.dev.fill(&mut b, T::ZERO)?;
        Ok(b)
    }

    fn slots(&mut self, n: usize) -> usize {
        let s = self.next_slot;
        assert!(
            s + n <= SCALAR_SLOTS,
            "more than {SCALAR_SLOTS} loss slots in one step"
        );
        self.next_slot += n;
        s
    }

    /// Make sure the 0, 1, 2, … vector covers `n` entries.
    fn ensure_iota(&mut self, n: usize) -> DResult<()> {
        let have = self.dev.idx_len(&self.iota);
        if have < n {
            let len = n.max(2 * have).max(1024);
            self.iota = self.dev.upload_idx(&(0..len as u32).collect::<Vec<_>>())?;
        }
        Ok(())
    }

    fn ix<'a>(dev_iota: &'a D::Idx, i: &'a Indices<D::Idx>, len_hint: usize) -> Ix<'a, D::Idx> {
        match i {
            Indices::Owned(b) => Ix::new(b, 0, len_hint),
            Indices::Iota { off, len } => Ix::iota(dev_iota, *off, *len),
        }
    }

    fn push(
        &mut self,
        rows: usize,
        cols: usize,
        value: Option<D::Buf>,
        slot: usize,
        needs_grad: bool,
        op: Op<T, D>,
    ) -> Var {
        self.nodes.push(Node {
            rows,
            cols,
            value,
            slot,
            grad: None,
            scalar_grad: 0.0,
            needs_grad,
            op,
        });
        Var(self.nodes.len() - 1)
    }

    pub fn shape(&self, v: Var) -> (usize, usize) {
        (self.nodes[v.0].rows, self.nodes[v.0].cols)
    }

    /// The value of a tensor node.
    pub fn value(&self, v: Var) -> &D::Buf {
        self.nodes[v.0]
            .value
            .as_ref()
            .expect("tensor node has a value")
    }

    /// Host copy of a tensor node.
    pub fn to_host(&self, v: Var) -> DResult<Vec<T>> {
        self.dev.to_vec(self.value(v))
    }

    /// The value of a scalar node (a loss), read back from the device. Training loops use
    /// [`Graph::accumulate`] instead and read once per epoch.
    pub fn scalar(&self, v: Var) -> DResult<f64> {
        self.scalar_at(v, 0)
    }

    /// Statistic `offset` of a scalar node (softmax cross-entropy: 1 = correct predictions).
    pub fn scalar_at(&self, v: Var, offset: usize) -> DResult<f64> {
        let all = self.dev.scalars_to_vec(&self.scalars)?;
        Ok(all[self.nodes[v.0].slot + offset])
    }

    /// acc[dst] += coef · (statistic `offset` of scalar node v), on the device.
    pub fn accumulate(
        &self,
        v: Var,
        offset: usize,
        coef: f64,
        acc: &mut D::Scalars,
        dst: usize,
    ) -> DResult<()> {
        self.dev
            .scalars_accumulate(&self.scalars, self.nodes[v.0].slot + offset, coef, acc, dst)
    }

    /// A constant input (no gradient), rows×cols, from host data.
    pub fn input(&mut self, data: &[T], rows: usize, cols: usize) -> DResult<Var> {
        assert_eq!(
            data.len(),
            rows * cols,
            "input: {} values for {rows}×{cols}",
            data.len()
        );
        let mut buf = self.take(rows * cols)?;
        self.dev.write(&mut buf, data)?;
        Ok(self.push(rows, cols, Some(buf), 0, false, Op::Input))
    }

    /// A constant input: rows `idx` of the device matrix `x` (… × cols).
    pub fn input_rows(&mut self, x: &D::Buf, cols: usize, idx: Ix<'_, D::Idx>) -> DResult<Var> {
        let mut buf = self.take(idx.len * cols)?;
        self.dev.gather_rows(x, cols, idx, &mut buf)?;
        Ok(self.push(idx.len, cols, Some(buf), 0, false, Op::Input))
    }

    /// A constant input: rows `start..start + rows` of the device matrix `x` (… × cols).
    pub fn input_slice(
        &mut self,
        x: &D::Buf,
        start: usize,
        rows: usize,
        cols: usize,
    ) -> DResult<Var> {
        let mut buf = self.take(rows * cols)?;
        self.dev
            .copy_range(x, start * cols, &mut buf, 0, rows * cols)?;
        Ok(self.push(rows, cols, Some(buf), 0, false, Op::Input))
    }

    /// y = act(x·Wᵀ + b), W stored out×in.
    pub fn linear(
        &mut self,
        params: &Params<T, D>,
        x: Var,
        w: ParamId,
        b: Option<ParamId>,
        act: Act,
    ) -> DResult<Var> {
        let (rows, in_dim) = self.shape(x);
        let (out_dim, w_in) = params.shape(w);
        assert_eq!(
            w_in,
            in_dim,
            "linear `{}`: input has {in_dim} columns, weight expects {w_in}",
            params.name(w)
        );
        let mut y = self.take(rows * out_dim)?;
        let spec = GemmSpec {
            m: rows,
            n: out_dim,
            k: in_dim,
            a_t: false,
            b_t: true,
            accumulate: false,
        };
        self.dev
            .gemm(spec, self.value(x), params.value(w), &mut y)?;
        self.dev
            .bias_act(&mut y, b.map(|b| params.value(b)), rows, out_dim, act)?;
        Ok(self.push(rows, out_dim, Some(y), 0, true, Op::Linear { x, w, b, act }))
    }

    /// y = x ⊙ mask (dropout with a pre-scaled mask, or masking noise), mask from the host.
    pub fn mask(&mut self, x: Var, mask: &[T]) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        assert_eq!(mask.len(), rows * cols);
        let mut m = self.take(rows * cols)?;
        self.dev.write(&mut m, mask)?;
        let mut y = self.take(rows * cols)?;
        self.dev.mul(self.value(x), &m, &mut y)?;
        let needs = self.nodes[x.0].needs_grad;
        Ok(self.push(rows, cols, Some(y), 0, needs, Op::Mask { x, mask: m }))
    }

    /// Row-wise L2 normalisation, norms clamped below at `eps` (as `F.normalize`).
    pub fn l2_normalize(&mut self, x: Var, eps: T) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        let mut y = self.take(rows * cols)?;
        let mut norms = self.take(rows)?;
        self.dev
            .l2norm(self.value(x), rows, cols, eps, &mut y, &mut norms)?;
        let needs = self.nodes[x.0].needs_grad;
        Ok(self.push(rows, cols, Some(y), 0, needs, Op::L2Norm { x, norms, eps }))
    }

    fn pair_dot_with(
        &mut self,
        u: Var,
        n: usize,
        a: Indices<D::Idx>,
        b: Indices<D::Idx>,
    ) -> DResult<Var> {
        let (_, cols) = self.shape(u);
        let mut out = self.take(n)?;
        self.dev.pair_dot(
            self.value(u),
            cols,
            Self::ix(&self.iota, &a, n),
            Self::ix(&self.iota, &b, n),
            &mut out,
        )?;
        let needs = self.nodes[u.0].needs_grad;
        Ok(self.push(n, 1, Some(out), 0, needs, Op::PairDot { u, a, b }))
    }

    /// out_i = ⟨u[a_i], u[b_i]⟩ (cosines when u is normalised), as an n×1 column; indices
    /// from the host.
    pub fn pair_dot(&mut self, u: Var, a: &[u32], b: &[u32]) -> DResult<Var> {
        assert_eq!(a.len(), b.len());
        let ia = Indices::Owned(self.dev.upload_idx(a)?);
        let ib = Indices::Owned(self.dev.upload_idx(b)?);
        self.pair_dot_with(u, a.len(), ia, ib)
    }

    /// out_i = ⟨u[a0 + i], u[b0 + i]⟩ for i < n: pairs of two row blocks of u.
    pub fn pair_dot_blocks(&mut self, u: Var, a0: usize, b0: usize, n: usize) -> DResult<Var> {
        self.ensure_iota(a0.max(b0) + n)?;
        self.pair_dot_with(
            u,
            n,
            Indices::Iota { off: a0, len: n },
            Indices::Iota { off: b0, len: n },
        )
    }

    fn gather_with(&mut self, x: Var, n: usize, idx: Indices<D::Idx>) -> DResult<Var> {
        let (_, cols) = self.shape(x);
        let mut out = self.take(n * cols)?;
        self.dev
            .gather_rows(self.value(x), cols, Self::ix(&self.iota, &idx, n), &mut out)?;
        let needs = self.nodes[x.0].needs_grad;
        Ok(self.push(n, cols, Some(out), 0, needs, Op::Gather { x, idx }))
    }

    /// Rows `idx` of x (indices from the host).
    pub fn gather(&mut self, x: Var, idx: &[u32]) -> DResult<Var> {
        let i = Indices::Owned(self.dev.upload_idx(idx)?);
        self.gather_with(x, idx.len(), i)
    }

    /// Rows start..end of x.
    pub fn rows(&mut self, x: Var, start: usize, end: usize) -> DResult<Var> {
        self.ensure_iota(end)?;
        self.gather_with(
            x,
            end - start,
            Indices::Iota {
                off: start,
                len: end - start,
            },
        )
    }

    /// ProbPair loss (1/denom) Σ w_i BCE(y_i, σ((c_i − m)/T)) with m = tanh(m_raw),
    /// T = softplus(t_raw); y and w are n×1 columns.
    pub fn probpair_loss(
        &mut self,
        params: &Params<T, D>,
        c: Var,
        m_raw: ParamId,
        t_raw: ParamId,
        y: Var,
        w: Var,
        denom: f64,
    ) -> DResult<Var> {
        let n = self.shape(c).0;
        assert_eq!(self.shape(y).0, n);
        assert_eq!(self.shape(w).0, n);
        let mut d = self.take(n)?;
        let slot = self.slots(3);
        self.dev.probpair_bce(
            val(&self.nodes, c),
            params.value(m_raw),
            params.value(t_raw),
            val(&self.nodes, y),
            val(&self.nodes, w),
            denom,
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(
            1,
            1,
            None,
            slot,
            true,
            Op::ProbPair {
                c,
                m: m_raw,
                t: t_raw,
                d,
            },
        ))
    }

    /// scale · Σ (x − target)² (reconstruction; scale = 1/(rows·cols) for a mean).
    pub fn sq_error(&mut self, x: Var, target: Var, scale: f64) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        assert_eq!(self.shape(target), (rows, cols), "sq_error: target shape");
        let mut d = self.take(rows * cols)?;
        let slot = self.slots(1);
        self.dev.sq_error(
            val(&self.nodes, x),
            val(&self.nodes, target),
            scale,
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(1, 1, None, slot, true, Op::SqError { x, d }))
    }

    /// [`Graph::sq_error`] against host data.
    pub fn sq_error_host(&mut self, x: Var, target: &[T], scale: f64) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        let t = self.input(target, rows, cols)?;
        self.sq_error(x, t, scale)
    }

    /// Mean softmax cross-entropy against labels on the device; statistic 1 of the result is
    /// the number of correct argmax predictions.
    pub fn softmax_ce(&mut self, logits: Var, labels: Ix<'_, D::Idx>) -> DResult<Var> {
        let (rows, cols) = self.shape(logits);
        assert_eq!(labels.len, rows);
        let mut d = self.take(rows * cols)?;
        let slot = self.slots(2);
        self.dev.softmax_ce(
            val(&self.nodes, logits),
            rows,
            cols,
            labels,
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(1, 1, None, slot, true, Op::SoftmaxCe { logits, d }))
    }

    /// (1/denom) Σ w_i [huber_δ(p_i − t_i) + λ p_i²] for an n×1 prediction column.
    pub fn huber_l2(
        &mut self,
        p: Var,
        target: Var,
        w: Option<Var>,
        delta: f64,
        smooth: bool,
        lambda: f64,
        denom: f64,
    ) -> DResult<Var> {
        let n = self.shape(p).0 * self.shape(p).1;
        let mut d = self.take(n)?;
        let slot = self.slots(1);
        self.dev.huber_l2(
            val(&self.nodes, p),
            val(&self.nodes, target),
            w.map(|w| val(&self.nodes, w)),
            HuberL2 {
                delta,
                smooth,
                lambda,
                denom,
            },
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(1, 1, None, slot, true, Op::Huber { p, d }))
    }

    /// Row-wise softmax of x as a constant (predictions; no gradient flows through it).
    pub fn softmax_rows(&mut self, x: Var) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        let mut out = self.take(rows * cols)?;
        self.dev
            .softmax_rows(val(&self.nodes, x), rows, cols, &mut out)?;
        Ok(self.push(rows, cols, Some(out), 0, false, Op::Input))
    }

    /// Row-wise softmax, differentiable.
    pub fn softmax(&mut self, x: Var) -> DResult<Var> {
        let (rows, cols) = self.shape(x);
        let mut out = self.take(rows * cols)?;
        self.dev
            .softmax_rows(val(&self.nodes, x), rows, cols, &mut out)?;
        let needs = self.nodes[x.0].needs_grad;
        Ok(self.push(rows, cols, Some(out), 0, needs, Op::Softmax { x }))
    }

    /// Co-assignment BCE of the pairs (i, n + i), i < n, of soft assignments q (≥ 2n rows):
    /// P_i = q_iᵀ B q_{n+i}, B = σ(B′) with `b_raw` (a c×c parameter) or I; P clamped to
    /// [eps, 1 − eps]; (1/denom) Σ w_i BCE(y_i, P_i). y and w are n×1 columns.
    pub fn pair_cobce(
        &mut self,
        params: &Params<T, D>,
        q: Var,
        n: usize,
        b_raw: Option<ParamId>,
        y: Var,
        w: Var,
        eps: f64,
        denom: f64,
    ) -> DResult<Var> {
        let (rows, c) = self.shape(q);
        assert!(rows >= 2 * n, "pair_cobce: {rows} rows for {n} pairs");
        assert_eq!(self.shape(y).0, n);
        let mut d = self.take_zeroed(rows * c)?;
        let mut db = match b_raw {
            Some(b) => {
                assert_eq!(params.shape(b), (c, c), "B′ must be c×c");
                Some((b, self.take_zeroed(c * c)?))
            }
            None => None,
        };
        let slot = self.slots(1);
        self.dev.pair_cobce(
            val(&self.nodes, q),
            CoBce { c, n, eps, denom },
            b_raw.map(|b| params.value(b)),
            val(&self.nodes, y),
            val(&self.nodes, w),
            &mut d,
            db.as_mut().map(|(_, buf)| buf),
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(1, 1, None, slot, true, Op::PairCoBce { q, d, b: db }))
    }

    /// log det(XᵀX + eps·I) of a rows×c matrix (the volume term of VolMaxDCC).
    pub fn logdet_gram(&mut self, x: Var, eps: f64) -> DResult<Var> {
        let (rows, c) = self.shape(x);
        let mut m = self.take(c * c)?;
        let spec = GemmSpec {
            m: c,
            n: c,
            k: rows,
            a_t: true,
            b_t: false,
            accumulate: false,
        };
        self.dev
            .gemm(spec, val(&self.nodes, x), val(&self.nodes, x), &mut m)?;
        let mut minv = self.take(c * c)?;
        let slot = self.slots(1);
        self.dev
            .spd_logdet_inverse(&m, c, eps, &mut self.scalars, slot, &mut minv)?;
        self.give(m);
        Ok(self.push(1, 1, None, slot, true, Op::LogdetGram { x, minv }))
    }

    /// Student-t soft assignments of the rows of z to the centres of parameter `mu` (k×d):
    /// q ∝ (1 + ‖z − μ‖²/α)^(−e) row-normalised (DEC: e = (α + 1)/2).
    pub fn student_t(
        &mut self,
        params: &Params<T, D>,
        z: Var,
        mu: ParamId,
        alpha: f64,
        e: f64,
    ) -> DResult<Var> {
        let (rows, d) = self.shape(z);
        let (k, md) = params.shape(mu);
        assert_eq!(
            md, d,
            "student_t: centres of width {md} for embeddings of width {d}"
        );
        let mut q = self.take(rows * k)?;
        self.dev.student_t(
            val(&self.nodes, z),
            params.value(mu),
            StudentT {
                rows,
                d,
                k,
                alpha,
                e,
            },
            &mut q,
        )?;
        Ok(self.push(rows, k, Some(q), 0, true, Op::StudentT { z, mu, alpha, e }))
    }

    /// KL(P ‖ Q) of the fixed target `p` (a constant input) against q, summed over columns and
    /// divided by `denom`.
    pub fn kl_target(&mut self, q: Var, p: Var, denom: f64) -> DResult<Var> {
        let (rows, cols) = self.shape(q);
        assert_eq!(self.shape(p), (rows, cols), "kl_target: target shape");
        let mut d = self.take(rows * cols)?;
        let slot = self.slots(1);
        self.dev.kl_target(
            val(&self.nodes, q),
            val(&self.nodes, p),
            denom,
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        Ok(self.push(1, 1, None, slot, true, Op::KlTarget { q, d }))
    }

    /// Soft SpherePair loss on pair cosines c (n×1) with targets y and weights w.
    pub fn spherepair_loss(&mut self, c: Var, y: Var, w: Var, denom: f64) -> DResult<Var> {
        let n = self.shape(c).0;
        assert_eq!(self.shape(y).0, n);
        assert_eq!(self.shape(w).0, n);
        let mut d = self.take(n)?;
        let slot = self.slots(1);
        self.dev.spherepair_bce(
            val(&self.nodes, c),
            val(&self.nodes, y),
            val(&self.nodes, w),
            denom,
            &mut d,
            &mut self.scalars,
            slot,
        )?;
        // The same backward as the other fused losses: d is d loss / d c.
        Ok(self.push(1, 1, None, slot, true, Op::SqError { x: c, d }))
    }

    /// Σ coef · term over scalar nodes.
    pub fn sum(&mut self, terms: &[(Var, f64)]) -> DResult<Var> {
        let slot = self.slots(1);
        let src: Vec<(usize, f64)> = terms
            .iter()
            .map(|(v, c)| (self.nodes[v.0].slot, *c))
            .collect();
        self.dev.scalars_combine(&mut self.scalars, slot, &src)?;
        Ok(self.push(
            1,
            1,
            None,
            slot,
            true,
            Op::Sum {
                terms: terms.to_vec(),
            },
        ))
    }

    fn acc_grad(&mut self, v: Var) -> DResult<D::Buf> {
        match self.nodes[v.0].grad.take() {
            Some(g) => Ok(g),
            None => {
                let n = self.nodes[v.0].rows * self.nodes[v.0].cols;
                self.take_zeroed(n)
            }
        }
    }

    /// Back-propagate from scalar `loss`, accumulating into `params`' gradients.
    pub fn backward(&mut self, loss: Var, params: &mut Params<T, D>) -> DResult<()> {
        self.nodes[loss.0].scalar_grad = 1.0;
        for i in (0..self.nodes.len()).rev() {
            if !self.nodes[i].needs_grad {
                continue;
            }
            let op = std::mem::replace(&mut self.nodes[i].op, Op::Input);
            let r = self.backward_op(i, &op, params);
            self.nodes[i].op = op;
            r?;
        }
        Ok(())
    }

    fn backward_op(&mut self, i: usize, op: &Op<T, D>, params: &mut Params<T, D>) -> DResult<()> {
        match op {
            Op::Input => {}
            Op::Sum { terms } => {
                let g = self.nodes[i].scalar_grad;
                for (t, c) in terms {
                    self.nodes[t.0].scalar_grad += g * c;
                }
            }
            Op::ProbPair { c, m, t, d } => {
                let g = self.nodes[i].scalar_grad;
                if g != 0.0 {
                    if self.nodes[c.0].needs_grad {
                        let mut gc = self.acc_grad(*c)?;
                        self.dev.axpy(T::from_f64(g), d, &mut gc)?;
                        self.nodes[c.0].grad = Some(gc);
                    }
                    let slot = self.nodes[i].slot;
                    self.dev
                        .scalar_to_grad(&self.scalars, slot + 1, g, params.grad_mut(*m)?)?;
                    self.dev
                        .scalar_to_grad(&self.scalars, slot + 2, g, params.grad_mut(*t)?)?;
                }
            }
            Op::SqError { x: src, d }
            | Op::SoftmaxCe { logits: src, d }
            | Op::Huber { p: src, d }
            | Op::KlTarget { q: src, d }
            | Op::PairCoBce { q: src, d, b: None } => {
                let g = self.nodes[i].scalar_grad;
                if g != 0.0 && self.nodes[src.0].needs_grad {
                    let mut gx = self.acc_grad(*src)?;
                    self.dev.axpy(T::from_f64(g), d, &mut gx)?;
                    self.nodes[src.0].grad = Some(gx);
                }
            }
            Op::PairCoBce {
                q,
                d,
                b: Some((b, db)),
            } => {
                let g = self.nodes[i].scalar_grad;
                if g != 0.0 {
                    if self.nodes[q.0].needs_grad {
                        let mut gq = self.acc_grad(*q)?;
                        let r = self.dev.axpy(T::from_f64(g), d, &mut gq);
                        self.nodes[q.0].grad = Some(gq);
                        r?;
                    }
                    self.dev.axpy(T::from_f64(g), db, params.grad_mut(*b)?)?;
                }
            }
            Op::Softmax { x } => {
                if let Some(dy) = self.nodes[i].grad.take() {
                    let (rows, cols) = (self.nodes[i].rows, self.nodes[i].cols);
                    let mut dx = self.acc_grad(*x)?;
                    let r = self.dev.softmax_backward(
                        self.nodes[i].value.as_ref().expect("value"),
                        &dy,
                        rows,
                        cols,
                        &mut dx,
                    );
                    self.nodes[x.0].grad = Some(dx);
                    self.nodes[i].grad = Some(dy);
                    r?;
                }
            }
            Op::LogdetGram { x, minv } => {
                let g = self.nodes[i].scalar_grad;
                if g != 0.0 && self.nodes[x.0].needs_grad {
                    let (rows, c) = (self.nodes[x.0].rows, self.nodes[x.0].cols);
                    // d logdet(XᵀX)/dX = 2 X M⁻¹.
                    let mut t = self.take(rows * c)?;
                    let spec = GemmSpec {
                        m: rows,
                        n: c,
                        k: c,
                        a_t: false,
                        b_t: false,
                        accumulate: false,
                    };
                    self.dev.gemm(
                        spec,
                        self.nodes[x.0].value.as_ref().expect("value"),
                        minv,
                        &mut t,
                    )?;
                    let mut gx = self.acc_grad(*x)?;
                    let r = self.dev.axpy(T::from_f64(2.0 * g), &t, &mut gx);
                    self.nodes[x.0].grad = Some(gx);
                    self.give(t);
                    r?;
                }
            }
            Op::StudentT { z, mu, alpha, e } => {
                if let Some(dq) = self.nodes[i].grad.take() {
                    let (rows, k) = (self.nodes[i].rows, self.nodes[i].cols);
                    let d = self.nodes[z.0].cols;
                    let mut dz = self.acc_grad(*z)?;
                    let (muv, dmu, accumulate) = params.value_and_grad_for_write(*mu);
                    if !accumulate {
                        self.dev.fill(dmu, T::ZERO)?;
                    }
                    let r = self.dev.student_t_backward(
                        self.nodes[z.0].value.as_ref().expect("value"),
                        muv,
                        self.nodes[i].value.as_ref().expect("value"),
                        &dq,
                        StudentT {
                            rows,
                            d,
                            k,
                            alpha: *alpha,
                            e: *e,
                        },
                        &mut dz,
                        dmu,
                    );
                    self.nodes[z.0].grad = Some(dz);
                    self.nodes[i].grad = Some(dq);
                    r?;
                }
            }
            Op::Linear { x, w, b, act } => {
                let Some(dy) = self.nodes[i].grad.take() else {
                    return Ok(());
                };
                let (rows, out_dim) = (self.nodes[i].rows, self.nodes[i].cols);
                let in_dim = self.nodes[x.0].cols;
                let dz = if *act == Act::Identity {
                    dy
                } else {
                    let mut dz = self.take(rows * out_dim)?;
                    self.dev.act_backward(
                        self.nodes[i].value.as_ref().expect("value"),
                        &dy,
                        &mut dz,
                        *act,
                    )?;
                    self.give(dy);
                    dz
                };
                if let Some(b) = b {
                    let (db, accumulate) = params.grad_for_write(*b);
                    if !accumulate {
                        self.dev.fill(db, T::ZERO)?;
                    }
                    self.dev.col_sums_acc(&dz, rows, out_dim, db)?;
                }
                let (wv, dw, accumulate) = params.value_and_grad_for_write(*w);
                let dw_spec = GemmSpec {
                    m: out_dim,
                    n: in_dim,
                    k: rows,
                    a_t: true,
                    b_t: false,
                    accumulate,
                };
                if self.nodes[x.0].needs_grad {
                    let (mut dx, dx_accumulate) = match self.nodes[x.0].grad.take() {
                        Some(g) => (g, true),
                        None => (self.take(rows * in_dim)?, false),
                    };
                    let dx_spec = GemmSpec {
                        m: rows,
                        n: in_dim,
                        k: out_dim,
                        a_t: false,
                        b_t: false,
                        accumulate: dx_accumulate,
                    };
                    let xv = self.nodes[x.0].value.as_ref().expect("value");
                    let r = self
                        .dev
                        .gemm2(dw_spec, &dz, xv, dw, dx_spec, &dz, wv, &mut dx);
                    self.nodes[x.0].grad = Some(dx);
                    r?;
                } else {
                    let xv = self.nodes[x.0].value.as_ref().expect("value");
                    self.dev.gemm(dw_spec, &dz, xv, dw)?;
                }
                self.nodes[i].grad = Some(dz);
            }
            Op::Mask { x, mask } => {
                if let Some(dy) = self.nodes[i].grad.take() {
                    let mut dx = self.acc_grad(*x)?;
                    let r = self.dev.mul_acc(&dy, mask, &mut dx);
                    self.nodes[x.0].grad = Some(dx);
                    self.nodes[i].grad = Some(dy);
                    r?;
                }
            }
            Op::L2Norm { x, norms, eps } => {
                if let Some(dy) = self.nodes[i].grad.take() {
                    let (rows, cols) = (self.nodes[i].rows, self.nodes[i].cols);
                    let mut dx = self.acc_grad(*x)?;
                    let r = self.dev.l2norm_backward(
                        self.nodes[i].value.as_ref().expect("value"),
                        norms,
                        *eps,
                        &dy,
                        rows,
                        cols,
                        &mut dx,
                    );
                    self.nodes[x.0].grad = Some(dx);
                    self.nodes[i].grad = Some(dy);
                    r?;
                }
            }
            Op::PairDot { u, a, b } => {
                if let Some(dy) = self.nodes[i].grad.take() {
                    let cols = self.nodes[u.0].cols;
                    let n = self.nodes[i].rows;
                    let mut du = self.acc_grad(*u)?;
                    let r = self.dev.pair_dot_backward(
                        self.nodes[u.0].value.as_ref().expect("value"),
                        cols,
                        Self::ix(&self.iota, a, n),
                        Self::ix(&self.iota, b, n),
                        &dy,
                        &mut du,
                    );
                    self.nodes[u.0].grad = Some(du);
                    self.nodes[i].grad = Some(dy);
                    r?;
                }
            }
            Op::Gather { x, idx } => {
                if let Some(dy) = self.nodes[i].grad.take() {
                    let cols = self.nodes[x.0].cols;
                    let n = self.nodes[i].rows;
                    let mut dx = self.acc_grad(*x)?;
                    let r =
                        self.dev
                            .scatter_add_rows(&dy, cols, Self::ix(&self.iota, idx, n), &mut dx);
                    self.nodes[x.0].grad = Some(dx);
                    self.nodes[i].grad = Some(dy);
                    r?;
                }
            }
        }
        Ok(())
    }
}
