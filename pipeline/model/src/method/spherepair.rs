//! Soft SpherePair (App. C.2): the angular BCE with s⁺ = (cos + 1)/2 and s⁻ = cos² on the
//! real-valued y, the normalised-code reconstruction, early stopping on the loss; k-means.

use std::sync::Arc;

pub use upcc_stages::spherepair::SphereSettings;
use upcc_stages::train::{PairLoss, Weighting};

use super::probpair::{wire_train_with, Trainer};
use super::{settings, CellNodes, Method, Settings};
use crate::error::Result;
use crate::specs::resolver::Resolver;
use crate::stage;
use crate::wiring::{Cell, Wiring};

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
