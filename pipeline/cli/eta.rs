//! Time estimates for the nodes still to compute, from the wall times the store's manifests
//! recorded for comparable nodes: same stage, same dataset, same numerics class (device), the
//! most similar node id first, scaled by the ratio of epochs when both name them.

use serde_json::Value;
use upcc_engine::{Dag, NodeStatus, PlanEntry, Store};

use upcc_model::error::Result;

/// One computed node the store remembers.
struct Past {
    stage: String,
    numerics: String,
    id: String,
    epochs: Option<f64>,
    seconds: f64,
}

/// The recorded computations of a store.
pub struct History {
    past: Vec<Past>,
}

/// The estimate for a set of nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Sum of the estimated node times (seconds of node time, not of wall time when nodes run
    /// side by side).
    pub seconds: f64,
    pub with_basis: usize,
    pub without_basis: usize,
}

/// The first `epochs` number in `params` (depth first, keys in order): the training length.
fn epochs(params: &Value) -> Option<f64> {
    match params {
        Value::Object(m) => {
            if let Some(e) = m.get("epochs").and_then(Value::as_f64) {
                return Some(e);
            }
            m.values().find_map(epochs)
        }
        _ => None,
    }
}

/// `train/mnist5k/lv0.01/probpair/pre/t1` → its dataset segment (`mnist5k`).
fn dataset_of(id: &str) -> Option<&str> {
    id.split('/').nth(1)
}

fn common_segments(a: &str, b: &str) -> usize {
    a.split('/')
        .zip(b.split('/'))
        .take_while(|(x, y)| x == y)
        .count()
}

impl History {
    /// Read every manifest of the store (unreadable ones are skipped: `verify` reports them).
    pub fn read(store: &Store) -> Result<History> {
        let mut past = Vec::new();
        for key in store.list_manifests()? {
            if let Ok(Some(m)) = store.read_manifest_intact(&key) {
                past.push(Past {
                    stage: m.material.stage.clone(),
                    numerics: m.material.numerics.clone(),
                    epochs: epochs(&m.material.params),
                    id: m.node_id,
                    seconds: m.provenance.duration_s,
                });
            }
        }
        Ok(History { past })
    }

    /// The estimated time of node `i` of `dag`, or `None` without a comparable record.
    pub fn node_seconds(&self, dag: &Dag, i: usize) -> Option<f64> {
        let n = dag.node(i);
        let ds = dataset_of(&n.id);
        let best = self
            .past
            .iter()
            .filter(|p| p.stage == n.stage && p.numerics == n.numerics && dataset_of(&p.id) == ds)
            .max_by_key(|p| common_segments(&p.id, &n.id))?;
        let scale = match (epochs(&n.params), best.epochs) {
            (Some(new), Some(old)) if old > 0.0 => new / old,
            _ => 1.0,
        };
        Some(best.seconds * scale)
    }

    /// The estimate for nodes `todo` of `dag`.
    pub fn estimate(&self, dag: &Dag, todo: &[usize]) -> Estimate {
        let mut e = Estimate::default();
        for &i in todo {
            match self.node_seconds(dag, i) {
                Some(s) => {
                    e.seconds += s;
                    e.with_basis += 1;
                }
                None => e.without_basis += 1,
            }
        }
        e
    }
}

/// The estimate for the nodes of `entries` (indices of `dag`) that are not fresh and that the
/// remote cache cannot answer, or for all of them when `all` (a forced rerun); the store's
/// manifests are read only when there is something to estimate.
pub fn estimate(store: &Store, dag: &Dag, entries: &[PlanEntry], all: bool) -> Result<Estimate> {
    let todo: Vec<usize> = (0..entries.len())
        .filter(|&i| all || (entries[i].status != NodeStatus::Fresh && !entries[i].remote))
        .collect();
    if todo.is_empty() {
        return Ok(Estimate::default());
    }
    Ok(History::read(store)?.estimate(dag, &todo))
}

/// `3 h 05 min`, `12 min`, `40 s`.
pub fn human(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, (s % 3600 + 30) / 60)
    } else if s >= 60 {
        format!("{} min", (s + 30) / 60)
    } else {
        format!("{s} s")
    }
}

impl Estimate {
    /// One line for people: what is estimated and on what basis.
    pub fn describe(&self) -> String {
        let todo = self.with_basis + self.without_basis;
        if todo == 0 {
            return "nothing to compute".into();
        }
        if self.with_basis == 0 {
            return format!(
                "no basis for a time estimate of the {todo} nodes to compute yet (no comparable node — same stage, dataset and device class — was computed in this store)"
            );
        }
        let mut s = format!(
            "estimated {} of node time for the {todo} nodes to compute (from the recorded times of comparable nodes",
            human(self.seconds)
        );
        if self.without_basis > 0 {
            s.push_str(&format!(
                "; {} of them {} no basis and {} not counted",
                self.without_basis,
                if self.without_basis == 1 {
                    "has"
                } else {
                    "have"
                },
                if self.without_basis == 1 { "is" } else { "are" }
            ));
        }
        s.push(')');
        s
    }

    pub fn to_json(self) -> Value {
        serde_json::json!({
            "seconds": self.seconds,
            "with_basis": self.with_basis,
            "without_basis": self.without_basis,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_found_depth_first_and_durations_read_humanly() {
        let p = serde_json::json!({"seed": 1, "settings": {"epochs": 40, "lr": 0.001}});
        assert_eq!(epochs(&p), Some(40.0));
        assert_eq!(epochs(&serde_json::json!({"layerwise_epochs": 3})), None);
        assert_eq!(
            dataset_of("train/mnist5k/lv0.01/probpair/pre/t1"),
            Some("mnist5k")
        );
        assert_eq!(common_segments("train/a/b/x", "train/a/b/y"), 3);
        assert_eq!(human(42.4), "42 s");
        assert_eq!(human(125.0), "2 min");
        assert_eq!(human(3.0 * 3600.0 + 5.0 * 60.0), "3 h 05 min");
    }
}
