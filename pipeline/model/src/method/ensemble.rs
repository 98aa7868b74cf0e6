//! The expert-aware ensembles SP-EA and WPP-EA (App. C.4): one SpherePair / Weighted ProbPair
//! member per expert, member e weighting other experts' pair terms by α; k-means partitions of
//! the members; their co-association consensus by hierarchical clustering. α is chosen by
//! validation ACC unless fixed.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::cluster::Assignments;
use upcc_stages::ensemble::{self, EnsembleSettings, Linkage};
use upcc_stages::train::{MemberOf, PairLoss, TrainSettings, Weighting};

use super::dcc::selection_supervision;
use super::probpair::{wire_train_with, Trainer};
use super::spherepair::SphereSettings;
use super::{settings, CellNodes, Method, Settings};
use crate::error::Result;
use crate::specs::resolver::Resolver;
use crate::stage;
use crate::wiring::{input, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

/// The consensus of the members' partitions.
#[derive(Serialize)]
pub struct EnsembleTask {
    pub members: usize,
    pub linkage: Linkage,
    pub max_tuples: usize,
}

impl Task for EnsembleTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = stage::features::load(ctx)?;
        let mut parts = Vec::with_capacity(self.members);
        for e in 0..self.members {
            let a = Assignments::from_parquet(ctx.input(&format!("m{e}"))?).map_err(stage_err)?;
            parts.push(a.cluster);
        }
        let cluster = ensemble::consensus(&parts, f.n_classes, self.linkage, self.max_tuples)
            .map_err(stage_err)?;
        ctx.log(format!(
            "consensus of {} members ({:?} linkage) into {} clusters",
            self.members, self.linkage, f.n_classes
        ));
        let a = Assignments {
            ids: f.ids.clone(),
            is_test: f.is_test.clone(),
            is_val: f.is_val.clone(),
            label: f.labels.clone(),
            cluster,
        };
        parquet(ctx, "assignments", a.to_parquet())
    }
}

/// Which single-model method the members are.
#[derive(Clone, Copy)]
enum Base {
    SpherePair,
    WeightedProbPair,
}

pub struct EnsembleMethod {
    kind: &'static str,
    base: Base,
}

pub static SP_EA: EnsembleMethod = EnsembleMethod {
    kind: "sp-ea",
    base: Base::SpherePair,
};

pub static WPP_EA: EnsembleMethod = EnsembleMethod {
    kind: "wpp-ea",
    base: Base::WeightedProbPair,
};

/// The members' trainer settings.
enum BaseSettings {
    Sphere(SphereSettings),
    Wpp(TrainSettings),
}

struct Resolved {
    ensemble: EnsembleSettings,
    base: BaseSettings,
}

impl EnsembleMethod {
    /// The E member nodes and the consensus node of a cell; α given, or chosen by `selection`.
    fn wire_members(
        &self,
        w: &mut Wiring,
        cell: &Cell,
        r: &Resolved,
        feat: usize,
        alpha: Option<f64>,
        selection: Option<usize>,
    ) -> Result<usize> {
        // Validated: the ensembles take multi-expert settings only.
        let experts = cell.sspec.n_experts().unwrap_or(1);
        let mut inputs = vec![input("features", feat, "features")];
        for e in 0..experts {
            let member = MemberOf {
                expert: e as u16,
                alpha,
            };
            let trainer = match &r.base {
                BaseSettings::Sphere(s) => super::spherepair::trainer(s),
                BaseSettings::Wpp(s) => Trainer {
                    settings: s.clone(),
                    weighting: Weighting::Kappa,
                    loss: PairLoss::ProbPair,
                    stop: None,
                },
            };
            let tr = wire_train_with(w, cell, feat, trainer, Some((member, selection)))?;
            let km =
                stage::cluster::kmeans_named(w, feat, tr, "embeddings", cell, &format!("/e{e}"))?;
            inputs.push(input(&format!("m{e}"), km, "assignments"));
        }
        w.add(NodeSpec {
            id: format!("ensemble/{}", cell.id(w)),
            stage: "ensemble",
            version: ensemble::VERSION,
            numerics: Numerics::Exact,
            inputs,
            outputs: &["assignments"],
            labels: cell.labels("ensemble"),
            resources: Wiring::small(2048),
            task: EnsembleTask {
                members: experts,
                linkage: r.ensemble.linkage,
                max_tuples: r.ensemble.max_tuples,
            },
        })
    }
}

impl Method for EnsembleMethod {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn summary(&self) -> &'static str {
        match self.base {
            Base::SpherePair => "SP-EA: expert-aware ensemble of soft SpherePair members, co-association consensus",
            Base::WeightedProbPair => {
                "WPP-EA: expert-aware ensemble of Weighted ProbPair members, co-association consensus"
            }
        }
    }
    fn sections(&self) -> &'static [&'static str] {
        match self.base {
            Base::SpherePair => &["ensemble", "spherepair"],
            Base::WeightedProbPair => &["ensemble", "train"],
        }
    }
    fn needs_multi_expert(&self) -> bool {
        true
    }
    fn needs_validation(&self, s: &Settings) -> bool {
        settings::<Resolved>(s).ensemble.alpha.is_none()
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let ensemble: Option<EnsembleSettings> = cx.section("ensemble");
        let base = match self.base {
            Base::SpherePair => cx
                .section::<SphereSettings>("spherepair")
                .map(BaseSettings::Sphere),
            Base::WeightedProbPair => cx.section::<TrainSettings>("train").map(BaseSettings::Wpp),
        };
        Some(Arc::new(Resolved {
            ensemble: ensemble?,
            base: base?,
        }))
    }
    fn selection(&self, w: &mut Wiring, cell: &Cell, s: &Settings) -> Result<Option<usize>> {
        let r: &Resolved = settings(s);
        if r.ensemble.alpha.is_some() {
            return Ok(None);
        }
        let sup = selection_supervision(w, cell, r.ensemble.shared_multi.as_deref());
        let search = stage::select::Search {
            supervision: sup,
            parameter: "alpha",
            grid: &r.ensemble.alphas,
            runs: r.ensemble.search_runs,
            scope: r.ensemble.search_scope,
        };
        stage::select::wire(w, cell, search, &mut |w, search, feat, alpha| {
            self.wire_members(w, search, r, feat, Some(alpha), None)
        })
        .map(Some)
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let selection = self.selection(w, cell, s)?;
        let r: &Resolved = settings(s);
        let node = self.wire_members(w, cell, r, feat, r.ensemble.alpha, selection)?;
        Ok(CellNodes {
            train: node,
            assignments: node,
        })
    }
}
