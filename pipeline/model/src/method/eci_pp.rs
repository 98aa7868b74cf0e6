//! ECI-PP (Section 4.2, Algorithm 1): cross-fitted Estimators, expert-specific Correctors and
//! the Integrator; k-means on the Integrator's embeddings; held-out diagnostics per iteration.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::check::Problem;
use upcc_stages::eci::{self, EciSettings};
use upcc_stages::train::{self, TrainParams, TrainSettings, Weighting};

use super::{settings, training_inputs, CellNodes, Method, Settings};
use crate::error::{Error, Result};
use crate::on_device;
use crate::specs::resolver::Resolver;
use crate::specs::schema::SupervisionSpec;
use crate::stage;
use crate::wiring::{
    input, node_device, parquet, train_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

pub struct EciPp;

/// What one ECI-PP node runs with (and its key's parameters).
#[derive(Serialize)]
pub struct EciTask {
    #[serde(flatten)]
    pub params: TrainParams,
    pub eci: EciSettings,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for EciTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let (f, c, weights) = training_inputs(ctx, self.params.pretrained)?;
        let d = stage::constraints::load(ctx, "diagnostic")?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |dv| eci::run(
            dv,
            &self.params,
            &self.eci,
            eci::EciInputs {
                features: &f,
                constraints: &c,
                diagnostic: &d,
                pretrained: weights.as_deref(),
            },
            &mut Mon(ctx),
        ))
        .map_err(train_err("train"))?;
        ctx.summary("seconds_per_epoch", r.seconds_per_iteration);
        let epochs = self.params.settings.epochs.max(1) as f64;
        ctx.summary("seconds_per_epoch_estimators", r.timing.estimators / epochs);
        ctx.summary("seconds_per_epoch_correctors", r.timing.correctors / epochs);
        ctx.summary("seconds_per_epoch_integrator", r.timing.integrator / epochs);
        ctx.summary(
            "seconds_per_epoch_diagnostics",
            r.timing.diagnostics / epochs,
        );
        if let Some(last) = r.curve.last() {
            ctx.summary("final_loss", last.loss);
        }
        parquet(
            ctx,
            "embeddings",
            train::embeddings_to_parquet(&f, &r.embeddings, r.dim),
        )?;
        parquet(ctx, "curve", train::curve_to_parquet(&r.curve))?;
        parquet(
            ctx,
            "diagnostics",
            eci::diagnostics_to_parquet(&r.diagnostics),
        )
    }
}

/// ECI-PP's resolved settings: the shared training settings and its own.
pub struct EciResolved {
    pub train: TrainSettings,
    pub eci: EciSettings,
}

impl Method for EciPp {
    fn kind(&self) -> &'static str {
        "eci-pp"
    }
    fn summary(&self) -> &'static str {
        "ECI-PP: Estimator–Corrector–Integrator ProbPair (Section 4.2, Algorithm 1)"
    }
    fn sections(&self) -> &'static [&'static str] {
        &["train", "eci"]
    }
    fn records_diagnostics(&self) -> bool {
        true
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let train: Option<TrainSettings> = cx.section("train");
        let eci: Option<EciSettings> = cx.section("eci");
        let (train, eci) = (train?, eci?);
        if eci.warmup_epochs > train.epochs {
            cx.problem(
                "eci",
                Problem::new(
                    "warmup_epochs",
                    format!(
                        "({}) exceeds `train.epochs` ({}), the total number of epochs",
                        eci.warmup_epochs, train.epochs
                    ),
                ),
            );
            return None;
        }
        Some(Arc::new(EciResolved { train, eci }))
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let r: &EciResolved = settings(s);
        let cons = stage::constraints::wire(w, feat, cell)?;
        let mut inputs = vec![
            input("features", feat, "features"),
            input("constraints", cons, "constraints"),
        ];
        if cell.pretrain {
            let p = stage::pretrain::wire(w, feat, cell, true)?;
            inputs.push(input("weights", p, "weights"));
        }
        inputs.push(input("diagnostic", cons, "diagnostic"));
        let params = TrainParams::new(
            r.train.clone(),
            Weighting::None,
            cell.dspec.embedding_dim,
            cell.pretrain,
            cell.seed,
        );
        if let SupervisionSpec::Single { .. } | SupervisionSpec::Multi { .. } = cell.sspec {
            if cell.budget < r.eci.folds {
                return Err(Error::user(format!(
                    "`eci.folds` ({}) exceeds the {} constraints of supervision `{}` (budget {}): every fold needs at least one",
                    r.eci.folds, cell.budget, cell.supervision, cell.budget
                ))
                .hint(format!("lower `eci.folds` to at most {} or raise the budget", cell.budget)));
            }
        }
        let id = format!("train/{}", cell.id(w));
        let copies = r.eci.folds.saturating_add(1);
        let need = w.shape(cell.dataset).map(|s| {
            train::memory_bytes(
                &params.settings,
                params.embedding_dim,
                s.dim,
                s.rows.unwrap_or(0),
                copies,
            )
        });
        let resources = w.trainer_sized(
            &id,
            "train",
            format!("{copies} autoencoders (eci.folds + 1)"),
            need,
            4096,
            3072,
        );
        let compute = w.compute.clone();
        let tr = w.add(NodeSpec {
            id,
            stage: "eci-pp",
            version: eci::VERSION,
            numerics: Numerics::Device,
            inputs,
            outputs: &["embeddings", "curve", "diagnostics"],
            labels: cell.labels("eci-pp"),
            resources,
            task: EciTask {
                params,
                eci: r.eci.clone(),
                compute,
            },
        })?;
        let assignments = stage::cluster::kmeans(w, feat, tr, "embeddings", cell)?;
        Ok(CellNodes {
            train: tr,
            assignments,
        })
    }
}
