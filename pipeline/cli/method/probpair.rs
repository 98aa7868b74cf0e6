//! ProbPair and Weighted ProbPair (Section 4.1): the probabilistic angular read-out on an
//! autoencoder, with κ-weighted pairs for the weighted variant; k-means on the embeddings.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::train::{self, TrainParams, TrainSettings, Weighting};

use super::{settings, training_inputs, CellNodes, Method, Settings};
use crate::error::Result;
use crate::on_device;
use crate::spec::Resolver;
use crate::stage;
use crate::wiring::{
    input, node_device, parquet, stage_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

/// ProbPair (uniform pair weights) or Weighted ProbPair (κ).
pub struct ProbPair {
    kind: &'static str,
    weighting: Weighting,
}

pub static PROBPAIR: ProbPair = ProbPair {
    kind: "probpair",
    weighting: Weighting::None,
};

pub static WEIGHTED_PROBPAIR: ProbPair = ProbPair {
    kind: "weighted-probpair",
    weighting: Weighting::Kappa,
};

#[derive(Serialize)]
pub struct TrainTask {
    #[serde(flatten)]
    pub params: TrainParams,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for TrainTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let (f, c, weights) = training_inputs(ctx, self.params.pretrained)?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| train::run(
            d,
            &self.params,
            &f,
            &c,
            weights.as_deref(),
            &mut Mon(ctx)
        ))
        .map_err(stage_err)?;
        if let Some(last) = r.curve.last() {
            ctx.summary("final_loss", last.loss);
            ctx.summary("m", last.m);
            ctx.summary("t", last.t);
        }
        ctx.summary("seconds_per_epoch", r.seconds_per_epoch);
        parquet(
            ctx,
            "embeddings",
            train::embeddings_to_parquet(&f, &r.embeddings, r.dim),
        )?;
        parquet(ctx, "curve", train::curve_to_parquet(&r.curve))
    }
}

impl Method for ProbPair {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn summary(&self) -> &'static str {
        match self.weighting {
            Weighting::None => "ProbPair: probabilistic angular read-out, BCE on y (Section 4.1)",
            Weighting::Kappa => "Weighted ProbPair: ProbPair with pairs weighted by κ (Eq. 9)",
        }
    }
    fn sections(&self) -> &'static [&'static str] {
        &["train"]
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let s: TrainSettings = cx.section("train")?;
        Some(Arc::new(s))
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let settings: &TrainSettings = settings(s);
        let tr = wire_train(w, cell, feat, settings.clone(), self.weighting)?;
        let assignments = stage::cluster::kmeans(w, feat, tr, "embeddings", cell)?;
        Ok(CellNodes {
            train: tr,
            assignments,
        })
    }
}

/// The training node of a ProbPair-family cell (constraints and, with pretraining, the SDAE).
pub fn wire_train(
    w: &mut Wiring,
    cell: &Cell,
    feat: usize,
    settings: TrainSettings,
    weighting: Weighting,
) -> Result<usize> {
    let cons = stage::constraints::wire(w, feat, cell)?;
    let mut inputs = vec![
        input("features", feat, "features"),
        input("constraints", cons, "constraints"),
    ];
    if cell.pretrain {
        let p = stage::pretrain::wire(w, feat, cell, true)?;
        inputs.push(input("weights", p, "weights"));
    }
    let params = TrainParams::new(
        settings,
        weighting,
        cell.dspec.embedding_dim,
        cell.pretrain,
        cell.seed,
    );
    let resources = w.trainer(2048, 1024);
    let compute = w.compute.clone();
    w.add(NodeSpec {
        id: format!("train/{}", cell.id(w)),
        stage: "train",
        version: train::VERSION,
        numerics: Numerics::Device,
        inputs,
        outputs: &["embeddings", "curve"],
        labels: cell.labels("train"),
        resources,
        task: TrainTask { params, compute },
    })
}
