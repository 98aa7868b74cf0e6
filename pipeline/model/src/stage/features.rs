//! `features`: read a dataset's files, validate, split and scale them.

use std::collections::BTreeMap;

use serde::Serialize;
use upcc_engine::{InputDef, Source, SourceLocation, Task, TaskContext, TaskError};
use upcc_stages::features::{self, FeatureParams, Split, SplitKind};

use crate::error::Result;
use crate::specs::axis::Axis;
use crate::specs::embedded::embedded;
use crate::specs::schema::ValidationScope;
use crate::wiring::{labels, parquet, stage_err, NodeSpec, Numerics, Wiring};

#[derive(Serialize)]
pub struct FeaturesTask {
    #[serde(flatten)]
    pub params: FeatureParams,
    /// The sizes the paper gives (absent from the key when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect: Option<features::Expected>,
    /// Input role → the path shown in messages.
    #[serde(skip)]
    pub displays: BTreeMap<String, String>,
    /// Role → its inputs, concatenated in order (a file published in parts); a role absent
    /// here is the input of its own name.
    #[serde(skip)]
    pub parts: BTreeMap<String, Vec<String>>,
    #[serde(skip)]
    pub dataset: String,
}

impl Task for FeaturesTask {
    fn run(&self, ctx: &mut TaskContext) -> std::result::Result<(), TaskError> {
        let mut joined: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        for (role, inputs) in &self.parts {
            let mut bytes = Vec::new();
            for i in inputs {
                bytes.extend_from_slice(ctx.input(i)?);
            }
            ctx.log(format!(
                "file `{role}`: {} parts joined, {} bytes",
                inputs.len(),
                bytes.len()
            ));
            joined.insert(role, bytes);
        }
        let mut files = BTreeMap::new();
        for (role, display) in &self.displays {
            let bytes = match joined.get(role.as_str()) {
                Some(b) => b.as_slice(),
                None => ctx.input(role)?,
            };
            files.insert(
                role.clone(),
                features::SourceFile {
                    display: display.clone(),
                    bytes,
                },
            );
        }
        let f = features::build(&self.params, &files).map_err(stage_err)?;
        if let Some(e) = &self.expect {
            let differences = e.differences(&f);
            if !differences.is_empty() {
                return Err(TaskError::Input(format!(
                    "dataset `{}` is not the paper's: {}. Check the files (a subset, another version, a wrong split?); if the difference is deliberate, change or drop the dataset's `expect`",
                    self.dataset,
                    differences.join("; ")
                )));
            }
        }
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

/// Decoded features of a node's `features` input.
pub fn load(ctx: &TaskContext) -> std::result::Result<features::Features, TaskError> {
    features::Features::from_parquet(ctx.input("features")?).map_err(stage_err)
}

/// The features node of dataset `name`: every training row trains (unless the dataset's
/// `validation_scope` is `all`).
pub fn wire(w: &mut Wiring, name: &str) -> Result<usize> {
    let all = w.spec.file.datasets[name].validation_scope == ValidationScope::All;
    wire_with(w, name, all)
}

/// The features node the search runs of dataset `name` train on: its `validation` rows held
/// out (split `val`).
pub fn wire_holdout(w: &mut Wiring, name: &str) -> Result<usize> {
    wire_with(w, name, true)
}

fn wire_with(w: &mut Wiring, name: &str, holdout: bool) -> Result<usize> {
    let d = &w.spec.file.datasets[name];
    let validation = if holdout { d.validation } else { 0 };
    let scope_all = d.validation_scope == ValidationScope::All;
    let single = d.format.roles().0[0];
    let split = d.split.unwrap_or(Split {
        kind: if d.files.contains_key(single) || d.fetch.contains_key(single) {
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
        validation,
        validation_order: (validation > 0).then_some(d.validation_order),
        labels: d.labels,
    };
    let mut inputs = Vec::new();
    let mut displays = BTreeMap::new();
    let mut parts = BTreeMap::new();
    for role in d.fetch.keys() {
        let fetched = super::fetch::wire(w, name, role)?;
        if let [(_, node, url)] = fetched.as_slice() {
            displays.insert(role.clone(), url.clone());
            inputs.push(crate::wiring::input(role, *node, "data"));
        } else {
            let first = &fetched[0].2;
            displays.insert(
                role.clone(),
                format!("{first} (+{} parts)", fetched.len() - 1),
            );
            parts.insert(
                role.clone(),
                fetched.iter().map(|(n, _, _)| n.clone()).collect(),
            );
            for (input_name, node, _) in &fetched {
                inputs.push(crate::wiring::input(input_name, *node, "data"));
            }
        }
    }
    for (role, path) in d.files.iter().filter(|(r, _)| !d.fetch.contains_key(*r)) {
        let location = match path.strip_prefix("embedded:") {
            Some(e) => SourceLocation::Embedded {
                name: e.to_string(),
                bytes: embedded(e).expect("validated"),
            },
            None => SourceLocation::File(w.spec.resolve_path(path)),
        };
        let source = Source {
            context: format!("dataset `{name}`, file `{role}`"),
            location,
        };
        displays.insert(role.clone(), source.display());
        inputs.push((role.clone(), InputDef::Source(source)));
    }
    w.add(NodeSpec {
        id: if validation > 0 && !scope_all {
            format!("features/{name}@val")
        } else {
            format!("features/{name}")
        },
        stage: "features",
        version: features::VERSION,
        numerics: Numerics::Exact,
        inputs,
        outputs: &["features"],
        labels: labels("features", [(Axis::Dataset, name.to_string())]),
        resources: Wiring::small(1024),
        task: FeaturesTask {
            params,
            expect: d.expect.clone(),
            displays,
            parts,
            dataset: name.to_string(),
        },
    })
}
