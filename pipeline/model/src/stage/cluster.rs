//! `cluster`: k-means on a method's embeddings (the embedding-based methods' final step).

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::cluster;

use crate::error::Result;
use crate::wiring::{input, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

#[derive(Serialize)]
pub struct ClusterTask {
    #[serde(flatten)]
    pub params: cluster::ClusterParams,
}

impl Task for ClusterTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = super::features::load(ctx)?;
        let t = upcc_stages::table::Table::from_parquet(
            ctx.input("embeddings")?,
            "embeddings artifact",
        )
        .map_err(stage_err)?;
        let (z, dim) = t.f32_rows("z").map_err(stage_err)?;
        if z.len() != f.rows() * dim {
            return Err(TaskError::Failed(
                "embeddings and features disagree on the number of rows".into(),
            ));
        }
        let (a, km) = cluster::run(
            &self.params,
            &z,
            dim,
            &f.labels,
            &f.is_test,
            &f.is_val,
            &f.ids,
            f.n_classes,
        )
        .map_err(stage_err)?;
        ctx.log(format!(
            "k-means: inertia {:.4} after {} iterations (best of {})",
            km.inertia, km.iterations, self.params.settings.n_init
        ));
        ctx.summary("inertia", km.inertia);
        parquet(ctx, "assignments", a.to_parquet())
    }
}

/// k-means on output `output` (embeddings) of node `emb` for a cell: the `assignments` node.
pub fn kmeans(w: &mut Wiring, feat: usize, emb: usize, output: &str, cell: &Cell) -> Result<usize> {
    kmeans_named(w, feat, emb, output, cell, "")
}

/// [`kmeans`] with a suffix on the node id (one per ensemble member).
pub fn kmeans_named(
    w: &mut Wiring,
    feat: usize,
    emb: usize,
    output: &str,
    cell: &Cell,
    suffix: &str,
) -> Result<usize> {
    let params = cluster::ClusterParams {
        settings: w.spec.params.cluster.clone(),
        k: 0,
        seed: cell.seed,
    };
    let resources = w.cpu(512);
    w.add(NodeSpec {
        id: format!("cluster/{}{suffix}", cell.id(w)),
        stage: "cluster",
        version: cluster::VERSION,
        numerics: Numerics::Exact,
        inputs: vec![
            input("features", feat, "features"),
            input("embeddings", emb, output),
        ],
        outputs: &["assignments"],
        labels: cell.labels("cluster"),
        resources,
        task: ClusterTask { params },
    })
}
