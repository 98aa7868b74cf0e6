//! ECI-PP: Estimator–Corrector–Integrator ProbPair (Section 4.2, Algorithm 1, Appendix C.5).
//!
//! K cross-fitted Estimators give out-of-fold beliefs ŷ_oof; expert-specific Correctors learn
//! probability-space corrections Δ̂ on [ŷ_oof; φ]; softclip, gap, screening weights and
//! Bayesian-confidence fusion build the Integrator's targets; the Integrator's relations feed
//! the Estimators back for iterative refinement. Held-out diagnostics on the test-split
//! diagnostic set are recorded per iteration.

use serde::{Deserialize, Serialize};
use upcc_nn::{Act, Adam, Device, Ix, Mlp, Params, Stream, WeightInit};

pub use upcc_nn::science::{bayesian_confidence, screen, softclip};

use crate::constraints::Constraints;
use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{map_rows, PairIndex, Rows, G, P};
use crate::table::TableBuilder;
use crate::train::{kappa, EpochStats, PairBatches, ProbPairModel, TrainParams, Trainer};

pub const VERSION: u32 = 1;

/// The form of the Corrector's robust loss with transition δ (`corrector_huber`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectorLoss {
    /// ½r² inside, δ(|r| − ½δ) outside (PyTorch's `HuberLoss(delta=δ)`).
    Huber,
    /// ½r²/δ inside, |r| − ½δ outside (PyTorch's `SmoothL1Loss(beta=δ)`).
    SmoothL1,
}

/// Which final linear layers of the Estimators and the Integrator the between-iteration noise
/// perturbs (`perturb_layers`; the Correctors' output layer always).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerturbLayers {
    /// The encoder's last layer (the embedding layer).
    Embedding,
    /// The decoder's output layer.
    DecoderOutput,
    /// Both.
    Both,
}

/// ECI-PP hyper-parameters (defaults: the paper's one global setting).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EciSettings {
    /// Number of cross-fitting folds K (one Estimator each).
    pub folds: usize,
    /// Warm-up epochs N_wu (counted within `train.epochs`, the total N_ep).
    pub warmup_epochs: usize,
    /// Weight the warm-up by the decisiveness κ (false: uniform weights).
    pub kappa_warmup: bool,
    /// Hidden sizes of each expert's Corrector (output: one tanh unit).
    pub corrector_hidden: Vec<usize>,
    /// λ_cor: weight of ‖Δ̂‖² in the Corrector loss.
    pub corrector_lambda: f64,
    /// Huber transition δ of the Corrector loss.
    pub corrector_huber: f64,
    /// Form of the Corrector's robust loss (FIDELITY.md).
    pub corrector_loss: CorrectorLoss,
    pub corrector_epochs: usize,
    pub corrector_patience: usize,
    /// Fraction of each expert's constraints held out for the Corrector's early stopping.
    pub corrector_validation: f64,
    pub corrector_lr: f64,
    pub corrector_batch_size: usize,
    /// γ: sharpness of the screening weight w = (1 − gap)^γ.
    pub gamma: f64,
    /// n0: Bayesian-confidence scale, n_i = n0·w_i.
    pub n0: f64,
    /// ξ: sharpness of softclip.
    pub xi: f64,
    /// Std of the Gaussian noise added to the final linear layers between iterations.
    pub perturb_std: f64,
    /// Which layers of the Estimators and the Integrator are perturbed (FIDELITY.md).
    pub perturb_layers: PerturbLayers,
    /// Perturb before the first refinement iteration too (false: only between refinement
    /// iterations, i.e. from the second on).
    pub perturb_first: bool,
    /// Record held-out diagnostics every this many iterations (0: never).
    pub diagnostics_every: usize,
}

impl Default for EciSettings {
    fn default() -> Self {
        EciSettings {
            folds: 5,
            warmup_epochs: 50,
            kappa_warmup: true,
            corrector_hidden: vec![64, 16],
            corrector_lambda: 0.5,
            corrector_huber: 0.1,
            corrector_loss: CorrectorLoss::Huber,
            corrector_epochs: 50,
            corrector_patience: 10,
            corrector_validation: 0.1,
            corrector_lr: 1e-3,
            corrector_batch_size: 256,
            gamma: 10.0,
            n0: 10.0,
            xi: 20.0,
            perturb_std: 0.01,
            perturb_layers: PerturbLayers::Embedding,
            perturb_first: true,
            diagnostics_every: 1,
        }
    }
}

/// Balanced fold of every constraint: position in a seeded permutation modulo K.
pub fn assign_folds(m: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut rng = Stream::new(seed, &["eci", "folds"]);
    let perm = rng.permutation(m);
    let mut fold = vec![0; m];
    for (pos, &i) in perm.iter().enumerate() {
        fold[i as usize] = pos % k;
    }
    fold
}

/// Per fold k: the constraints Estimator k trains on (all outside fold k) and the ones it
/// predicts out of fold (fold k).
pub fn fold_sets(folds: &[usize], k: usize) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    let subsets = (0..k)
        .map(|f| (0..folds.len()).filter(|&i| folds[i] != f).collect())
        .collect();
    let holdouts = (0..k)
        .map(|f| (0..folds.len()).filter(|&i| folds[i] == f).collect())
        .collect();
    (subsets, holdouts)
}

/// Area under the ROC curve of `scores` for `positives` (ties count one half).
pub fn auc(scores: &[f64], positives: &[bool]) -> f64 {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| {
        scores[a]
            .partial_cmp(&scores[b])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    // Average ranks over ties.
    let mut ranks = vec![0.0; scores.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let r = (i + j) as f64 / 2.0 + 1.0;
        for &t in &idx[i..=j] {
            ranks[t] = r;
        }
        i = j + 1;
    }
    let n_pos = positives.iter().filter(|&&p| p).count() as f64;
    let n_neg = positives.len() as f64 - n_pos;
    if n_pos == 0.0 || n_neg == 0.0 {
        return f64::NAN;
    }
    let sum: f64 = ranks
        .iter()
        .zip(positives)
        .filter(|(_, &p)| p)
        .map(|(r, _)| r)
        .sum();
    (sum - n_pos * (n_pos + 1.0) / 2.0) / (n_pos * n_neg)
}

/// Average precision (scikit-learn's definition: Σ (R_n − R_{n−1}) P_n over thresholds).
pub fn average_precision(scores: &[f64], positives: &[bool]) -> f64 {
    let n_pos = positives.iter().filter(|&&p| p).count();
    if n_pos == 0 {
        return f64::NAN;
    }
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| {
        scores[b]
            .partial_cmp(&scores[a])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let (mut tp, mut fp, mut ap, mut prev_recall) = (0usize, 0usize, 0.0, 0.0);
    let mut i = 0;
    while i < idx.len() {
        let s = scores[idx[i]];
        while i < idx.len() && scores[idx[i]] == s {
            if positives[idx[i]] {
                tp += 1;
            } else {
                fp += 1;
            }
            i += 1;
        }
        let recall = tp as f64 / n_pos as f64;
        let precision = tp as f64 / (tp + fp) as f64;
        ap += (recall - prev_recall) * precision;
        prev_recall = recall;
    }
    ap
}

/// φ_ab = [x_a ⊙ x_b ; |x_a − x_b|].
fn pair_features(x: &Features, a: u32, b: u32, out: &mut Vec<f32>) {
    let (ra, rb) = (x.row(a as usize), x.row(b as usize));
    out.extend(ra.iter().zip(rb).map(|(p, q)| p * q));
    out.extend(ra.iter().zip(rb).map(|(p, q)| (p - q).abs()));
}

/// Corrector input rows [ŷ; φ] of a pair set, on the device (ŷ, column 0, filled in per
/// iteration), and the members of each expert (ascending) for routing.
struct CorrectorInputs<D: Device<f32>> {
    rows: D::Buf,
    n: usize,
    members: Vec<(D::Idx, usize)>,
}

impl<D: Device<f32>> CorrectorInputs<D> {
    fn new(dev: &D, x: &Features, pairs: &Constraints, n_experts: usize) -> Result<Self> {
        let input_dim = 1 + 2 * x.dim;
        let mut v = Vec::with_capacity(pairs.len() * input_dim);
        for i in 0..pairs.len() {
            v.push(0.0);
            pair_features(x, pairs.a[i], pairs.b[i], &mut v);
        }
        let members = (0..n_experts)
            .map(|e| {
                let m: Vec<u32> = (0..pairs.len() as u32)
                    .filter(|&i| pairs.expert[i as usize] as usize == e)
                    .collect();
                Ok((dev.upload_idx(&m)?, m.len()))
            })
            .collect::<Result<_>>()?;
        Ok(CorrectorInputs {
            rows: dev.upload(&v)?,
            n: pairs.len(),
            members,
        })
    }
}

/// Rows `idx[..n]` of a device matrix with `cols` columns, as a new device buffer.
fn gather<D: Device<f32>>(
    dev: &D,
    x: &D::Buf,
    cols: usize,
    idx: &D::Idx,
    n: usize,
) -> Result<D::Buf> {
    let mut out = dev.zeros(n * cols)?;
    dev.gather_rows(x, cols, Ix::new(idx, 0, n), &mut out)?;
    Ok(out)
}

/// One expert's Corrector: an MLP on [ŷ_oof; φ] with a tanh output, Δ̂ ∈ (−1, 1).
pub struct Corrector<D: Device<f32>> {
    params: P<D>,
    mlp: Mlp,
    /// Constraint indices (into the constraint set) this expert trains and validates on.
    train: Vec<u32>,
    valid: Vec<u32>,
    valid_idx: D::Idx,
}

impl<D: Device<f32>> Corrector<D> {
    fn new(
        dev: &D,
        s: &EciSettings,
        input_dim: usize,
        members: &[usize],
        seed: u64,
        expert: usize,
    ) -> Result<Self> {
        let label = expert.to_string();
        let mut rng = Stream::new(seed, &["eci", "corrector", &label]);
        let mut params = Params::new(dev);
        let mut dims = vec![input_dim];
        dims.extend_from_slice(&s.corrector_hidden);
        dims.push(1);
        let mlp = Mlp::new(
            &mut params,
            "corrector",
            &dims,
            Act::Relu,
            Act::Tanh,
            WeightInit::Torch,
            0,
            &mut rng,
        )?;
        let mut order = members.to_vec();
        rng.shuffle(&mut order);
        let n_valid = if order.len() >= 10 {
            ((order.len() as f64) * s.corrector_validation).round() as usize
        } else {
            0
        };
        let valid: Vec<u32> = order[..n_valid].iter().map(|&i| i as u32).collect();
        let mut train: Vec<u32> = order[n_valid..].iter().map(|&i| i as u32).collect();
        train.sort_unstable();
        Ok(Corrector {
            params,
            mlp,
            train,
            valid_idx: dev.upload_idx(&valid)?,
            valid,
        })
    }

    /// Δ̂ for `n` rows (listed in `idx`) of the input matrix, on the device, no gradients.
    fn predict(&self, inputs: &D::Buf, input_dim: usize, idx: &D::Idx, n: usize) -> Result<D::Buf> {
        map_rows(
            self.params.device(),
            inputs,
            input_dim,
            Rows::Idx(idx, n),
            4096,
            1,
            &mut |g, x| self.mlp.forward(g, &self.params, x, None),
        )
    }

    /// Fit on (input rows, target Δ) of its constraints with early stopping on the held-out
    /// part; keeps the best validation weights. Returns the epochs run. One validation loss
    /// is read back per epoch.
    fn fit(
        &mut self,
        s: &EciSettings,
        inputs: &D::Buf,
        input_dim: usize,
        delta: &D::Buf,
        rng: &mut Stream,
    ) -> Result<usize> {
        let dev = self.params.device().clone();
        let nv = self.valid.len();
        let vx = gather(&dev, inputs, input_dim, &self.valid_idx, nv)?;
        let vt = gather(&dev, delta, 1, &self.valid_idx, nv)?;
        let mut opt = Adam::new(&self.params, vec![s.corrector_lr])?;
        let mut g = G::new(&dev)?;
        let loss_of = |this: &Corrector<D>, g: &mut G<D>| -> Result<f64> {
            if nv == 0 {
                return Ok(0.0);
            }
            g.reset();
            let xi = g.input_slice(&vx, 0, nv, input_dim)?;
            let t = g.input_slice(&vt, 0, nv, 1)?;
            let p = this.mlp.forward(g, &this.params, xi, None)?;
            let l = g.huber_l2(
                p,
                t,
                None,
                s.corrector_huber,
                s.corrector_loss == CorrectorLoss::SmoothL1,
                s.corrector_lambda,
                nv as f64,
            )?;
            Ok(g.scalar(l)?)
        };
        let mut best = (loss_of(self, &mut g)?, self.params.snapshot()?);
        let mut wait = 0;
        let mut epochs = 0;
        let bs = s.corrector_batch_size.max(1);
        for _ in 0..s.corrector_epochs {
            epochs += 1;
            let mut order = self.train.clone();
            rng.shuffle(&mut order);
            let order_dev = dev.upload_idx(&order)?;
            for (bi, batch) in order.chunks(bs).enumerate() {
                let ix = Ix::new(&order_dev, bi * bs, batch.len());
                g.reset();
                self.params.zero_grads();
                let xi = g.input_rows(inputs, input_dim, ix)?;
                let t = g.input_rows(delta, 1, ix)?;
                let p = self.mlp.forward(&mut g, &self.params, xi, None)?;
                let l = g.huber_l2(
                    p,
                    t,
                    None,
                    s.corrector_huber,
                    s.corrector_loss == CorrectorLoss::SmoothL1,
                    s.corrector_lambda,
                    batch.len() as f64,
                )?;
                g.backward(l, &mut self.params)?;
                opt.step(&mut self.params)?;
            }
            if self.valid.is_empty() {
                continue;
            }
            let v = loss_of(self, &mut g)?;
            if v < best.0 {
                best = (v, self.params.snapshot()?);
                wait = 0;
            } else {
                wait += 1;
                if wait >= s.corrector_patience {
                    break;
                }
            }
        }
        if !self.valid.is_empty() {
            self.params.restore(&best.1)?;
        }
        Ok(epochs)
    }
}

/// One iteration's held-out diagnostics (Section 5.2, Appendix C.4).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diagnostics {
    pub iteration: u32,
    pub brier_estimator: f64,
    pub brier_corrected_clean: f64,
    pub brier_integrator: f64,
    pub gap_clean: f64,
    pub auc: f64,
    pub ap: f64,
    pub auc_oracle: f64,
    pub ap_oracle: f64,
    /// Mean |Δ̂| over the training constraints (how much the Correctors correct).
    pub mean_abs_delta: f64,
    /// Mean screening weight w over the training constraints.
    pub mean_w: f64,
}

pub fn diagnostics_to_parquet(d: &[Diagnostics]) -> Result<Vec<u8>> {
    TableBuilder::new()
        .u32("iteration", d.iter().map(|x| x.iteration).collect())
        .f64(
            "brier_estimator",
            d.iter().map(|x| x.brier_estimator).collect(),
        )
        .f64(
            "brier_corrected_clean",
            d.iter().map(|x| x.brier_corrected_clean).collect(),
        )
        .f64(
            "brier_integrator",
            d.iter().map(|x| x.brier_integrator).collect(),
        )
        .f64("gap_clean", d.iter().map(|x| x.gap_clean).collect())
        .f64("auc", d.iter().map(|x| x.auc).collect())
        .f64("ap", d.iter().map(|x| x.ap).collect())
        .f64("auc_oracle", d.iter().map(|x| x.auc_oracle).collect())
        .f64("ap_oracle", d.iter().map(|x| x.ap_oracle).collect())
        .f64(
            "mean_abs_delta",
            d.iter().map(|x| x.mean_abs_delta).collect(),
        )
        .f64("mean_w", d.iter().map(|x| x.mean_w).collect())
        .to_parquet()
}

/// Output of an ECI-PP run.
pub struct EciTrained {
    pub embeddings: Vec<f32>,
    pub dim: usize,
    /// Integrator's epochs.
    pub curve: Vec<EpochStats>,
    pub diagnostics: Vec<Diagnostics>,
    /// Wall time per epoch, in total and by part (for the benchmark).
    pub seconds_per_iteration: f64,
    pub timing: Timing,
}

/// Seconds spent in each part of ECI-PP over the whole run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timing {
    /// Estimator epochs and out-of-fold predictions.
    pub estimators: f64,
    /// Corrector fits, corrections, screening and fusion.
    pub correctors: f64,
    /// Integrator epochs and its relation read-out.
    pub integrator: f64,
    /// Held-out diagnostics.
    pub diagnostics: f64,
}

/// Time `f` and add its seconds to `acc` (after the device finished the work).
fn timed<D: Device<f32>, T>(dev: &D, acc: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t0 = std::time::Instant::now();
    let out = f()?;
    dev.synchronize()?;
    *acc += t0.elapsed().as_secs_f64();
    Ok(out)
}

/// Δ̂ of every pair of an input set from the Corrector of its expert: each pair is routed only
/// to its own expert's module.
fn route<D: Device<f32>>(
    dev: &D,
    correctors: &[Corrector<D>],
    inputs: &CorrectorInputs<D>,
    input_dim: usize,
) -> Result<D::Buf> {
    let mut delta = dev.zeros(inputs.n)?;
    for (c, (idx, n)) in correctors.iter().zip(&inputs.members) {
        if *n == 0 {
            continue;
        }
        let d = c.predict(&inputs.rows, input_dim, idx, *n)?;
        dev.scatter_add_rows(&d, 1, Ix::distinct(idx, 0, *n), &mut delta)?;
    }
    Ok(delta)
}

/// Everything an ECI-PP run keeps on the device.
struct State<'a, D: Device<f32>> {
    dev: D,
    s: &'a EciSettings,
    features: &'a Features,
    cons: &'a Constraints,
    x: D::Buf,
    y: D::Buf,
    cor_inputs: CorrectorInputs<D>,
    input_dim: usize,
    correctors: Vec<Corrector<D>>,
}

impl<D: Device<f32>> State<'_, D> {
    /// Δ̂ for every constraint given beliefs `y_hat` (writes ŷ into the input rows).
    fn corrections(&mut self, y_hat: &D::Buf) -> Result<D::Buf> {
        self.dev.set_column(
            y_hat,
            &mut self.cor_inputs.rows,
            self.cor_inputs.n,
            self.input_dim,
            0,
        )?;
        route(
            &self.dev,
            &self.correctors,
            &self.cor_inputs,
            self.input_dim,
        )
    }

    /// Refit every expert's Corrector on Δ = ŷ_oof − y.
    fn fit_correctors(&mut self, y_oof: &D::Buf, rng: &mut Stream) -> Result<usize> {
        let dev = &self.dev;
        let m = self.cons.len();
        dev.set_column(y_oof, &mut self.cor_inputs.rows, m, self.input_dim, 0)?;
        let mut delta = dev.zeros(m)?;
        dev.copy_range(y_oof, 0, &mut delta, 0, m)?;
        dev.axpy(-1.0, &self.y, &mut delta)?;
        let mut epochs = 0;
        let (inputs, dim, s) = (&self.cor_inputs.rows, self.input_dim, self.s);
        for c in self.correctors.iter_mut() {
            epochs += c.fit(s, inputs, dim, &delta, rng)?;
        }
        Ok(epochs)
    }

    /// Corrections, screening and Bayesian-confidence fusion for every training constraint:
    /// (y_BC, w, Δ̂), on the device.
    fn fuse(&mut self, y_oof: &D::Buf) -> Result<(D::Buf, D::Buf, D::Buf)> {
        let delta = self.corrections(y_oof)?;
        let m = self.cons.len();
        let (mut y_bc, mut w) = (self.dev.zeros(m)?, self.dev.zeros(m)?);
        let s = self.s;
        self.dev.eci_fuse(
            &self.y, &delta, y_oof, s.xi, s.gamma, s.n0, &mut y_bc, &mut w,
        )?;
        Ok((y_bc, w, delta))
    }
}

/// The K Estimators with their trainers and fold bookkeeping.
struct Estimators<D: Device<f32>> {
    models: Vec<ProbPairModel<D>>,
    trainers: Vec<Trainer<D>>,
    /// Per fold: the constraint ids Estimator k trains on, and its out-of-fold pairs.
    subsets: Vec<Vec<u32>>,
    holdouts: Vec<(D::Idx, usize, PairIndex<D>)>,
}

impl<D: Device<f32>> Estimators<D> {
    /// One epoch of every Estimator on (targets, weights) over its folds: concurrently where
    /// the device allows it (independent models; results do not depend on threads).
    fn epoch(
        &mut self,
        st: &State<D>,
        targets: &D::Buf,
        weights: &D::Buf,
        epoch: u32,
    ) -> Result<()> {
        use rayon::prelude::*;
        let (x, dim, cons) = (&st.x, st.features.dim, st.cons);
        let one = |model: &mut ProbPairModel<D>, trainer: &mut Trainer<D>, ids: &Vec<u32>| {
            let data = PairBatches {
                a: &cons.a,
                b: &cons.b,
                ids,
                targets,
                weights,
            };
            trainer.epoch(model, x, dim, &data, epoch).map(|_| ())
        };
        if st.dev.concurrent_models() {
            self.models
                .par_iter_mut()
                .zip(self.trainers.par_iter_mut())
                .zip(self.subsets.par_iter())
                .map(|((m, t), ids)| one(m, t, ids))
                .collect::<Result<Vec<()>>>()?;
        } else {
            for ((m, t), ids) in self
                .models
                .iter_mut()
                .zip(&mut self.trainers)
                .zip(&self.subsets)
            {
                one(m, t, ids)?;
            }
        }
        Ok(())
    }

    /// ŷ_oof: every constraint's belief from the one Estimator that did not train on it.
    fn out_of_fold(&self, st: &State<D>) -> Result<D::Buf> {
        let mut out = st.dev.zeros(st.cons.len())?;
        for (model, (ids, n, pairs)) in self.models.iter().zip(&self.holdouts) {
            let p = model.pair_probs(&st.x, st.features.dim, pairs)?;
            st.dev
                .scatter_add_rows(&p, 1, Ix::distinct(ids, 0, *n), &mut out)?;
        }
        Ok(out)
    }
}

/// What an ECI-PP training reads: the dataset, its training constraints, the held-out
/// diagnostic pairs and (with pretraining) the SDAE weights.
pub struct EciInputs<'a> {
    pub features: &'a Features,
    pub constraints: &'a Constraints,
    pub diagnostic: &'a Constraints,
    pub pretrained: Option<&'a [u8]>,
}

/// Run ECI-PP on device `dev` (the diagnostic set may be empty).
pub fn run<D: Device<f32>>(
    dev: &D,
    tp: &TrainParams,
    s: &EciSettings,
    inputs: EciInputs<'_>,
    monitor: &mut dyn Monitor,
) -> Result<EciTrained> {
    let EciInputs {
        features,
        constraints: cons,
        diagnostic: diag,
        pretrained,
    } = inputs;
    crate::train::validate(tp, features.dim, features.rows(), s.folds + 1)?;
    validate(s, tp)?;
    cons.validate(features, false, "constraints artifact")?;
    let m = cons.len();
    if m < s.folds {
        return Err(StageError::input(format!(
            "ECI-PP needs at least K = {} constraints, got {m}",
            s.folds
        )));
    }
    let settings = &tp.settings;
    let seed = tp.seed;
    let folds = assign_folds(m, s.folds, seed);
    let (subsets, holdouts) = fold_sets(&folds, s.folds);
    // Models: K Estimators and the Integrator, all from the same pretrained weights.
    let mut est = Estimators {
        models: Vec::with_capacity(s.folds),
        trainers: Vec::with_capacity(s.folds),
        subsets: subsets
            .iter()
            .map(|v| v.iter().map(|&i| i as u32).collect())
            .collect(),
        holdouts: Vec::with_capacity(s.folds),
    };
    for (k, hold) in holdouts.iter().enumerate() {
        let label = format!("estimator-{k}");
        let mut rng = Stream::new(seed, &["eci", "init", &label]);
        let model = ProbPairModel::new(dev, tp, features.dim, pretrained, &mut rng)?;
        est.trainers
            .push(Trainer::new(&model, settings, features, seed, &label)?);
        est.models.push(model);
        let ids: Vec<u32> = hold.iter().map(|&i| i as u32).collect();
        let a: Vec<u32> = hold.iter().map(|&i| cons.a[i]).collect();
        let b: Vec<u32> = hold.iter().map(|&i| cons.b[i]).collect();
        est.holdouts.push((
            dev.upload_idx(&ids)?,
            ids.len(),
            PairIndex::new(dev, &a, &b)?,
        ));
    }
    let mut rng = Stream::new(seed, &["eci", "init", "integrator"]);
    let mut integrator = ProbPairModel::new(dev, tp, features.dim, pretrained, &mut rng)?;
    let mut int_trainer = Trainer::new(&integrator, settings, features, seed, "integrator")?;
    // Corrector inputs: [ŷ; x_a ⊙ x_b; |x_a − x_b|].
    let input_dim = 1 + 2 * features.dim;
    let n_experts = cons.n_experts().max(1);
    let correctors = (0..n_experts)
        .map(|e| {
            let members: Vec<usize> = (0..m).filter(|&i| cons.expert[i] as usize == e).collect();
            Corrector::new(dev, s, input_dim, &members, seed, e)
        })
        .collect::<Result<_>>()?;
    let mut st = State {
        dev: dev.clone(),
        s,
        features,
        cons,
        x: dev.upload(&features.x)?,
        y: dev.upload(&cons.y)?,
        cor_inputs: CorrectorInputs::new(dev, features, cons, n_experts)?,
        input_dim,
        correctors,
    };
    let all_pairs = PairIndex::new(dev, &cons.a, &cons.b)?;
    let all_ids: Vec<u32> = (0..m as u32).collect();
    let mut cor_rng = Stream::new(seed, &["eci", "corrector-batches"]);
    let mut noise_rng = Stream::new(seed, &["eci", "perturbation"]);
    let kappa_w = dev.upload(&if s.kappa_warmup {
        kappa(&cons.y)
    } else {
        vec![1.0; m]
    })?;
    // The held-out diagnostic set.
    let mut diag_set = if s.diagnostics_every > 0 && !diag.is_empty() {
        Some(DiagSet {
            inputs: CorrectorInputs::new(dev, features, diag, n_experts)?,
            pairs: PairIndex::new(dev, &diag.a, &diag.b)?,
            cons: diag,
        })
    } else {
        None
    };

    let total = settings.epochs;
    let warmup = s.warmup_epochs.min(total);
    let mut curve = Vec::new();
    let mut diagnostics = Vec::new();
    let started = std::time::Instant::now();
    let mut timing = Timing::default();
    fn int_data<'a, D: Device<f32>>(
        cons: &'a Constraints,
        ids: &'a [u32],
        targets: &'a D::Buf,
        weights: &'a D::Buf,
    ) -> PairBatches<'a, D> {
        PairBatches {
            a: &cons.a,
            b: &cons.b,
            ids,
            targets,
            weights,
        }
    }

    // Stage I: warm-up of the Estimators on (y, κ).
    for epoch in 0..warmup {
        timed(dev, &mut timing.estimators, || {
            est.epoch(&st, &st.y, &kappa_w, epoch as u32)
        })?;
        monitor.progress(
            epoch as u64 + 1,
            total as u64,
            &format!("warm-up {}/{warmup}", epoch + 1),
        );
    }
    let mut y_oof = timed(dev, &mut timing.estimators, || est.out_of_fold(&st))?;
    let (mut y_bc, mut w, mut delta) = timed(dev, &mut timing.correctors, || {
        st.fit_correctors(&y_oof, &mut cor_rng)?;
        st.fuse(&y_oof)
    })?;
    for epoch in 0..warmup {
        let stats = timed(dev, &mut timing.integrator, || {
            int_trainer.epoch(
                &mut integrator,
                &st.x,
                features.dim,
                &int_data::<D>(cons, &all_ids, &y_bc, &w),
                epoch as u32,
            )
        })?;
        curve.push(stats);
    }
    if let Some(d) = diag_set.as_mut() {
        let mut rec = timed(dev, &mut timing.diagnostics, || {
            diagnose(&mut st, &est.models, &integrator, d, warmup as u32)
        })?;
        rec.record_training(dev, &delta, &w)?;
        diagnostics.push(rec);
    }
    // Stage II: iterative refinement.
    let est_layers = perturbed_layers(s.perturb_layers, tp.settings.hidden.len());
    let cor_last = format!("corrector.{}", s.corrector_hidden.len());
    let cor_layers = vec![format!("{cor_last}.weight"), format!("{cor_last}.bias")];
    for t in warmup..total {
        // Mild perturbation of the final linear layers between iterations.
        let perturb = s.perturb_std > 0.0 && (s.perturb_first || t > warmup);
        for e in est.models.iter_mut().filter(|_| perturb) {
            e.params
                .perturb(&est_layers, s.perturb_std, &mut noise_rng)?;
        }
        if perturb {
            integrator
                .params
                .perturb(&est_layers, s.perturb_std, &mut noise_rng)?;
        }
        for c in st.correctors.iter_mut().filter(|_| perturb) {
            c.params
                .perturb(&cor_layers, s.perturb_std, &mut noise_rng)?;
        }
        let y_int = timed(dev, &mut timing.integrator, || {
            integrator.pair_probs(&st.x, features.dim, &all_pairs)
        })?;
        timed(dev, &mut timing.estimators, || {
            est.epoch(&st, &y_int, &w, t as u32)
        })?;
        y_oof = timed(dev, &mut timing.estimators, || est.out_of_fold(&st))?;
        (y_bc, w, delta) = timed(dev, &mut timing.correctors, || {
            st.fit_correctors(&y_oof, &mut cor_rng)?;
            st.fuse(&y_oof)
        })?;
        let stats = timed(dev, &mut timing.integrator, || {
            int_trainer.epoch(
                &mut integrator,
                &st.x,
                features.dim,
                &int_data::<D>(cons, &all_ids, &y_bc, &w),
                t as u32,
            )
        })?;
        let t1 = t as u32 + 1;
        let mut mean_w = None;
        if let Some(d) = diag_set.as_mut() {
            if (t1 as usize - warmup).is_multiple_of(s.diagnostics_every) {
                let mut rec = timed(dev, &mut timing.diagnostics, || {
                    diagnose(&mut st, &est.models, &integrator, d, t1)
                })?;
                rec.record_training(dev, &delta, &w)?;
                mean_w = Some(rec.mean_w);
                diagnostics.push(rec);
            }
        }
        let mean_w = match mean_w {
            Some(v) => v,
            None => mean(&dev.to_vec(&w)?),
        };
        monitor.progress(
            t1 as u64,
            total as u64,
            &format!("iteration {t1}: loss {:.4}, mean w {mean_w:.3}", stats.loss),
        );
        curve.push(stats);
    }
    let iterations = (total - warmup).max(1);
    let seconds_per_iteration = started.elapsed().as_secs_f64() / (iterations + warmup) as f64;
    if let Some(last) = diagnostics.last() {
        monitor.log(&format!(
            "held-out diagnostics at iteration {}: Brier est {:.4} cor {:.4} int {:.4}, gap {:.4}, AUC {:.3}, AP {:.3}; mean |Δ̂| {:.4}, mean w {:.3}",
            last.iteration, last.brier_estimator, last.brier_corrected_clean, last.brier_integrator, last.gap_clean, last.auc, last.ap, last.mean_abs_delta, last.mean_w
        ));
    }
    let emb = integrator.ae.embed(
        &integrator.params,
        &st.x,
        features.dim,
        Rows::All(features.rows()),
    )?;
    Ok(EciTrained {
        embeddings: dev.to_vec(&emb)?,
        dim: tp.embedding_dim,
        curve,
        diagnostics,
        seconds_per_iteration,
        timing,
    })
}

fn mean(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

/// The held-out diagnostic pairs on the device.
struct DiagSet<'a, D: Device<f32>> {
    inputs: CorrectorInputs<D>,
    pairs: PairIndex<D>,
    cons: &'a Constraints,
}

fn diagnose<D: Device<f32>>(
    st: &mut State<D>,
    estimators: &[ProbPairModel<D>],
    integrator: &ProbPairModel<D>,
    d: &mut DiagSet<D>,
    iteration: u32,
) -> Result<Diagnostics> {
    let diag = d.cons;
    let n = diag.len();
    let s = st.s;
    let dev = &st.dev;
    let dim = st.features.dim;
    // Held-out Estimator belief: the mean over the K Estimators.
    let mut est = vec![0f64; n];
    for e in estimators {
        let p = dev.to_vec(&e.pair_probs(&st.x, dim, &d.pairs)?)?;
        for (v, p) in est.iter_mut().zip(p) {
            *v += p as f64 / estimators.len() as f64;
        }
    }
    let est32: Vec<f32> = est.iter().map(|&v| v as f32).collect();
    let est_dev = dev.upload(&est32)?;
    dev.set_column(&est_dev, &mut d.inputs.rows, n, st.input_dim, 0)?;
    let delta: Vec<f64> = dev
        .to_vec(&route(dev, &st.correctors, &d.inputs, st.input_dim)?)?
        .into_iter()
        .map(f64::from)
        .collect();
    let y_int = dev.to_vec(&integrator.pair_probs(&st.x, dim, &d.pairs)?)?;
    let corrupted: Vec<bool> = diag.corrupted.iter().map(|c| c.unwrap_or(false)).collect();
    let (mut gaps, mut gaps_oracle) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut b_est, mut b_cor, mut b_int, mut gap_clean, mut n_clean) =
        (0.0, 0.0, 0.0, 0.0, 0usize);
    for i in 0..n {
        let o = diag.oracle[i] as f64;
        let (y_cor, gap, _) = screen(diag.y[i] as f64, delta[i], est[i], s.xi, s.gamma);
        let (_, gap_o, _) = screen(diag.y_oracle[i] as f64, delta[i], est[i], s.xi, s.gamma);
        gaps.push(gap);
        gaps_oracle.push(gap_o);
        b_est += (est[i] - o).powi(2);
        b_int += (y_int[i] as f64 - o).powi(2);
        if !corrupted[i] {
            b_cor += (y_cor - o).powi(2);
            gap_clean += gap;
            n_clean += 1;
        }
    }
    let nc = n_clean.max(1) as f64;
    Ok(Diagnostics {
        iteration,
        brier_estimator: b_est / n as f64,
        brier_corrected_clean: b_cor / nc,
        brier_integrator: b_int / n as f64,
        gap_clean: gap_clean / nc,
        auc: auc(&gaps, &corrupted),
        ap: average_precision(&gaps, &corrupted),
        auc_oracle: auc(&gaps_oracle, &corrupted),
        ap_oracle: average_precision(&gaps_oracle, &corrupted),
        mean_abs_delta: f64::NAN,
        mean_w: f64::NAN,
    })
}

impl Diagnostics {
    /// Mean |Δ̂| and mean w over the training constraints of this iteration.
    fn record_training<D: Device<f32>>(
        &mut self,
        dev: &D,
        delta: &D::Buf,
        w: &D::Buf,
    ) -> Result<()> {
        let d = dev.to_vec(delta)?;
        self.mean_abs_delta =
            d.iter().map(|&x| (x as f64).abs()).sum::<f64>() / d.len().max(1) as f64;
        self.mean_w = mean(&dev.to_vec(w)?);
        Ok(())
    }
}

impl crate::check::Check for EciSettings {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.at_least("folds", self.folds, 2);
        c.sizes("corrector_hidden", &self.corrector_hidden, true);
        // A lower bound (one input): a Corrector of these sizes per expert, on one batch.
        let mut dims = vec![1];
        dims.extend_from_slice(&self.corrector_hidden);
        dims.push(1);
        if let Some(p) = crate::check::fits_in_memory(
            "corrector_hidden",
            "a Corrector of these sizes",
            crate::check::net_bytes(&dims, self.corrector_batch_size),
        ) {
            c.problems.push(p);
        }
        c.non_negative("corrector_lambda", self.corrector_lambda);
        c.positive("corrector_huber", self.corrector_huber);
        c.epochs("corrector_epochs", self.corrector_epochs, 1);
        c.at_least("corrector_patience", self.corrector_patience, 1);
        c.in_range(
            "corrector_validation",
            self.corrector_validation,
            0.0,
            0.5,
            false,
        );
        c.learning_rate("corrector_lr", self.corrector_lr);
        c.at_least("corrector_batch_size", self.corrector_batch_size, 1);
        c.positive("gamma", self.gamma);
        c.non_negative("n0", self.n0);
        c.positive("xi", self.xi);
        c.non_negative("perturb_std", self.perturb_std);
        c.done()
    }
}

/// Parameter names of the Estimator/Integrator layers the perturbation touches, for an
/// autoencoder with `hidden` hidden layers on each side (layers `encoder.0..=hidden`).
pub fn perturbed_layers(which: PerturbLayers, hidden: usize) -> Vec<String> {
    let layer = |net: &str| {
        [
            format!("{net}.{hidden}.weight"),
            format!("{net}.{hidden}.bias"),
        ]
    };
    match which {
        PerturbLayers::Embedding => layer("encoder").to_vec(),
        PerturbLayers::DecoderOutput => layer("decoder").to_vec(),
        PerturbLayers::Both => [layer("encoder"), layer("decoder")].concat(),
    }
}

/// The checks of the settings plus what involves the training settings: the warm-up is part
/// of the total number of epochs.
pub fn validate(s: &EciSettings, tp: &TrainParams) -> Result<()> {
    let mut problems = crate::check::Check::check(s);
    if s.warmup_epochs > tp.settings.epochs {
        problems.push(crate::check::Problem::new(
            "warmup_epochs",
            format!(
                "({}) exceeds `train.epochs` ({}), the total number of epochs",
                s.warmup_epochs, tp.settings.epochs
            ),
        ));
    }
    crate::check::require("eci", problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_perturbed_layer_is_a_parameter_of_the_estimator_and_the_integrator() {
        use crate::train::{ProbPairModel, TrainParams, TrainSettings, Weighting};
        let settings = TrainSettings {
            hidden: vec![4, 3],
            ..TrainSettings::default()
        };
        let tp = TrainParams::new(settings, Weighting::Kappa, 2, false, 1);
        let mut rng = Stream::new(1, &["test"]);
        let model = ProbPairModel::new(&upcc_nn::Cpu, &tp, 5, None, &mut rng).unwrap();
        for which in [
            PerturbLayers::Embedding,
            PerturbLayers::DecoderOutput,
            PerturbLayers::Both,
        ] {
            let names = perturbed_layers(which, 2);
            assert_eq!(
                names.len(),
                if which == PerturbLayers::Both { 4 } else { 2 }
            );
            for n in &names {
                assert!(
                    model.params.id_of(n).is_some(),
                    "{which:?}: no parameter `{n}`"
                );
            }
        }
        // The embedding layer maps to the code (2 units), the decoder output to the input (5).
        let shape = |n: &str| {
            let id = model.params.id_of(n).unwrap();
            model.params.shape(id)
        };
        assert_eq!(shape("encoder.2.weight"), (2, 3));
        assert_eq!(shape("decoder.2.weight"), (5, 4));
    }

    #[test]
    fn softclip_matches_hand_values_and_stays_inside_the_unit_interval() {
        // ξ = 20: softclip(0.5) = (softplus(10) − softplus(−10))/20 = 10/20 = 0.5.
        assert!((softclip(0.5, 20.0) - 0.5).abs() < 1e-12);
        // softclip(0) = (ln 2 − softplus(−20))/20 = (0.693147 − 2.06e-9)/20.
        assert!((softclip(0.0, 20.0) - (2f64.ln() - (-20f64).exp().ln_1p()) / 20.0).abs() < 1e-12);
        assert!((softclip(0.0, 20.0) - 0.034_657).abs() < 1e-6);
        // Inside (0, 1) mathematically; far outside the interval f64 rounds to the bounds.
        for u in [-0.5, -0.2, 0.0, 0.3, 1.0, 1.4] {
            let v = softclip(u, 20.0);
            assert!(v > 0.0 && v < 1.0, "softclip({u}) = {v}");
        }
        assert!(
            (0.0..=1.0).contains(&softclip(-3.0, 20.0))
                && (0.0..=1.0).contains(&softclip(5.0, 20.0))
        );
        // Far inside, it is the identity.
        assert!((softclip(0.3, 20.0) - 0.3).abs() < 1e-2);
    }

    #[test]
    fn screening_and_fusion_on_hand_computed_values() {
        let (xi, gamma, n0) = (20.0, 10.0, 10.0);
        // y = 0.2, Δ̂ = 0.3 → y_cor = softclip(0.5) = 0.5; ŷ_oof = 0.5 → gap 0, w 1.
        let (y_cor, gap, w) = screen(0.2, 0.3, 0.5, xi, gamma);
        assert!((y_cor - 0.5).abs() < 1e-12 && gap.abs() < 1e-12 && (w - 1.0).abs() < 1e-12);
        // n = 10: y_BC = (0.2 + 10·0.5)/11 = 5.2/11.
        assert!((bayesian_confidence(0.2, y_cor, w, n0) - 5.2 / 11.0).abs() < 1e-12);
        // A gap of 0.3 gives w = 0.7^10 = 0.0282475249, n = 0.282475249.
        let (y_cor, gap, w) = screen(0.2, 0.0, 0.5, xi, gamma);
        let expected_gap = softclip(0.5, xi) - softclip(0.2, xi);
        assert!((gap - expected_gap).abs() < 1e-12);
        assert!((w - (1.0 - expected_gap).powi(10)).abs() < 1e-12);
        let n = n0 * w;
        assert!(
            (bayesian_confidence(0.2, y_cor, w, n0) - (0.2 + n * y_cor) / (1.0 + n)).abs() < 1e-12
        );
        // With w = 0 the prior y is kept exactly.
        assert_eq!(bayesian_confidence(0.2, 0.9, 0.0, n0), 0.2);
    }

    #[test]
    fn folds_are_balanced_and_every_constraint_has_exactly_one() {
        let f = assign_folds(103, 5, 7);
        let mut counts = [0usize; 5];
        for &k in &f {
            counts[k] += 1;
        }
        assert_eq!(counts.iter().sum::<usize>(), 103);
        assert!(counts.iter().all(|&c| c == 20 || c == 21), "{counts:?}");
        assert_eq!(f, assign_folds(103, 5, 7));
        // Every constraint is predicted by exactly one Estimator, which never trained on it.
        let (train, hold) = fold_sets(&f, 5);
        for i in 0..103 {
            let predictors: Vec<usize> = (0..5).filter(|&k| hold[k].contains(&i)).collect();
            assert_eq!(predictors.len(), 1, "constraint {i}");
            let k = predictors[0];
            assert!(
                !train[k].contains(&i),
                "estimator {k} trained on its own out-of-fold constraint {i}"
            );
            for other in (0..5).filter(|&o| o != k) {
                assert!(train[other].contains(&i));
            }
        }
    }

    #[test]
    fn auc_and_ap_on_hand_computed_cases() {
        let s = [0.9, 0.8, 0.7, 0.1];
        let p = [true, false, true, false];
        // Pairs (pos, neg): (0.9,0.8) ✓ (0.9,0.1) ✓ (0.7,0.8) ✗ (0.7,0.1) ✓ → 3/4.
        assert!((auc(&s, &p) - 0.75).abs() < 1e-12);
        // AP: thresholds 0.9 (P=1, R=.5), 0.8 (P=.5, R=.5), 0.7 (P=2/3, R=1) → .5·1 + .5·2/3.
        assert!((average_precision(&s, &p) - (0.5 + 1.0 / 3.0)).abs() < 1e-12);
        // Ties count one half.
        assert!((auc(&[0.5, 0.5], &[true, false]) - 0.5).abs() < 1e-12);
    }
}
