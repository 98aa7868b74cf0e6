//! The sections of a spec's `params` and the limits validation holds a spec to.

use crate::method;

/// Sections of `params` every spec may set, besides the methods' own.
pub(crate) const STAGE_SECTIONS: [&str; 5] =
    ["expert", "constraints", "pretrain", "cluster", "table"];

/// Every parameter section: the stages' and the methods'.
pub fn sections() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = STAGE_SECTIONS.to_vec();
    v.extend(method::method_sections());
    v.sort_unstable();
    v.dedup();
    v
}

/// Larger embeddings are mistakes (and would not fit in memory with the usual backbone).
pub(crate) const MAX_EMBEDDING_DIM: usize = 100_000;

/// The most classes a dataset may declare (each is a column of every expert's output).
pub(crate) const MAX_CLASSES: usize = 1_000_000;

/// More trial × cell nodes than this is a mistake, not an experiment.
pub(crate) const MAX_NODES: u128 = 2_000_000;
