//! ProbPair and Weighted ProbPair (Section 4.1): the probabilistic angular read-out on an
//! autoencoder, with κ-weighted pairs for the weighted variant; k-means on the embeddings.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::train::{
    self, LossStop, MemberOf, PairLoss, TrainParams, TrainSettings, Weighting,
};

use super::{settings, training_inputs, CellNodes, Method, Settings};
use crate::error::Result;
use crate::on_device;
use crate::specs::resolver::Resolver;
use crate::stage;
use crate::wiring::{
    input, node_device, parquet, train_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
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
        let mut params = self.params.clone();
        // An ensemble member whose α a selection node chose.
        if let Some(m) = &mut params.member {
            if m.alpha.is_none() {
                let chosen = crate::stage::select::chosen(ctx.input("selection")?)?;
                ctx.log(format!("α = {chosen} (selected by validation ACC)"));
                m.alpha = Some(chosen);
            }
        }
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| train::run(
            d,
            &params,
            &f,
            &c,
            weights.as_deref(),
            &mut Mon(ctx)
        ))
        .map_err(train_err(match params.loss {
            PairLoss::SoftSpherePair => "spherepair",
            PairLoss::ProbPair => "train",
        }))?;
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
    let trainer = Trainer {
        settings,
        weighting,
        loss: PairLoss::ProbPair,
        stop: None,
    };
    wire_train_with(w, cell, feat, trainer, None)
}

/// What the shared angular trainer (`stages/core/src/train.rs`) trains with.
pub struct Trainer {
    pub settings: TrainSettings,
    pub weighting: Weighting,
    pub loss: PairLoss,
    pub stop: Option<LossStop>,
}

/// A training node of the shared angular trainer: the pair loss, early stopping, and for an
/// ensemble member its expert, α (None: from the `selection` node given) and id suffix.
pub fn wire_train_with(
    w: &mut Wiring,
    cell: &Cell,
    feat: usize,
    trainer: Trainer,
    member: Option<(MemberOf, Option<usize>)>,
) -> Result<usize> {
    let Trainer {
        settings,
        weighting,
        loss,
        stop,
    } = trainer;
    // The settings section whose sizes decide the networks (for messages).
    let section = match loss {
        PairLoss::SoftSpherePair => "spherepair",
        PairLoss::ProbPair => "train",
    };
    let cons = stage::constraints::wire(w, feat, cell)?;
    let mut inputs = vec![
        input("features", feat, "features"),
        input("constraints", cons, "constraints"),
    ];
    if cell.pretrain {
        let p = stage::pretrain::wire(w, feat, cell, true)?;
        inputs.push(input("weights", p, "weights"));
    }
    let mut params = TrainParams::new(
        settings,
        weighting,
        cell.dspec.embedding_dim,
        cell.pretrain,
        cell.seed,
    );
    params.loss = loss;
    params.stop = stop;
    let mut id = format!("train/{}", cell.id(w));
    if let Some((m, selection)) = member {
        id.push_str(&format!("/e{}", m.expert));
        params.member = Some(m);
        if let Some(s) = selection {
            inputs.push(input("selection", s, "chosen"));
        }
    }
    let need = w.shape(cell.dataset).map(|s| {
        train::memory_bytes(
            &params.settings,
            params.embedding_dim,
            s.dim,
            s.rows.unwrap_or(0),
            1,
        )
    });
    let resources = w.trainer_sized(&id, section, "the autoencoder".into(), need, 2048, 1024);
    let compute = w.compute.clone();
    w.add(NodeSpec {
        id,
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
