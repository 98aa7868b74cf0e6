//! VanillaDCC and VolMaxDCC: end-to-end MLP classifiers on the constraints, clustered by their
//! own argmax (no pretraining). VolMaxDCC's λ is chosen by validation ACC unless fixed.

use std::sync::Arc;

use serde::Serialize;
use upcc_engine::{Task, TaskContext, TaskError};
use upcc_stages::dcc::{self, DccOptimizer, DccParams, DccSettings, VolMaxSettings};

use super::{settings, CellNodes, Method, Settings};
use crate::error::Result;
use crate::on_device;
use crate::specs::resolver::Resolver;
use crate::specs::schema::SupervisionSpec;
use crate::stage;
use crate::wiring::{
    input, node_device, parquet, train_err, Cell, ComputeRef, Mon, NodeSpec, Numerics, Wiring,
};

/// One DCC training node; with `lambda_from_input` VolMaxDCC reads λ from its `selection`
/// input (the key then holds no λ, and a selection that chooses the same λ again keeps it fresh).
#[derive(Serialize)]
pub struct DccTask {
    #[serde(flatten)]
    pub params: DccParams,
    #[serde(skip)]
    pub compute: ComputeRef,
}

impl Task for DccTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = stage::features::load(ctx)?;
        let c = stage::constraints::load(ctx, "constraints")?;
        let mut params = self.params.clone();
        if let DccOptimizer::VolMax { lambda, .. } = &mut params.optimizer {
            if lambda.is_none() {
                let chosen = stage::select::chosen(ctx.input("selection")?)?;
                ctx.log(format!("λ = {chosen} (selected by validation ACC)"));
                *lambda = Some(chosen);
            }
        }
        let dev = node_device(&self.compute, ctx)?;
        let r = on_device!(&dev, |d| dcc::run(d, &params, &f, &c, &mut Mon(ctx))).map_err(
            train_err(match params.optimizer {
                DccOptimizer::VolMax { .. } => "volmax",
                DccOptimizer::Adam { .. } => "dcc",
            }),
        )?;
        ctx.summary("epochs", r.curve.len());
        if let Some(last) = r.curve.last() {
            ctx.summary("final_loss", last.loss);
        }
        parquet(ctx, "assignments", r.assignments.to_parquet())?;
        parquet(ctx, "curve", dcc::curve_to_parquet(&r.curve))
    }
}

/// Add a DCC training node for a cell; `selection` wires λ from a selection node.
fn wire_node(
    w: &mut Wiring,
    cell: &Cell,
    feat: usize,
    params: DccParams,
    selection: Option<usize>,
) -> Result<usize> {
    let cons = stage::constraints::wire(w, feat, cell)?;
    let mut inputs = vec![
        input("features", feat, "features"),
        input("constraints", cons, "constraints"),
    ];
    if let Some(s) = selection {
        inputs.push(input("selection", s, "chosen"));
    }
    let id = format!("dcc/{}", cell.id(w));
    let section = match params.optimizer {
        dcc::DccOptimizer::VolMax { .. } => "volmax",
        dcc::DccOptimizer::Adam { .. } => "dcc",
    };
    let need = w
        .shape(cell.dataset)
        .map(|s| dcc::memory_bytes(&params, s.dim, w.classes(cell.dataset), s.rows.unwrap_or(0)));
    let resources = w.trainer_sized(
        &id,
        section,
        "the classifier network".into(),
        need,
        2048,
        1024,
    );
    let compute = w.compute.clone();
    w.add(NodeSpec {
        id,
        stage: "dcc",
        version: dcc::VERSION,
        numerics: Numerics::Device,
        inputs,
        outputs: &["assignments", "curve"],
        labels: cell.labels("dcc"),
        resources,
        task: DccTask { params, compute },
    })
}

/// VanillaDCC (MCL).
pub struct VanillaDcc;

impl Method for VanillaDcc {
    fn kind(&self) -> &'static str {
        "vanilla-dcc"
    }
    fn summary(&self) -> &'static str {
        "VanillaDCC: MLP soft assignments, BCE of q_aᵀq_b (MCL), argmax clustering"
    }
    fn sections(&self) -> &'static [&'static str] {
        &["dcc"]
    }
    fn pretrainable(&self) -> bool {
        false
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let s: DccSettings = cx.section("dcc")?;
        Some(Arc::new(s))
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, s: &Settings, feat: usize) -> Result<CellNodes> {
        let s: &DccSettings = settings(s);
        let node = wire_node(w, cell, feat, DccParams::vanilla(s, cell.seed), None)?;
        Ok(CellNodes {
            train: node,
            assignments: node,
        })
    }
}

/// VolMaxDCC with its λ search.
pub struct VolMaxDcc;

/// The supervision whose runs select λ for a cell: multi-expert settings share the one named by
/// `shared_multi` when the spec defines it as a multi-expert setting.
pub fn selection_supervision<'a>(
    w: &Wiring<'a>,
    cell: &Cell<'a>,
    shared: Option<&'a str>,
) -> &'a str {
    match (cell.sspec, shared) {
        (SupervisionSpec::Multi { .. }, Some(s))
            if matches!(
                w.spec.file.supervision.get(s),
                Some(SupervisionSpec::Multi { .. })
            ) =>
        {
            s
        }
        _ => cell.supervision,
    }
}

impl Method for VolMaxDcc {
    fn kind(&self) -> &'static str {
        "volmax-dcc"
    }
    fn summary(&self) -> &'static str {
        "VolMaxDCC: confusion-adjusted co-assignment q_aᵀBq_b minus λ·log det(QᵀQ), λ by validation ACC"
    }
    fn sections(&self) -> &'static [&'static str] {
        &["volmax"]
    }
    fn pretrainable(&self) -> bool {
        false
    }
    fn needs_validation(&self, s: &Settings) -> bool {
        settings::<VolMaxSettings>(s).lambda.is_none()
    }
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings> {
        let s: VolMaxSettings = cx.section("volmax")?;
        Some(Arc::new(s))
    }
    fn selection(&self, w: &mut Wiring, cell: &Cell, s: &Settings) -> Result<Option<usize>> {
        let s: &VolMaxSettings = settings(s);
        if s.lambda.is_some() {
            return Ok(None);
        }
        let sup = selection_supervision(w, cell, s.shared_multi.as_deref());
        let search = stage::select::Search {
            supervision: sup,
            parameter: "lambda",
            grid: &s.lambdas,
            runs: s.search_runs,
            scope: s.search_scope,
        };
        stage::select::wire(w, cell, search, &mut |w, search, feat, lambda| {
            wire_node(
                w,
                search,
                feat,
                DccParams::volmax(s, Some(lambda), search.seed),
                None,
            )
        })
        .map(Some)
    }
    fn wire(&self, w: &mut Wiring, cell: &Cell, st: &Settings, feat: usize) -> Result<CellNodes> {
        let selection = self.selection(w, cell, st)?;
        let s: &VolMaxSettings = settings(st);
        let node = wire_node(
            w,
            cell,
            feat,
            DccParams::volmax(s, s.lambda, cell.seed),
            selection,
        )?;
        Ok(CellNodes {
            train: node,
            assignments: node,
        })
    }
}
