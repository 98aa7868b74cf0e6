//! Times one training step of the paper's autoencoder (784-500-500-2000-10 + mirror decoder,
//! decoding from the L2-normalised code, mean-squared error, Adam 1e-3).
//!
//! `cargo run --release -p upcc-nn --example ae_step -- [batch ...]`; prints one JSON line per
//! batch size with the median of timed steps after warm-up steps. `THREADS` sets the CPU
//! threads (default 2); `DEVICE=cuda` times the step on the GPU (synchronised after each step,
//! and also back to back: 36 steps, one synchronisation).

use std::time::Instant;

use upcc_nn::{Act, Adam, Cpu, DResult, Device, Graph, Mlp, Params, Stream, WeightInit};

fn main() {
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let device = std::env::var("DEVICE").unwrap_or_else(|_| "cpu".into());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let result = pool.install(|| match device.as_str() {
        "cpu" => run(&Cpu),
        #[cfg(feature = "cuda")]
        "cuda" => run(&upcc_nn::Cuda::new(0)?),
        other => {
            eprintln!("unknown DEVICE `{other}` (cpu or cuda)");
            std::process::exit(2)
        }
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run<D: Device<f32>>(dev: &D) -> DResult<()> {
    let batches: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let batches = if batches.is_empty() {
        vec![256, 1024]
    } else {
        batches
    };
    let gpu = dev.name() != "cpu";
    let dims = [784usize, 500, 500, 2000, 10];
    for batch in batches {
        let mut rng = Stream::new(0, &["bench"]);
        let mut params: Params<f32, D> = Params::new(dev);
        let enc = Mlp::new(
            &mut params,
            "encoder",
            &dims,
            Act::Relu,
            Act::Identity,
            WeightInit::Torch,
            0,
            &mut rng,
        )?;
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
        )?;
        let mut opt = Adam::new(&params, vec![1e-3])?;
        let x: Vec<f32> = (0..batch * 784).map(|_| rng.uniform() as f32).collect();
        let x = dev.upload(&x)?;
        let mut g = Graph::new(dev)?;
        let mut step = |g: &mut Graph<f32, D>, params: &mut Params<f32, D>| -> DResult<()> {
            g.reset();
            params.zero_grads();
            let xi = g.input_slice(&x, 0, batch, 784)?;
            let z = enc.forward(g, params, xi, None)?;
            let u = g.l2_normalize(z, 1e-12)?;
            let r = dec.forward(g, params, u, None)?;
            let loss = g.sq_error(r, xi, 1.0 / (batch * 784) as f64)?;
            g.backward(loss, params)?;
            opt.step(params)
        };
        let (warm, timed) = if gpu { (20, 200) } else { (5, 30) };
        let mut times = Vec::new();
        for s in 0..warm + timed {
            let t0 = Instant::now();
            step(&mut g, &mut params)?;
            dev.synchronize()?;
            if s >= warm {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = times[times.len() / 2];
        let weights: usize = dims.windows(2).map(|w| w[0] * w[1]).sum::<usize>() * 2;
        let gflops = 6.0 * weights as f64 * batch as f64 / (median * 1e-3) / 1e9;
        let mut line = format!(
            "{{\"impl\":\"upcc\",\"device\":\"{}\",\"batch\":{batch},\"threads\":{},\"median_ms\":{median:.3},\"gflops\":{gflops:.1}",
            dev.name(),
            rayon::current_num_threads()
        );
        if gpu {
            // Back to back: 36 steps queued, one synchronisation (launch-bound throughput).
            let t0 = Instant::now();
            for _ in 0..36 {
                step(&mut g, &mut params)?;
            }
            dev.synchronize()?;
            let per = t0.elapsed().as_secs_f64() * 1e3 / 36.0;
            line.push_str(&format!(",\"back_to_back_ms\":{per:.3}"));
        }
        println!("{line}}}");
    }
    Ok(())
}
