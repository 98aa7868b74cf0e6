//! Soft SpherePair (App. C.2): the angular BCE with s⁺ = (cos + 1)/2 and s⁻ = cos² on the
//! real-valued y, the normalised-code reconstruction, early stopping on the loss; k-means.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use upcc_stages::check::{Check, Checker, Problem};
use upcc_stages::train::{LossStop, PairLoss, RecReduction, TrainSettings, Weighting};

use super::probpair::{wire_train_with, Trainer};
use super::{settings, CellNodes, Method, Settings};
use crate::error::Result;
use crate::spec::Resolver;
use crate::stage;
use crate::wiring::{Cell, Wiring};

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

/// Soft SpherePair on the shared trainer.
pub fn trainer(s: &SphereSettings) -> Trainer {
    Trainer {
        settings: s.train_settings(),
        weighting: Weighting::None,
        loss: PairLoss::SoftSpherePair,
        stop: s.stop.clone(),
    }
}

pub struct SpherePair;

impl Method for SpherePair {
    fn kind(&self) -> &'static str {
        "spherepair"
    }
    fn summary(&self) -> &'static str {
        "SpherePair (soft): angular BCE with s⁺ = (cos + 1)/2, s⁻ = cos² on real-valued y"
    }
    fn sections(&self) -> &'static [&'static str] {
        &["spherepair"]
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let s: SphereSettings = cx.section("spherepair")?;
        Some(Arc::new(s))
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let s: &SphereSettings = settings(s);
        let tr = wire_train_with(w, cell, feat, trainer(s), None)?;
        let assignments = stage::cluster::kmeans(w, feat, tr, "embeddings", cell)?;
        Ok(CellNodes {
            train: tr,
            assignments,
        })
    }
}
