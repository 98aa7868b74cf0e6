//! The tape: a forward pass records [`Op`]s; [`Graph::backward`] walks them in reverse and
//! accumulates gradients into the parameters.
//!
//! Buffers are pooled by size and reused across steps (`reset`), so a training step does
//! not allocate once the first step has run.

use std::collections::HashMap;

use crate::device::{Act, Device, GemmSpec};
use crate::params::{ParamId, Params};
use crate::scalar::{sigmoid, softplus, Real};

/// A value in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Var(usize);

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
        a: Vec<u32>,
        b: Vec<u32>,
    },
    Gather {
        x: Var,
        idx: Vec<u32>,
    },
    /// Scalar ops: the gradient w.r.t. the tensor input is computed in the forward pass
    /// (`d`), scaled by the upstream scalar gradient in backward.
    ProbPair {
        c: Var,
        m: ParamId,
        t: ParamId,
        d: D::Buf,
        dm_raw: f64,
        dt_raw: f64,
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
}

struct Node<T: Real, D: Device<T>> {
    rows: usize,
    cols: usize,
    value: Option<D::Buf>,
    /// Scalar value (losses).
    scalar: f64,
    grad: Option<D::Buf>,
    scalar_grad: f64,
    needs_grad: bool,
    op: Op<T, D>,
}

/// A recorded computation on device `D`.
pub struct Graph<T: Real, D: Device<T>> {
    dev: D,
    nodes: Vec<Node<T, D>>,
    pool: HashMap<usize, Vec<D::Buf>>,
}

impl<T: Real, D: Device<T>> Graph<T, D> {
    pub fn new(dev: D) -> Self {
        Graph {
            dev,
            nodes: Vec::new(),
            pool: HashMap::new(),
        }
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Forget the recorded ops, keeping their buffers for the next step.
    pub fn reset(&mut self) {
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
                | Op::Huber { d, .. } => self.give(d),
                _ => {}
            }
        }
    }

    fn give(&mut self, buf: D::Buf) {
        let len = self.dev.len(&buf);
        self.pool.entry(len).or_default().push(buf);
    }

    /// A buffer of `len` elements with unspecified contents (callers overwrite it).
    fn take(&mut self, len: usize) -> D::Buf {
        match self.pool.get_mut(&len).and_then(|v| v.pop()) {
            Some(b) => b,
            None => self.dev.zeros(len),
        }
    }

    fn take_zeroed(&mut self, len: usize) -> D::Buf {
        let mut b = self.take(len);
        self.dev.fill(&mut b, T::ZERO);
        b
    }

    fn push(
        &mut self,
        rows: usize,
        cols: usize,
        value: Option<D::Buf>,
        scalar: f64,
        needs_grad: bool,
        op: Op<T, D>,
    ) -> Var {
        self.nodes.push(Node {
            rows,
            cols,
            value,
            scalar,
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
    pub fn to_host(&self, v: Var) -> Vec<T> {
        self.dev.to_vec(self.value(v))
    }

    /// The value of a scalar node (a loss).
    pub fn scalar(&self, v: Var) -> f64 {
        self.nodes[v.0].scalar
    }

    /// A constant input (no gradient), rows×cols, from host data.
    pub fn input(&mut self, data: &[T], rows: usize, cols: usize) -> Var {
        assert_eq!(
            data.len(),
            rows * cols,
            "input: {} values for {rows}×{cols}",
            data.len()
        );
        let mut buf = self.take(rows * cols);
        self.dev.write(&mut buf, data);
        self.push(rows, cols, Some(buf), 0.0, false, Op::Input)
    }

    /// y = act(x·Wᵀ + b), W stored out×in.
    pub fn linear(
        &mut self,
        params: &Params<T, D>,
        x: Var,
        w: ParamId,
        b: Option<ParamId>,
        act: Act,
    ) -> Var {
        let (rows, in_dim) = self.shape(x);
        let (out_dim, w_in) = params.shape(w);
        assert_eq!(
            w_in,
            in_dim,
            "linear `{}`: input has {in_dim} columns, weight expects {w_in}",
            params.name(w)
        );
        let mut y = self.take(rows * out_dim);
        let spec = GemmSpec {
            m: rows,
            n: out_dim,
            k: in_dim,
            a_t: false,
            b_t: true,
            accumulate: false,
        };
        self.dev.gemm(spec, self.value(x), params.value(w), &mut y);
        self.dev
            .bias_act(&mut y, b.map(|b| params.value(b)), rows, out_dim, act);
        self.push(
            rows,
            out_dim,
            Some(y),
            0.0,
            true,
            Op::Linear { x, w, b, act },
        )
    }

    /// y = x ⊙ mask (dropout with a pre-scaled mask, or masking noise).
    pub fn mask(&mut self, x: Var, mask: &[T]) -> Var {
        let (rows, cols) = self.shape(x);
        assert_eq!(mask.len(), rows * cols);
        let mut m = self.take(rows * cols);
        self.dev.write(&mut m, mask);
        let mut y = self.take(rows * cols);
        self.dev.mul(self.value(x), &m, &mut y);
        let needs = self.nodes[x.0].needs_grad;
        self.push(rows, cols, Some(y), 0.0, needs, Op::Mask { x, mask: m })
    }

    /// Row-wise L2 normalisation, norms clamped below at `eps` (as `F.normalize`).
    pub fn l2_normalize(&mut self, x: Var, eps: T) -> Var {
        let (rows, cols) = self.shape(x);
        let mut y = self.take(rows * cols);
        let mut norms = self.take(rows);
        self.dev
            .l2norm(self.value(x), rows, cols, eps, &mut y, &mut norms);
        let needs = self.nodes[x.0].needs_grad;
        self.push(
            rows,
            cols,
            Some(y),
            0.0,
            needs,
            Op::L2Norm { x, norms, eps },
        )
    }

    /// out_i = ⟨u[a_i], u[b_i]⟩ (cosines when u is normalised), as an n×1 column.
    pub fn pair_dot(&mut self, u: Var, a: &[u32], b: &[u32]) -> Var {
        assert_eq!(a.len(), b.len());
        let (_, cols) = self.shape(u);
        let mut out = self.take(a.len());
        self.dev.pair_dot(self.value(u), cols, a, b, &mut out);
        let needs = self.nodes[u.0].needs_grad;
        self.push(
            a.len(),
            1,
            Some(out),
            0.0,
            needs,
            Op::PairDot {
                u,
                a: a.to_vec(),
                b: b.to_vec(),
            },
        )
    }

    /// Rows `idx` of x.
    pub fn gather(&mut self, x: Var, idx: &[u32]) -> Var {
        let (_, cols) = self.shape(x);
        let mut out = self.take(idx.len() * cols);
        self.dev.gather_rows(self.value(x), cols, idx, &mut out);
        let needs = self.nodes[x.0].needs_grad;
        self.push(
            idx.len(),
            cols,
            Some(out),
            0.0,
            needs,
            Op::Gather {
                x,
                idx: idx.to_vec(),
            },
        )
    }

    /// Rows start..end of x.
    pub fn rows(&mut self, x: Var, start: usize, end: usize) -> Var {
        let idx: Vec<u32> = (start as u32..end as u32).collect();
        self.gather(x, &idx)
    }

    /// ProbPair loss (1/denom) Σ w_i BCE(y_i, σ((c_i − m)/T)) with m = tanh(m_raw),
    /// T = softplus(t_raw).
    pub fn probpair_loss(
        &mut self,
        params: &Params<T, D>,
        c: Var,
        m_raw: ParamId,
        t_raw: ParamId,
        y: &[T],
        w: &[T],
        denom: f64,
    ) -> Var {
        let n = self.shape(c).0;
        assert_eq!(y.len(), n);
        assert_eq!(w.len(), n);
        let (mr, tr) = (params.scalar(m_raw), params.scalar(t_raw));
        let m = mr.tanh();
        let t = softplus(tr);
        let mut d = self.take(n);
        let (loss, g) = self
            .dev
            .probpair_bce(self.value(c), m, t, y, w, denom, &mut d);
        let dm_raw = g.dm * (1.0 - m.to_f64() * m.to_f64());
        let dt_raw = g.dt * sigmoid(tr.to_f64());
        self.push(
            1,
            1,
            None,
            loss,
            true,
            Op::ProbPair {
                c,
                m: m_raw,
                t: t_raw,
                d,
                dm_raw,
                dt_raw,
            },
        )
    }

    /// scale · Σ (x − target)² (reconstruction; scale = 1/(rows·cols) for a mean).
    pub fn sq_error(&mut self, x: Var, target: &[T], scale: f64) -> Var {
        let (rows, cols) = self.shape(x);
        assert_eq!(target.len(), rows * cols);
        let mut d = self.take(rows * cols);
        let mut t = self.take(rows * cols);
        self.dev.write(&mut t, target);
        let loss = self.dev.sq_error(self.value(x), &t, scale, &mut d);
        self.give(t);
        self.push(1, 1, None, loss, true, Op::SqError { x, d })
    }

    /// Mean softmax cross-entropy; also returns the number of correct argmax predictions.
    pub fn softmax_ce(&mut self, logits: Var, labels: &[u32]) -> (Var, usize) {
        let (rows, cols) = self.shape(logits);
        let mut d = self.take(rows * cols);
        let (loss, correct) = self
            .dev
            .softmax_ce(self.value(logits), rows, cols, labels, &mut d);
        (
            self.push(1, 1, None, loss, true, Op::SoftmaxCe { logits, d }),
            correct,
        )
    }

    /// (1/denom) Σ w_i [huber_δ(p_i − t_i) + λ p_i²] for an n×1 prediction column.
    pub fn huber_l2(
        &mut self,
        p: Var,
        target: &[T],
        w: Option<&[T]>,
        delta: f64,
        lambda: f64,
        denom: f64,
    ) -> Var {
        let n = self.shape(p).0 * self.shape(p).1;
        let mut d = self.take(n);
        let loss = self
            .dev
            .huber_l2(self.value(p), target, w, delta, lambda, denom, &mut d);
        self.push(1, 1, None, loss, true, Op::Huber { p, d })
    }

    /// Σ coef · term over scalar nodes.
    pub fn sum(&mut self, terms: &[(Var, f64)]) -> Var {
        let v: f64 = terms.iter().map(|(t, c)| c * self.nodes[t.0].scalar).sum();
        self.push(
            1,
            1,
            None,
            v,
            true,
            Op::Sum {
                terms: terms.to_vec(),
            },
        )
    }

    fn acc_grad(&mut self, v: Var) -> D::Buf {
        match self.nodes[v.0].grad.take() {
            Some(g) => g,
            None => {
                let n = self.nodes[v.0].rows * self.nodes[v.0].cols;
                self.take_zeroed(n)
            }
        }
    }

    /// Back-propagate from scalar `loss`, accumulating into `params`' gradients.
    pub fn backward(&mut self, loss: Var, params: &mut Params<T, D>) {
        self.nodes[loss.0].scalar_grad = 1.0;
        for i in (0..self.nodes.len()).rev() {
            if !self.nodes[i].needs_grad {
                continue;
            }
            let op = std::mem::replace(&mut self.nodes[i].op, Op::Input);
            match &op {
                Op::Input => {}
                Op::Sum { terms } => {
                    let g = self.nodes[i].scalar_grad;
                    for (t, c) in terms {
                        self.nodes[t.0].scalar_grad += g * c;
                    }
                }
                Op::ProbPair {
                    c,
                    m,
                    t,
                    d,
                    dm_raw,
                    dt_raw,
                } => {
                    let g = self.nodes[i].scalar_grad;
                    if g != 0.0 {
                        if self.nodes[c.0].needs_grad {
                            let mut gc = self.acc_grad(*c);
                            self.dev.axpy(T::from_f64(g), d, &mut gc);
                            self.nodes[c.0].grad = Some(gc);
                        }
                        add_scalar_grad(params, *m, g * dm_raw);
                        add_scalar_grad(params, *t, g * dt_raw);
                    }
                }
                Op::SqError { x: src, d }
                | Op::SoftmaxCe { logits: src, d }
                | Op::Huber { p: src, d } => {
                    let g = self.nodes[i].scalar_grad;
                    if g != 0.0 && self.nodes[src.0].needs_grad {
                        let mut gx = self.acc_grad(*src);
                        self.dev.axpy(T::from_f64(g), d, &mut gx);
                        self.nodes[src.0].grad = Some(gx);
                    }
                }
                Op::Linear { x, w, b, act } => {
                    if let Some(dy) = self.nodes[i].grad.take() {
                        let (rows, out_dim) = (self.nodes[i].rows, self.nodes[i].cols);
                        let in_dim = self.nodes[x.0].cols;
                        let dz = if *act == Act::Identity {
                            dy
                        } else {
                            let mut dz = self.take(rows * out_dim);
                            self.dev.act_backward(
                                self.nodes[i].value.as_ref().expect("value"),
                                &dy,
                                &mut dz,
                                *act,
                            );
                            self.give(dy);
                            dz
                        };
                        if let Some(b) = b {
                            let (db, accumulate) = params.grad_for_write(*b);
                            if !accumulate {
                                self.dev.fill(db, T::ZERO);
                            }
                            self.dev.col_sums_acc(&dz, rows, out_dim, db);
                        }
                        let xv = self.nodes[x.0].value.as_ref().expect("value");
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
                                None => (self.take(rows * in_dim), false),
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
                            self.dev
                                .gemm2(dw_spec, &dz, xv, dw, dx_spec, &dz, wv, &mut dx);
                            self.nodes[x.0].grad = Some(dx);
                        } else {
                            self.dev.gemm(dw_spec, &dz, xv, dw);
                        }
                        self.nodes[i].grad = Some(dz);
                    }
                }
                Op::Mask { x, mask } => {
                    if let Some(dy) = self.nodes[i].grad.take() {
                        let mut dx = self.acc_grad(*x);
                        self.dev.mul_acc(&dy, mask, &mut dx);
                        self.nodes[x.0].grad = Some(dx);
                        self.nodes[i].grad = Some(dy);
                    }
                }
                Op::L2Norm { x, norms, eps } => {
                    if let Some(dy) = self.nodes[i].grad.take() {
                        let (rows, cols) = (self.nodes[i].rows, self.nodes[i].cols);
                        let mut dx = self.acc_grad(*x);
                        self.dev.l2norm_backward(
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
                    }
                }
                Op::PairDot { u, a, b } => {
                    if let Some(dy) = self.nodes[i].grad.take() {
                        let cols = self.nodes[u.0].cols;
                        let mut du = self.acc_grad(*u);
                        self.dev.pair_dot_backward(
                            self.nodes[u.0].value.as_ref().expect("value"),
                            cols,
                            a,
                            b,
                            &dy,
                            &mut du,
                        );
                        self.nodes[u.0].grad = Some(du);
                        self.nodes[i].grad = Some(dy);
                    }
                }
                Op::Gather { x, idx } => {
                    if let Some(dy) = self.nodes[i].grad.take() {
                        let cols = self.nodes[x.0].cols;
                        let mut dx = self.acc_grad(*x);
                        self.dev.scatter_add_rows(&dy, cols, idx, &mut dx);
                        self.nodes[x.0].grad = Some(dx);
                        self.nodes[i].grad = Some(dy);
                    }
                }
            }
            self.nodes[i].op = op;
        }
    }
}

fn add_scalar_grad<T: Real, D: Device<T>>(params: &mut Params<T, D>, id: ParamId, g: f64) {
    let dev = params.device().clone();
    let src = dev.upload(&[T::from_f64(g)]);
    dev.axpy(T::ONE, &src, params.grad_mut(id));
}
