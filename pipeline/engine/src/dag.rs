//! The DAG of nodes: built once, validated, then planned and executed.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::digest::{Artifact, Digest};
use crate::task::{Resources, Task};

/// Index of a node in its DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeIndex(pub usize);

/// Where a source input's bytes come from.
#[derive(Clone, Debug)]
pub enum SourceLocation {
    File(PathBuf),
    /// Bytes compiled into the binary (the vendored MNIST sample), with a display name.
    Embedded {
        name: String,
        bytes: &'static [u8],
    },
}

/// An input that is not produced by a node: a user's data file.
#[derive(Clone, Debug)]
pub struct Source {
    /// Where the source comes from in user terms (`dataset mnist5k, field path`).
    pub context: String,
    pub location: SourceLocation,
}

impl Source {
    pub fn display(&self) -> String {
        match &self.location {
            SourceLocation::File(p) => p.display().to_string(),
            SourceLocation::Embedded { name, .. } => format!("embedded:{name}"),
        }
    }

    /// Read the bytes.
    pub fn load(&self) -> Result<Vec<u8>, std::io::Error> {
        match &self.location {
            SourceLocation::File(p) => {
                // A device or pipe (`/dev/zero`) would be read until memory runs out.
                let meta = fs_err::metadata(p)?;
                if !meta.is_file() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        if meta.is_dir() {
                            "is a directory, not a data file"
                        } else {
                            "is not a regular file (a device, pipe or socket); give a data file"
                        },
                    ));
                }
                fs_err::read(p)
            }
            SourceLocation::Embedded { bytes, .. } => Ok(bytes.to_vec()),
        }
    }

    /// Read and hash.
    pub fn digest(&self) -> Result<(Digest<Artifact>, Vec<u8>), std::io::Error> {
        let bytes = self.load()?;
        Ok((Digest::of_bytes(&bytes), bytes))
    }
}

/// How one input of a node is wired.
#[derive(Clone, Debug)]
pub enum InputDef {
    Node { node: NodeIndex, output: String },
    Source(Source),
}

/// A node as the spec layer defines it.
#[derive(Clone)]
pub struct NodeDef {
    /// Logical id, stable across parameter changes (`train/mnist5k/lv0.01/probpair/t0`).
    pub id: String,
    pub stage: String,
    pub stage_version: u32,
    /// Fully resolved parameters (defaults filled in).
    pub params: Value,
    pub numerics: String,
    /// The stage's source files → their digests (see [`crate::KeyMaterial::code`]).
    pub code: BTreeMap<String, String>,
    pub inputs: Vec<(String, InputDef)>,
    pub outputs: Vec<String>,
    /// Grid coordinates (`dataset`, `method`, ...) for selection and display.
    pub labels: BTreeMap<String, String>,
    pub resources: Resources,
    pub task: Arc<dyn Task>,
}

impl std::fmt::Debug for NodeDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeDef")
            .field("id", &self.id)
            .field("stage", &self.stage)
            .finish()
    }
}

/// Errors while building a DAG.
#[derive(Debug, thiserror::Error)]
pub enum DagError {
    #[error("node `{0}` is defined twice with different stages, parameters or inputs")]
    Conflict(String),
    #[error(
        "node `{node}` reads output `{output}` of `{upstream}`, which declares no such output"
    )]
    UnknownOutput {
        node: String,
        upstream: String,
        output: String,
    },
    #[error("node `{node}` refers to node index {index}, which is not (yet) in the DAG")]
    DanglingInput { node: String, index: usize },
}

/// Builds a DAG; inputs may only refer to nodes already added, so it is acyclic by
/// construction and node order is a topological order.
#[derive(Default)]
pub struct DagBuilder {
    nodes: Vec<NodeDef>,
    by_id: HashMap<String, usize>,
}

impl DagBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a node, or return the existing one if the same id was added with the same definition.
    pub fn add(&mut self, def: NodeDef) -> Result<NodeIndex, DagError> {
        for (_, input) in &def.inputs {
            if let InputDef::Node { node, output } = input {
                let up = self.nodes.get(node.0).ok_or(DagError::DanglingInput {
                    node: def.id.clone(),
                    index: node.0,
                })?;
                if !up.outputs.contains(output) {
                    return Err(DagError::UnknownOutput {
                        node: def.id.clone(),
                        upstream: up.id.clone(),
                        output: output.clone(),
                    });
                }
            }
        }
        if let Some(&i) = self.by_id.get(&def.id) {
            let old = &self.nodes[i];
            if old.stage != def.stage
                || old.params != def.params
                || !same_inputs(&old.inputs, &def.inputs)
            {
                return Err(DagError::Conflict(def.id));
            }
            return Ok(NodeIndex(i));
        }
        let i = self.nodes.len();
        self.by_id.insert(def.id.clone(), i);
        self.nodes.push(def);
        Ok(NodeIndex(i))
    }

    pub fn build(self) -> Dag {
        Dag::from_nodes(self.nodes)
    }
}

fn same_inputs(a: &[(String, InputDef)], b: &[(String, InputDef)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, ia), (nb, ib))| {
            na == nb
                && match (ia, ib) {
                    (
                        InputDef::Node {
                            node: x,
                            output: ox,
                        },
                        InputDef::Node {
                            node: y,
                            output: oy,
                        },
                    ) => x == y && ox == oy,
                    (InputDef::Source(x), InputDef::Source(y)) => x.display() == y.display(),
                    _ => false,
                }
        })
}

/// A validated DAG in topological order.
pub struct Dag {
    nodes: Vec<NodeDef>,
    dependents: Vec<Vec<usize>>,
}

impl Dag {
    fn from_nodes(nodes: Vec<NodeDef>) -> Self {
        let mut dependents = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            for (_, input) in &n.inputs {
                if let InputDef::Node { node, .. } = input {
                    if !dependents[node.0].contains(&i) {
                        dependents[node.0].push(i);
                    }
                }
            }
        }
        Dag { nodes, dependents }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, i: usize) -> &NodeDef {
        &self.nodes[i]
    }

    pub fn nodes(&self) -> &[NodeDef] {
        &self.nodes
    }

    pub fn dependents(&self, i: usize) -> &[usize] {
        &self.dependents[i]
    }

    /// Indices of the direct upstream nodes of `i`.
    pub fn upstream(&self, i: usize) -> Vec<usize> {
        let mut out: Vec<usize> = self.nodes[i]
            .inputs
            .iter()
            .filter_map(|(_, inp)| match inp {
                InputDef::Node { node, .. } => Some(node.0),
                InputDef::Source(_) => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The sub-DAG of `roots` and everything they depend on, in the same relative order.
    pub fn restrict(&self, roots: &[usize]) -> Dag {
        let mut keep = vec![false; self.nodes.len()];
        let mut stack: Vec<usize> = roots.to_vec();
        while let Some(i) = stack.pop() {
            if keep[i] {
                continue;
            }
            keep[i] = true;
            stack.extend(self.upstream(i));
        }
        let mut remap = vec![usize::MAX; self.nodes.len()];
        let mut nodes = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            remap[i] = nodes.len();
            let mut n = n.clone();
            for (_, input) in n.inputs.iter_mut() {
                if let InputDef::Node { node, .. } = input {
                    *node = NodeIndex(remap[node.0]);
                }
            }
            nodes.push(n);
        }
        Dag::from_nodes(nodes)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::task::{TaskContext, TaskError};

    pub struct Noop;
    impl Task for Noop {
        fn run(&self, _ctx: &mut TaskContext) -> Result<(), TaskError> {
            Ok(())
        }
    }

    pub fn node(id: &str, inputs: Vec<(String, InputDef)>) -> NodeDef {
        NodeDef {
            id: id.into(),
            stage: "s".into(),
            stage_version: 1,
            params: Value::Null,
            numerics: "exact".into(),
            code: BTreeMap::new(),
            inputs,
            outputs: vec!["out".into()],
            labels: BTreeMap::new(),
            resources: Resources::default(),
            task: Arc::new(Noop),
        }
    }

    fn from(i: NodeIndex) -> (String, InputDef) {
        (
            "in".into(),
            InputDef::Node {
                node: i,
                output: "out".into(),
            },
        )
    }

    #[test]
    fn restrict_keeps_exactly_the_ancestors() {
        // a → b → d, a → c
        let mut b = DagBuilder::new();
        let a = b.add(node("a", vec![])).unwrap();
        let bb = b.add(node("b", vec![from(a)])).unwrap();
        let _c = b.add(node("c", vec![from(a)])).unwrap();
        let d = b.add(node("d", vec![from(bb)])).unwrap();
        let dag = b.build();
        let sub = dag.restrict(&[d.0]);
        let ids: Vec<_> = sub.nodes().iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "d"]);
        assert_eq!(sub.upstream(2), vec![1]);
        assert_eq!(sub.dependents(0), &[1]);
    }

    #[test]
    fn same_node_twice_is_shared_but_conflicting_definition_is_an_error() {
        let mut b = DagBuilder::new();
        let a1 = b.add(node("a", vec![])).unwrap();
        let a2 = b.add(node("a", vec![])).unwrap();
        assert_eq!(a1, a2);
        let mut other = node("a", vec![]);
        other.params = serde_json::json!({"x": 1});
        assert!(matches!(b.add(other), Err(DagError::Conflict(_))));
    }

    #[test]
    fn reading_an_undeclared_output_is_an_error() {
        let mut b = DagBuilder::new();
        let a = b.add(node("a", vec![])).unwrap();
        let bad = node(
            "b",
            vec![(
                "in".into(),
                InputDef::Node {
                    node: a,
                    output: "nope".into(),
                },
            )],
        );
        assert!(matches!(b.add(bad), Err(DagError::UnknownOutput { .. })));
    }
}
