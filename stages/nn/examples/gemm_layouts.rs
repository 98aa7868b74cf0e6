//! Micro-benchmark of gemm layouts for the autoencoder's shapes (development aid).
use std::time::Instant;
use upcc_nn::{Cpu, Device, GemmSpec};

fn time(spec: GemmSpec, reps: usize) -> f64 {
    let a = vec![0.5f32; spec.m * spec.k];
    let b = vec![0.25f32; spec.k * spec.n];
    let mut c = vec![0f32; spec.m * spec.n];
    for _ in 0..3 {
        Device::<f32>::gemm(&Cpu, spec, &a, &b, &mut c);
    }
    let t0 = Instant::now();
    for _ in 0..reps {
        Device::<f32>::gemm(&Cpu, spec, &a, &b, &mut c);
    }
    t0.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let batch: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    for (i, o) in [
        (784usize, 500usize),
        (500, 500),
        (500, 2000),
        (2000, 10),
        (10, 2000),
        (2000, 500),
        (500, 784),
    ] {
        let mut line = format!("{i:>4}->{o:<4}");
        for (a_t, b_t, acc, name) in [
            (false, true, false, "fwd x·Wt"),
            (false, false, false, "fwd x·W"),
            (true, false, true, "dW dzT·x"),
            (false, false, true, "dX dz·W"),
        ] {
            let spec = match name {
                "dW dzT·x" => GemmSpec {
                    m: o,
                    n: i,
                    k: batch,
                    a_t,
                    b_t,
                    accumulate: acc,
                },
                "dX dz·W" => GemmSpec {
                    m: batch,
                    n: i,
                    k: o,
                    a_t,
                    b_t,
                    accumulate: acc,
                },
                _ => GemmSpec {
                    m: batch,
                    n: o,
                    k: i,
                    a_t,
                    b_t,
                    accumulate: acc,
                },
            };
            let t = time(spec, 20);
            let gf = 2.0 * (spec.m * spec.n * spec.k) as f64 / t / 1e9;
            line += &format!("  {name}: {:.3}ms {:.0}GF", t * 1e3, gf);
        }
        println!("{line}");
    }
}
