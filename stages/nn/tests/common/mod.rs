//! The parity scenarios every backend is held to: every `Device` op (with zero-length buffers
//! and the optional arguments left out) and a whole training step, on one device, with the
//! tolerance they are compared by. `cuda_ops.rs` runs them on a GPU against the CPU;
//! `parity.rs` runs them against the CPU under another summation order, on any machine.

#![allow(dead_code)]

pub mod soft;

use upcc_nn::{
    Act, Adam, CoBce, Device, GemmSpec, Graph, HuberL2, Init, Ix, Mlp, Params, Stream, StudentT,
    WeightInit,
};

pub fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = Stream::new(seed, &["cuda-ops"]);
    (0..n).map(|_| s.uniform_range(-1.0, 1.0) as f32).collect()
}

/// One f32 output of a scenario: its values and, for outputs of sums whose terms cancel
/// (matrix products), the scale of each value — Σ |a_ip||b_pj| (+ |c_ij| when accumulating) —
/// which any other summation order may be off by a few ulps of.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub name: String,
    pub values: Vec<f32>,
    pub scale: Option<Vec<f32>>,
}

/// Named f32 outputs and named f64 slot vectors of a scenario.
pub type Outputs = (Vec<Output>, Vec<(String, Vec<f64>)>);

fn out(name: impl Into<String>, values: Vec<f32>) -> Output {
    Output {
        name: name.into(),
        values,
        scale: None,
    }
}

/// Σ_p |a_ip||b_pj| (+ |c_ij|) of a product, on the host in f64.
fn gemm_scale(spec: GemmSpec, a: &[f32], b: &[f32], c0: &[f32]) -> Vec<f32> {
    let GemmSpec {
        m,
        n,
        k,
        a_t,
        b_t,
        accumulate,
    } = spec;
    let at = |i: usize, p: usize| if a_t { a[p * m + i] } else { a[i * k + p] };
    let bt = |p: usize, j: usize| if b_t { b[j * k + p] } else { b[p * n + j] };
    let mut s = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut v: f64 = (0..k)
                .map(|p| (at(i, p).abs() as f64) * (bt(p, j).abs() as f64))
                .sum();
            if accumulate {
                v += c0[i * n + j].abs() as f64;
            }
            s[i * n + j] = v as f32;
        }
    }
    s
}

/// The tolerance of one element: 1e-6 absolute, 1e-4 relative, and 1e-5 of the element's
/// scale where it has one (the condition of a dot product: cancelling terms leave a small
/// result whose error is set by the terms, not by the result).
pub fn tolerance(a: f32, b: f32, scale: Option<f32>) -> f32 {
    1e-6 + 1e-4 * a.abs().max(b.abs()) + 1e-5 * scale.unwrap_or(0.0)
}

/// The worst |a − b| / tolerance over every output (1 = at the limit), panicking with the
/// element's name and values past it. Lengths and names must agree one to one.
pub fn compare(reference: &Outputs, other: &Outputs, label: &str) -> f64 {
    let ((ra, rs), (oa, os)) = (reference, other);
    let names = |v: &[Output]| v.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(ra), names(oa), "{label}: the same outputs in order");
    let snames = |v: &[(String, Vec<f64>)]| v.iter().map(|o| o.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        snames(rs),
        snames(os),
        "{label}: the same slot vectors in order"
    );
    let mut worst = 0f64;
    for (r, o) in ra.iter().zip(oa) {
        assert_eq!(
            r.values.len(),
            o.values.len(),
            "{label} {}: lengths",
            r.name
        );
        for (i, (&a, &b)) in r.values.iter().zip(&o.values).enumerate() {
            let tol = tolerance(a, b, r.scale.as_ref().map(|s| s[i]));
            let ratio = ((a - b).abs() / tol) as f64;
            assert!(
                ratio <= 1.0,
                "{label} {}[{i}]: {a} vs {b} (tolerance {tol})",
                r.name
            );
            worst = worst.max(ratio);
        }
    }
    for ((name, a), (_, b)) in rs.iter().zip(os) {
        assert_eq!(a.len(), b.len(), "{label} {name}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            if x == y {
                continue; // also ±inf and the slots a scenario leaves at 0
            }
            let tol = 1e-9 + 1e-5 * x.abs().max(y.abs());
            let ratio = (x - y).abs() / tol;
            assert!(
                ratio <= 1.0,
                "{label} {name}[{i}]: {x} vs {y} (tolerance {tol})"
            );
            worst = worst.max(ratio);
        }
    }
    worst
}

/// Every op of the trait on one device; named outputs (f32 buffers and f64 slots).
pub fn every_op<D: Device<f32>>(d: &D) -> Outputs {
    let mut outs: Vec<Output> = Vec::new();
    let mut sc: Vec<(String, Vec<f64>)> = Vec::new();
    let up = |v: &[f32]| d.upload(v).unwrap();
    let get = |b: &D::Buf| d.to_vec(b).unwrap();
    // Products in every layout, overwrite and accumulate.
    let (m, n, k) = (67, 45, 130);
    for a_t in [false, true] {
        for b_t in [false, true] {
            for acc in [false, true] {
                let (ha, hb, hc) = (rand(m * k, 1), rand(k * n, 2), rand(m * n, 3));
                let mut c = up(&hc);
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    a_t,
                    b_t,
                    accumulate: acc,
                };
                d.gemm(spec, &up(&ha), &up(&hb), &mut c).unwrap();
                outs.push(Output {
                    name: format!("gemm a_t={a_t} b_t={b_t} acc={acc}"),
                    values: get(&c),
                    scale: Some(gemm_scale(spec, &ha, &hb, &hc)),
                });
            }
        }
    }
    // Two products at once (the weight and input gradients of a layer).
    let (s1, s2) = (
        GemmSpec {
            m: 9,
            n: 13,
            k: 70,
            a_t: true,
            b_t: false,
            accumulate: true,
        },
        GemmSpec {
            m: 17,
            n: 9,
            k: 13,
            a_t: false,
            b_t: true,
            accumulate: false,
        },
    );
    let (a1, b1, c1h) = (rand(9 * 70, 50), rand(70 * 13, 51), rand(9 * 13, 52));
    let (a2, b2) = (rand(17 * 13, 53), rand(9 * 13, 54));
    let (mut c1, mut c2) = (up(&c1h), d.zeros(17 * 9).unwrap());
    d.gemm2(
        s1,
        &up(&a1),
        &up(&b1),
        &mut c1,
        s2,
        &up(&a2),
        &up(&b2),
        &mut c2,
    )
    .unwrap();
    outs.push(Output {
        name: "gemm2 first".into(),
        values: get(&c1),
        scale: Some(gemm_scale(s1, &a1, &b1, &c1h)),
    });
    outs.push(Output {
        name: "gemm2 second".into(),
        values: get(&c2),
        scale: Some(gemm_scale(s2, &a2, &b2, &[])),
    });
    let (rows, cols) = (37, 19);
    let x = rand(rows * cols, 4);
    for act in [Act::Identity, Act::Relu, Act::Tanh] {
        let mut y = up(&x);
        let bias = up(&rand(cols, 5));
        d.bias_act(&mut y, Some(&bias), rows, cols, act).unwrap();
        outs.push(out(format!("bias_act {act:?}"), get(&y)));
        let dy = up(&rand(rows * cols, 6));
        let mut dz = d.zeros(rows * cols).unwrap();
        d.act_backward(&y, &dy, &mut dz, act).unwrap();
        outs.push(out(format!("act_backward {act:?}"), get(&dz)));
    }
    // Without a bias (the kernel gets a placeholder it must not read).
    for act in [Act::Relu, Act::Tanh] {
        let mut y = up(&x);
        d.bias_act(&mut y, None, rows, cols, act).unwrap();
        outs.push(out(format!("bias_act {act:?} without bias"), get(&y)));
    }
    let mut db = up(&rand(cols, 7));
    d.col_sums_acc(&up(&x), rows, cols, &mut db).unwrap();
    outs.push(out("col_sums_acc", get(&db)));
    let mut dst = up(&rand(rows * cols, 8));
    d.axpy(0.7, &up(&x), &mut dst).unwrap();
    outs.push(out("axpy", get(&dst)));
    d.axpy_range(-1.5, &up(&x), 5, &mut dst, 11, 40).unwrap();
    outs.push(out("axpy_range", get(&dst)));
    d.copy_range(&up(&x), 3, &mut dst, 100, 50).unwrap();
    outs.push(out("copy_range", get(&dst)));
    let mut written = d.zeros(7).unwrap();
    d.write(&mut written, &rand(7, 55)).unwrap();
    outs.push(out("write", get(&written)));
    let mask = up(&rand(rows * cols, 9));
    let mut y = d.zeros(rows * cols).unwrap();
    d.mul(&up(&x), &mask, &mut y).unwrap();
    outs.push(out("mul", get(&y)));
    d.mul_acc(&up(&x), &mask, &mut y).unwrap();
    outs.push(out("mul_acc", get(&y)));
    let mut s2b = up(&x);
    d.scale(&mut s2b, 0.3).unwrap();
    outs.push(out("scale", get(&s2b)));
    let mut f = up(&x);
    d.fill(&mut f, 2.5).unwrap();
    outs.push(out("fill", get(&f)));
    let mut sc_dst = up(&rand(rows * 4, 10));
    d.set_column(&up(&rand(rows, 11)), &mut sc_dst, rows, 4, 2)
        .unwrap();
    outs.push(out("set_column", get(&sc_dst)));
    // Row normalisation, one zero row (clamped at eps).
    let mut xz = x.clone();
    xz[..cols].fill(0.0);
    let (mut yn, mut norms) = (d.zeros(rows * cols).unwrap(), d.zeros(rows).unwrap());
    d.l2norm(&up(&xz), rows, cols, 1e-12, &mut yn, &mut norms)
        .unwrap();
    outs.push(out("l2norm", get(&yn)));
    outs.push(out("l2norm norms", get(&norms)));
    let mut dx = up(&rand(rows * cols, 12));
    d.l2norm_backward(
        &yn,
        &norms,
        1e-12,
        &up(&rand(rows * cols, 13)),
        rows,
        cols,
        &mut dx,
    )
    .unwrap();
    outs.push(out("l2norm_backward", get(&dx)));
    // Pairs, gathers and scatters: with repeated indices and with distinct ones.
    let ia = d.upload_idx(&[3, 0, 7, 7, 12, 36, 1]).unwrap();
    let ib = d.upload_idx(&[5, 0, 2, 9, 12, 30, 36]).unwrap();
    let mut pd = d.zeros(7).unwrap();
    d.pair_dot(
        &up(&x),
        cols,
        Ix::new(&ia, 0, 7),
        Ix::new(&ib, 0, 7),
        &mut pd,
    )
    .unwrap();
    outs.push(out("pair_dot", get(&pd)));
    let g7 = up(&rand(7, 14));
    let mut du = up(&rand(rows * cols, 15));
    d.pair_dot_backward(
        &up(&x),
        cols,
        Ix::new(&ia, 0, 7),
        Ix::new(&ib, 0, 7),
        &g7,
        &mut du,
    )
    .unwrap();
    outs.push(out("pair_dot_backward (repeats)", get(&du)));
    let iota = d.upload_idx(&(0..rows as u32).collect::<Vec<_>>()).unwrap();
    let mut du2 = up(&rand(rows * cols, 16));
    let g10 = up(&rand(10, 17));
    d.pair_dot_backward(
        &up(&x),
        cols,
        Ix::distinct(&iota, 0, 10),
        Ix::distinct(&iota, 10, 10),
        &g10,
        &mut du2,
    )
    .unwrap();
    outs.push(out("pair_dot_backward (blocks)", get(&du2)));
    let mut gathered = d.zeros(7 * cols).unwrap();
    d.gather_rows(&up(&x), cols, Ix::new(&ia, 0, 7), &mut gathered)
        .unwrap();
    outs.push(out("gather_rows", get(&gathered)));
    let mut sx = up(&rand(rows * cols, 18));
    d.scatter_add_rows(&gathered, cols, Ix::new(&ia, 0, 7), &mut sx)
        .unwrap();
    outs.push(out("scatter_add_rows (repeats)", get(&sx)));
    let mut sx2 = up(&rand(rows * cols, 19));
    d.scatter_add_rows(
        &up(&rand(5 * cols, 20)),
        cols,
        Ix::distinct(&iota, 4, 5),
        &mut sx2,
    )
    .unwrap();
    outs.push(out("scatter_add_rows (distinct)", get(&sx2)));
    // Losses into slots.
    let mut slots = d.scalars(20).unwrap();
    d.scalars_fill(&mut slots, -3.5).unwrap();
    sc.push(("filled slots".into(), d.scalars_to_vec(&slots).unwrap()));
    d.scalars_fill(&mut slots, 0.0).unwrap();
    let c = up(&rand(7, 21));
    let (mr, tr) = (up(&[0.2]), up(&[-1.1]));
    let y01: Vec<f32> = rand(7, 22).iter().map(|v| v.abs()).collect();
    let w01: Vec<f32> = rand(7, 23).iter().map(|v| v.abs()).collect();
    let mut dc = d.zeros(7).unwrap();
    d.probpair_bce(
        &c,
        &mr,
        &tr,
        &up(&y01),
        &up(&w01),
        7.0,
        &mut dc,
        &mut slots,
        0,
    )
    .unwrap();
    outs.push(out("probpair_bce dc", get(&dc)));
    let mut pr = d.zeros(7).unwrap();
    d.pair_readout(
        &yn,
        cols,
        Ix::new(&ia, 0, 7),
        Ix::new(&ib, 0, 7),
        &mr,
        &tr,
        &mut pr,
    )
    .unwrap();
    outs.push(out("pair_readout", get(&pr)));
    let mut dse = d.zeros(rows * cols).unwrap();
    d.sq_error(
        &up(&x),
        &up(&rand(rows * cols, 24)),
        0.01,
        &mut dse,
        &mut slots,
        3,
    )
    .unwrap();
    outs.push(out("sq_error dx", get(&dse)));
    let labels = d
        .upload_idx(
            &(0..rows as u32)
                .map(|r| r % cols as u32)
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let mut dl = d.zeros(rows * cols).unwrap();
    d.softmax_ce(
        &up(&x),
        rows,
        cols,
        Ix::new(&labels, 0, rows),
        &mut dl,
        &mut slots,
        4,
    )
    .unwrap();
    outs.push(out("softmax_ce dlogits", get(&dl)));
    let mut sm = d.zeros(rows * cols).unwrap();
    d.softmax_rows(&up(&x), rows, cols, &mut sm).unwrap();
    outs.push(out("softmax_rows", get(&sm)));
    for (i, smooth) in [false, true].into_iter().enumerate() {
        for weighted in [true, false] {
            let mut dp = d.zeros(rows).unwrap();
            let p = up(&rand(rows, 25));
            let w = up(&rand(rows, 27));
            d.huber_l2(
                &p,
                &up(&rand(rows, 26)),
                weighted.then_some(&w),
                HuberL2 {
                    delta: 0.1,
                    smooth,
                    lambda: 0.5,
                    denom: rows as f64,
                },
                &mut dp,
                &mut slots,
                6 + i + 10 * usize::from(!weighted),
            )
            .unwrap();
            outs.push(out(
                format!("huber_l2 smooth={smooth} weighted={weighted} dp"),
                get(&dp),
            ));
        }
    }
    d.scalars_combine(&mut slots, 8, &[(0, 1.0), (3, 0.02)])
        .unwrap();
    d.scalars_combine(&mut slots, 9, &[]).unwrap();
    let mut acc = d.scalars(2).unwrap();
    d.scalars_accumulate(&slots, 8, 3.0, &mut acc, 1).unwrap();
    d.scalars_accumulate(&slots, 4, 1.0, &mut acc, 1).unwrap();
    let mut g1 = up(&[0.25]);
    d.scalar_to_grad(&slots, 1, 2.0, &mut g1).unwrap();
    outs.push(out("scalar_to_grad", get(&g1)));
    sc.push(("slots".into(), d.scalars_to_vec(&slots).unwrap()));
    sc.push(("accumulated".into(), d.scalars_to_vec(&acc).unwrap()));
    // ECI-PP fusion.
    let (mut ybc, mut w) = (d.zeros(rows).unwrap(), d.zeros(rows).unwrap());
    let yv: Vec<f32> = rand(rows, 28).iter().map(|v| v.abs()).collect();
    d.eci_fuse(
        &up(&yv),
        &up(&rand(rows, 29)),
        &up(&rand(rows, 30)),
        20.0,
        10.0,
        10.0,
        &mut ybc,
        &mut w,
    )
    .unwrap();
    outs.push(out("eci_fuse y_bc", get(&ybc)));
    outs.push(out("eci_fuse w", get(&w)));
    // Optimisers and clipping.
    let (mut p, g) = (up(&rand(300, 31)), up(&rand(300, 32)));
    let (mut am, mut av) = (d.zeros(300).unwrap(), d.zeros(300).unwrap());
    for step in 1..=3 {
        d.adam(&mut p, &g, &mut am, &mut av, 1e-3, 0.9, 0.999, 1e-8, step)
            .unwrap();
    }
    outs.push(out("adam", get(&p)));
    let mut buf = d.zeros(300).unwrap();
    for first in [true, false, false] {
        d.sgd_momentum(&mut p, &g, &mut buf, 0.1, 0.9, first)
            .unwrap();
    }
    outs.push(out("sgd_momentum", get(&p)));
    let (mut g_a, mut g_b) = (up(&rand(50, 33)), up(&rand(70, 34)));
    d.clip_grad_norm(&mut [&mut g_a, &mut g_b], 1.0).unwrap();
    outs.push(out("clip_grad_norm a", get(&g_a)));
    outs.push(out("clip_grad_norm b", get(&g_b)));
    sc.push(("sum_squares".into(), vec![d.sum_squares(&up(&x)).unwrap()]));
    // The baselines' ops.
    let mut dsm = up(&rand(rows * cols, 35));
    d.softmax_backward(&sm, &up(&rand(rows * cols, 36)), rows, cols, &mut dsm)
        .unwrap();
    outs.push(out("softmax_backward", get(&dsm)));
    let mut slots2 = d.scalars(8).unwrap();
    let npairs = 7;
    for with_b in [false, true] {
        let braw = up(&rand(cols * cols, 37));
        let mut dq = d.zeros(rows * cols).unwrap();
        let mut db = d.zeros(cols * cols).unwrap();
        let yv: Vec<f32> = rand(npairs, 38).iter().map(|v| v.abs()).collect();
        d.pair_cobce(
            &sm,
            CoBce {
                c: cols,
                n: npairs,
                eps: 1e-6,
                denom: npairs as f64,
            },
            with_b.then_some(&braw),
            &up(&yv),
            &up(&rand(npairs, 39).iter().map(|v| v.abs()).collect::<Vec<_>>()),
            &mut dq,
            with_b.then_some(&mut db),
            &mut slots2,
            usize::from(with_b),
        )
        .unwrap();
        outs.push(out(format!("pair_cobce b={with_b} dq"), get(&dq)));
        outs.push(out(format!("pair_cobce b={with_b} dB'"), get(&db)));
    }
    // The Gram matrix of softmax rows + eps·I has condition ~400, which would amplify the
    // rounding of a product computed on each device 400 times: both devices invert the same
    // bits, made on the host.
    let smh = get(&sm);
    let gram: Vec<f32> = (0..cols * cols)
        .map(|e| {
            let (i, j) = (e / cols, e % cols);
            (0..rows)
                .map(|r| smh[r * cols + i] as f64 * smh[r * cols + j] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    let mut minv = d.zeros(cols * cols).unwrap();
    d.spd_logdet_inverse(&up(&gram), cols, 1e-3, &mut slots2, 2, &mut minv)
        .unwrap();
    outs.push(out("spd inverse", get(&minv)));
    // A matrix that is not positive definite: −inf and a zero inverse.
    let mut minv2 = up(&rand(4, 56));
    d.spd_logdet_inverse(
        &up(&[1.0, 2.0, 2.0, 1.0]),
        2,
        0.0,
        &mut slots2,
        5,
        &mut minv2,
    )
    .unwrap();
    outs.push(out("spd not positive definite", get(&minv2)));
    let (kk, dim) = (3, 5);
    let z = up(&rand(rows * dim, 40));
    let mu = up(&rand(kk * dim, 41));
    let mut q = d.zeros(rows * kk).unwrap();
    let st = StudentT {
        rows,
        d: dim,
        k: kk,
        alpha: 1.0,
        e: 1.0,
    };
    d.student_t(&z, &mu, st, &mut q).unwrap();
    outs.push(out("student_t", get(&q)));
    let (mut dz, mut dmu) = (up(&rand(rows * dim, 42)), up(&rand(kk * dim, 43)));
    d.student_t_backward(
        &z,
        &mu,
        &q,
        &up(&rand(rows * kk, 44)),
        st,
        &mut dz,
        &mut dmu,
    )
    .unwrap();
    outs.push(out("student_t_backward dz", get(&dz)));
    outs.push(out("student_t_backward dmu", get(&dmu)));
    let mut dkl = d.zeros(rows * kk).unwrap();
    let target: Vec<f32> = get(&q).iter().map(|v| v * v).collect();
    d.kl_target(&q, &up(&target), rows as f64, &mut dkl, &mut slots2, 3)
        .unwrap();
    outs.push(out("kl_target dq", get(&dkl)));
    let cosv: Vec<f32> = rand(9, 45).iter().map(|v| v * 0.95).collect();
    let mut dsp = d.zeros(9).unwrap();
    d.spherepair_bce(
        &up(&cosv),
        &up(&rand(9, 46).iter().map(|v| v.abs()).collect::<Vec<_>>()),
        &up(&[1.0; 9]),
        9.0,
        &mut dsp,
        &mut slots2,
        4,
    )
    .unwrap();
    outs.push(out("spherepair_bce dc", get(&dsp)));
    sc.push(("baseline slots".into(), d.scalars_to_vec(&slots2).unwrap()));
    outs.extend(empty_ops(d));
    (outs, sc)
}

/// Every op that takes a buffer on buffers of length 0 (a batch without pairs, a network
/// without a layer): nothing happens, nothing fails.
fn empty_ops<D: Device<f32>>(d: &D) -> Vec<Output> {
    let e = || d.zeros(0).unwrap();
    let mut z = e();
    let none = d.upload(&[]).unwrap();
    let idx = d.upload_idx(&[]).unwrap();
    let ix = Ix::new(&idx, 0, 0);
    let mut s = d.scalars(4).unwrap();
    let mut empty_s = d.scalars(0).unwrap();
    d.scalars_fill(&mut empty_s, 1.0).unwrap();
    d.fill(&mut z, 1.0).unwrap();
    d.write(&mut z, &[]).unwrap();
    d.copy_range(&none, 0, &mut z, 0, 0).unwrap();
    d.axpy_range(2.0, &none, 0, &mut z, 0, 0).unwrap();
    d.axpy(2.0, &none, &mut z).unwrap();
    d.mul(&none, &none, &mut z).unwrap();
    d.mul_acc(&none, &none, &mut z).unwrap();
    d.scale(&mut z, 2.0).unwrap();
    d.act_backward(&none, &none, &mut z, Act::Tanh).unwrap();
    d.bias_act(&mut z, None, 0, 5, Act::Relu).unwrap();
    let spec = GemmSpec {
        m: 0,
        n: 4,
        k: 3,
        a_t: false,
        b_t: false,
        accumulate: false,
    };
    d.gemm(spec, &none, &d.zeros(12).unwrap(), &mut z).unwrap();
    // k = 0: C is zeroed (overwrite) or kept (accumulate).
    let mut c = d.upload(&[1.0, 2.0]).unwrap();
    let k0 = GemmSpec {
        m: 1,
        n: 2,
        k: 0,
        a_t: false,
        b_t: false,
        accumulate: true,
    };
    d.gemm(k0, &none, &none, &mut c).unwrap();
    let kept = d.to_vec(&c).unwrap();
    d.gemm(
        GemmSpec {
            accumulate: false,
            ..k0
        },
        &none,
        &none,
        &mut c,
    )
    .unwrap();
    let zeroed = d.to_vec(&c).unwrap();
    let (mut y, mut n) = (e(), e());
    d.l2norm(&none, 0, 4, 1e-12, &mut y, &mut n).unwrap();
    d.l2norm_backward(&none, &none, 1e-12, &none, 0, 4, &mut z)
        .unwrap();
    d.pair_dot(&none, 3, ix, ix, &mut z).unwrap();
    d.pair_dot_backward(&none, 3, ix, ix, &none, &mut z)
        .unwrap();
    d.gather_rows(&none, 3, ix, &mut z).unwrap();
    d.scatter_add_rows(&none, 3, ix, &mut z).unwrap();
    d.softmax_rows(&none, 0, 3, &mut z).unwrap();
    d.softmax_backward(&none, &none, 0, 3, &mut z).unwrap();
    d.col_sums_acc(&none, 0, 0, &mut z).unwrap();
    let (mut yb, mut wb) = (e(), e());
    d.eci_fuse(&none, &none, &none, 20.0, 10.0, 10.0, &mut yb, &mut wb)
        .unwrap();
    d.sq_error(&none, &none, 1.0, &mut z, &mut s, 0).unwrap();
    d.huber_l2(
        &none,
        &none,
        None,
        HuberL2 {
            delta: 0.1,
            smooth: false,
            lambda: 0.5,
            denom: 1.0,
        },
        &mut z,
        &mut s,
        1,
    )
    .unwrap();
    let st = StudentT {
        rows: 0,
        d: 2,
        k: 3,
        alpha: 1.0,
        e: 1.0,
    };
    let mu = d.zeros(6).unwrap();
    let mut dmu = d.zeros(6).unwrap();
    d.student_t(&none, &mu, st, &mut z).unwrap();
    d.student_t_backward(&none, &mu, &none, &none, st, &mut z, &mut dmu)
        .unwrap();
    d.clip_grad_norm(&mut [&mut z], 1.0).unwrap();
    let (mut p, mut m, mut v) = (e(), e(), e());
    d.adam(&mut p, &none, &mut m, &mut v, 1e-3, 0.9, 0.999, 1e-8, 1)
        .unwrap();
    d.sgd_momentum(&mut p, &none, &mut m, 0.1, 0.9, true)
        .unwrap();
    assert_eq!(d.sum_squares(&none).unwrap(), 0.0);
    assert!(d.to_vec(&z).unwrap().is_empty());
    assert!(d.scalars_to_vec(&empty_s).unwrap().is_empty());
    let slots = d.scalars_to_vec(&s).unwrap();
    vec![
        out("gemm k=0 accumulate", kept),
        out("gemm k=0 overwrite", zeroed),
        out(
            "empty losses",
            slots.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        ),
        out("empty student_t dmu", d.to_vec(&dmu).unwrap()),
    ]
}

/// Forward and backward of a small autoencoder with a ProbPair loss: the training step of
/// every stage, on one device; returns the loss slots, every gradient and the updated weights.
pub fn training_step<D: Device<f32>>(d: &D) -> Vec<(String, Vec<f32>)> {
    let mut rng = Stream::new(7, &["step"]);
    let mut params: Params<f32, D> = Params::new(d);
    let enc = Mlp::new(
        &mut params,
        "encoder",
        &[30, 40, 8],
        Act::Relu,
        Act::Identity,
        WeightInit::Torch,
        0,
        &mut rng,
    )
    .unwrap();
    let dec = Mlp::new(
        &mut params,
        "decoder",
        &[8, 40, 30],
        Act::Relu,
        Act::Identity,
        WeightInit::Torch,
        0,
        &mut rng,
    )
    .unwrap();
    let m = params
        .add("m", 1, 1, Init::Const(0.1), 1, &mut rng)
        .unwrap();
    let t = params
        .add("t", 1, 1, Init::Const(-2.0), 1, &mut rng)
        .unwrap();
    let mut opt = Adam::new(&params, vec![1e-3, 1e-2]).unwrap();
    let mut g: Graph<f32, D> = Graph::new(d).unwrap();
    let x = d.upload(&rand(64 * 30, 40)).unwrap();
    let order = d.upload_idx(&(0..64u32).rev().collect::<Vec<_>>()).unwrap();
    let y = d
        .upload(&rand(20, 41).iter().map(|v| v.abs()).collect::<Vec<_>>())
        .unwrap();
    let mut acc = d.scalars(2).unwrap();
    let mut out = Vec::new();
    for _ in 0..3 {
        g.reset();
        params.zero_grads();
        let xi = g.input_rows(&x, 30, Ix::new(&order, 0, 64)).unwrap();
        let z = enc.forward(&mut g, &params, xi, None).unwrap();
        let u = g.l2_normalize(z, 1e-12).unwrap();
        let cos = g.pair_dot_blocks(u, 0, 20, 20).unwrap();
        let yv = g.input_slice(&y, 0, 20, 1).unwrap();
        let wv = g.input_slice(&y, 0, 20, 1).unwrap();
        let pair = g.probpair_loss(&params, cos, m, t, yv, wv, 20.0).unwrap();
        let ui = g.rows(u, 40, 64).unwrap();
        let r = dec.forward(&mut g, &params, ui, None).unwrap();
        let target = g.rows(xi, 40, 64).unwrap();
        let rec = g.sq_error(r, target, 1.0 / (24.0 * 30.0)).unwrap();
        let total = g.sum(&[(pair, 1.0), (rec, 0.02)]).unwrap();
        g.accumulate(total, 0, 1.0, &mut acc, 0).unwrap();
        g.backward(total, &mut params).unwrap();
        params.clip_grad_norm(1.0).unwrap();
        for id in params.ids().collect::<Vec<_>>() {
            out.push((
                format!("grad {}", params.name(id)),
                d.to_vec(params.grad(id).unwrap()).unwrap(),
            ));
        }
        opt.step(&mut params).unwrap();
    }
    for id in params.ids() {
        out.push((
            format!("value {}", params.name(id)),
            params.to_host(id).unwrap(),
        ));
    }
    out.push((
        "loss".into(),
        d.scalars_to_vec(&acc)
            .unwrap()
            .iter()
            .map(|&v| v as f32)
            .collect(),
    ));
    out
}

/// The tolerance of a training step: three Adam steps amplify rounding differences a little.
pub fn step_tolerance(a: f32, b: f32) -> f32 {
    1e-5 + 1e-3 * a.abs().max(b.abs())
}

/// The worst |a − b| / tolerance of two training steps, panicking past 1.
pub fn compare_steps(
    reference: &[(String, Vec<f32>)],
    other: &[(String, Vec<f32>)],
    label: &str,
) -> f64 {
    let names = |v: &[(String, Vec<f32>)]| v.iter().map(|o| o.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(reference), names(other), "{label}: the same outputs");
    let mut worst = 0f64;
    for ((name, a), (_, b)) in reference.iter().zip(other) {
        assert_eq!(a.len(), b.len(), "{label} {name}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            let tol = step_tolerance(x, y);
            let ratio = ((x - y).abs() / tol) as f64;
            assert!(
                ratio <= 1.0,
                "{label} {name}[{i}]: {x} vs {y} (tolerance {tol})"
            );
            worst = worst.max(ratio);
        }
    }
    worst
}
