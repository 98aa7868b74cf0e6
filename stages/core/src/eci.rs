//! ECI-PP: Estimator–Corrector–Integrator ProbPair (Section 4.2, Algorithm 1, Appendix C.5).
//!
//! K cross-fitted Estimators give out-of-fold beliefs ŷ_oof; expert-specific Correctors learn
//! probability-space corrections Δ̂ on [ŷ_oof; φ]; softclip, gap, screening weights and
//! Bayesian-confidence fusion build the Integrator's targets; the Integrator's relations feed
//! the Estimators back for iterative refinement. Held-out diagnostics on the test-split
//! diagnostic set are recorded per iteration.

use serde::{Deserialize, Serialize};
use upcc_nn::{softplus, Act, Adam, Mlp, Params, Stream, WeightInit};

use crate::constraints::Constraints;
use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{Dev, G, P};
use crate::table::TableBuilder;
use crate::train::{kappa, EpochStats, ProbPairModel, TrainParams, Trainer};

pub const VERSION: u32 = 1;

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
            corrector_epochs: 50,
            corrector_patience: 10,
            corrector_validation: 0.1,
            corrector_lr: 1e-3,
            corrector_batch_size: 256,
            gamma: 10.0,
            n0: 10.0,
            xi: 20.0,
            perturb_std: 0.01,
            diagnostics_every: 1,
        }
    }
}

/// softclip_ξ(u) = ξ⁻¹ softplus(ξu) − ξ⁻¹ softplus(ξ(u − 1)): a smooth map into (0, 1).
pub fn softclip(u: f64, xi: f64) -> f64 {
    (softplus(xi * u) - softplus(xi * (u - 1.0))) / xi
}

/// Eq. 10: y_cor = softclip(y + Δ̂), gap = |softclip(ŷ_oof) − y_cor|, w = (1 − gap)^γ.
pub fn screen(y: f64, delta: f64, y_oof: f64, xi: f64, gamma: f64) -> (f64, f64, f64) {
    let y_cor = softclip(y + delta, xi);
    let gap = (softclip(y_oof, xi) - y_cor).abs();
    let w = (1.0 - gap).max(0.0).powf(gamma);
    (y_cor, gap, w)
}

/// Eq. 11: y_BC = (y + n·y_cor)/(1 + n) with n = n0·w.
pub fn bayesian_confidence(y: f64, y_cor: f64, w: f64, n0: f64) -> f64 {
    let n = n0 * w;
    (y + n * y_cor) / (1.0 + n)
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

/// One expert's Corrector: an MLP on [ŷ_oof; φ] with a tanh output, Δ̂ ∈ (−1, 1).
pub struct Corrector {
    params: P,
    mlp: Mlp,
    /// Constraint indices (into the constraint set) this expert trains and validates on.
    train: Vec<usize>,
    valid: Vec<usize>,
}

impl Corrector {
    fn new(s: &EciSettings, input_dim: usize, members: &[usize], seed: u64, expert: usize) -> Self {
        let label = expert.to_string();
        let mut rng = Stream::new(seed, &["eci", "corrector", &label]);
        let mut params = Params::new(Dev::default());
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
        );
        let mut order = members.to_vec();
        rng.shuffle(&mut order);
        let n_valid = if order.len() >= 10 {
            ((order.len() as f64) * s.corrector_validation).round() as usize
        } else {
            0
        };
        let valid = order[..n_valid].to_vec();
        let mut train = order[n_valid..].to_vec();
        train.sort_unstable();
        Corrector {
            params,
            mlp,
            train,
            valid,
        }
    }

    /// Δ̂ for rows of an input matrix (rows × input_dim), no gradients.
    fn predict(&self, input: &[f32], input_dim: usize) -> Vec<f32> {
        let rows = input.len() / input_dim;
        let mut out = Vec::with_capacity(rows);
        let mut g = G::new(Dev::default());
        for start in (0..rows).step_by(4096) {
            let end = (start + 4096).min(rows);
            g.reset();
            let x = g.input(
                &input[start * input_dim..end * input_dim],
                end - start,
                input_dim,
            );
            let y = self.mlp.forward(&mut g, &self.params, x, None);
            out.extend(g.to_host(y));
        }
        out
    }

    /// Fit on (input rows, target Δ) of its constraints with early stopping on the held-out
    /// part; keeps the best validation weights. Returns the epochs run.
    fn fit(
        &mut self,
        s: &EciSettings,
        inputs: &[f32],
        input_dim: usize,
        delta: &[f32],
        rng: &mut Stream,
    ) -> usize {
        let gather = |idx: &[usize]| -> (Vec<f32>, Vec<f32>) {
            let mut x = Vec::with_capacity(idx.len() * input_dim);
            let mut t = Vec::with_capacity(idx.len());
            for &i in idx {
                x.extend_from_slice(&inputs[i * input_dim..(i + 1) * input_dim]);
                t.push(delta[i]);
            }
            (x, t)
        };
        let (vx, vt) = gather(&self.valid);
        let mut opt = Adam::new(&self.params, vec![s.corrector_lr]);
        let mut g = G::new(Dev::default());
        let loss_of = |this: &Corrector, x: &[f32], t: &[f32], g: &mut G| -> f64 {
            if t.is_empty() {
                return 0.0;
            }
            g.reset();
            let xi = g.input(x, t.len(), input_dim);
            let p = this.mlp.forward(g, &this.params, xi, None);
            let l = g.huber_l2(
                p,
                t,
                None,
                s.corrector_huber,
                s.corrector_lambda,
                t.len() as f64,
            );
            g.scalar(l)
        };
        let mut best = (loss_of(self, &vx, &vt, &mut g), snapshot(&self.params));
        let mut wait = 0;
        let mut epochs = 0;
        for _ in 0..s.corrector_epochs {
            epochs += 1;
            let mut order = self.train.clone();
            rng.shuffle(&mut order);
            for batch in order.chunks(s.corrector_batch_size.max(1)) {
                let (x, t) = gather(batch);
                g.reset();
                self.params.zero_grads();
                let xi = g.input(&x, batch.len(), input_dim);
                let p = self.mlp.forward(&mut g, &self.params, xi, None);
                let l = g.huber_l2(
                    p,
                    &t,
                    None,
                    s.corrector_huber,
                    s.corrector_lambda,
                    batch.len() as f64,
                );
                g.backward(l, &mut self.params);
                opt.step(&mut self.params);
            }
            if self.valid.is_empty() {
                continue;
            }
            let v = loss_of(self, &vx, &vt, &mut g);
            if v < best.0 {
                best = (v, snapshot(&self.params));
                wait = 0;
            } else {
                wait += 1;
                if wait >= s.corrector_patience {
                    break;
                }
            }
        }
        if !self.valid.is_empty() {
            restore(&mut self.params, &best.1);
        }
        epochs
    }
}

fn snapshot(p: &P) -> Vec<Vec<f32>> {
    p.ids().map(|id| p.to_host(id)).collect()
}

fn restore(p: &mut P, values: &[Vec<f32>]) {
    let ids: Vec<_> = p.ids().collect();
    for (id, v) in ids.into_iter().zip(values) {
        p.set_host(id, v);
    }
}

/// Add N(0, std²) to every value of the given parameters.
fn perturb(p: &mut P, names: &[String], std: f64, rng: &mut Stream) {
    if std <= 0.0 {
        return;
    }
    for name in names {
        if let Some(id) = p.id_of(name) {
            let mut v = p.to_host(id);
            for x in v.iter_mut() {
                *x += (std * rng.normal()) as f32;
            }
            p.set_host(id, &v);
        }
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

/// Time `f` and add its seconds to `acc`.
fn timed<T>(acc: &mut f64, f: impl FnOnce() -> T) -> T {
    let t0 = std::time::Instant::now();
    let out = f();
    *acc += t0.elapsed().as_secs_f64();
    out
}

struct State<'a> {
    s: &'a EciSettings,
    features: &'a Features,
    cons: &'a Constraints,
    /// Corrector input rows: [placeholder ŷ; φ] per constraint, ŷ filled in per iteration.
    cor_inputs: Vec<f32>,
    input_dim: usize,
    correctors: Vec<Corrector>,
}

impl State<'_> {
    /// Δ̂ for every constraint given beliefs `y_hat` (writes ŷ into the input rows).
    fn corrections(&mut self, y_hat: &[f32]) -> Vec<f32> {
        for (i, &v) in y_hat.iter().enumerate() {
            self.cor_inputs[i * self.input_dim] = v;
        }
        route(
            &self.correctors,
            &self.cor_inputs,
            self.input_dim,
            &self.cons.expert,
        )
    }

    /// Refit every expert's Corrector on Δ = ŷ_oof − y.
    fn fit_correctors(&mut self, y_oof: &[f32], rng: &mut Stream) -> usize {
        for (i, &v) in y_oof.iter().enumerate() {
            self.cor_inputs[i * self.input_dim] = v;
        }
        let delta: Vec<f32> = y_oof.iter().zip(&self.cons.y).map(|(o, y)| o - y).collect();
        let mut epochs = 0;
        let (inputs, dim, s) = (&self.cor_inputs, self.input_dim, self.s);
        for c in self.correctors.iter_mut() {
            epochs += c.fit(s, inputs, dim, &delta, rng);
        }
        epochs
    }
}

/// Δ̂ of every row of `inputs` (rows × input_dim) from the Corrector of its expert: each
/// constraint is routed only to its own expert's module.
fn route(correctors: &[Corrector], inputs: &[f32], input_dim: usize, experts: &[u16]) -> Vec<f32> {
    let mut delta = vec![0f32; experts.len()];
    for (e, c) in correctors.iter().enumerate() {
        let members: Vec<usize> = (0..experts.len())
            .filter(|&i| experts[i] as usize == e)
            .collect();
        let mut rows = Vec::with_capacity(members.len() * input_dim);
        for &i in &members {
            rows.extend_from_slice(&inputs[i * input_dim..(i + 1) * input_dim]);
        }
        for (&i, d) in members.iter().zip(c.predict(&rows, input_dim)) {
            delta[i] = d;
        }
    }
    delta
}

/// Run ECI-PP. `diag` is the held-out diagnostic set (may be empty).
pub fn run(
    tp: &TrainParams,
    s: &EciSettings,
    features: &Features,
    cons: &Constraints,
    diag: &Constraints,
    pretrained: Option<&[u8]>,
    monitor: &mut dyn Monitor,
) -> Result<EciTrained> {
    crate::train::validate(tp)?;
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
    // Models: K Estimators and the Integrator, all from the same pretrained weights.
    let mut estimators = Vec::with_capacity(s.folds);
    let mut trainers = Vec::with_capacity(s.folds);
    for k in 0..s.folds {
        let label = format!("estimator-{k}");
        let mut rng = Stream::new(seed, &["eci", "init", &label]);
        let model = ProbPairModel::new(tp, features.dim, pretrained, &mut rng)?;
        trainers.push(Trainer::new(&model, settings, features, seed, &label));
        estimators.push(model);
    }
    let mut rng = Stream::new(seed, &["eci", "init", "integrator"]);
    let mut integrator = ProbPairModel::new(tp, features.dim, pretrained, &mut rng)?;
    let mut int_trainer = Trainer::new(&integrator, settings, features, seed, "integrator");
    let (subsets, holdouts) = fold_sets(&folds, s.folds);
    // Corrector inputs: [ŷ; x_a ⊙ x_b; |x_a − x_b|].
    let input_dim = 1 + 2 * features.dim;
    let mut cor_inputs = Vec::with_capacity(m * input_dim);
    for i in 0..m {
        cor_inputs.push(0.0);
        pair_features(features, cons.a[i], cons.b[i], &mut cor_inputs);
    }
    let n_experts = cons.n_experts().max(1);
    let correctors = (0..n_experts)
        .map(|e| {
            let members: Vec<usize> = (0..m).filter(|&i| cons.expert[i] as usize == e).collect();
            Corrector::new(s, input_dim, &members, seed, e)
        })
        .collect();
    let mut st = State {
        s,
        features,
        cons,
        cor_inputs,
        input_dim,
        correctors,
    };
    let mut cor_rng = Stream::new(seed, &["eci", "corrector-batches"]);
    let mut noise_rng = Stream::new(seed, &["eci", "perturbation"]);
    let kappa_w = if s.kappa_warmup {
        kappa(&cons.y)
    } else {
        vec![1.0; m]
    };
    // Diagnostic-set corrector inputs.
    let diag_inputs: Vec<f32> = {
        let mut v = Vec::with_capacity(diag.len() * input_dim);
        for i in 0..diag.len() {
            v.push(0.0);
            pair_features(features, diag.a[i], diag.b[i], &mut v);
        }
        v
    };

    let total = settings.epochs;
    let warmup = s.warmup_epochs.min(total);
    let mut curve = Vec::new();
    let mut diagnostics = Vec::new();
    let started = std::time::Instant::now();
    let mut timing = Timing::default();

    // Estimator epochs in parallel (independent models; results do not depend on threads).
    let train_estimators = |estimators: &mut Vec<ProbPairModel>,
                            trainers: &mut Vec<Trainer>,
                            targets: &[f32],
                            weights: &[f32],
                            epoch: u32|
     -> Result<()> {
        use rayon::prelude::*;
        estimators
            .par_iter_mut()
            .zip(trainers.par_iter_mut())
            .zip(subsets.par_iter())
            .map(|((model, trainer), idx)| {
                let a: Vec<u32> = idx.iter().map(|&i| cons.a[i]).collect();
                let b: Vec<u32> = idx.iter().map(|&i| cons.b[i]).collect();
                let y: Vec<f32> = idx.iter().map(|&i| targets[i]).collect();
                let w: Vec<f32> = idx.iter().map(|&i| weights[i]).collect();
                trainer
                    .epoch(model, features, &a, &b, &y, &w, epoch)
                    .map(|_| ())
            })
            .collect::<Result<Vec<()>>>()
            .map(|_| ())
    };
    let oof = |estimators: &[ProbPairModel]| -> Vec<f32> {
        let mut out = vec![0f32; m];
        for (k, est) in estimators.iter().enumerate() {
            let idx = &holdouts[k];
            let a: Vec<u32> = idx.iter().map(|&i| cons.a[i]).collect();
            let b: Vec<u32> = idx.iter().map(|&i| cons.b[i]).collect();
            for (&i, p) in idx.iter().zip(est.predict_pairs(features, &a, &b)) {
                out[i] = p;
            }
        }
        out
    };

    // Stage I: warm-up of the Estimators on (y, κ).
    for epoch in 0..warmup {
        timed(&mut timing.estimators, || {
            train_estimators(
                &mut estimators,
                &mut trainers,
                &cons.y,
                &kappa_w,
                epoch as u32,
            )
        })?;
        monitor.progress(
            epoch as u64 + 1,
            total as u64,
            &format!("warm-up {}/{warmup}", epoch + 1),
        );
    }
    let mut y_oof = timed(&mut timing.estimators, || oof(&estimators));
    let (mut y_bc, mut w) = timed(&mut timing.correctors, || {
        st.fit_correctors(&y_oof, &mut cor_rng);
        fuse(&mut st, &y_oof)
    });
    for epoch in 0..warmup {
        let stats = timed(&mut timing.integrator, || {
            int_trainer.epoch(
                &mut integrator,
                features,
                &cons.a,
                &cons.b,
                &y_bc,
                &w,
                epoch as u32,
            )
        })?;
        curve.push(stats);
    }
    if s.diagnostics_every > 0 && !diag.is_empty() {
        diagnostics.push(timed(&mut timing.diagnostics, || {
            diagnose(
                &mut st,
                &estimators,
                &integrator,
                diag,
                &diag_inputs,
                warmup as u32,
            )
        }));
    }
    // Stage II: iterative refinement.
    let enc_last = format!("encoder.{}", tp.settings.hidden.len());
    let est_layers = vec![format!("{enc_last}.weight"), format!("{enc_last}.bias")];
    let cor_last = format!("corrector.{}", s.corrector_hidden.len());
    let cor_layers = vec![format!("{cor_last}.weight"), format!("{cor_last}.bias")];
    for t in warmup..total {
        // Mild perturbation of the final linear layers between iterations.
        for e in estimators.iter_mut() {
            perturb(&mut e.params, &est_layers, s.perturb_std, &mut noise_rng);
        }
        perturb(
            &mut integrator.params,
            &est_layers,
            s.perturb_std,
            &mut noise_rng,
        );
        for c in st.correctors.iter_mut() {
            perturb(&mut c.params, &cor_layers, s.perturb_std, &mut noise_rng);
        }
        let y_int = timed(&mut timing.integrator, || {
            integrator.predict_pairs(features, &cons.a, &cons.b)
        });
        timed(&mut timing.estimators, || {
            train_estimators(&mut estimators, &mut trainers, &y_int, &w, t as u32)
        })?;
        y_oof = timed(&mut timing.estimators, || oof(&estimators));
        (y_bc, w) = timed(&mut timing.correctors, || {
            st.fit_correctors(&y_oof, &mut cor_rng);
            fuse(&mut st, &y_oof)
        });
        let stats = timed(&mut timing.integrator, || {
            int_trainer.epoch(
                &mut integrator,
                features,
                &cons.a,
                &cons.b,
                &y_bc,
                &w,
                t as u32,
            )
        })?;
        let t1 = t as u32 + 1;
        if s.diagnostics_every > 0
            && !diag.is_empty()
            && (t1 as usize - warmup).is_multiple_of(s.diagnostics_every)
        {
            diagnostics.push(timed(&mut timing.diagnostics, || {
                diagnose(&mut st, &estimators, &integrator, diag, &diag_inputs, t1)
            }));
        }
        let mean_w = w.iter().map(|&v| v as f64).sum::<f64>() / m as f64;
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
            "held-out diagnostics at iteration {}: Brier est {:.4} cor {:.4} int {:.4}, gap {:.4}, AUC {:.3}, AP {:.3}",
            last.iteration, last.brier_estimator, last.brier_corrected_clean, last.brier_integrator, last.gap_clean, last.auc, last.ap
        ));
    }
    let embeddings = integrator
        .ae
        .embed(&integrator.params, &features.x, features.dim);
    Ok(EciTrained {
        embeddings,
        dim: tp.embedding_dim,
        curve,
        diagnostics,
        seconds_per_iteration,
        timing,
    })
}

/// Corrections, screening and Bayesian-confidence fusion for every training constraint.
fn fuse(st: &mut State, y_oof: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let delta = st.corrections(y_oof);
    let s = st.s;
    let mut y_bc = Vec::with_capacity(delta.len());
    let mut w = Vec::with_capacity(delta.len());
    for i in 0..delta.len() {
        let y = st.cons.y[i] as f64;
        let (y_cor, _gap, wi) = screen(y, delta[i] as f64, y_oof[i] as f64, s.xi, s.gamma);
        y_bc.push(bayesian_confidence(y, y_cor, wi, s.n0) as f32);
        w.push(wi as f32);
    }
    (y_bc, w)
}

fn diagnose(
    st: &mut State,
    estimators: &[ProbPairModel],
    integrator: &ProbPairModel,
    diag: &Constraints,
    inputs: &[f32],
    iteration: u32,
) -> Diagnostics {
    let n = diag.len();
    let s = st.s;
    // Held-out Estimator belief: the mean over the K Estimators.
    let mut est = vec![0f64; n];
    for e in estimators {
        for (v, p) in est
            .iter_mut()
            .zip(e.predict_pairs(st.features, &diag.a, &diag.b))
        {
            *v += p as f64 / estimators.len() as f64;
        }
    }
    let mut rows = inputs.to_vec();
    for (i, &v) in est.iter().enumerate() {
        rows[i * st.input_dim] = v as f32;
    }
    let delta: Vec<f64> = route(&st.correctors, &rows, st.input_dim, &diag.expert)
        .into_iter()
        .map(f64::from)
        .collect();
    let y_int = integrator.predict_pairs(st.features, &diag.a, &diag.b);
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
    Diagnostics {
        iteration,
        brier_estimator: b_est / n as f64,
        brier_corrected_clean: b_cor / nc,
        brier_integrator: b_int / n as f64,
        gap_clean: gap_clean / nc,
        auc: auc(&gaps, &corrupted),
        ap: average_precision(&gaps, &corrupted),
        auc_oracle: auc(&gaps_oracle, &corrupted),
        ap_oracle: average_precision(&gaps_oracle, &corrupted),
    }
}

pub fn validate(s: &EciSettings, tp: &TrainParams) -> Result<()> {
    if s.folds < 2 {
        return Err(StageError::input(format!(
            "`eci.folds` must be at least 2, got {}",
            s.folds
        )));
    }
    if s.warmup_epochs > tp.settings.epochs {
        return Err(StageError::input(format!(
            "`eci.warmup_epochs` ({}) exceeds `train.epochs` ({}), the total number of epochs",
            s.warmup_epochs, tp.settings.epochs
        )));
    }
    for (name, v) in [
        ("gamma", s.gamma),
        ("n0", s.n0),
        ("xi", s.xi),
        ("corrector_lambda", s.corrector_lambda),
        ("corrector_huber", s.corrector_huber),
    ] {
        let allowed = (v > 0.0 && v.is_finite()) || (name == "corrector_lambda" && v == 0.0);
        if !allowed {
            return Err(StageError::input(format!(
                "`eci.{name}` must be positive, got {v}"
            )));
        }
    }
    if !(0.0..0.5).contains(&s.corrector_validation) {
        return Err(StageError::input(format!(
            "`eci.corrector_validation` must be in [0, 0.5), got {}",
            s.corrector_validation
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
