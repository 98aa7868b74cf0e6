//! Every op's backward pass against central finite differences in f64.

use crate::cpu::Cpu;
use crate::device::Act;
use crate::device::{Device, Ix};
use crate::graph::{Graph, Var};
use crate::params::{Init, ParamId, Params};
use crate::rng::Stream;

type P = Params<f64, Cpu>;
type G = Graph<f64, Cpu>;

fn rand_vec(n: usize, rng: &mut Stream) -> Vec<f64> {
    (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
}

type R = crate::device::DResult<Var>;

/// Compare analytic and numeric gradients of every parameter element.
fn check(params: &mut P, build: &dyn Fn(&mut G, &P) -> R) {
    let mut g = G::new(&Cpu).unwrap();
    params.zero_grads();
    let loss = build(&mut g, params).unwrap();
    g.backward(loss, params).unwrap();
    let ids: Vec<ParamId> = params.ids().collect();
    let h = 1e-6;
    for id in ids {
        let analytic = params.grad(id).unwrap().clone();
        let base = params.to_host(id).unwrap();
        for k in 0..base.len() {
            let mut v = base.clone();
            v[k] = base[k] + h;
            params.set_host(id, &v).unwrap();
            g.reset();
            let lp = build(&mut g, params).unwrap();
            let lp = g.scalar(lp).unwrap();
            v[k] = base[k] - h;
            params.set_host(id, &v).unwrap();
            g.reset();
            let lm = build(&mut g, params).unwrap();
            let lm = g.scalar(lm).unwrap();
            params.set_host(id, &base).unwrap();
            let numeric = (lp - lm) / (2.0 * h);
            let err = (numeric - analytic[k]).abs() / (1e-7 + numeric.abs().max(analytic[k].abs()));
            assert!(
                err < 1e-5 || (numeric - analytic[k]).abs() < 1e-9,
                "param `{}`[{k}]: analytic {} vs numeric {numeric}",
                params.name(id),
                analytic[k]
            );
        }
    }
}

struct Setup {
    params: P,
    w: ParamId,
    b: ParamId,
    x: Vec<f64>,
    target: Vec<f64>,
}

/// X (5×4 constant) → linear 4→3 (params w, b) → op under test.
fn setup(seed: u64) -> Setup {
    let mut rng = Stream::new(seed, &["gradcheck"]);
    let mut params = P::new(&Cpu);
    let w = params
        .add("w", 3, 4, Init::Uniform(0.8), 0, &mut rng)
        .unwrap();
    let b = params
        .add("b", 1, 3, Init::Uniform(0.5), 0, &mut rng)
        .unwrap();
    Setup {
        params,
        w,
        b,
        x: rand_vec(20, &mut rng),
        target: rand_vec(15, &mut rng),
    }
}

#[test]
fn linear_with_each_activation_and_squared_error() {
    for act in [Act::Identity, Act::Relu, Act::Tanh] {
        let mut s = setup(1);
        let (w, b, x, t) = (s.w, s.b, s.x.clone(), s.target.clone());
        check(&mut s.params, &move |g, p| {
            let xi = g.input(&x, 5, 4)?;
            let y = g.linear(p, xi, w, Some(b), act)?;
            g.sq_error_host(y, &t, 0.7)
        });
    }
}

#[test]
fn stacked_linears_propagate_input_gradients() {
    let mut s = setup(2);
    let mut rng = Stream::new(9, &["w2"]);
    let w2 = s
        .params
        .add("w2", 2, 3, Init::Uniform(0.8), 0, &mut rng)
        .unwrap();
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let t: Vec<f64> = s.target[..10].to_vec();
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let h = g.linear(p, xi, w, Some(b), Act::Tanh)?;
        let y = g.linear(p, h, w2, None, Act::Identity)?;
        g.sq_error_host(y, &t, 1.0)
    });
}

#[test]
fn mask_l2norm_gather_and_pair_dot() {
    let mut s = setup(3);
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let mask = vec![
        1.25, 0.0, 1.25, 1.25, 0.0, 1.25, 1.25, 1.25, 0.0, 1.25, 1.25, 1.25, 0.0, 1.25, 1.25,
    ];
    let t: Vec<f64> = s.target[..9].to_vec();
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let y = g.linear(p, xi, w, Some(b), Act::Identity)?;
        let y = g.mask(y, &mask)?;
        let u = g.l2_normalize(y, 1e-12)?;
        let c = g.pair_dot(u, &[0, 1, 2, 4], &[3, 3, 0, 1])?;
        let rows = g.gather(u, &[4, 0, 4])?;
        let blocks = g.pair_dot_blocks(u, 0, 2, 3)?;
        let slice = g.rows(u, 1, 4)?;
        let l1 = g.sq_error_host(c, &[0.1, -0.2, 0.3, 0.9], 1.0)?;
        let l2 = g.sq_error_host(rows, &t, 0.5)?;
        let l3 = g.sq_error_host(blocks, &[0.4, -0.1, 0.2], 0.8)?;
        let l4 = g.sq_error_host(slice, &t, 0.2)?;
        g.sum(&[(l1, 1.0), (l2, 0.3), (l3, 0.7), (l4, 1.1)])
    });
}

#[test]
fn probpair_loss_including_readout_parameters() {
    let mut s = setup(4);
    let mut rng = Stream::new(5, &["readout"]);
    let m = s
        .params
        .add("m", 1, 1, Init::Const(0.2), 1, &mut rng)
        .unwrap();
    let t = s
        .params
        .add("t", 1, 1, Init::Const(-1.5), 1, &mut rng)
        .unwrap();
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let y = [0.9, 0.1, 0.5, 0.0, 1.0];
    let wts = [1.0, 0.5, 0.25, 0.8, 0.0];
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let z = g.linear(p, xi, w, Some(b), Act::Identity)?;
        let u = g.l2_normalize(z, 1e-12)?;
        let c = g.pair_dot(u, &[0, 1, 2, 3, 4], &[1, 2, 3, 4, 0])?;
        let yv = g.input(&y, 5, 1)?;
        let wv = g.input(&wts, 5, 1)?;
        g.probpair_loss(p, c, m, t, yv, wv, 5.0)
    });
}

#[test]
fn softmax_cross_entropy() {
    let mut s = setup(6);
    let (w, b, x) = (s.w, s.b, s.x.clone());
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let z = g.linear(p, xi, w, Some(b), Act::Relu)?;
        let labels = Device::<f64>::upload_idx(g.device(), &[0, 2, 1, 1, 0])?;
        g.softmax_ce(z, Ix::new(&labels, 0, 5))
    });
}

#[test]
fn huber_with_l2_penalty_on_both_sides_of_the_transition() {
    let mut s = setup(7);
    let mut rng = Stream::new(8, &["w2"]);
    let w2 = s
        .params
        .add("w2", 1, 3, Init::Uniform(0.8), 0, &mut rng)
        .unwrap();
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let target = [0.5, -0.4, 0.02, 0.9, -0.7];
    for smooth in [false, true] {
        let x = x.clone();
        check(&mut s.params, &move |g, p| {
            let xi = g.input(&x, 5, 4)?;
            let h = g.linear(p, xi, w, Some(b), Act::Relu)?;
            let o = g.linear(p, h, w2, None, Act::Tanh)?;
            let t = g.input(&target, 5, 1)?;
            let wv = g.input(&[1.0, 0.5, 2.0, 1.0, 1.0], 5, 1)?;
            g.huber_l2(o, t, Some(wv), 0.1, smooth, 0.5, 5.0)
        });
    }
}

#[test]
fn buffers_are_reused_after_reset() {
    let mut s = setup(10);
    let (w, b, x, t) = (s.w, s.b, s.x.clone(), s.target.clone());
    let mut g = G::new(&Cpu).unwrap();
    let mut losses = Vec::new();
    for _ in 0..3 {
        g.reset();
        s.params.zero_grads();
        let xi = g.input(&x, 5, 4).unwrap();
        let y = g.linear(&s.params, xi, w, Some(b), Act::Relu).unwrap();
        let l = g.sq_error_host(y, &t, 1.0).unwrap();
        g.backward(l, &mut s.params).unwrap();
        losses.push((g.scalar(l).unwrap(), s.params.grad(w).unwrap().clone()));
    }
    assert_eq!(losses[0], losses[1]);
    assert_eq!(losses[1], losses[2]);
}

#[test]
fn softmax_and_pair_co_assignment_bce_with_and_without_b() {
    let mut s = setup(11);
    let mut rng = Stream::new(12, &["braw"]);
    let braw = s
        .params
        .add("braw", 3, 3, Init::Uniform(1.5), 1, &mut rng)
        .unwrap();
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let y = [0.9, 0.2];
    let wts = [1.0, 0.5];
    for with_b in [false, true] {
        let x = x.clone();
        check(&mut s.params, &move |g, p| {
            let xi = g.input(&x, 5, 4)?;
            let z = g.linear(p, xi, w, Some(b), Act::Tanh)?;
            let q = g.softmax(z)?;
            let yv = g.input(&y, 2, 1)?;
            let wv = g.input(&wts, 2, 1)?;
            g.pair_cobce(p, q, 2, with_b.then_some(braw), yv, wv, 1e-6, 2.0)
        });
    }
}

#[test]
fn log_det_of_the_gram_matrix() {
    let mut s = setup(13);
    let (w, b, x) = (s.w, s.b, s.x.clone());
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let z = g.linear(p, xi, w, Some(b), Act::Identity)?;
        let q = g.softmax(z)?;
        let ld = g.logdet_gram(q, 1e-6)?;
        g.sum(&[(ld, -0.7)])
    });
}

#[test]
fn student_t_assignments_and_the_dec_kl_target() {
    let mut s = setup(14);
    let mut rng = Stream::new(15, &["mu"]);
    let mu = s
        .params
        .add("mu", 2, 3, Init::Uniform(1.0), 0, &mut rng)
        .unwrap();
    let (w, b, x) = (s.w, s.b, s.x.clone());
    // A fixed target distribution (5 rows × 2 clusters).
    let target = [0.7, 0.3, 0.1, 0.9, 0.5, 0.5, 0.8, 0.2, 0.35, 0.65];
    for e in [1.0, 2.0] {
        let x = x.clone();
        check(&mut s.params, &move |g, p| {
            let xi = g.input(&x, 5, 4)?;
            let z = g.linear(p, xi, w, Some(b), Act::Identity)?;
            let q = g.student_t(p, z, mu, 1.0, e)?;
            let pt = g.input(&target, 5, 2)?;
            let kl = g.kl_target(q, pt, 5.0)?;
            let sq = g.sq_error_host(q, &target, 0.3)?;
            g.sum(&[(kl, 1.0), (sq, 1.0)])
        });
    }
}

#[test]
fn soft_spherepair_loss_on_pair_cosines() {
    let mut s = setup(16);
    let (w, b, x) = (s.w, s.b, s.x.clone());
    let y = [0.9, 0.1, 0.5, 0.0, 1.0];
    let wts = [1.0, 0.5, 0.25, 0.8, 2.0];
    check(&mut s.params, &move |g, p| {
        let xi = g.input(&x, 5, 4)?;
        let z = g.linear(p, xi, w, Some(b), Act::Identity)?;
        let u = g.l2_normalize(z, 1e-12)?;
        let c = g.pair_dot(u, &[0, 1, 2, 3, 4], &[1, 2, 3, 4, 0])?;
        let yv = g.input(&y, 5, 1)?;
        let wv = g.input(&wts, 5, 1)?;
        g.spherepair_loss(c, yv, wv, 5.0)
    });
}
