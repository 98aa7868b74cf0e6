//! `pretrain`: the SDAE protocol, shared by every pretrained cell of a dataset.

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::pretrain;
use upcc_stages::table::PARQUET_MEDIA_TYPE;

use crate::error::Result;
use crate::on_device;
use crate::specs::axis::Axis;
use crate::wiring::{
    input, labels, node_device, train_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

#[derive(Serialize)]
pub struct PretrainTask {
    #[serde(flatten)]
    pub params: pretrain::PretrainParams,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for PretrainTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = super::features::load(ctx)?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| pretrain::run(d, &self.params, &f, &mut Mon(ctx)))
            .map_err(train_err("pretrain"))?;
        ctx.summary("train_mse_init", r.train_mse_before);
        ctx.summary("train_mse", r.train_mse_after);
        ctx.summary("test_mse", r.test_mse_after);
        ctx.put_output(
            "weights",
            r.weights,
            pretrain::SAFETENSORS_MEDIA_TYPE,
            "sdae.safetensors",
        );
        ctx.put_output("curve", r.curve, PARQUET_MEDIA_TYPE, "curve.parquet");
        Ok(())
    }
}

/// The pretraining node of a cell's dataset (shared across trials unless `per_trial`), with
/// `normalize_code` as the method wants it (the "Sphere" SDAE decodes from the normalised
/// code; CIDEC's plain SDAE does not).
pub fn wire(w: &mut Wiring, feat: usize, cell: &Cell, normalize_code: bool) -> Result<usize> {
    let ps = &w.spec.params.pretrain;
    let ds = cell.data_id();
    let seed = ps.sharing.seed_for(cell.seed);
    let mut settings = ps.settings.clone();
    settings.normalize_code = normalize_code && settings.normalize_code;
    let plain = if settings.normalize_code || !ps.settings.normalize_code {
        ""
    } else {
        "/plain"
    };
    let params = pretrain::PretrainParams {
        settings,
        embedding_dim: cell.dspec.embedding_dim,
        seed,
    };
    let id = format!("pretrain/{ds}{plain}/{}", ps.sharing.id_for(cell.seed));
    let need = w.shape(cell.dataset).map(|s| {
        pretrain::memory_bytes(
            &params.settings,
            params.embedding_dim,
            s.dim,
            s.rows.unwrap_or(0),
        )
    });
    let resources = w.trainer_sized(&id, "pretrain", "the SDAE".into(), need, 2048, 1024);
    let compute = w.compute.clone();
    w.add(NodeSpec {
        id,
        stage: "pretrain",
        version: pretrain::VERSION,
        numerics: Numerics::Device,
        inputs: vec![input("features", feat, "features")],
        outputs: &["weights", "curve"],
        labels: labels("pretrain", [(Axis::Dataset, ds.to_string())]),
        resources,
        task: PretrainTask { params, compute },
    })
}
