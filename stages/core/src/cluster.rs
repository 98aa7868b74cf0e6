//! `cluster`: k-means on the normalised training embeddings; test points go to the nearest
//! centroid (Algorithm 1, stage III).
//!
//! Written here rather than taken from a crate: the seeding must follow our per-stage random
//! streams, the stopping rule must be scikit-learn's (tolerance scaled by the mean feature
//! variance) and accumulation is in f64 in a fixed order so results are bit-reproducible.

use serde::{Deserialize, Serialize};
use upcc_nn::Stream;

use crate::error::{Result, StageError};
use crate::table::{Table, TableBuilder};

pub const VERSION: u32 = 1;

/// How points are labelled once centroids are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Assign {
    /// Train: the k-means labels; test: nearest centroid (the paper's Algorithm 1).
    Nearest,
    /// Train and test: argmax cosine to the centroids (the SpherePair code).
    Cosine,
}

/// The most k-means starts a spec may ask for.
pub const MAX_N_INIT: usize = 10_000;

/// What a spec may set for clustering (defaults: the SpherePair code's k-means).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// Number of k-means++ initialisations; the lowest inertia wins.
    pub n_init: usize,
    pub max_iter: usize,
    /// Relative tolerance (scikit-learn semantics).
    pub tol: f64,
    pub assign: Assign,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            n_init: 50,
            max_iter: 300,
            tol: 1e-4,
            assign: Assign::Nearest,
        }
    }
}

impl crate::check::Check for ClusterSettings {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.at_least("n_init", self.n_init, 1);
        if self.n_init > MAX_N_INIT {
            c.push(
                "n_init",
                format!(
                    "is {}; at most {MAX_N_INIT} k-means starts (the paper's code uses 50; more changes nothing but the time)",
                    self.n_init
                ),
            );
        }
        c.at_least("max_iter", self.max_iter, 1);
        c.non_negative("tol", self.tol);
        c.done()
    }
}

/// Parameters of one clustering node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClusterParams {
    pub settings: ClusterSettings,
    /// Number of clusters; 0 means the dataset's number of classes.
    pub k: usize,
    pub seed: u64,
}

/// Result of k-means.
#[derive(Clone, Debug)]
pub struct KMeans {
    pub centroids: Vec<f64>,
    pub labels: Vec<u32>,
    pub inertia: f64,
    pub iterations: usize,
}

fn sqdist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// k-means++ seeding (greedy, 2 + ⌊ln k⌋ local trials, as scikit-learn).
fn kmeans_pp(x: &[f64], dim: usize, k: usize, rng: &mut Stream) -> Vec<f64> {
    let n = x.len() / dim;
    let row = |i: usize| &x[i * dim..(i + 1) * dim];
    let trials = 2 + (k as f64).ln().floor() as usize;
    let mut centers = Vec::with_capacity(k * dim);
    let first = rng.below(n as u64) as usize;
    centers.extend_from_slice(row(first));
    let mut closest: Vec<f64> = (0..n).map(|i| sqdist(row(i), row(first))).collect();
    let mut pot: f64 = closest.iter().sum();
    for _ in 1..k {
        let mut best: Option<(f64, usize, Vec<f64>)> = None;
        for _ in 0..trials {
            let r = rng.uniform() * pot;
            let mut acc = 0.0;
            let mut cand = n - 1;
            for (i, &d) in closest.iter().enumerate() {
                acc += d;
                if acc > r {
                    cand = i;
                    break;
                }
            }
            let new_closest: Vec<f64> = (0..n)
                .map(|i| closest[i].min(sqdist(row(i), row(cand))))
                .collect();
            let new_pot: f64 = new_closest.iter().sum();
            if best.as_ref().is_none_or(|b| new_pot < b.0) {
                best = Some((new_pot, cand, new_closest));
            }
        }
        let (p, c, cl) = best.expect("at least one trial");
        centers.extend_from_slice(row(c));
        closest = cl;
        pot = p;
    }
    centers
}

fn assign_nearest(x: &[f64], dim: usize, centers: &[f64]) -> (Vec<u32>, f64) {
    let k = centers.len() / dim;
    let mut inertia = 0.0;
    let labels = x
        .chunks(dim)
        .map(|p| {
            let (mut best, mut bd) = (0, f64::INFINITY);
            for c in 0..k {
                let d = sqdist(p, &centers[c * dim..(c + 1) * dim]);
                if d < bd {
                    bd = d;
                    best = c;
                }
            }
            inertia += bd;
            best as u32
        })
        .collect();
    (labels, inertia)
}

/// Lloyd's algorithm from one k-means++ seeding.
fn lloyd(x: &[f64], dim: usize, k: usize, max_iter: usize, tol: f64, rng: &mut Stream) -> KMeans {
    let n = x.len() / dim;
    let mut centers = kmeans_pp(x, dim, k, rng);
    let mut labels = vec![u32::MAX; n];
    let mut iterations = 0;
    for it in 0..max_iter {
        iterations = it + 1;
        let (new_labels, _) = assign_nearest(x, dim, &centers);
        let mut sums = vec![0f64; k * dim];
        let mut counts = vec![0usize; k];
        for (i, &l) in new_labels.iter().enumerate() {
            counts[l as usize] += 1;
            for (s, v) in sums[l as usize * dim..(l as usize + 1) * dim]
                .iter_mut()
                .zip(&x[i * dim..(i + 1) * dim])
            {
                *s += v;
            }
        }
        let mut new_centers = centers.clone();
        for c in 0..k {
            if counts[c] > 0 {
                for j in 0..dim {
                    new_centers[c * dim + j] = sums[c * dim + j] / counts[c] as f64;
                }
            } else {
                // Empty cluster: move it to the point farthest from its centroid.
                let far = (0..n)
                    .max_by(|&a, &b| {
                        let da = sqdist(
                            &x[a * dim..(a + 1) * dim],
                            &centers
                                [new_labels[a] as usize * dim..(new_labels[a] as usize + 1) * dim],
                        );
                        let db = sqdist(
                            &x[b * dim..(b + 1) * dim],
                            &centers
                                [new_labels[b] as usize * dim..(new_labels[b] as usize + 1) * dim],
                        );
                        da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Equal)
                    })
                    .expect("n > 0");
                new_centers[c * dim..(c + 1) * dim].copy_from_slice(&x[far * dim..(far + 1) * dim]);
            }
        }
        let shift: f64 = (0..k)
            .map(|c| {
                sqdist(
                    &centers[c * dim..(c + 1) * dim],
                    &new_centers[c * dim..(c + 1) * dim],
                )
            })
            .sum();
        let converged = new_labels == labels;
        centers = new_centers;
        labels = new_labels;
        if converged || shift <= tol {
            break;
        }
    }
    // Final E-step so labels match the returned centroids.
    let (labels, inertia) = assign_nearest(x, dim, &centers);
    KMeans {
        centroids: centers,
        labels,
        inertia,
        iterations,
    }
}

/// k-means with `n_init` k-means++ starts on rows of `x` (row-major, `dim` wide).
pub fn kmeans(x: &[f32], dim: usize, k: usize, params: &ClusterParams) -> Result<KMeans> {
    let n = x.len() / dim.max(1);
    if k == 0 || n < k {
        return Err(StageError::input(format!(
            "k-means needs at least k = {k} points, got {n}"
        )));
    }
    let s = &params.settings;
    crate::check::require("cluster", crate::check::Check::check(s))?;
    let xf: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    if xf.iter().any(|v| !v.is_finite()) {
        return Err(StageError::failed(
            "embeddings contain non-finite values (training diverged)",
        ));
    }
    // scikit-learn: tolerance relative to the mean per-feature variance.
    let mut var_sum = 0.0;
    for j in 0..dim {
        let mean = (0..n).map(|i| xf[i * dim + j]).sum::<f64>() / n as f64;
        var_sum += (0..n)
            .map(|i| (xf[i * dim + j] - mean).powi(2))
            .sum::<f64>()
            / n as f64;
    }
    let tol = s.tol * var_sum / dim as f64;
    // Independent starts run in parallel; the winner is the lowest inertia, ties to the
    // earliest start, so the result does not depend on the number of threads.
    use rayon::prelude::*;
    // Only the inertias are kept (a start's labels are as large as the data): the winner is
    // computed once more from its own random stream, which gives it bit for bit.
    let start = |run: usize| {
        let mut rng = Stream::new(params.seed, &["cluster", "kmeans", &run.to_string()]);
        lloyd(&xf, dim, k, s.max_iter, tol, &mut rng)
    };
    let inertias: Vec<f64> = (0..s.n_init)
        .into_par_iter()
        .map(|run| start(run).inertia)
        .collect();
    let mut best = 0;
    for (i, r) in inertias.iter().enumerate() {
        if *r < inertias[best] {
            best = i;
        }
    }
    Ok(start(best))
}

/// Labels of `x` by the chosen assignment rule.
pub fn assign(x: &[f32], dim: usize, centroids: &[f64], rule: Assign) -> Vec<u32> {
    let xf: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    match rule {
        Assign::Nearest => assign_nearest(&xf, dim, centroids).0,
        Assign::Cosine => {
            let k = centroids.len() / dim;
            let norms: Vec<f64> = (0..k)
                .map(|c| {
                    centroids[c * dim..(c + 1) * dim]
                        .iter()
                        .map(|v| v * v)
                        .sum::<f64>()
                        .sqrt()
                        .max(1e-12)
                })
                .collect();
            xf.chunks(dim)
                .map(|p| {
                    let pn = p.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
                    let mut best = (0, f64::NEG_INFINITY);
                    for c in 0..k {
                        let cos = p
                            .iter()
                            .zip(&centroids[c * dim..(c + 1) * dim])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (pn * norms[c]);
                        if cos > best.1 {
                            best = (c, cos);
                        }
                    }
                    best.0 as u32
                })
                .collect()
        }
    }
}

/// Cluster assignments of every instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignments {
    pub ids: Vec<u32>,
    pub is_test: Vec<bool>,
    /// Validation rows (empty or all false without a validation split).
    pub is_val: Vec<bool>,
    pub label: Vec<u32>,
    pub cluster: Vec<u32>,
}

impl Assignments {
    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        TableBuilder::new()
            .u32("id", self.ids.clone())
            .split3("split", &self.is_test, &self.is_val)
            .u32("label", self.label.clone())
            .u32("cluster", self.cluster.clone())
            .to_parquet()
    }

    pub fn from_parquet(bytes: &[u8]) -> Result<Assignments> {
        let t = Table::from_parquet(bytes, "assignments table")?;
        Ok(Assignments {
            ids: t.u32("id")?,
            is_test: t.is_test("split")?,
            is_val: t.is_val("split")?,
            label: t.u32("label")?,
            cluster: t.u32("cluster")?,
        })
    }
}

/// Cluster embeddings (`z`, all instances) into k groups.
pub fn run(
    params: &ClusterParams,
    z: &[f32],
    dim: usize,
    labels: &[u32],
    is_test: &[bool],
    is_val: &[bool],
    ids: &[u32],
    n_classes: usize,
) -> Result<(Assignments, KMeans)> {
    let k = if params.k == 0 { n_classes } else { params.k };
    // Centroids from the training rows; test and validation rows go to the nearest.
    let train: Vec<usize> = (0..labels.len())
        .filter(|&i| !is_test[i] && !is_val.get(i).copied().unwrap_or(false))
        .collect();
    let xt: Vec<f32> = train
        .iter()
        .flat_map(|&i| z[i * dim..(i + 1) * dim].iter().copied())
        .collect();
    let km = kmeans(&xt, dim, k, params)?;
    let all = assign(z, dim, &km.centroids, params.settings.assign);
    let mut cluster = all;
    if params.settings.assign == Assign::Nearest {
        for (j, &i) in train.iter().enumerate() {
            cluster[i] = km.labels[j];
        }
    }
    Ok((
        Assignments {
            ids: ids.to_vec(),
            is_test: is_test.to_vec(),
            is_val: is_val.to_vec(),
            label: labels.to_vec(),
            cluster,
        },
        km,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separated_blobs_are_recovered_and_runs_are_reproducible() {
        let mut rng = Stream::new(1, &["blobs"]);
        let centers = [(0.0, 0.0), (5.0, 5.0), (-5.0, 5.0)];
        let mut x = Vec::new();
        let mut truth = Vec::new();
        for (c, (cx, cy)) in centers.iter().enumerate() {
            for _ in 0..50 {
                x.push((cx + rng.normal() * 0.3) as f32);
                x.push((cy + rng.normal() * 0.3) as f32);
                truth.push(c as u32);
            }
        }
        let p = ClusterParams {
            settings: ClusterSettings {
                n_init: 5,
                ..Default::default()
            },
            ..Default::default()
        };
        let a = kmeans(&x, 2, 3, &p).unwrap();
        let b = kmeans(&x, 2, 3, &p).unwrap();
        assert_eq!(a.labels, b.labels);
        // Same partition as the truth, up to renaming.
        for i in 0..truth.len() {
            for j in 0..truth.len() {
                assert_eq!(truth[i] == truth[j], a.labels[i] == a.labels[j]);
            }
        }
    }

    #[test]
    fn test_points_go_to_the_nearest_centroid() {
        let centroids = [0.0, 0.0, 10.0, 0.0];
        assert_eq!(
            assign(
                &[1.0, 0.0, 9.0, 1.0, 4.9, 0.0],
                2,
                &centroids,
                Assign::Nearest
            ),
            [0, 1, 0]
        );
    }
}
