//! `ensemble`: the expert-aware ensembles SP-EA and WPP-EA (Appendix C.4) and hyperparameter
//! selection by validation accuracy.
//!
//! E members (one per expert, member e weighting other experts' pair terms by α) each give a
//! hard partition; the consensus is hierarchical clustering of D = 1 − A, A the members'
//! co-association matrix. No n×n matrix is built: points with the same tuple of member labels
//! are at distance 0 and always merge first, so the distinct tuples are clustered, weighted by
//! how many points share them (RCV1-10 has 142k points but few distinct tuples). The
//! agglomeration is the generic algorithm with nearest-neighbour lists and Lance–Williams
//! updates; ties are broken by the smallest point index in each cluster, so the result does not
//! depend on how points are grouped into tuples.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::check::{Check, Checker, Problem};
use crate::error::{Result, StageError};

pub const VERSION: u32 = 1;

/// How the distance between merged clusters is computed (the paper does not say: FIDELITY.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Linkage {
    /// Size-weighted mean distance (UPGMA).
    #[default]
    Average,
    Single,
    Complete,
}

/// The ensembles' settings (section `ensemble`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnsembleSettings {
    /// The α grid searched by validation ACC.
    pub alphas: Vec<f64>,
    /// A fixed α instead of the search.
    pub alpha: Option<f64>,
    /// Validation runs per α (trial seeds 1..=search_runs).
    pub search_runs: usize,
    pub linkage: Linkage,
    /// Refuse consensus problems with more distinct member-label tuples than this (memory:
    /// 8 bytes per pair of tuples).
    pub max_tuples: usize,
    /// Multi-expert settings share the α selected under this supervision setting when the spec
    /// defines it (Table 6's caption: shared; App. C.4's text: per configuration, `null`).
    pub shared_multi: Option<String>,
    /// Where the α search runs: once per dataset and setting at the spec's main constraint
    /// budget and corruption, reused by every budget and corruption (the paper's Table 6), or
    /// again in every cell.
    pub search_scope: SearchScope,
}

/// Where a hyperparameter search runs (VolMaxDCC's λ, the ensembles' α).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchScope {
    /// Once per dataset and supervision setting, at the main setting (the spec's
    /// `constraints.budget` and `constraints.corruption`: 9k and π = 0.3 in the paper), its
    /// choice used by every cell of that setting at any budget or corruption.
    #[default]
    Setting,
    /// Again in every cell, at the cell's own budget and corruption.
    Cell,
}

impl Default for EnsembleSettings {
    fn default() -> Self {
        EnsembleSettings {
            alphas: vec![0.0, 0.01, 0.05, 0.1, 0.5, 1.0],
            alpha: None,
            search_runs: 3,
            linkage: Linkage::Average,
            max_tuples: 40_000,
            shared_multi: Some("multi3".into()),
            search_scope: SearchScope::Setting,
        }
    }
}

impl Check for EnsembleSettings {
    fn check(&self) -> Vec<Problem> {
        let mut c = Checker::new();
        if self.alpha.is_none() && self.alphas.is_empty() {
            c.push("alphas", "needs at least one α to search (or set `alpha`)");
        }
        for (i, a) in self.alphas.iter().enumerate() {
            c.in_range(&format!("alphas[{i}]"), *a, 0.0, 1.0, true);
        }
        if let Some(a) = self.alpha {
            c.in_range("alpha", a, 0.0, 1.0, true);
        }
        c.at_least("search_runs", self.search_runs, 1);
        c.at_least("max_tuples", self.max_tuples, 2);
        c.done()
    }
}

/// Clusters of one agglomeration: every point's cluster (0..k, numbered by first appearance).
pub fn consensus(
    members: &[Vec<u32>],
    k: usize,
    linkage: Linkage,
    max_tuples: usize,
) -> Result<Vec<u32>> {
    let e = members.len();
    if e == 0 {
        return Err(StageError::input("an ensemble needs at least one member"));
    }
    let n = members[0].len();
    if members.iter().any(|m| m.len() != n) {
        return Err(StageError::failed(
            "ensemble members disagree on the number of points",
        ));
    }
    // Distinct tuples, in order of first appearance; rep = the smallest point index.
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    let mut tuples: Vec<Vec<u32>> = Vec::new();
    let mut counts: Vec<f64> = Vec::new();
    let mut reps: Vec<usize> = Vec::new();
    let mut of_point = Vec::with_capacity(n);
    for p in 0..n {
        let t: Vec<u32> = members.iter().map(|m| m[p]).collect();
        let id = *index.entry(t.clone()).or_insert_with(|| {
            tuples.push(t);
            counts.push(0.0);
            reps.push(p);
            tuples.len() - 1
        });
        counts[id] += 1.0;
        of_point.push(id);
    }
    let m = tuples.len();
    if m > max_tuples {
        return Err(StageError::input(format!(
            "the ensemble's members give {m} distinct label tuples, more than `ensemble.max_tuples` ({max_tuples}); raise it if the memory allows ({} bytes)",
            m * m * 4
        )));
    }
    // D = 1 − A scaled by E: the number of members that disagree (an integer, so that
    // average linkage's sums stay exact).
    let dist =
        |a: &[u32], b: &[u32]| -> f64 { a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 };
    let mut d = Condensed::new(m, |i, j| dist(&tuples[i], &tuples[j]));
    let labels_of_tuples = agglomerate(&mut d, &counts, &reps, k, linkage);
    Ok(renumber(
        &of_point
            .iter()
            .map(|&t| labels_of_tuples[t])
            .collect::<Vec<_>>(),
    ))
}

/// Number clusters 0, 1, … by first appearance.
pub fn renumber(labels: &[u32]) -> Vec<u32> {
    let mut map: HashMap<u32, u32> = HashMap::new();
    labels
        .iter()
        .map(|&l| {
            let next = map.len() as u32;
            *map.entry(l).or_insert(next)
        })
        .collect()
}

/// A symmetric distance matrix without its diagonal.
pub struct Condensed {
    n: usize,
    v: Vec<f64>,
}

impl Condensed {
    pub fn new(n: usize, f: impl Fn(usize, usize) -> f64) -> Self {
        let mut v = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for i in 0..n {
            for j in i + 1..n {
                v.push(f(i, j));
            }
        }
        Condensed { n, v }
    }

    fn idx(&self, i: usize, j: usize) -> usize {
        let (a, b) = if i < j { (i, j) } else { (j, i) };
        a * self.n - a * (a + 1) / 2 + (b - a - 1)
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.v[self.idx(i, j)]
    }

    fn set(&mut self, i: usize, j: usize, x: f64) {
        let k = self.idx(i, j);
        self.v[k] = x;
    }
}

/// Agglomerate `d.n` weighted singletons (sizes `w`, tie-break representatives `rep`) down to
/// `k` clusters; returns each singleton's cluster id. Pairs are ordered by (distance, smaller
/// rep, larger rep), so equal distances merge in a representation-independent order. Average
/// linkage keeps sums of pairwise distances (exact for integer distances) and divides when it
/// compares, so grouping equal points beforehand gives the very same merges.
/// A candidate merge: its linkage distance and the two representatives (the tie-break).
type PairKey = (f64, usize, usize);
/// A cluster's nearest neighbour and the pair's key.
type Nearest = Option<(usize, PairKey)>;

#[allow(clippy::needless_range_loop)]
pub fn agglomerate(
    d: &mut Condensed,
    w: &[f64],
    rep: &[usize],
    k: usize,
    linkage: Linkage,
) -> Vec<u32> {
    let m = d.n;
    let mut size = w.to_vec();
    if linkage == Linkage::Average {
        for i in 0..m {
            for j in i + 1..m {
                let v = d.get(i, j) * w[i] * w[j];
                d.set(i, j, v);
            }
        }
    }
    let avg = linkage == Linkage::Average;
    let mut rep = rep.to_vec();
    let mut active = vec![true; m];
    let mut parent: Vec<usize> = (0..m).collect();
    let key = |dd: f64, a: usize, b: usize| (dd, a.min(b), a.max(b));
    let less = |x: PairKey, y: PairKey| x.0 < y.0 || (x.0 == y.0 && (x.1, x.2) < (y.1, y.2));
    // The linkage distance between clusters i and j.
    let dist = |d: &Condensed, size: &[f64], i: usize, j: usize| -> f64 {
        if avg {
            d.get(i, j) / (size[i] * size[j])
        } else {
            d.get(i, j)
        }
    };
    // Nearest neighbour of each active cluster (among active clusters).
    let nn_of =
        |i: usize, d: &Condensed, active: &[bool], rep: &[usize], size: &[f64]| -> Nearest {
            let mut best: Nearest = None;
            for j in 0..d.n {
                if j == i || !active[j] {
                    continue;
                }
                let kk = key(dist(d, size, i, j), rep[i], rep[j]);
                if best.is_none_or(|(_, b)| less(kk, b)) {
                    best = Some((j, kk));
                }
            }
            best
        };
    let mut nn: Vec<Nearest> = (0..m).map(|i| nn_of(i, d, &active, &rep, &size)).collect();
    let mut clusters = m;
    while clusters > k.max(1) {
        // The globally closest pair.
        let mut best: Option<(usize, usize, PairKey)> = None;
        for i in 0..m {
            if !active[i] {
                continue;
            }
            if let Some((j, kk)) = nn[i] {
                if best.is_none_or(|(_, _, b)| less(kk, b)) {
                    best = Some((i, j, kk));
                }
            }
        }
        let Some((i, j, _)) = best else { break };
        // Merge j into i (keep the one with the smaller representative as the survivor).
        let (keep, gone) = if rep[i] <= rep[j] { (i, j) } else { (j, i) };
        for l in 0..m {
            if !active[l] || l == keep || l == gone {
                continue;
            }
            let (a, b) = (d.get(keep, l), d.get(gone, l));
            let nd = match linkage {
                // Sums of pairwise distances add up.
                Linkage::Average => a + b,
                Linkage::Single => a.min(b),
                Linkage::Complete => a.max(b),
            };
            d.set(keep, l, nd);
        }
        size[keep] += size[gone];
        rep[keep] = rep[keep].min(rep[gone]);
        active[gone] = false;
        parent[gone] = keep;
        clusters -= 1;
        // Refresh the nearest neighbours that may have changed.
        for l in 0..m {
            if !active[l] {
                continue;
            }
            let stale = l == keep
                || matches!(nn[l], Some((t, _)) if t == keep || t == gone)
                || linkage != Linkage::Single;
            if stale {
                nn[l] = nn_of(l, d, &active, &rep, &size);
            } else if let Some((_, cur)) = nn[l] {
                // Single linkage only shrinks distances to the merged cluster.
                let kk = key(dist(d, &size, l, keep), rep[l], rep[keep]);
                if less(kk, cur) {
                    nn[l] = Some((keep, kk));
                }
            }
        }
    }
    let find = |mut x: usize, parent: &[usize]| {
        while parent[x] != x {
            x = parent[x];
        }
        x
    };
    renumber(&(0..m).map(|i| find(i, &parent) as u32).collect::<Vec<_>>())
}

/// The grid value with the highest mean validation accuracy over its runs (ties: the earlier
/// grid value). `runs[i]` are the accuracies of grid value i.
pub fn select_best(runs: &[Vec<f64>]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, r) in runs.iter().enumerate() {
        if r.is_empty() {
            continue;
        }
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        // Means equal up to rounding are ties.
        if best.is_none_or(|(_, b)| mean > b + 1e-12) {
            best = Some((i, mean));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use upcc_nn::Stream;

    /// Brute force: every point its own singleton (n×n), then the same agglomeration.
    fn brute(members: &[Vec<u32>], k: usize, linkage: Linkage) -> Vec<u32> {
        let n = members[0].len();
        let mut d = Condensed::new(n, |i, j| {
            members.iter().filter(|m| m[i] != m[j]).count() as f64
        });
        let w = vec![1.0; n];
        let rep: Vec<usize> = (0..n).collect();
        agglomerate(&mut d, &w, &rep, k, linkage)
    }

    fn random_members(n: usize, e: usize, k: u32, seed: u64) -> Vec<Vec<u32>> {
        let mut rng = Stream::new(seed, &["members"]);
        // Members agreeing on a hidden partition with some noise.
        let truth: Vec<u32> = (0..n).map(|_| rng.below(k as u64) as u32).collect();
        (0..e)
            .map(|_| {
                truth
                    .iter()
                    .map(|&t| {
                        if rng.uniform() < 0.2 {
                            rng.below(k as u64) as u32
                        } else {
                            t
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn tuple_weighted_consensus_equals_the_brute_force_n_by_n_one() {
        for linkage in [Linkage::Single, Linkage::Complete, Linkage::Average] {
            for seed in 0..6 {
                let members = random_members(120, 3, 4, seed);
                let fast = consensus(&members, 4, linkage, 10_000).unwrap();
                let slow = brute(&members, 4, linkage);
                assert_eq!(fast, slow, "{linkage:?}, seed {seed}");
            }
        }
    }

    #[test]
    fn brute_force_agglomeration_matches_kodama_on_points_without_ties() {
        let mut rng = Stream::new(3, &["points"]);
        let n = 40;
        let pts: Vec<(f64, f64)> = (0..n).map(|_| (rng.normal(), rng.normal())).collect();
        let dist = |i: usize, j: usize| {
            ((pts[i].0 - pts[j].0).powi(2) + (pts[i].1 - pts[j].1).powi(2)).sqrt()
        };
        for (linkage, method) in [
            (Linkage::Average, kodama::Method::Average),
            (Linkage::Single, kodama::Method::Single),
            (Linkage::Complete, kodama::Method::Complete),
        ] {
            for k in [2, 3, 5] {
                let mut d = Condensed::new(n, dist);
                let ours = agglomerate(
                    &mut d,
                    &vec![1.0; n],
                    &(0..n).collect::<Vec<_>>(),
                    k,
                    linkage,
                );
                let mut cond = Condensed::new(n, dist).v;
                let dend = kodama::linkage(&mut cond, n, method);
                // Cut kodama's dendrogram after n − k merges.
                let mut parent: Vec<usize> = (0..2 * n).collect();
                fn find(p: &mut [usize], x: usize) -> usize {
                    let mut r = x;
                    while p[r] != r {
                        r = p[r];
                    }
                    r
                }
                for (s, step) in dend.steps().iter().take(n - k).enumerate() {
                    let (a, b) = (
                        find(&mut parent, step.cluster1),
                        find(&mut parent, step.cluster2),
                    );
                    parent[a] = n + s;
                    parent[b] = n + s;
                }
                let theirs = renumber(
                    &(0..n)
                        .map(|i| find(&mut parent, i) as u32)
                        .collect::<Vec<_>>(),
                );
                assert_eq!(ours, theirs, "{linkage:?}, k = {k}");
            }
        }
    }

    #[test]
    fn identical_members_reproduce_their_partition() {
        let part = vec![0, 0, 1, 1, 2, 2, 0];
        let members = vec![part.clone(), part.clone(), part.clone()];
        assert_eq!(
            consensus(&members, 3, Linkage::Average, 100).unwrap(),
            renumber(&part)
        );
        assert!(
            consensus(&members, 3, Linkage::Average, 2).is_err(),
            "too many tuples"
        );
    }

    #[test]
    fn selection_takes_the_best_mean_and_the_earlier_on_ties() {
        let runs = vec![vec![0.5, 0.7], vec![0.65, 0.55, 0.6], vec![0.6, 0.6]];
        // Means 0.6, 0.6, 0.6: the first.
        assert_eq!(select_best(&runs).map(|b| b.0), Some(0));
        let runs = vec![vec![0.5], vec![0.9, 0.7], vec![]];
        assert_eq!(select_best(&runs), Some((1, 0.8)));
        assert_eq!(select_best(&[]), None);
    }
}
