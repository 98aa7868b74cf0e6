//! From a spec to the DAG: every target cell × trial becomes the chain
//! features → expert → constraints → (pretrain) → train → cluster → metrics, and every target
//! a table node over its cells' metrics. Nodes shared between cells (features, experts,
//! pretraining) are added once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Value};
use upcc_engine::{
    Dag, DagBuilder, InputDef, NodeDef, NodeIndex, Resources, Source, SourceLocation, Task,
};
use upcc_report::TableLayout;
use upcc_stages::features::{DataFormat, FeatureParams, Split, SplitKind};
use upcc_stages::{cluster, constraints, eci, expert, features, metrics, pretrain, train};

use crate::device::Compute;

use crate::error::{CliError, Result};
use crate::spec::{axes_of, embedded, Spec, SupervisionSpec, TargetKind};
use crate::tasks::*;

/// A cell × trial of a target and the node whose output the target reads (metrics for
/// tables, the expert node for expert tables, the training node for figures).
#[derive(Clone, Debug)]
pub struct CellTrial {
    pub coords: BTreeMap<String, String>,
    pub trial: u64,
    pub leaf: usize,
    pub output: &'static str,
}

/// A target as built: its table node and cells.
#[derive(Clone, Debug)]
pub struct TargetNodes {
    pub name: String,
    pub kind: TargetKind,
    /// The table or figure node.
    pub node: usize,
    pub layout: TableLayout,
    pub cells: Vec<CellTrial>,
    pub inputs: Vec<TableInput>,
}

pub struct Built {
    pub dag: Dag,
    pub targets: Vec<TargetNodes>,
}

fn fmt_f(x: f64) -> String {
    let s = format!("{x}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

fn params_json<T: serde::Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v)
        .map_err(|e| CliError::internal(format!("cannot serialise parameters: {e}")))
}

struct Builder<'a> {
    spec: &'a Spec,
    b: DagBuilder,
    threads: usize,
    compute: Arc<Compute>,
    /// Numerics class of the nodes that train networks (from the device).
    numerics: String,
    /// Optional axes that appear in node ids (those some target of the spec varies).
    id_axes: BTreeSet<&'static str>,
}

impl Builder<'_> {
    // One argument per field of `NodeDef`; a struct literal at every call site reads worse.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        id: String,
        stage: &str,
        version: u32,
        params: Value,
        numerics: &str,
        inputs: Vec<(String, InputDef)>,
        outputs: &[&str],
        labels: BTreeMap<String, String>,
        resources: Resources,
        task: Arc<dyn Task>,
    ) -> Result<usize> {
        let def = NodeDef {
            id,
            stage: stage.into(),
            stage_version: version,
            params,
            numerics: numerics.into(),
            inputs,
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            labels,
            resources,
            task,
        };
        self.b
            .add(def)
            .map(|i| i.0)
            .map_err(|e| CliError::internal(e.to_string()))
    }

    fn node_input(name: &str, node: usize, output: &str) -> (String, InputDef) {
        (
            name.to_string(),
            InputDef::Node {
                node: NodeIndex(node),
                output: output.to_string(),
            },
        )
    }

    /// Resources of a node that trains networks: a GPU slot with `gpu_mb` of GPU memory and
    /// one CPU thread to drive it on a GPU, else the per-node CPU threads.
    fn trainer(&self, memory_mb: u64, gpu_mb: u64) -> Resources {
        if self.compute.is_gpu() {
            Resources {
                threads: 1,
                memory_mb,
                gpu_memory_mb: gpu_mb,
            }
        } else {
            Resources {
                threads: self.threads,
                memory_mb,
                gpu_memory_mb: 0,
            }
        }
    }

    /// Resources of a CPU node using the per-node threads (k-means).
    fn cpu(&self, memory_mb: u64) -> Resources {
        Resources {
            threads: self.threads,
            memory_mb,
            gpu_memory_mb: 0,
        }
    }

    fn features(&mut self, name: &str) -> Result<usize> {
        let d = &self.spec.file.datasets[name];
        let separate = matches!(d.format, DataFormat::Idx | DataFormat::Npy);
        let split = d.split.unwrap_or(Split {
            kind: if d.files.contains_key(if separate { "x" } else { "data" }) {
                SplitKind::Stratified
            } else {
                SplitKind::Official
            },
            test_fraction: 0.2,
            seed: 0,
        });
        let params = FeatureParams {
            format: d.format,
            label_column: d.label_column.clone(),
            header: d.header,
            scaling: d.scaling,
            split,
            n_classes: d.n_classes,
        };
        let mut inputs = Vec::new();
        let mut displays = BTreeMap::new();
        for (role, path) in &d.files {
            let location = match path.strip_prefix("embedded:") {
                Some(e) => SourceLocation::Embedded {
                    name: e.to_string(),
                    bytes: embedded(e).expect("validated"),
                },
                None => SourceLocation::File(self.spec.resolve_path(path)),
            };
            let source = Source {
                context: format!("dataset `{name}`, file `{role}`"),
                location,
            };
            displays.insert(role.clone(), source.display());
            inputs.push((role.clone(), InputDef::Source(source)));
        }
        let labels = BTreeMap::from([
            ("stage".into(), "features".into()),
            ("dataset".into(), name.to_string()),
        ]);
        let pj = params_json(&params)?;
        self.add(
            format!("features/{name}"),
            "features",
            features::VERSION,
            pj,
            "exact",
            inputs,
            &["features"],
            labels,
            Resources {
                threads: 1,
                memory_mb: 1024,
                gpu_memory_mb: 0,
            },
            Arc::new(FeaturesTask { params, displays }),
        )
    }
}

/// The expert node of (dataset, supervision, trial); `None` for user-supplied constraints.
fn expert_node(
    bd: &mut Builder,
    feat: usize,
    ds: &str,
    sup: &str,
    sspec: &SupervisionSpec,
    seed: u64,
) -> Result<Option<usize>> {
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
        SupervisionSpec::File { .. } => return Ok(None),
    };
    let ep = expert::ExpertParams {
        setting,
        classifier: bd.spec.file.params.expert.clone(),
        seed,
    };
    let labels = BTreeMap::from([
        ("stage".to_string(), "expert".to_string()),
        ("dataset".to_string(), ds.to_string()),
        ("supervision".to_string(), sup.to_string()),
        ("trial".to_string(), seed.to_string()),
    ]);
    let pj = params_json(&ep)?;
    let resources = bd.trainer(1024, 512);
    let numerics = bd.numerics.clone();
    let compute = bd.compute.clone();
    bd.add(
        format!("expert/{ds}/{sup}/t{seed}"),
        "expert",
        expert::VERSION,
        pj,
        &numerics,
        vec![Builder::node_input("features", feat, "features")],
        &["probs", "experts"],
        labels,
        resources,
        Arc::new(ExpertTask {
            params: ep,
            compute,
        }),
    )
    .map(Some)
}

/// Parse the ids of optional axes.
fn cell_suffix(id_axes: &BTreeSet<&str>, corruption: f64, budget: usize) -> String {
    let mut s = String::new();
    if id_axes.contains("corruption") {
        s.push_str(&format!("/pi{}", fmt_f(corruption)));
    }
    if id_axes.contains("budget") {
        s.push_str(&format!("/n{budget}"));
    }
    s
}

/// Build the full DAG of a spec: CPU training nodes get `threads` threads each; `compute` is
/// the training device.
pub fn build(spec: &Spec, threads: usize, compute: Arc<Compute>) -> Result<Built> {
    let numerics = compute.numerics();
    build_with(spec, threads, compute, numerics)
}

/// The DAG whose training nodes carry numerics class `numerics`, for planning only (which
/// results of that device class are in the store); its tasks would compute on the CPU.
pub fn build_for_numerics(spec: &Spec, numerics: &str) -> Result<Built> {
    build_with(spec, 1, Compute::cpu(), numerics.to_string())
}

fn build_with(
    spec: &Spec,
    threads: usize,
    compute: Arc<Compute>,
    numerics: String,
) -> Result<Built> {
    let mut id_axes = BTreeSet::new();
    for t in spec.file.targets.values() {
        if t.grid.corruption.is_some() {
            id_axes.insert("corruption");
        }
        if t.grid.budget.is_some() {
            id_axes.insert("budget");
        }
    }
    let mut bd = Builder {
        spec,
        b: DagBuilder::new(),
        threads: threads.max(1),
        numerics,
        compute,
        id_axes,
    };
    let params = &spec.file.params;
    let mut targets = Vec::new();
    for (tname, target) in &spec.file.targets {
        let g = &target.grid;
        let corruptions = g
            .corruption
            .clone()
            .unwrap_or_else(|| vec![params.constraints.corruption]);
        let budgets = g
            .budget
            .clone()
            .unwrap_or_else(|| vec![params.constraints.budget]);
        let mut cells = Vec::new();
        for ds in &g.dataset {
            let dspec = &spec.file.datasets[ds];
            let feat = bd.features(ds)?;
            for sup in &g.supervision {
                let sspec = &spec.file.supervision[sup];
                if target.kind == TargetKind::Experts {
                    for &seed in &spec.trials {
                        let coords = BTreeMap::from([
                            ("dataset".to_string(), ds.clone()),
                            ("supervision".to_string(), sup.clone()),
                        ]);
                        let ex = expert_node(&mut bd, feat, ds, sup, sspec, seed)?
                            .expect("validated: experts targets have experts");
                        cells.push(CellTrial {
                            coords,
                            trial: seed,
                            leaf: ex,
                            output: "experts",
                        });
                    }
                    continue;
                }
                for &pi in &corruptions {
                    for &budget in &budgets {
                        for method in &g.method {
                            for &pre in &g.pretrain {
                                for &seed in &spec.trials {
                                    let mut coords = BTreeMap::from([
                                        ("dataset".to_string(), ds.clone()),
                                        ("supervision".to_string(), sup.clone()),
                                        ("method".to_string(), method.clone()),
                                        ("pretrain".to_string(), pre.to_string()),
                                    ]);
                                    if g.corruption.is_some() {
                                        coords.insert("corruption".into(), fmt_f(pi));
                                    }
                                    if g.budget.is_some() {
                                        coords.insert("budget".into(), budget.to_string());
                                    }
                                    let (train_node, metrics) = chain(
                                        &mut bd,
                                        feat,
                                        ds,
                                        dspec.embedding_dim,
                                        sup,
                                        sspec,
                                        pi,
                                        budget,
                                        method,
                                        pre,
                                        seed,
                                    )?;
                                    let (leaf, output) = if target.kind == TargetKind::Figure {
                                        (train_node, "diagnostics")
                                    } else {
                                        (metrics, "metrics")
                                    };
                                    cells.push(CellTrial {
                                        coords,
                                        trial: seed,
                                        leaf,
                                        output,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        let axes: Vec<(String, Vec<String>)> = axes_of(target)
            .into_iter()
            .map(|a| {
                let vals: Vec<String> = match a {
                    "dataset" => g.dataset.clone(),
                    "supervision" => g.supervision.clone(),
                    "method" => g.method.clone(),
                    "pretrain" => g.pretrain.iter().map(|b| b.to_string()).collect(),
                    "corruption" => corruptions.iter().map(|c| fmt_f(*c)).collect(),
                    _ => budgets.iter().map(|b| b.to_string()).collect(),
                };
                (a.to_string(), vals)
            })
            .collect();
        let experts = target.kind == TargetKind::Experts;
        let layout = TableLayout {
            title: target.title.clone().unwrap_or_else(|| tname.clone()),
            axes,
            columns: target.columns(),
            metrics: if experts { vec![upcc_report::Metric::Acc] } else { target.metrics.clone() },
            splits: if experts { vec!["test".into()] } else { target.splits.clone() },
            settings: params.table.clone(),
            highlight_best: !experts,
            caption: experts.then(|| "Mean ± std over trials of the experts' test accuracy (%, ACC); multi-expert settings: the mean over their experts".to_string()),
        };
        let inputs: Vec<TableInput> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| TableInput {
                input: format!("m{i}"),
                coords: c.coords.clone(),
                trial: c.trial.to_string(),
            })
            .collect();
        let wiring: Vec<(String, InputDef)> = inputs
            .iter()
            .zip(&cells)
            .map(|(ti, c)| Builder::node_input(&ti.input, c.leaf, c.output))
            .collect();
        let pj = json!({
            "kind": format!("{:?}", target.kind).to_lowercase(),
            "layout": params_json(&layout)?,
            "trials": spec.trials.len(),
            "inputs": inputs.iter().map(|t| json!({"input": t.input, "coords": t.coords, "trial": t.trial})).collect::<Vec<_>>(),
        });
        let labels = BTreeMap::from([
            ("stage".into(), "table".into()),
            ("target".into(), tname.clone()),
        ]);
        let resources = Resources {
            threads: 1,
            memory_mb: 256,
            gpu_memory_mb: 0,
        };
        let node = match target.kind {
            TargetKind::Table | TargetKind::Experts => {
                let source = if experts {
                    TableSource::Experts
                } else {
                    TableSource::Metrics
                };
                let task = TableTask {
                    layout: layout.clone(),
                    inputs: inputs.clone(),
                    trials: spec.trials.len(),
                    source,
                };
                bd.add(
                    format!("table/{tname}"),
                    "table",
                    TABLE_VERSION,
                    pj,
                    "exact",
                    wiring,
                    &["table", "markdown", "latex", "csv"],
                    labels,
                    resources,
                    Arc::new(task),
                )?
            }
            TargetKind::Figure => {
                let mut labels = labels;
                labels.insert("stage".into(), "figure".into());
                let task = FigureTask {
                    title: layout.title.clone(),
                    inputs: inputs.clone(),
                    std_ddof: params.table.std_ddof,
                };
                bd.add(
                    format!("figure/{tname}"),
                    "figure",
                    FIGURE_VERSION,
                    pj,
                    "exact",
                    wiring,
                    &["png", "svg", "table"],
                    labels,
                    resources,
                    Arc::new(task),
                )?
            }
        };
        targets.push(TargetNodes {
            name: tname.clone(),
            kind: target.kind,
            node,
            layout,
            cells,
            inputs,
        });
    }
    Ok(Built {
        dag: bd.b.build(),
        targets,
    })
}

/// Version of the table stage (rendering lives in `upcc-report`).
pub const TABLE_VERSION: u32 = 1;
/// Version of the figure stage (drawing lives in `upcc-report`).
pub const FIGURE_VERSION: u32 = 1;

#[allow(clippy::too_many_arguments)]
fn chain(
    bd: &mut Builder,
    feat: usize,
    ds: &str,
    embedding_dim: usize,
    sup: &str,
    sspec: &SupervisionSpec,
    pi: f64,
    budget: usize,
    method: &str,
    pre: bool,
    seed: u64,
) -> Result<(usize, usize)> {
    let spec = bd.spec;
    let params = &spec.file.params;
    let t = seed.to_string();
    let suffix = cell_suffix(&bd.id_axes, pi, budget);
    let base_labels = |stage: &str| {
        BTreeMap::from([
            ("stage".to_string(), stage.to_string()),
            ("dataset".to_string(), ds.to_string()),
            ("supervision".to_string(), sup.to_string()),
            ("trial".to_string(), t.clone()),
            ("corruption".to_string(), fmt_f(pi)),
            ("budget".to_string(), budget.to_string()),
        ])
    };
    // Expert and constraints.
    let cons = match sspec {
        SupervisionSpec::File { path } => {
            let source = Source {
                context: format!("supervision `{sup}`, field `path`"),
                location: SourceLocation::File(spec.resolve_path(path)),
            };
            let display = source.display();
            let mut labels = base_labels("constraints");
            labels.remove("trial");
            bd.add(
                format!("constraints/{ds}/{sup}"),
                "constraints",
                constraints::VERSION,
                json!({"source": "file"}),
                "exact",
                vec![
                    Builder::node_input("features", feat, "features"),
                    ("file".into(), InputDef::Source(source)),
                ],
                &["constraints", "diagnostic"],
                labels,
                Resources {
                    threads: 1,
                    memory_mb: 256,
                    gpu_memory_mb: 0,
                },
                Arc::new(ConstraintsFileTask { display }),
            )?
        }
        SupervisionSpec::Single { .. } | SupervisionSpec::Multi { .. } => {
            let ex = expert_node(bd, feat, ds, sup, sspec, seed)?.expect("not a file supervision");
            let cp = constraints::ConstraintParams {
                settings: constraints::ConstraintSettings {
                    budget,
                    corruption: pi,
                    diagnostic_pairs: params.constraints.diagnostic_pairs,
                },
                seed,
            };
            let pj = params_json(&cp)?;
            bd.add(
                format!("constraints/{ds}/{sup}{suffix}/t{t}"),
                "constraints",
                constraints::VERSION,
                pj,
                "exact",
                vec![
                    Builder::node_input("features", feat, "features"),
                    Builder::node_input("probs", ex, "probs"),
                ],
                &["constraints", "diagnostic"],
                base_labels("constraints"),
                Resources {
                    threads: 1,
                    memory_mb: 256,
                    gpu_memory_mb: 0,
                },
                Arc::new(ConstraintsTask { params: cp }),
            )?
        }
    };
    // Pretraining (shared across trials unless per_trial).
    let pre_node = if pre {
        let ps = &spec.pretrain;
        let pseed = if ps.per_trial { seed } else { ps.seed };
        let pp = pretrain::PretrainParams {
            settings: ps.settings.clone(),
            embedding_dim,
            seed: pseed,
        };
        let id = if ps.per_trial {
            format!("pretrain/{ds}/t{t}")
        } else {
            format!("pretrain/{ds}/s{pseed}")
        };
        let labels = BTreeMap::from([
            ("stage".to_string(), "pretrain".to_string()),
            ("dataset".to_string(), ds.to_string()),
        ]);
        let pj = params_json(&pp)?;
        let numerics = bd.numerics.clone();
        let compute = bd.compute.clone();
        Some(bd.add(
            id,
            "pretrain",
            pretrain::VERSION,
            pj,
            &numerics,
            vec![Builder::node_input("features", feat, "features")],
            &["weights", "curve"],
            labels,
            bd.trainer(2048, 1024),
            Arc::new(PretrainTask {
                params: pp,
                compute,
            }),
        )?)
    } else {
        None
    };
    let resolved = spec.methods[method].clone();
    let kind = resolved.kind;
    let tp = train::TrainParams::new(resolved.train, kind.weighting(), embedding_dim, pre, seed);
    let cell = format!(
        "{ds}/{sup}{suffix}/{method}/{}/t{t}",
        if pre { "pre" } else { "nopre" }
    );
    let mut labels = base_labels("train");
    labels.insert("method".into(), method.to_string());
    labels.insert("pretrain".into(), pre.to_string());
    let mut inputs = vec![
        Builder::node_input("features", feat, "features"),
        Builder::node_input("constraints", cons, "constraints"),
    ];
    if let Some(p) = pre_node {
        inputs.push(Builder::node_input("weights", p, "weights"));
    }
    let mut pj = params_json(&tp)?;
    pj["method"] = json!(kind.name());
    let numerics = bd.numerics.clone();
    let compute = bd.compute.clone();
    let tr = match resolved.eci {
        None => bd.add(
            format!("train/{cell}"),
            "train",
            train::VERSION,
            pj,
            &numerics,
            inputs,
            &["embeddings", "curve"],
            labels.clone(),
            bd.trainer(2048, 1024),
            Arc::new(TrainTask {
                params: tp,
                compute,
            }),
        )?,
        Some(eci_settings) => {
            // ECI-PP also reads the held-out diagnostic set and writes diagnostics.
            inputs.push(Builder::node_input("diagnostic", cons, "diagnostic"));
            pj["eci"] = params_json(&eci_settings)?;
            bd.add(
                format!("train/{cell}"),
                "eci-pp",
                eci::VERSION,
                pj,
                &numerics,
                inputs,
                &["embeddings", "curve", "diagnostics"],
                labels.clone(),
                bd.trainer(4096, 3072),
                Arc::new(EciTask {
                    params: tp,
                    eci: eci_settings,
                    compute,
                }),
            )?
        }
    };
    let cp = cluster::ClusterParams {
        settings: params.cluster.clone(),
        k: 0,
        seed,
    };
    labels.insert("stage".into(), "cluster".into());
    let pj = params_json(&cp)?;
    let cl = bd.add(
        format!("cluster/{cell}"),
        "cluster",
        cluster::VERSION,
        pj,
        "exact",
        vec![
            Builder::node_input("features", feat, "features"),
            Builder::node_input("embeddings", tr, "embeddings"),
        ],
        &["assignments"],
        labels.clone(),
        bd.cpu(512),
        Arc::new(ClusterTask { params: cp }),
    )?;
    labels.insert("stage".into(), "metrics".into());
    let me = bd.add(
        format!("metrics/{cell}"),
        "metrics",
        metrics::VERSION,
        json!({}),
        "exact",
        vec![Builder::node_input("assignments", cl, "assignments")],
        &["metrics"],
        labels,
        Resources {
            threads: 1,
            memory_mb: 128,
            gpu_memory_mb: 0,
        },
        Arc::new(MetricsTask),
    )?;
    Ok((tr, me))
}
