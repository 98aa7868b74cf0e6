//! `metrics`: clustering accuracy (Hungarian matching), NMI (arithmetic and geometric
//! normalisation, both stored; the tables name which one they show) and ARI.

use serde::{Deserialize, Serialize};

use crate::cluster::Assignments;
use crate::error::Result;
use crate::table::{Table, TableBuilder};

/// 2: each row carries what identifies the result (cell coordinates, training parameters).
pub const VERSION: u32 = 2;

/// A value that identifies a result (a cell coordinate or a training parameter): one column
/// of its metrics table, repeated on every split's row.
#[derive(Clone, Debug, PartialEq)]
pub enum Ident {
    Str(String),
    Bool(bool),
    Int(i64),
    Float(f64),
}

/// The scores of one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub split: String,
    pub n: u32,
    pub acc: f64,
    pub nmi_arithmetic: f64,
    pub nmi_geometric: f64,
    pub ari: f64,
}

fn contingency(truth: &[u32], pred: &[u32]) -> (Vec<Vec<u64>>, usize, usize) {
    let r = truth
        .iter()
        .copied()
        .max()
        .map(|m| m as usize + 1)
        .unwrap_or(0);
    let c = pred
        .iter()
        .copied()
        .max()
        .map(|m| m as usize + 1)
        .unwrap_or(0);
    let mut table = vec![vec![0u64; c]; r];
    for (&t, &p) in truth.iter().zip(pred) {
        table[t as usize][p as usize] += 1;
    }
    (table, r, c)
}

/// Minimum-cost perfect assignment on an n×n integer cost matrix (Hungarian algorithm with
/// potentials, O(n³)); returns `col_of_row`.
pub fn hungarian(cost: &[Vec<i64>]) -> Vec<usize> {
    let n = cost.len();
    let inf = i64::MAX / 4;
    let (mut u, mut v) = (vec![0i64; n + 1], vec![0i64; n + 1]);
    let mut p = vec![0usize; n + 1];
    let mut way = vec![0usize; n + 1];
    for i in 1..=n {
        p[0] = i;
        let mut j0 = 0;
        let mut minv = vec![inf; n + 1];
        let mut used = vec![false; n + 1];
        loop {
            used[j0] = true;
            let i0 = p[j0];
            let mut delta = inf;
            let mut j1 = 0;
            for j in 1..=n {
                if !used[j] {
                    let cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
                    if cur < minv[j] {
                        minv[j] = cur;
                        way[j] = j0;
                    }
                    if minv[j] < delta {
                        delta = minv[j];
                        j1 = j;
                    }
                }
            }
            for j in 0..=n {
                if used[j] {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if p[j0] == 0 {
                break;
            }
        }
        loop {
            let j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    let mut col_of_row = vec![0; n];
    for j in 1..=n {
        if p[j] > 0 {
            col_of_row[p[j] - 1] = j - 1;
        }
    }
    col_of_row
}

/// Accuracy under the best one-to-one matching of clusters to classes.
pub fn accuracy(truth: &[u32], pred: &[u32]) -> f64 {
    if truth.is_empty() {
        return f64::NAN;
    }
    let (table, r, c) = contingency(truth, pred);
    let n = r.max(c);
    let max = table.iter().flatten().copied().max().unwrap_or(0) as i64;
    // Cost[pred][true] = max − count, as the reference `acc()`.
    let cost: Vec<Vec<i64>> = (0..n)
        .map(|p| {
            (0..n)
                .map(|t| {
                    max - if t < r && p < c {
                        table[t][p] as i64
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect();
    let assign = hungarian(&cost);
    let matched: u64 = assign
        .iter()
        .enumerate()
        .map(|(p, &t)| if t < r && p < c { table[t][p] } else { 0 })
        .sum();
    matched as f64 / truth.len() as f64
}

fn entropy(counts: &[u64], n: f64) -> f64 {
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum()
}

/// (arithmetic, geometric) normalised mutual information.
pub fn nmi(truth: &[u32], pred: &[u32]) -> (f64, f64) {
    let (table, r, c) = contingency(truth, pred);
    let n = truth.len() as f64;
    let rows: Vec<u64> = (0..r).map(|i| table[i].iter().sum()).collect();
    let cols: Vec<u64> = (0..c).map(|j| (0..r).map(|i| table[i][j]).sum()).collect();
    let (ht, hp) = (entropy(&rows, n), entropy(&cols, n));
    let mut mi = 0.0;
    for i in 0..r {
        for j in 0..c {
            let nij = table[i][j] as f64;
            if nij > 0.0 {
                mi += nij / n * (nij * n / (rows[i] as f64 * cols[j] as f64)).ln();
            }
        }
    }
    // scikit-learn's conventions for degenerate labelings.
    if (ht == 0.0 && hp == 0.0)
        || rows.iter().filter(|&&x| x > 0).count() == 1
            && cols.iter().filter(|&&x| x > 0).count() == 1
    {
        return (1.0, 1.0);
    }
    let mi = mi.max(0.0);
    let ar = (ht + hp) / 2.0;
    let ge = (ht * hp).sqrt();
    (
        if ar > 0.0 { mi / ar } else { 0.0 },
        if ge > 0.0 { mi / ge } else { 0.0 },
    )
}

/// Adjusted Rand index.
pub fn ari(truth: &[u32], pred: &[u32]) -> f64 {
    let (table, r, c) = contingency(truth, pred);
    let comb2 = |x: u64| (x as f64) * (x as f64 - 1.0) / 2.0;
    let n = truth.len() as u64;
    let sum_ij: f64 = table.iter().flatten().map(|&x| comb2(x)).sum();
    let a: f64 = (0..r).map(|i| comb2(table[i].iter().sum())).sum();
    let b: f64 = (0..c)
        .map(|j| comb2((0..r).map(|i| table[i][j]).sum()))
        .sum();
    let total = comb2(n);
    let expected = a * b / total;
    let max = (a + b) / 2.0;
    if max == expected {
        return 1.0;
    }
    (sum_ij - expected) / (max - expected)
}

pub fn scores(split: &str, truth: &[u32], pred: &[u32]) -> Scores {
    let (nmi_arithmetic, nmi_geometric) = nmi(truth, pred);
    Scores {
        split: split.to_string(),
        n: truth.len() as u32,
        acc: accuracy(truth, pred),
        nmi_arithmetic,
        nmi_geometric,
        ari: ari(truth, pred),
    }
}

/// Train and test scores of assignments (and validation scores when there is a validation
/// split).
pub fn run(a: &Assignments) -> Vec<Scores> {
    let is_val = |i: usize| a.is_val.get(i).copied().unwrap_or(false);
    let has_val = (0..a.label.len()).any(is_val);
    let splits: &[&str] = if has_val {
        &["train", "test", "val"]
    } else {
        &["train", "test"]
    };
    splits
        .iter()
        .map(|&split| {
            let (t, p): (Vec<u32>, Vec<u32>) = (0..a.label.len())
                .filter(|&i| match split {
                    "test" => a.is_test[i],
                    "val" => is_val(i),
                    _ => !a.is_test[i] && !is_val(i),
                })
                .map(|i| (a.label[i], a.cluster[i]))
                .unzip();
            scores(split, &t, &p)
        })
        .collect()
}

pub fn to_parquet(s: &[Scores]) -> Result<Vec<u8>> {
    to_parquet_identified(s, &[])
}

/// The scores, one row per split, each row first carrying the columns of `ident` (so that a
/// metrics table read on its own, or many of them concatenated, says which result it is).
pub fn to_parquet_identified(s: &[Scores], ident: &[(String, Ident)]) -> Result<Vec<u8>> {
    let rows = s.len();
    let mut b = TableBuilder::new();
    for (name, v) in ident {
        b = match v {
            Ident::Str(x) => b.str(name, vec![x.clone(); rows]),
            Ident::Bool(x) => b.bool(name, vec![*x; rows]),
            Ident::Int(x) => b.i64(name, vec![*x; rows]),
            Ident::Float(x) => b.f64(name, vec![*x; rows]),
        };
    }
    b.str("split", s.iter().map(|x| x.split.clone()).collect())
        .u32("n", s.iter().map(|x| x.n).collect())
        .f64("acc", s.iter().map(|x| x.acc).collect())
        .f64(
            "nmi_arithmetic",
            s.iter().map(|x| x.nmi_arithmetic).collect(),
        )
        .f64("nmi_geometric", s.iter().map(|x| x.nmi_geometric).collect())
        .f64("ari", s.iter().map(|x| x.ari).collect())
        .to_parquet()
}

pub fn from_parquet(bytes: &[u8]) -> Result<Vec<Scores>> {
    let t = Table::from_parquet(bytes, "metrics table")?;
    let (split, n, acc, na, ng, ar) = (
        t.str("split")?,
        t.u32("n")?,
        t.f64("acc")?,
        t.f64("nmi_arithmetic")?,
        t.f64("nmi_geometric")?,
        t.f64("ari")?,
    );
    Ok((0..split.len())
        .map(|i| Scores {
            split: split[i].clone(),
            n: n[i],
            acc: acc[i],
            nmi_arithmetic: na[i],
            nmi_geometric: ng[i],
            ari: ar[i],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_and_relabelled_clusterings_score_one() {
        let t = [0, 0, 1, 1, 2, 2];
        let p = [2, 2, 0, 0, 1, 1];
        assert_eq!(accuracy(&t, &p), 1.0);
        let (a, g) = nmi(&t, &p);
        assert!((a - 1.0).abs() < 1e-12 && (g - 1.0).abs() < 1e-12);
        assert!((ari(&t, &p) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn hand_computed_case() {
        // truth: 0 0 0 1 1 1; pred: 0 0 1 1 1 1.
        let t = [0, 0, 0, 1, 1, 1];
        let p = [0, 0, 1, 1, 1, 1];
        // Best matching: 0→0 (2 hits), 1→1 (3 hits) → 5/6.
        assert!((accuracy(&t, &p) - 5.0 / 6.0).abs() < 1e-12);
        // Contingency [[2,1],[0,3]]; H(t) = ln 2, H(p) = −(1/3 ln 1/3 + 2/3 ln 2/3),
        // MI = 1/3 ln 2 + 1/6 ln(1/2) + 1/2 ln(3/2) = 0.318257.
        let ht = 2f64.ln();
        let hp = -(1.0 / 3.0 * (1.0f64 / 3.0).ln() + 2.0 / 3.0 * (2.0f64 / 3.0).ln());
        let mi = 1.0 / 3.0 * 2f64.ln() + 1.0 / 6.0 * (0.5f64).ln() + 0.5 * (1.5f64).ln();
        let (a, g) = nmi(&t, &p);
        assert!((a - mi / ((ht + hp) / 2.0)).abs() < 1e-12);
        assert!((g - mi / (ht * hp).sqrt()).abs() < 1e-12);
        assert!((a - 0.478_70).abs() < 1e-4, "{a}");
        // ARI: sum C(nij,2) = 1 + 3 = 4; a = 3 + 3 = 6; b = 1 + 6 = 7; C(6,2) = 15;
        // expected = 42/15 = 2.8; max = 6.5 → (4 − 2.8)/(6.5 − 2.8) = 0.3243.
        assert!((ari(&t, &p) - 1.2 / 3.7).abs() < 1e-12);
    }

    #[test]
    fn degenerate_and_independent_labelings() {
        // One cluster for everything: NMI 0, ARI 0.
        let t = [0, 1, 0, 1];
        let p = [0, 0, 0, 0];
        assert_eq!(nmi(&t, &p), (0.0, 0.0));
        assert!(ari(&t, &p).abs() < 1e-12);
        assert!((accuracy(&t, &p) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn hungarian_finds_the_minimum() {
        let cost = vec![vec![4, 1, 3], vec![2, 0, 5], vec![3, 2, 2]];
        let a = hungarian(&cost);
        let total: i64 = a.iter().enumerate().map(|(i, &j)| cost[i][j]).sum();
        assert_eq!(total, 5);
    }

    #[test]
    fn more_clusters_than_classes_are_matched_partially() {
        let t = [0, 0, 1, 1];
        let p = [0, 1, 2, 2];
        assert!((accuracy(&t, &p) - 0.75).abs() < 1e-12);
    }
}
