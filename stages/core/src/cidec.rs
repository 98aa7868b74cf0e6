//! `cidec`: CIDEC, DEC/IDEC with pairwise constraints through the MCL loss (Appendix C.2, C.5).
//!
//! An autoencoder (plain SDAE pretraining: no normalised code) gives embeddings z; C anchors
//! are initialised by k-means on the training embeddings; Student-t soft assignments
//! q_jc ∝ (1 + ‖z_j − μ_c‖²/α)^(−(α+1)/2); the DEC target p_jc ∝ q_jc²/f_c (f_c = Σ_j q_jc) is
//! recomputed every epoch. The loss is KL(P‖Q) + λ₁·reconstruction + λ₂·MCL, with the MCL term
//! BCE(q_aᵀq_b, y) on the real-valued y; λ₁ = 1, λ₂ = 0.1; Adam 1e-3, batch 256, at most 500
//! epochs with the assignment-change stop. The partition is the argmax of q.

use serde::{Deserialize, Serialize};
use upcc_nn::{Adam, Device, Ix, ParamId, Stream, WeightInit};

use crate::check::{Check, Checker, Problem};
use crate::cluster::{self, Assignments, ClusterParams, ClusterSettings};
use crate::constraints::Constraints;
use crate::dcc::{AssignmentStop, DccTrained, StopTracker};
use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{map_rows, Autoencoder, Rows, EVAL_ROWS, G, P};

pub const VERSION: u32 = 1;

/// The exponent of the Student-t kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StudentExponent {
    /// (α + 1)/2, as DEC defines it.
    Dec,
    /// α + 1, what the DCC/SpherePair code computes (`q ** (alpha + 1) / 2`).
    Code,
}

/// CIDEC's settings (section `cidec`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CidecSettings {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    pub lr: f64,
    pub batch_size: usize,
    /// Degrees of freedom α of the Student-t kernel.
    pub alpha: f64,
    pub exponent: StudentExponent,
    /// λ₁: weight of the reconstruction term.
    pub lambda_rec: f64,
    /// λ₂: weight of the MCL constraint term.
    pub lambda_mcl: f64,
    /// Weight of the KL clustering term (the code's effective 0.1; the paper's 1).
    pub kl_weight: f64,
    /// k-means starts of the anchor initialisation.
    pub kmeans_init: usize,
    pub eps: f64,
    pub grad_clip: Option<f64>,
    pub stop: AssignmentStop,
}

impl Default for CidecSettings {
    fn default() -> Self {
        CidecSettings {
            hidden: vec![500, 500, 2000],
            epochs: 500,
            lr: 1e-3,
            batch_size: 256,
            alpha: 1.0,
            exponent: StudentExponent::Dec,
            lambda_rec: 1.0,
            lambda_mcl: 0.1,
            kl_weight: 1.0,
            kmeans_init: 20,
            eps: 1e-7,
            grad_clip: None,
            // The code does not stop before epoch 30 (the paper is silent): FIDELITY.md.
            stop: AssignmentStop {
                min_epochs: 30,
                ..AssignmentStop::default()
            },
        }
    }
}

impl Check for CidecSettings {
    fn check(&self) -> Vec<Problem> {
        let mut c = Checker::new();
        c.sizes("hidden", &self.hidden, true);
        c.epochs("epochs", self.epochs, 1);
        c.learning_rate("lr", self.lr);
        c.at_least("batch_size", self.batch_size, 1);
        c.positive("alpha", self.alpha);
        c.non_negative("lambda_rec", self.lambda_rec);
        c.non_negative("lambda_mcl", self.lambda_mcl);
        c.non_negative("kl_weight", self.kl_weight);
        c.at_least("kmeans_init", self.kmeans_init, 1);
        c.in_range("eps", self.eps, 0.0, 0.5, false);
        if let Some(g) = self.grad_clip {
            if !(g.is_finite() && g > 0.0) {
                c.push(
                    "grad_clip",
                    format!("must be a finite number > 0 (or null for no clipping), got {g}"),
                );
            }
        }
        c.in_range("stop.tol", self.stop.tol, 0.0, 1.0, true);
        c.at_least("stop.consecutive", self.stop.consecutive, 1);
        if let Some(p) = crate::check::fits_in_memory(
            "hidden",
            "an autoencoder of these sizes",
            crate::check::autoencoder_bytes(1, &self.hidden, 1, self.batch_size.saturating_mul(3)),
        ) {
            c.problems.push(p);
        }
        c.done()
    }
}

/// Bytes a CIDEC node needs: the autoencoder with its optimiser state and the activations of
/// a mini-batch (two instances per pair and about as many single instances), the data, and
/// every instance's embedding and soft assignment.
pub fn memory_bytes(
    s: &CidecSettings,
    embedding_dim: usize,
    dim: usize,
    classes: usize,
    rows: usize,
) -> u128 {
    crate::check::autoencoder_bytes(
        dim,
        &s.hidden,
        embedding_dim,
        s.batch_size.saturating_mul(3),
    )
    .saturating_add(crate::check::f32_bytes(rows, dim))
    .saturating_add(crate::check::f32_bytes(
        rows,
        embedding_dim.saturating_add(classes),
    ))
}

/// What one CIDEC node runs with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CidecParams {
    pub settings: CidecSettings,
    pub embedding_dim: usize,
    /// Start from the plain SDAE's weights (the node then has a `weights` input).
    pub pretrained: bool,
    pub seed: u64,
}

impl CidecSettings {
    fn exponent_value(&self) -> f64 {
        match self.exponent {
            StudentExponent::Dec => (self.alpha + 1.0) / 2.0,
            StudentExponent::Code => self.alpha + 1.0,
        }
    }
}

/// The DEC target of soft assignments q (rows × k): p_jc ∝ q_jc² / f_c, f_c = Σ_j q_jc.
pub fn dec_target(q: &[f32], k: usize) -> Vec<f32> {
    let rows = q.len() / k.max(1);
    let mut f = vec![0f64; k];
    for r in 0..rows {
        for c in 0..k {
            f[c] += q[r * k + c] as f64;
        }
    }
    let mut p = vec![0f32; q.len()];
    for r in 0..rows {
        let w: Vec<f64> = (0..k)
            .map(|c| (q[r * k + c] as f64).powi(2) / f[c].max(1e-30))
            .collect();
        let s: f64 = w.iter().sum();
        for c in 0..k {
            p[r * k + c] = (w[c] / s.max(1e-30)) as f32;
        }
    }
    p
}

fn argmax_rows(v: &[f32], cols: usize) -> Vec<u32> {
    v.chunks(cols)
        .map(|r| crate::expert::argmax(r) as u32)
        .collect()
}

/// Train CIDEC and assign every row to its argmax cluster.
pub fn run<D: Device<f32>>(
    dev: &D,
    p: &CidecParams,
    features: &Features,
    cons: &Constraints,
    pretrained: Option<&[u8]>,
    monitor: &mut dyn Monitor,
) -> Result<DccTrained> {
    let s = &p.settings;
    crate::check::require("cidec", s.check())?;
    cons.validate(features, false, "constraints artifact")?;
    if cons.is_empty() {
        return Err(StageError::input("no constraints to train on"));
    }
    let bytes = memory_bytes(
        s,
        p.embedding_dim,
        features.dim,
        features.n_classes,
        features.rows(),
    );
    if let Some(problem) = crate::check::fits_in_memory("hidden", "this autoencoder", bytes) {
        crate::check::require("cidec", vec![problem])?;
    }
    let k = features.n_classes;
    let e = s.exponent_value();
    let d_emb = p.embedding_dim;
    let mut rng = Stream::new(p.seed, &["cidec", "init"]);
    let mut params = P::new(dev);
    let ae = Autoencoder::new(
        &mut params,
        features.dim,
        &s.hidden,
        d_emb,
        WeightInit::Torch,
        0,
        &mut rng,
    )?;
    if let Some(bytes) = pretrained {
        params
            .load_safetensors(bytes, |name| {
                (name.starts_with("encoder.") || name.starts_with("decoder."))
                    .then(|| name.to_string())
            })
            .map_err(|e| {
                StageError::input(format!("pretrained weights do not fit this model: {e}"))
            })?;
    }
    let mu: ParamId = params.add_values("centres", k, d_emb, &vec![0.0; k * d_emb], 0)?;
    let x = dev.upload(&features.x)?;
    let train = features.train_indices();
    let train_idx: Vec<u32> = train.iter().map(|&i| i as u32).collect();
    let train_dev = dev.upload_idx(&train_idx)?;
    let embed = |params: &P<D>, rows: Rows<'_, D>| -> Result<D::Buf> {
        map_rows(
            dev,
            &x,
            features.dim,
            rows,
            EVAL_ROWS,
            d_emb,
            &mut |g, xi| ae.encoder.forward(g, params, xi, None),
        )
    };
    // Anchors: k-means on the training embeddings.
    let z0 = dev.to_vec(&embed(&params, Rows::Idx(&train_dev, train.len()))?)?;
    let km = cluster::kmeans(
        &z0,
        d_emb,
        k,
        &ClusterParams {
            settings: ClusterSettings {
                n_init: s.kmeans_init,
                ..Default::default()
            },
            k,
            seed: p.seed,
        },
    )?;
    let centres: Vec<f32> = km.centroids.iter().map(|&v| v as f32).collect();
    params.set_host(mu, &centres)?;
    let soft = |params: &P<D>, rows: Rows<'_, D>| -> Result<Vec<f32>> {
        let q = map_rows(dev, &x, features.dim, rows, EVAL_ROWS, k, &mut |g, xi| {
            let z = ae.encoder.forward(g, params, xi, None)?;
            g.student_t(params, z, mu, s.alpha, e)
        })?;
        Ok(dev.to_vec(&q)?)
    };
    let mut opt = Adam::new(&params, vec![s.lr])?;
    let mut g = G::new(dev)?;
    let mut acc = dev.scalars(1)?;
    let mut batch_rng = Stream::new(p.seed, &["cidec", "batches"]);
    let mut stop = StopTracker::new(&s.stop);
    let targets = dev.upload(&cons.y)?;
    let m = cons.len();
    let ones = dev.upload(&vec![1.0f32; m])?;
    let bs = s.batch_size;
    let n_batches = m.div_ceil(bs);
    let inst_bs = train.len() / n_batches;
    let mut y_ep = dev.zeros(m)?;
    let mut curve = Vec::new();
    let mut q_train = soft(&params, Rows::Idx(&train_dev, train.len()))?;
    for epoch in 0..s.epochs {
        // The DEC target of this epoch, from the current assignments.
        let target = dec_target(&q_train, k);
        let order = batch_rng.permutation(m);
        let iperm = batch_rng.permutation(train.len());
        let mut rows_order = Vec::with_capacity(2 * m + n_batches * inst_bs);
        let mut p_order: Vec<f32> = Vec::with_capacity(n_batches * inst_bs * k);
        for bi in 0..n_batches {
            let cb = &order[bi * bs..((bi + 1) * bs).min(m)];
            rows_order.extend(cb.iter().map(|&i| cons.a[i as usize]));
            rows_order.extend(cb.iter().map(|&i| cons.b[i as usize]));
            for &j in &iperm[bi * inst_bs..(bi + 1) * inst_bs] {
                rows_order.push(train[j as usize] as u32);
                p_order.extend_from_slice(&target[j as usize * k..(j as usize + 1) * k]);
            }
        }
        let order_dev = dev.upload_idx(&order)?;
        let rows_dev = dev.upload_idx(&rows_order)?;
        let p_dev = dev.upload(&p_order)?;
        dev.gather_rows(&targets, 1, Ix::new(&order_dev, 0, m), &mut y_ep)?;
        dev.scalars_fill(&mut acc, 0.0)?;
        let mut row_off = 0;
        for bi in 0..n_batches {
            let start = bi * bs;
            let n = (start + bs).min(m) - start;
            let rows = 2 * n + inst_bs;
            g.reset();
            params.zero_grads();
            let xi = g.input_rows(&x, features.dim, Ix::new(&rows_dev, row_off, rows))?;
            row_off += rows;
            let z = ae.encoder.forward(&mut g, &params, xi, None)?;
            let q = g.student_t(&params, z, mu, s.alpha, e)?;
            let y = g.input_slice(&y_ep, start, n, 1)?;
            let w = g.input_slice(&ones, 0, n, 1)?;
            let mcl = g.pair_cobce(&params, q, n, None, y, w, s.eps, n as f64)?;
            let loss = if inst_bs == 0 {
                g.sum(&[(mcl, s.lambda_mcl)])?
            } else {
                let qi = g.rows(q, 2 * n, rows)?;
                let pt = g.input_slice(&p_dev, bi * inst_bs, inst_bs, k)?;
                let kl = g.kl_target(qi, pt, inst_bs as f64)?;
                let zi = g.rows(z, 2 * n, rows)?;
                let recon = ae.decoder.forward(&mut g, &params, zi, None)?;
                let target_x = g.rows(xi, 2 * n, rows)?;
                let rec = g.sq_error(recon, target_x, 1.0 / (inst_bs * features.dim) as f64)?;
                g.sum(&[(kl, s.kl_weight), (rec, s.lambda_rec), (mcl, s.lambda_mcl)])?
            };
            g.accumulate(loss, 0, 1.0, &mut acc, 0)?;
            g.backward(loss, &mut params)?;
            if let Some(c) = s.grad_clip {
                params.clip_grad_norm(c)?;
            }
            opt.step(&mut params)?;
        }
        let loss = dev.scalars_to_vec(&acc)?[0] / n_batches as f64;
        if !loss.is_finite() {
            return Err(StageError::failed(format!(
                "training diverged at epoch {epoch} (non-finite loss)"
            )));
        }
        q_train = soft(&params, Rows::Idx(&train_dev, train.len()))?;
        let labels = argmax_rows(&q_train, k);
        if stop.epoch_done(epoch, s.epochs, loss, labels, &mut curve, monitor) {
            break;
        }
    }
    let q_all = soft(&params, Rows::All(features.rows()))?;
    Ok(DccTrained {
        assignments: Assignments {
            ids: features.ids.clone(),
            is_test: features.is_test.clone(),
            is_val: features.is_val.clone(),
            label: features.labels.clone(),
            cluster: argmax_rows(&q_all, k),
        },
        curve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dec_target_sharpens_and_balances() {
        // Two rows, two clusters: q = [0.6, 0.4], [0.5, 0.5]; f = [1.1, 0.9].
        let p = dec_target(&[0.6, 0.4, 0.5, 0.5], 2);
        let (a, b) = (0.36 / 1.1, 0.16 / 0.9);
        assert!((p[0] as f64 - a / (a + b)).abs() < 1e-6);
        let (c, d) = (0.25 / 1.1, 0.25 / 0.9);
        assert!((p[2] as f64 - c / (c + d)).abs() < 1e-6);
        // Each row sums to 1 and the first row got sharper.
        assert!((p[0] + p[1] - 1.0).abs() < 1e-6 && p[0] > 0.6);
    }

    #[test]
    fn the_two_readings_of_the_exponent() {
        let s = CidecSettings::default();
        assert_eq!(s.exponent_value(), 1.0);
        let code = CidecSettings {
            exponent: StudentExponent::Code,
            ..Default::default()
        };
        assert_eq!(code.exponent_value(), 2.0);
        assert!(s.check().is_empty());
    }
}
