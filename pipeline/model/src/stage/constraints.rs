//! `constraints`: probabilistic constraints from the experts' judgments through the corruption
//! channel (with the held-out diagnostic set), or the user's own constraints from a file.

use serde::Serialize;
use upcc_engine::{InputDef, Source, SourceLocation, Task, TaskContext, TaskError};
use upcc_stages::{constraints, expert};

use crate::error::Result;
use crate::specs::axis::Axis;
use crate::specs::schema::SupervisionSpec;
use crate::wiring::{input, labels, parquet, stage_err, Cell, NodeSpec, Numerics, Wiring};

#[derive(Serialize)]
pub struct ConstraintsTask {
    #[serde(flatten)]
    pub params: constraints::ConstraintParams,
    /// Oracle judgments 1[t_a = t_b] under this many nominal experts (supervision `oracle`);
    /// absent: the experts' judgments (input `probs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle_experts: Option<usize>,
}

impl Task for ConstraintsTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = super::features::load(ctx)?;
        let probs;
        let judge = match self.oracle_experts {
            Some(experts) => constraints::Judge::Oracle { experts },
            None => {
                probs =
                    expert::ExpertProbs::from_parquet(ctx.input("probs")?).map_err(stage_err)?;
                constraints::Judge::Experts(&probs)
            }
        };
        let (c, d) = constraints::generate(&self.params, &f, judge).map_err(stage_err)?;
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
#[derive(Serialize)]
pub struct ConstraintsFileTask {
    /// Always `file` (the key's parameters; the file itself is an input).
    pub source: &'static str,
    #[serde(skip)]
    pub display: String,
}

impl Task for ConstraintsFileTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let f = super::features::load(ctx)?;
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

/// Decoded constraints of a node's `name` input.
pub fn load(
    ctx: &TaskContext,
    name: &str,
) -> std::result::Result<constraints::Constraints, TaskError> {
    constraints::Constraints::from_parquet(ctx.input(name)?, &format!("{name} artifact"))
        .map_err(stage_err)
}

/// The constraints node of a cell (outputs `constraints` and `diagnostic`), with the experts
/// it needs.
pub fn wire(w: &mut Wiring, feat: usize, cell: &Cell) -> Result<usize> {
    let (ds, sup, seed) = (cell.data_id(), cell.supervision, cell.seed);
    let ds = ds.as_str();
    let mut labels = labels(
        "constraints",
        [
            (Axis::Dataset, ds.to_string()),
            (Axis::Supervision, sup.to_string()),
            (Axis::Corruption, cell.coord(Axis::Corruption)),
            (Axis::Budget, cell.coord(Axis::Budget)),
        ],
    );
    labels.insert("trial".to_string(), seed.to_string());
    match cell.sspec {
        SupervisionSpec::File { path } => {
            let source = Source {
                context: format!("supervision `{sup}`, field `path`"),
                location: SourceLocation::File(w.spec.resolve_path(path)),
            };
            let display = source.display();
            labels.remove("trial");
            w.add(NodeSpec {
                id: format!("constraints/{ds}/{sup}"),
                stage: "constraints",
                version: constraints::VERSION,
                numerics: Numerics::Exact,
                inputs: vec![
                    input("features", feat, "features"),
                    ("file".into(), InputDef::Source(source)),
                ],
                outputs: &["constraints", "diagnostic"],
                labels,
                resources: Wiring::small(256),
                task: ConstraintsFileTask {
                    source: "file",
                    display,
                },
            })
        }
        SupervisionSpec::Single { .. }
        | SupervisionSpec::Multi { .. }
        | SupervisionSpec::Oracle { .. } => {
            let mut inputs = vec![input("features", feat, "features")];
            let oracle_experts = match cell.sspec {
                SupervisionSpec::Oracle { experts } => Some(*experts),
                _ => {
                    let ex = super::expert::wire(w, feat, ds, sup, cell.sspec, seed)?
                        .expect("not a file supervision");
                    inputs.push(input("probs", ex, "probs"));
                    None
                }
            };
            let params = constraints::ConstraintParams {
                settings: constraints::ConstraintSettings {
                    budget: cell.budget,
                    corruption: cell.corruption,
                    diagnostic_pairs: w.spec.params.constraints.diagnostic_pairs,
                },
                seed,
            };
            let suffix = cell.axes_suffix(w);
            w.add(NodeSpec {
                id: format!("constraints/{ds}/{sup}{suffix}/t{seed}"),
                stage: "constraints",
                version: constraints::VERSION,
                numerics: Numerics::Exact,
                inputs,
                outputs: &["constraints", "diagnostic"],
                labels,
                resources: Wiring::small(256),
                task: ConstraintsTask {
                    params,
                    oracle_experts,
                },
            })
        }
    }
}
