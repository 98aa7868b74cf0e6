//! Networks shared by several stages: the autoencoder backbone (d-500-500-2000-D with a
//! mirror decoder) and batched evaluation helpers.

use upcc_nn::{Act, Cpu, Graph, Mlp, Params, Stream, WeightInit};

/// The numeric type and device every stage trains with today.
pub type Dev = Cpu;
pub type P = Params<f32, Dev>;
pub type G = Graph<f32, Dev>;

/// Numerics class of stages that train networks (part of their node keys).
pub const NUMERICS: &str = "cpu-f32";

/// Encoder d→h1→…→D (ReLU hidden, linear code) and decoder D→…→d (ReLU hidden, linear out),
/// parameters `encoder.{i}.*` and `decoder.{i}.*`.
pub struct Autoencoder {
    pub encoder: Mlp,
    pub decoder: Mlp,
}

impl Autoencoder {
    pub fn new(
        params: &mut P,
        input_dim: usize,
        hidden: &[usize],
        embedding_dim: usize,
        init: WeightInit,
        group: usize,
        rng: &mut Stream,
    ) -> Self {
        let mut dims = vec![input_dim];
        dims.extend_from_slice(hidden);
        dims.push(embedding_dim);
        let encoder = Mlp::new(
            params,
            "encoder",
            &dims,
            Act::Relu,
            Act::Identity,
            init,
            group,
            rng,
        );
        let rev: Vec<usize> = dims.iter().rev().copied().collect();
        let decoder = Mlp::new(
            params,
            "decoder",
            &rev,
            Act::Relu,
            Act::Identity,
            init,
            group,
            rng,
        );
        Autoencoder { encoder, decoder }
    }

    /// Normalised embeddings of `x` (rows × d), computed in batches, no gradients.
    pub fn embed(&self, params: &P, x: &[f32], dim: usize) -> Vec<f32> {
        let rows = x.len() / dim;
        let d = self.encoder.out_dim();
        let mut out = Vec::with_capacity(rows * d);
        let mut g = G::new(Dev::default());
        for start in (0..rows).step_by(2048) {
            let end = (start + 2048).min(rows);
            g.reset();
            let xi = g.input(&x[start * dim..end * dim], end - start, dim);
            let z = self.encoder.forward(&mut g, params, xi, None);
            let u = g.l2_normalize(z, 1e-12);
            out.extend(g.to_host(u));
        }
        out
    }

    /// Mean squared reconstruction error of `x` decoded from the normalised code.
    pub fn reconstruction_mse(&self, params: &P, x: &[f32], dim: usize) -> f64 {
        let rows = x.len() / dim;
        if rows == 0 {
            return f64::NAN;
        }
        let mut g = G::new(Dev::default());
        let mut total = 0.0;
        for start in (0..rows).step_by(2048) {
            let end = (start + 2048).min(rows);
            g.reset();
            let chunk = &x[start * dim..end * dim];
            let xi = g.input(chunk, end - start, dim);
            let z = self.encoder.forward(&mut g, params, xi, None);
            let u = g.l2_normalize(z, 1e-12);
            let r = self.decoder.forward(&mut g, params, u, None);
            let l = g.sq_error(r, chunk, 1.0);
            total += g.scalar(l);
        }
        total / (rows * dim) as f64
    }
}

/// Softmax class probabilities of an MLP classifier for `x`, in batches (eval mode).
pub fn predict_proba(mlp: &Mlp, params: &P, x: &[f32], dim: usize) -> Vec<f32> {
    use upcc_nn::Device;
    let rows = x.len() / dim;
    let c = mlp.out_dim();
    let mut out = Vec::with_capacity(rows * c);
    let mut g = G::new(Dev::default());
    for start in (0..rows).step_by(2048) {
        let end = (start + 2048).min(rows);
        g.reset();
        let xi = g.input(&x[start * dim..end * dim], end - start, dim);
        let logits = mlp.forward(&mut g, params, xi, None);
        out.extend(Device::<f32>::softmax_rows(
            g.device(),
            g.value(logits),
            end - start,
            c,
        ));
    }
    out
}

/// Learning rate of step decay: lr · decay^⌊epoch/step⌋.
pub fn step_lr(lr: f64, decay: f64, step: usize, epoch: usize) -> f64 {
    match epoch.checked_div(step) {
        Some(k) => lr * decay.powi(k as i32),
        None => lr,
    }
}
