//! Times one training step of the paper's autoencoder (784-500-500-2000-10 + mirror decoder,
//! decoding from the L2-normalised code, mean-squared error, Adam 1e-3).
//!
//! `cargo run --release -p upcc-nn --example ae_step -- [batch ...]`; prints one JSON line per
//! batch size with the median of 30 timed steps after 5 warm-up steps. Uses the rayon pool's
//! threads (set RAYON_NUM_THREADS).

use std::time::Instant;

use upcc_nn::{Act, Adam, Cpu, Graph, Mlp, Params, Stream, WeightInit};

fn main() {
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    pool.install(run);
}

fn run() {
    let batches: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let batches = if batches.is_empty() {
        vec![256, 1024]
    } else {
        batches
    };
    let dims = [784usize, 500, 500, 2000, 10];
    for batch in batches {
        let mut rng = Stream::new(0, &["bench"]);
        let mut params: Params<f32, Cpu> = Params::new(&Cpu);
        let enc = Mlp::new(
            &mut params,
            "encoder",
            &dims,
            Act::Relu,
            Act::Identity,
            WeightInit::Torch,
            0,
            &mut rng,
        )
        .expect("cpu");
        let rev: Vec<usize> = dims.iter().rev().copied().collect();
        let dec = Mlp::new(
            &mut params,
            "decoder",
            &rev,
            Act::Relu,
            Act::Identity,
            WeightInit::Torch,
            0,
            &mut rng,
        )
        .expect("cpu");
        let mut opt = Adam::new(&params, vec![1e-3]).expect("cpu");
        let x: Vec<f32> = (0..batch * 784).map(|_| rng.uniform() as f32).collect();
        let mut g = Graph::new(&Cpu).expect("cpu");
        let mut times = Vec::new();
        for step in 0..35 {
            let t0 = Instant::now();
            g.reset();
            params.zero_grads();
            let xi = g.input(&x, batch, 784).expect("cpu");
            let ta = Instant::now();
            let z = enc.forward(&mut g, &params, xi, None).expect("cpu");
            let tb = Instant::now();
            let u = g.l2_normalize(z, 1e-12).expect("cpu");
            let r = dec.forward(&mut g, &params, u, None).expect("cpu");
            let tc = Instant::now();
            let loss = g.sq_error(r, xi, 1.0 / (batch * 784) as f64).expect("cpu");
            if std::env::var("PROF").is_ok() && step >= 33 {
                eprintln!(
                    "input {:.2} enc {:.2} dec {:.2} loss {:.2}",
                    (ta - t0).as_secs_f64() * 1e3,
                    (tb - ta).as_secs_f64() * 1e3,
                    (tc - tb).as_secs_f64() * 1e3,
                    tc.elapsed().as_secs_f64() * 1e3
                );
            }
            let t1 = Instant::now();
            g.backward(loss, &mut params).expect("cpu");
            let t2 = Instant::now();
            opt.step(&mut params).expect("cpu");
            if std::env::var("PROF").is_ok() && step >= 33 {
                eprintln!(
                    "fwd {:.2} bwd {:.2} opt {:.2}",
                    (t1 - t0).as_secs_f64() * 1e3,
                    (t2 - t1).as_secs_f64() * 1e3,
                    t2.elapsed().as_secs_f64() * 1e3
                );
            }
            if step >= 5 {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = times[times.len() / 2];
        let weights: usize = dims.windows(2).map(|w| w[0] * w[1]).sum::<usize>() * 2;
        let gflops = 6.0 * weights as f64 * batch as f64 / (median * 1e-3) / 1e9;
        println!(
            "{{\"impl\":\"upcc\",\"batch\":{batch},\"threads\":{},\"median_ms\":{median:.2},\"gflops\":{gflops:.1}}}",
            rayon::current_num_threads()
        );
    }
}
