//! `expert`: the simulated expert classifiers of a supervision setting.

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::expert;

use crate::error::Result;
use crate::on_device;
use crate::specs::axis::Axis;
use crate::specs::schema::SupervisionSpec;
use crate::wiring::{
    input, labels, node_device, parquet, train_err, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

#[derive(Serialize)]
pub struct ExpertTask {
    #[serde(flatten)]
    pub params: expert::ExpertParams,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for ExpertTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = super::features::load(ctx)?;
        let dev = node_device(&self.compute, ctx)?;
        let (probs, summaries) =
            on_device!(&dev, |d| expert::run(d, &self.params, &f, &mut Mon(ctx)))
                .map_err(train_err("expert"))?;
        let accs: Vec<f64> = summaries.iter().map(|s| s.test_accuracy).collect();
        ctx.summary("test_accuracy", accs.clone());
        ctx.summary(
            "mean_test_accuracy",
            accs.iter().sum::<f64>() / accs.len().max(1) as f64,
        );
        parquet(ctx, "probs", probs.to_parquet())?;
        parquet(ctx, "experts", expert::summaries_to_parquet(&summaries))
    }
}

/// The expert node of (dataset, supervision) that trial `trial` uses (shared by the trials
/// unless `expert.per_trial`); `None` for user-supplied constraints.
pub fn wire(
    w: &mut Wiring,
    feat: usize,
    ds: &str,
    sup: &str,
    sspec: &SupervisionSpec,
    trial: u64,
) -> Result<Option<usize>> {
    let sharing = w.spec.params.expert_sharing;
    let seed = sharing.seed_for(trial);
    let setting = match sspec {
        SupervisionSpec::Single { level } => expert::ExpertSetting::Single { level: *level },
        SupervisionSpec::Multi {
            experts,
            familiar,
            unfamiliar,
        } => expert::ExpertSetting::Multi {
            experts: *experts,
            familiar: *familiar,
            unfamiliar: *unfamiliar,
        },
        SupervisionSpec::File { .. } | SupervisionSpec::Oracle { .. } => return Ok(None),
    };
    let params = expert::ExpertParams {
        setting,
        classifier: w.spec.params.expert.clone(),
        seed,
    };
    let mut labels = labels(
        "expert",
        [
            (Axis::Dataset, ds.to_string()),
            (Axis::Supervision, sup.to_string()),
        ],
    );
    if sharing.per_trial {
        labels.insert("trial".to_string(), trial.to_string());
    }
    let id = format!("expert/{ds}/{sup}/{}", sharing.id_for(trial));
    let n_experts = match &params.setting {
        expert::ExpertSetting::Single { .. } => 1,
        expert::ExpertSetting::Multi { experts, .. } => *experts,
    };
    let need = w.shape(ds).map(|s| {
        expert::memory_bytes(
            &params.classifier,
            s.dim,
            w.classes(ds),
            s.rows.unwrap_or(0),
            n_experts,
        )
    });
    let resources = w.trainer_sized(
        &id,
        "expert",
        "an expert classifier".into(),
        need,
        1024,
        512,
    );
    let compute = w.compute.clone();
    w.add(NodeSpec {
        id,
        stage: "expert",
        version: expert::VERSION,
        numerics: Numerics::Device,
        inputs: vec![input("features", feat, "features")],
        outputs: &["probs", "experts"],
        labels,
        resources,
        task: ExpertTask { params, compute },
    })
    .map(Some)
}
