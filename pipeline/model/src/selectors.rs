//! Selectors: `key=value[,value…]` picks one cell or a slice of a spec's grid.

use std::collections::{BTreeMap, BTreeSet};

use upcc_engine::Dag;

use crate::error::{nearest, Error, Result};
use crate::graph::Built;
use crate::specs::axis::Axis;

/// What a selector picks by: a target, an axis of the grids, a trial, or a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Target,
    Axis(Axis),
    Trial,
    Stage,
}

impl Key {
    /// Every key, in the order messages list them.
    pub fn all() -> Vec<Key> {
        std::iter::once(Key::Target)
            .chain(Axis::ALL.map(Key::Axis))
            .chain([Key::Trial, Key::Stage])
            .collect()
    }

    /// The key as selectors write it (and as node labels name it).
    pub fn name(self) -> &'static str {
        match self {
            Key::Target => "target",
            Key::Axis(a) => a.name(),
            Key::Trial => "trial",
            Key::Stage => "stage",
        }
    }

    fn parse(name: &str) -> Option<Key> {
        Key::all().into_iter().find(|k| k.name() == name)
    }

    /// Whether it picks cells (every key but `target` and `stage`).
    fn picks_cells(self) -> bool {
        matches!(self, Key::Axis(_) | Key::Trial)
    }
}

/// Every key's name, as messages list them.
fn key_names() -> String {
    let names: Vec<&str> = Key::all().into_iter().map(Key::name).collect();
    names.join(", ")
}

/// Parsed selectors.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    filters: BTreeMap<Key, BTreeSet<String>>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    fn has_cell_filters(&self) -> bool {
        self.filters.keys().any(|k| k.picks_cells())
    }

    /// Whether a cell of target `target` whose leaf node has `labels` is selected.
    pub fn picks(&self, target: &str, labels: &BTreeMap<String, String>) -> bool {
        self.filters
            .get(&Key::Target)
            .is_none_or(|set| set.contains(target))
            && self.matches(labels)
    }

    /// Whether a node's labels match every filter but `target` (which picks targets).
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.filters
            .iter()
            .filter(|(k, _)| **k != Key::Target)
            .all(|(k, vals)| labels.get(k.name()).is_some_and(|v| vals.contains(v)))
    }
}

/// Parse and validate `key=value` selectors against the values the DAG knows.
pub fn parse(args: &[String], built: &Built) -> Result<Selection> {
    let mut known: BTreeMap<Key, BTreeSet<String>> = BTreeMap::new();
    for n in built.dag.nodes() {
        for (k, v) in &n.labels {
            if let Some(key) = Key::parse(k) {
                known.entry(key).or_default().insert(v.clone());
            }
        }
    }
    known
        .entry(Key::Target)
        .or_default()
        .extend(built.targets.iter().map(|t| t.name.clone()));
    let mut sel = Selection::default();
    for a in args {
        let (k, v) = a.split_once('=').ok_or_else(|| {
            Error::user(format!("selector `{a}` is not of the form key=value"))
                .hint(format!("selector keys: {}", key_names()))
        })?;
        let Some(key) = Key::parse(k) else {
            let mut e = Error::user(format!("unknown selector key `{k}` in `{a}`"));
            if let Some(n) = nearest(k, Key::all().into_iter().map(Key::name)) {
                e = e.hint(format!("did you mean `{n}`?"));
            }
            return Err(e.hint(format!("selector keys: {}", key_names())));
        };
        let valid = known.get(&key).cloned().unwrap_or_default();
        let listed = || valid.iter().cloned().collect::<Vec<_>>().join(", ");
        if v.split(',').any(|s| s.trim().is_empty()) {
            return Err(
                Error::user(format!("selector `{a}`: `{k}=` names no value"))
                    .hint(format!("values of `{k}`: {}", listed())),
            );
        }
        for value in v.split(',') {
            // Numbers may be written either way (0.3 / 0.30).
            let canon = canonical_value(key, value, &valid);
            if !valid.contains(&canon) {
                let mut e = Error::user(format!(
                    "selector `{k}={value}` matches nothing in this spec"
                ));
                if let Some(n) = nearest(value, valid.iter().map(|s| s.as_str())) {
                    e = e.hint(format!("did you mean `{k}={n}`?"));
                }
                return Err(e.hint(format!("values of `{k}`: {}", listed())));
            }
            sel.filters.entry(key).or_default().insert(canon);
        }
    }
    Ok(sel)
}

fn canonical_value(key: Key, value: &str, valid: &BTreeSet<String>) -> String {
    if key == Key::Axis(Axis::Corruption) {
        if let Ok(x) = value.parse::<f64>() {
            if let Some(v) = valid.iter().find(|v| v.parse::<f64>().ok() == Some(x)) {
                return v.clone();
            }
        }
    }
    value.to_string()
}

fn ancestors(dag: &Dag, roots: &[usize]) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack = roots.to_vec();
    while let Some(i) = stack.pop() {
        if seen.insert(i) {
            stack.extend(dag.upstream(i));
        }
    }
    seen
}

/// The nodes a selection asks to run (their ancestors come along).
pub fn roots(sel: &Selection, built: &Built) -> Result<Vec<usize>> {
    let targets: Vec<_> = built
        .targets
        .iter()
        .filter(|t| {
            sel.filters
                .get(&Key::Target)
                .is_none_or(|set| set.contains(&t.name))
        })
        .collect();
    let mut out: BTreeSet<usize> = BTreeSet::new();
    if sel.filters.contains_key(&Key::Stage) {
        let allowed = ancestors(
            &built.dag,
            &targets.iter().map(|t| t.node).collect::<Vec<_>>(),
        );
        for i in allowed {
            if sel.matches(&built.dag.node(i).labels) {
                out.insert(i);
            }
        }
    } else if !sel.has_cell_filters() {
        out.extend(targets.iter().map(|t| t.node));
    } else {
        for t in &targets {
            for c in &t.cells {
                if sel.matches(&built.dag.node(c.leaf).labels) {
                    out.insert(c.leaf);
                }
            }
        }
    }
    if out.is_empty() {
        return Err(Error::user("the selection matches no node of this spec")
            .hint("`upcc status SPEC` lists the nodes; combine selectors that share a cell"));
    }
    Ok(out.into_iter().collect())
}
