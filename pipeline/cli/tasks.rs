//! The stages as engine tasks: decode inputs, call the stage, encode outputs.
//!
//! This is the only place that sees both the engine and the science.

use std::collections::BTreeMap;
use std::sync::Arc;

use upcc_engine::{Task, TaskContext, TaskError};
use upcc_report::{CellResult, ScoreRow, TableLayout};
use upcc_stages::table::PARQUET_MEDIA_TYPE;
use upcc_stages::{
    cluster, constraints, eci, expert, features, metrics, pretrain, train, Monitor, StageError,
};

use crate::device::{Compute, NodeCompute};
use crate::on_device;

const MARKDOWN: &str = "text/markdown";
const LATEX: &str = "application/x-latex";
const CSV: &str = "text/csv";

/// Adapts the engine's context to the stages' monitor.
struct Mon<'a>(&'a mut TaskContext);

impl Monitor for Mon<'_> {
    fn log(&mut self, message: &str) {
        self.0.log(message);
    }
    fn progress(&mut self, done: u64, total: u64, message: &str) {
        self.0.progress(done, total, message);
    }
}

fn stage_err(e: StageError) -> TaskError {
    match e {
        StageError::Input(m) => TaskError::Input(m),
        StageError::Failed(m) => TaskError::Failed(m),
        StageError::Device(d) => TaskError::Failed(format!("device error: {d}")),
    }
}

/// The device one node computes on: the run's CPU, or the GPU of the slot the executor
/// assigned, with a stream and cuBLAS handle of its own.
fn node_device(compute: &Compute, ctx: &mut TaskContext) -> Result<NodeCompute, TaskError> {
    let c = compute
        .for_node(ctx.gpu())
        .map_err(|e| TaskError::Failed(format!("device error: {e}")))?;
    let (name, numerics) = on_device!(&c, |d| (
        upcc_nn::Device::<f32>::name(d),
        upcc_nn::Device::<f32>::numerics(d)
    ));
    ctx.log(format!("device {name} ({numerics})"));
    Ok(c)
}

fn parquet(
    ctx: &mut TaskContext,
    name: &str,
    bytes: Result<Vec<u8>, StageError>,
) -> Result<(), TaskError> {
    ctx.put_output(
        name,
        bytes.map_err(stage_err)?,
        PARQUET_MEDIA_TYPE,
        &format!("{name}.parquet"),
    );
    Ok(())
}

pub struct FeaturesTask {
    pub params: features::FeatureParams,
    /// Input role → the path shown in messages.
    pub displays: BTreeMap<String, String>,
}

impl Task for FeaturesTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let mut files = BTreeMap::new();
        for (role, display) in &self.displays {
            files.insert(
                role.clone(),
                features::SourceFile {
                    display: display.clone(),
                    bytes: ctx.input(role)?,
                },
            );
        }
        let f = features::build(&self.params, &files).map_err(stage_err)?;
        let (n_train, n_test) = (f.train_indices().len(), f.test_indices().len());
        ctx.log(format!(
            "{} rows ({} train, {} test), {} features, {} classes",
            f.rows(),
            n_train,
            n_test,
            f.dim,
            f.n_classes
        ));
        ctx.summary("n_train", n_train);
        ctx.summary("n_test", n_test);
        ctx.summary("dim", f.dim);
        ctx.summary("n_classes", f.n_classes);
        parquet(ctx, "features", f.to_parquet())
    }
}

fn load_features(ctx: &TaskContext) -> Result<features::Features, TaskError> {
    features::Features::from_parquet(ctx.input("features")?).map_err(stage_err)
}

pub struct ExpertTask {
    pub params: expert::ExpertParams,
    pub compute: Arc<Compute>,
}

impl Task for ExpertTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let f = load_features(ctx)?;
        let dev = node_device(&self.compute, ctx)?;
        let (probs, summaries) =
            on_device!(&dev, |d| expert::run(d, &self.params, &f, &mut Mon(ctx)))
                .map_err(stage_err)?;
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

pub struct ConstraintsTask {
    pub params: constraints::ConstraintParams,
}

impl Task for ConstraintsTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let f = load_features(ctx)?;
        let probs = expert::ExpertProbs::from_parquet(ctx.input("probs")?).map_err(stage_err)?;
        let (c, d) = constraints::generate(&self.params, &f, &probs).map_err(stage_err)?;
        let corrupted = c.corrupted.iter().filter(|x| **x == Some(true)).count();
        ctx.log(format!(
            "{} constraints ({corrupted} corrupted), {} diagnostic pairs",
            c.len(),
            d.len()
        ));
        ctx.summary("constraints", c.len());
        ctx.summary("corrupted", corrupted);
        ctx.summary(
            "mean_y",
            c.y.iter().map(|&v| v as f64).sum::<f64>() / c.len().max(1) as f64,
        );
        parquet(ctx, "constraints", c.to_parquet())?;
        parquet(ctx, "diagnostic", d.to_parquet())
    }
}

/// User-supplied constraints (supervision `kind: file`).
pub struct ConstraintsFileTask {
    pub display: String,
}

impl Task for ConstraintsFileTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let f = load_features(ctx)?;
        let c = constraints::from_user_file(&self.display, ctx.input("file")?, &f)
            .map_err(stage_err)?;
        ctx.log(format!(
            "{} user constraints from {}",
            c.len(),
            self.display
        ));
        ctx.summary("constraints", c.len());
        parquet(ctx, "constraints", c.to_parquet())?;
        parquet(
            ctx,
            "diagnostic",
            constraints::Constraints::default().to_parquet(),
        )
    }
}

pub struct PretrainTask {
    pub params: pretrain::PretrainParams,
    pub compute: Arc<Compute>,
}

impl Task for PretrainTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let f = load_features(ctx)?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| pretrain::run(d, &self.params, &f, &mut Mon(ctx)))
            .map_err(stage_err)?;
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

pub struct TrainTask {
    pub params: train::TrainParams,
    pub compute: Arc<Compute>,
}

/// Features, training constraints and (with pretraining) the SDAE weights of a training node.
fn training_inputs(
    ctx: &TaskContext,
    pretrained: bool,
) -> Result<
    (
        features::Features,
        constraints::Constraints,
        Option<Vec<u8>>,
    ),
    TaskError,
> {
    let f = load_features(ctx)?;
    let c =
        constraints::Constraints::from_parquet(ctx.input("constraints")?, "constraints artifact")
            .map_err(stage_err)?;
    let weights = if pretrained {
        Some(ctx.input("weights")?.to_vec())
    } else {
        None
    };
    Ok((f, c, weights))
}

impl Task for TrainTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
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

pub struct EciTask {
    pub params: train::TrainParams,
    pub eci: eci::EciSettings,
    pub compute: Arc<Compute>,
}

impl Task for EciTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let (f, c, weights) = training_inputs(ctx, self.params.pretrained)?;
        let d =
            constraints::Constraints::from_parquet(ctx.input("diagnostic")?, "diagnostic artifact")
                .map_err(stage_err)?;
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |dv| eci::run(
            dv,
            &self.params,
            &self.eci,
            &f,
            &c,
            &d,
            weights.as_deref(),
            &mut Mon(ctx),
        ))
        .map_err(stage_err)?;
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

pub struct ClusterTask {
    pub params: cluster::ClusterParams,
}

impl Task for ClusterTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let f = load_features(ctx)?;
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

pub struct MetricsTask;

impl Task for MetricsTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let a = cluster::Assignments::from_parquet(ctx.input("assignments")?).map_err(stage_err)?;
        let s = metrics::run(&a);
        for x in &s {
            ctx.log(format!(
                "{}: ACC {:.4} NMI {:.4} (arith) {:.4} (geom) ARI {:.4}",
                x.split, x.acc, x.nmi_arithmetic, x.nmi_geometric, x.ari
            ));
            ctx.summary(&format!("{}_nmi_geometric", x.split), x.nmi_geometric);
            ctx.summary(&format!("{}_acc", x.split), x.acc);
        }
        parquet(ctx, "metrics", metrics::to_parquet(&s))
    }
}

/// Input name of a cell/trial's metrics in a table node, and its coordinates.
#[derive(Clone, Debug)]
pub struct TableInput {
    pub input: String,
    pub coords: BTreeMap<String, String>,
    pub trial: String,
}

/// What a table aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableSource {
    /// Clustering scores of each cell (`metrics` outputs).
    Metrics,
    /// Expert test accuracies (`experts` outputs): the mean over a setting's experts.
    Experts,
}

pub struct TableTask {
    pub layout: TableLayout,
    pub inputs: Vec<TableInput>,
    pub trials: usize,
    pub source: TableSource,
}

/// Per-trial results from the bytes a table reads.
pub fn cell_result(
    source: TableSource,
    input: &TableInput,
    bytes: &[u8],
) -> Result<CellResult, StageError> {
    if source == TableSource::Experts {
        let t = upcc_stages::table::Table::from_parquet(bytes, "expert summary")?;
        let acc = t.f64("test_accuracy")?;
        let mean = acc.iter().sum::<f64>() / acc.len().max(1) as f64;
        return Ok(CellResult {
            coords: input.coords.clone(),
            trial: input.trial.clone(),
            scores: vec![ScoreRow {
                split: "test".into(),
                acc: mean,
                nmi_arithmetic: f64::NAN,
                nmi_geometric: f64::NAN,
                ari: f64::NAN,
            }],
        });
    }
    let scores = metrics::from_parquet(bytes)?;
    Ok(CellResult {
        coords: input.coords.clone(),
        trial: input.trial.clone(),
        scores: scores
            .into_iter()
            .map(|s| ScoreRow {
                split: s.split,
                acc: s.acc,
                nmi_arithmetic: s.nmi_arithmetic,
                nmi_geometric: s.nmi_geometric,
                ari: s.ari,
            })
            .collect(),
    })
}

impl Task for TableTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        let mut results = Vec::new();
        for i in &self.inputs {
            results.push(cell_result(self.source, i, ctx.input(&i.input)?).map_err(stage_err)?);
        }
        let r = upcc_report::render(&self.layout, &results, self.trials)
            .map_err(|e| TaskError::Failed(e.to_string()))?;
        ctx.summary("cells", r.cells_total);
        ctx.put_output("table", r.parquet, PARQUET_MEDIA_TYPE, "table.parquet");
        ctx.put_output("markdown", r.markdown.into_bytes(), MARKDOWN, "table.md");
        ctx.put_output("latex", r.latex.into_bytes(), LATEX, "table.tex");
        ctx.put_output("csv", r.csv.into_bytes(), CSV, "table.csv");
        Ok(())
    }
}

pub struct FigureTask {
    pub title: String,
    pub inputs: Vec<TableInput>,
    pub std_ddof: u8,
}

impl Task for FigureTask {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError> {
        use upcc_report::figure::{render, Series, TrialDiagnostics, PANELS};
        // One line per cell: label it by the coordinates that vary across the figure.
        let varying: Vec<String> = {
            let mut keys: Vec<String> = self
                .inputs
                .first()
                .map(|i| i.coords.keys().cloned().collect())
                .unwrap_or_default();
            keys.retain(|k| {
                self.inputs
                    .iter()
                    .any(|i| i.coords.get(k) != self.inputs[0].coords.get(k))
            });
            keys
        };
        let mut series: Vec<Series> = Vec::new();
        for i in &self.inputs {
            let t = upcc_stages::table::Table::from_parquet(
                ctx.input(&i.input)?,
                "diagnostics artifact",
            )
            .map_err(stage_err)?;
            let iterations = t.u32("iteration").map_err(stage_err)?;
            let column = |name: &str| t.f64(name).map_err(stage_err);
            let values = [
                column(PANELS[0].0)?,
                column(PANELS[1].0)?,
                column(PANELS[2].0)?,
                column(PANELS[3].0)?,
                column(PANELS[4].0)?,
                column(PANELS[5].0)?,
                column(PANELS[6].0)?,
                column(PANELS[7].0)?,
            ];
            let label = if varying.is_empty() {
                i.coords.values().cloned().collect::<Vec<_>>().join(" ")
            } else {
                varying
                    .iter()
                    .map(|k| i.coords[k].clone())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let trial = TrialDiagnostics { iterations, values };
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.trials.push(trial),
                None => series.push(Series {
                    label,
                    trials: vec![trial],
                }),
            }
        }
        if series
            .iter()
            .all(|s| s.trials.iter().all(|t| t.iterations.is_empty()))
        {
            return Err(TaskError::Input(
                "no held-out diagnostics were recorded (is `eci.diagnostics_every` 0, or the supervision a file without a diagnostic set?)".into(),
            ));
        }
        let f = render(&self.title, &series, self.std_ddof)
            .map_err(|e| TaskError::Failed(e.to_string()))?;
        let table = upcc_stages::table::TableBuilder::new()
            .str("series", f.stats.iter().map(|s| s.0.clone()).collect())
            .str("panel", f.stats.iter().map(|s| s.1.clone()).collect())
            .u32("iteration", f.stats.iter().map(|s| s.2).collect())
            .f64("mean", f.stats.iter().map(|s| s.3.mean).collect())
            .f64("std", f.stats.iter().map(|s| s.3.std).collect())
            .u32("n", f.stats.iter().map(|s| s.3.n).collect())
            .to_parquet();
        ctx.put_output("png", f.png, "image/png", "figure.png");
        ctx.put_output("svg", f.svg.into_bytes(), "image/svg+xml", "figure.svg");
        parquet(ctx, "table", table)
    }
}
