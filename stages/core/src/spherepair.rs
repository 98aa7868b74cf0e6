//! Soft SpherePair's settings (App. C.2): the shared trainer's with the angular BCE
//! (s⁺ = (cos + 1)/2, s⁻ = cos² on the real-valued y), the normalised-code reconstruction and
//! early stopping on the loss. The training itself is `train`'s, with
//! `PairLoss::SoftSpherePair`.

use serde::{Deserialize, Serialize};

use crate::check::{Check, Checker, Problem};
use crate::train::{LossStop, RecReduction, TrainSettings};

/// SpherePair's settings (section `spherepair`; defaults: the paper's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SphereSettings {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    pub lr: f64,
    pub batch_size: usize,
    pub lambda_rec: f64,
    pub rec_reduction: RecReduction,
    pub grad_clip: Option<f64>,
    /// Early stopping on the training loss (null: the full budget).
    pub stop: Option<LossStop>,
}

impl Default for SphereSettings {
    fn default() -> Self {
        SphereSettings {
            hidden: vec![500, 500, 2000],
            epochs: 500,
            lr: 1e-3,
            batch_size: 256,
            lambda_rec: 0.02,
            rec_reduction: RecReduction::Mean,
            grad_clip: Some(1.0),
            stop: Some(LossStop::Plateau {
                after: 100,
                rel_tol: 0.1,
                consecutive: 5,
            }),
        }
    }
}

impl SphereSettings {
    /// As the shared trainer's settings (the read-out parameters exist but the loss ignores them).
    pub fn train_settings(&self) -> TrainSettings {
        TrainSettings {
            hidden: self.hidden.clone(),
            epochs: self.epochs,
            lr: self.lr,
            batch_size: self.batch_size,
            lambda_rec: self.lambda_rec,
            rec_reduction: self.rec_reduction,
            grad_clip: self.grad_clip,
            ..Default::default()
        }
    }
}

impl Check for SphereSettings {
    fn check(&self) -> Vec<Problem> {
        let mut problems = self.train_settings().check();
        let mut c = Checker::new();
        match &self.stop {
            Some(LossStop::Plateau {
                rel_tol,
                consecutive,
                ..
            }) => {
                c.positive("stop.rel_tol", *rel_tol);
                c.at_least("stop.consecutive", *consecutive, 1);
            }
            Some(LossStop::NewMinimum { .. }) | None => {}
        }
        problems.extend(c.done());
        problems
    }
}
