//! CIDEC: DEC/IDEC with MCL constraints on a plain (not normalised) SDAE; argmax clustering.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::cidec::{self, CidecParams, CidecSettings};

use super::{settings, training_inputs, CellNodes, Method, Settings};
use crate::error::Result;
use crate::on_device;
use crate::specs::resolver::Resolver;
use crate::stage;
use crate::wiring::{
    input, node_device, parquet, train_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

#[derive(Serialize)]
pub struct CidecTask {
    #[serde(flatten)]
    pub params: CidecParams,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for CidecTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let (f, c, weights) = training_inputs(ctx, self.params.pretrained)?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| cidec::run(
            d,
            &self.params,
            &f,
            &c,
            weights.as_deref(),
            &mut Mon(ctx)
        ))
        .map_err(train_err("cidec"))?;
        ctx.summary("epochs", r.curve.len());
        parquet(ctx, "assignments", r.assignments.to_parquet())?;
        parquet(ctx, "curve", upcc_stages::dcc::curve_to_parquet(&r.curve))
    }
}

pub struct Cidec;

impl Method for Cidec {
    fn kind(&self) -> &'static str {
        "cidec"
    }
    fn summary(&self) -> &'static str {
        "CIDEC: DEC's Student-t assignments and KL target + reconstruction + MCL constraints"
    }
    fn sections(&self) -> &'static [&'static str] {
        &["cidec"]
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let s: CidecSettings = cx.section("cidec")?;
        Some(Arc::new(s))
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let s: &CidecSettings = settings(s);
        let cons = stage::constraints::wire(w, feat, cell)?;
        let mut inputs = vec![
            input("features", feat, "features"),
            input("constraints", cons, "constraints"),
        ];
        if cell.pretrain {
            // CIDEC's SDAE decodes from the raw code (DCC's plain stackedDAE).
            let p = stage::pretrain::wire(w, feat, cell, false)?;
            inputs.push(input("weights", p, "weights"));
        }
        let params = CidecParams {
            settings: s.clone(),
            embedding_dim: cell.dspec.embedding_dim,
            pretrained: cell.pretrain,
            seed: cell.seed,
        };
        let id = format!("cidec/{}", cell.id(w));
        let need = w.shape(cell.dataset).map(|sh| {
            cidec::memory_bytes(
                &params.settings,
                params.embedding_dim,
                sh.dim,
                w.classes(cell.dataset),
                sh.rows.unwrap_or(0),
            )
        });
        let resources = w.trainer_sized(&id, "cidec", "the autoencoder".into(), need, 2048, 1024);
        let compute = w.compute.clone();
        let node = w.add(NodeSpec {
            id,
            stage: "cidec",
            version: cidec::VERSION,
            numerics: Numerics::Device,
            inputs,
            outputs: &["assignments", "curve"],
            labels: cell.labels("cidec"),
            resources,
            task: CidecTask { params, compute },
        })?;
        Ok(CellNodes {
            train: node,
            assignments: node,
        })
    }
}
