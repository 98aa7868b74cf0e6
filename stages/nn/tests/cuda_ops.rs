//! Every `Device` op on CUDA against the CPU, forward and backward, and bitwise reruns on the GPU.
//!
//! These need an NVIDIA GPU, so they are `#[ignore]`d in the ordinary suite; `just gpu-test`
//! runs them with `--ignored` on a GPU machine (and fails, saying so, where there is none).
//! Tolerance: results agree within 1e-4 relative (+1e-6 absolute): cuBLAS and the kernels sum
//! in other orders than the CPU, so they differ by rounding only.
#![cfg(feature = "cuda")]

use upcc_nn::{
    Act, Adam, CoBce, Cpu, Cuda, Device, GemmSpec, Graph, HuberL2, Init, Ix, Mlp, Params, Stream,
    StudentT, WeightInit,
};

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = Stream::new(seed, &["cuda-ops"]);
    (0..n).map(|_| s.uniform_range(-1.0, 1.0) as f32).collect()
}

fn close(name: &str, cpu: &[f32], gpu: &[f32]) {
    assert_eq!(cpu.len(), gpu.len(), "{name}: lengths");
    for (i, (a, b)) in cpu.iter().zip(gpu).enumerate() {
        let tol = 1e-6 + 1e-4 * a.abs().max(b.abs());
        assert!((a - b).abs() <= tol, "{name}[{i}]: cpu {a} vs cuda {b}");
    }
}

fn close64(name: &str, cpu: &[f64], gpu: &[f64]) {
    assert_eq!(cpu.len(), gpu.len(), "{name}: lengths");
    for (i, (a, b)) in cpu.iter().zip(gpu).enumerate() {
        let tol = 1e-9 + 1e-5 * a.abs().max(b.abs());
        assert!((a - b).abs() <= tol, "{name}[{i}]: cpu {a} vs cuda {b}");
    }
}

fn gpu() -> Cuda {
    Cuda::new(0).expect("a CUDA GPU (these tests run through `just gpu-test` on a GPU machine)")
}

/// Named f32 outputs and named f64 slot vectors of a scenario.
type Outputs = (Vec<(String, Vec<f32>)>, Vec<(String, Vec<f64>)>);

/// Every op of the trait on one device; named outputs (f32 buffers and f64 slots).
fn every_op<D: Device<f32>>(d: &D) -> Outputs {
    let mut out: Vec<(String, Vec<f32>)> = Vec::new();
    let mut sc: Vec<(String, Vec<f64>)> = Vec::new();
    let up = |v: &[f32]| d.upload(v).unwrap();
    let get = |b: &D::Buf| d.to_vec(b).unwrap();
    // Products in every layout, overwrite and accumulate.
    let (m, n, k) = (67, 45, 130);
    for a_t in [false, true] {
        for b_t in [false, true] {
            for acc in [false, true] {
                let a = up(&rand(m * k, 1));
                let b = up(&rand(k * n, 2));
                let mut c = up(&rand(m * n, 3));
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    a_t,
                    b_t,
                    accumulate: acc,
                };
                d.gemm(spec, &a, &b, &mut c).unwrap();
                out.push((format!("gemm a_t={a_t} b_t={b_t} acc={acc}"), get(&c)));
            }
        }
    }
    let (rows, cols) = (37, 19);
    let x = rand(rows * cols, 4);
    for act in [Act::Identity, Act::Relu, Act::Tanh] {
        let mut y = up(&x);
        let bias = up(&rand(cols, 5));
        d.bias_act(&mut y, Some(&bias), rows, cols, act).unwrap();
        out.push((format!("bias_act {act:?}"), get(&y)));
        let dy = up(&rand(rows * cols, 6));
        let mut dz = d.zeros(rows * cols).unwrap();
        d.act_backward(&y, &dy, &mut dz, act).unwrap();
        out.push((format!("act_backward {act:?}"), get(&dz)));
    }
    let mut db = up(&rand(cols, 7));
    d.col_sums_acc(&up(&x), rows, cols, &mut db).unwrap();
    out.push(("col_sums_acc".into(), get(&db)));
    let mut dst = up(&rand(rows * cols, 8));
    d.axpy(0.7, &up(&x), &mut dst).unwrap();
    out.push(("axpy".into(), get(&dst)));
    d.axpy_range(-1.5, &up(&x), 5, &mut dst, 11, 40).unwrap();
    out.push(("axpy_range".into(), get(&dst)));
    d.copy_range(&up(&x), 3, &mut dst, 100, 50).unwrap();
    out.push(("copy_range".into(), get(&dst)));
    let mask = up(&rand(rows * cols, 9));
    let mut y = d.zeros(rows * cols).unwrap();
    d.mul(&up(&x), &mask, &mut y).unwrap();
    out.push(("mul".into(), get(&y)));
    d.mul_acc(&up(&x), &mask, &mut y).unwrap();
    out.push(("mul_acc".into(), get(&y)));
    let mut s2 = up(&x);
    d.scale(&mut s2, 0.3).unwrap();
    out.push(("scale".into(), get(&s2)));
    let mut f = up(&x);
    d.fill(&mut f, 2.5).unwrap();
    out.push(("fill".into(), get(&f)));
    let mut sc_dst = up(&rand(rows * 4, 10));
    d.set_column(&up(&rand(rows, 11)), &mut sc_dst, rows, 4, 2)
        .unwrap();
    out.push(("set_column".into(), get(&sc_dst)));
    // Row normalisation, one zero row (clamped at eps).
    let mut xz = x.clone();
    xz[..cols].fill(0.0);
    let (mut yn, mut norms) = (d.zeros(rows * cols).unwrap(), d.zeros(rows).unwrap());
    d.l2norm(&up(&xz), rows, cols, 1e-12, &mut yn, &mut norms)
        .unwrap();
    out.push(("l2norm".into(), get(&yn)));
    out.push(("l2norm norms".into(), get(&norms)));
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
    out.push(("l2norm_backward".into(), get(&dx)));
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
    out.push(("pair_dot".into(), get(&pd)));
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
    out.push(("pair_dot_backward (repeats)".into(), get(&du)));
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
    out.push(("pair_dot_backward (blocks)".into(), get(&du2)));
    let mut gathered = d.zeros(7 * cols).unwrap();
    d.gather_rows(&up(&x), cols, Ix::new(&ia, 0, 7), &mut gathered)
        .unwrap();
    out.push(("gather_rows".into(), get(&gathered)));
    let mut sx = up(&rand(rows * cols, 18));
    d.scatter_add_rows(&gathered, cols, Ix::new(&ia, 0, 7), &mut sx)
        .unwrap();
    out.push(("scatter_add_rows (repeats)".into(), get(&sx)));
    let mut sx2 = up(&rand(rows * cols, 19));
    d.scatter_add_rows(
        &up(&rand(5 * cols, 20)),
        cols,
        Ix::distinct(&iota, 4, 5),
        &mut sx2,
    )
    .unwrap();
    out.push(("scatter_add_rows (distinct)".into(), get(&sx2)));
    // Losses into slots.
    let mut slots = d.scalars(16).unwrap();
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
    out.push(("probpair_bce dc".into(), get(&dc)));
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
    out.push(("pair_readout".into(), get(&pr)));
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
    out.push(("sq_error dx".into(), get(&dse)));
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
    out.push(("softmax_ce dlogits".into(), get(&dl)));
    let mut sm = d.zeros(rows * cols).unwrap();
    d.softmax_rows(&up(&x), rows, cols, &mut sm).unwrap();
    out.push(("softmax_rows".into(), get(&sm)));
    for (i, smooth) in [false, true].into_iter().enumerate() {
        let mut dp = d.zeros(rows).unwrap();
        let p = up(&rand(rows, 25));
        d.huber_l2(
            &p,
            &up(&rand(rows, 26)),
            Some(&up(&rand(rows, 27))),
            HuberL2 {
                delta: 0.1,
                smooth,
                lambda: 0.5,
                denom: rows as f64,
            },
            &mut dp,
            &mut slots,
            6 + i,
        )
        .unwrap();
        out.push((format!("huber_l2 smooth={smooth} dp"), get(&dp)));
    }
    d.scalars_combine(&mut slots, 8, &[(0, 1.0), (3, 0.02)])
        .unwrap();
    let mut acc = d.scalars(2).unwrap();
    d.scalars_accumulate(&slots, 8, 3.0, &mut acc, 1).unwrap();
    d.scalars_accumulate(&slots, 4, 1.0, &mut acc, 1).unwrap();
    let mut g1 = up(&[0.25]);
    d.scalar_to_grad(&slots, 1, 2.0, &mut g1).unwrap();
    out.push(("scalar_to_grad".into(), get(&g1)));
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
    out.push(("eci_fuse y_bc".into(), get(&ybc)));
    out.push(("eci_fuse w".into(), get(&w)));
    // Optimisers and clipping.
    let (mut p, g) = (up(&rand(300, 31)), up(&rand(300, 32)));
    let (mut am, mut av) = (d.zeros(300).unwrap(), d.zeros(300).unwrap());
    for step in 1..=3 {
        d.adam(&mut p, &g, &mut am, &mut av, 1e-3, 0.9, 0.999, 1e-8, step)
            .unwrap();
    }
    out.push(("adam".into(), get(&p)));
    let mut buf = d.zeros(300).unwrap();
    for first in [true, false, false] {
        d.sgd_momentum(&mut p, &g, &mut buf, 0.1, 0.9, first)
            .unwrap();
    }
    out.push(("sgd_momentum".into(), get(&p)));
    let (mut g_a, mut g_b) = (up(&rand(50, 33)), up(&rand(70, 34)));
    d.clip_grad_norm(&mut [&mut g_a, &mut g_b], 1.0).unwrap();
    out.push(("clip_grad_norm a".into(), get(&g_a)));
    out.push(("clip_grad_norm b".into(), get(&g_b)));
    sc.push(("sum_squares".into(), vec![d.sum_squares(&up(&x)).unwrap()]));
    // The baselines' ops.
    let mut dsm = up(&rand(rows * cols, 35));
    d.softmax_backward(&sm, &up(&rand(rows * cols, 36)), rows, cols, &mut dsm)
        .unwrap();
    out.push(("softmax_backward".into(), get(&dsm)));
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
        out.push((format!("pair_cobce b={with_b} dq"), get(&dq)));
        out.push((format!("pair_cobce b={with_b} dB'"), get(&db)));
    }
    let mut gram = d.zeros(cols * cols).unwrap();
    let spec = GemmSpec {
        m: cols,
        n: cols,
        k: rows,
        a_t: true,
        b_t: false,
        accumulate: false,
    };
    d.gemm(spec, &sm, &sm, &mut gram).unwrap();
    let mut minv = d.zeros(cols * cols).unwrap();
    d.spd_logdet_inverse(&gram, cols, 1e-3, &mut slots2, 2, &mut minv)
        .unwrap();
    out.push(("spd inverse".into(), get(&minv)));
    let (k, dim) = (3, 5);
    let z = up(&rand(rows * dim, 40));
    let mu = up(&rand(k * dim, 41));
    let mut q = d.zeros(rows * k).unwrap();
    let st = StudentT {
        rows,
        d: dim,
        k,
        alpha: 1.0,
        e: 1.0,
    };
    d.student_t(&z, &mu, st, &mut q).unwrap();
    out.push(("student_t".into(), get(&q)));
    let (mut dz, mut dmu) = (up(&rand(rows * dim, 42)), up(&rand(k * dim, 43)));
    d.student_t_backward(&z, &mu, &q, &up(&rand(rows * k, 44)), st, &mut dz, &mut dmu)
        .unwrap();
    out.push(("student_t_backward dz".into(), get(&dz)));
    out.push(("student_t_backward dmu".into(), get(&dmu)));
    let mut dkl = d.zeros(rows * k).unwrap();
    let target: Vec<f32> = get(&q).iter().map(|v| v * v).collect();
    d.kl_target(&q, &up(&target), rows as f64, &mut dkl, &mut slots2, 3)
        .unwrap();
    out.push(("kl_target dq".into(), get(&dkl)));
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
    out.push(("spherepair_bce dc".into(), get(&dsp)));
    sc.push(("baseline slots".into(), d.scalars_to_vec(&slots2).unwrap()));
    (out, sc)
}

/// Forward and backward of a small autoencoder with a ProbPair loss: the training step of
/// every stage, on one device; returns the loss slots, every gradient and the updated weights.
fn training_step<D: Device<f32>>(d: &D) -> Vec<(String, Vec<f32>)> {
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

#[test]
#[ignore = "needs an NVIDIA GPU: run through `just gpu-test`"]
fn every_op_on_cuda_matches_the_cpu() {
    let (cpu, cpu_s) = every_op(&Cpu);
    let (gpu_o, gpu_s) = every_op(&gpu());
    for ((name, a), (_, b)) in cpu.iter().zip(&gpu_o) {
        close(name, a, b);
    }
    for ((name, a), (_, b)) in cpu_s.iter().zip(&gpu_s) {
        close64(name, a, b);
    }
    println!(
        "{} op outputs and {} slot vectors agree",
        cpu.len(),
        cpu_s.len()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `just gpu-test`"]
fn a_training_step_on_cuda_matches_the_cpu_forward_and_backward() {
    let cpu = training_step(&Cpu);
    let gpu_o = training_step(&gpu());
    for ((name, a), (_, b)) in cpu.iter().zip(&gpu_o) {
        // Three Adam steps amplify rounding differences a little.
        assert_eq!(a.len(), b.len(), "{name}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let tol = 1e-5 + 1e-3 * x.abs().max(y.abs());
            assert!((x - y).abs() <= tol, "{name}[{i}]: cpu {x} vs cuda {y}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `just gpu-test`"]
fn two_runs_on_the_gpu_give_identical_bits() {
    let dev = gpu();
    let a = every_op(&dev);
    let b = every_op(&dev.fork().unwrap());
    assert_eq!(a, b, "every op, bit for bit");
    assert_eq!(
        training_step(&dev),
        training_step(&dev),
        "training steps, bit for bit"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run through `just gpu-test`"]
fn the_device_reports_its_numerics_class_and_facts() {
    let dev = gpu();
    let n = Device::<f32>::numerics(&dev);
    assert!(n.starts_with("cuda-f32-sm"), "{n}");
    let info = dev.info();
    assert!(info.facts.iter().any(|(k, _)| k == "gpu"), "{info:?}");
    assert!(info.facts.iter().any(|(k, _)| k == "cublas"), "{info:?}");
    println!("{info:?}");
}

/// The scenarios themselves, on the CPU (what the GPU results are compared with).
#[test]
fn the_scenarios_run_on_the_cpu_and_are_deterministic() {
    let (ops, slots) = every_op(&Cpu);
    assert!(ops.len() > 40, "{}", ops.len());
    for (name, v) in &ops {
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
    }
    let clipped: f32 = ops
        .iter()
        .filter(|(n, _)| n.starts_with("clip_grad_norm"))
        .flat_map(|(_, v)| v.iter().map(|x| x * x))
        .sum();
    assert!(
        (clipped.sqrt() - 1.0).abs() < 1e-5,
        "clipped to norm 1: {}",
        clipped.sqrt()
    );
    let s = &slots[0].1;
    // Slot 8 = slot 0 + 0.02·slot 3, and the accumulator got 3·slot 8 + slot 4.
    assert!((s[8] - (s[0] + 0.02 * s[3])).abs() < 1e-12);
    assert!((slots[1].1[1] - (3.0 * s[8] + s[4])).abs() < 1e-12);
    assert_eq!(every_op(&Cpu), (ops, slots));
    assert_eq!(training_step(&Cpu), training_step(&Cpu));
}
