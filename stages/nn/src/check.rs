//! The preconditions of every [`Device`](crate::Device) op, written once for every backend.
//!
//! Each backend calls the check of an op with the lengths of its buffers before it touches
//! them, so a wrong shape is the same panic on the CPU and on a GPU (a programming error:
//! the executor turns it into a failed node), and never reaches a kernel. On a GPU an
//! out-of-range access would not panic: it is a sticky error that poisons the whole context,
//! so index *values* are checked too, against the largest index of the buffer (recorded when
//! it was uploaded). Because the CPU runs the same checks, the test suite exercises exactly
//! the preconditions the GPU relies on.

use crate::device::{CoBce, GemmSpec, StudentT};

/// An index range as the checks see it: `len` entries from `off` of a buffer of `buf_len`
/// entries whose largest value is below `bound` (0 for an empty buffer).
#[derive(Clone, Copy, Debug)]
pub struct IxShape {
    pub off: usize,
    pub len: usize,
    pub buf_len: usize,
    pub bound: usize,
}

/// Panic with the op's name unless `cond`.
macro_rules! ensure {
    ($op:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            panic!("{}: {}", $op, format!($($fmt)+));
        }
    };
}

#[track_caller]
fn same(op: &str, what: &str, got: usize, want: usize) {
    ensure!(
        op,
        got == want,
        "{what} has {got} elements, expected {want}"
    );
}

#[track_caller]
fn product(op: &str, a: usize, b: usize) -> usize {
    a.checked_mul(b)
        .unwrap_or_else(|| panic!("{op}: {a}×{b} elements overflow"))
}

/// `off..off + len` lies inside a buffer of `buf_len` elements.
#[track_caller]
pub fn range(op: &str, what: &str, off: usize, len: usize, buf_len: usize) {
    let end = off.checked_add(len);
    ensure!(
        op,
        end.is_some_and(|e| e <= buf_len),
        "{what} range {off}..{off}+{len} exceeds its {buf_len} elements"
    );
}

/// An index range inside its buffer whose values all address one of `rows` rows.
#[track_caller]
fn index(op: &str, what: &str, i: IxShape, rows: usize) {
    range(op, what, i.off, i.len, i.buf_len);
    ensure!(
        op,
        i.len == 0 || i.bound <= rows,
        "{what} holds index {} but there are only {rows} rows",
        i.bound.saturating_sub(1)
    );
}

/// Rows of a matrix with `cols` columns stored in `len` elements.
#[track_caller]
fn rows_of(op: &str, what: &str, len: usize, cols: usize) -> usize {
    if cols == 0 {
        return 0;
    }
    ensure!(
        op,
        len.is_multiple_of(cols),
        "{what} has {len} elements, not whole rows of {cols}"
    );
    len / cols
}

#[track_caller]
fn slot(op: &str, slots: usize, first: usize, count: usize) {
    ensure!(
        op,
        first.checked_add(count).is_some_and(|e| e <= slots),
        "slots {first}..{first}+{count} exceed the {slots} slots"
    );
}

#[track_caller]
pub fn write(dst: usize, src: usize) {
    same("write", "the source", src, dst);
}

#[track_caller]
pub fn copy_range(op: &str, src: usize, src_off: usize, dst: usize, dst_off: usize, len: usize) {
    range(op, "the source", src_off, len, src);
    range(op, "the destination", dst_off, len, dst);
}

#[track_caller]
pub fn set_column(src: usize, dst: usize, rows: usize, cols: usize, col: usize) {
    let op = "set_column";
    ensure!(op, col < cols, "column {col} of {cols}");
    same(op, "the column", src, rows);
    same(op, "the matrix", dst, product(op, rows, cols));
}

#[track_caller]
pub fn scalars_combine(slots: usize, dst: usize, terms: &[(usize, f64)]) {
    let op = "scalars_combine";
    slot(op, slots, dst, 1);
    for &(s, _) in terms {
        slot(op, slots, s, 1);
        // Backends may write the destination before reading the later terms.
        ensure!(
            op,
            s != dst,
            "slot {dst} is both a term and the destination"
        );
    }
}

#[track_caller]
pub fn scalars_accumulate(src: usize, src_slot: usize, dst: usize, dst_slot: usize) {
    slot("scalars_accumulate", src, src_slot, 1);
    slot("scalars_accumulate", dst, dst_slot, 1);
}

#[track_caller]
pub fn scalar_to_grad(slots: usize, s: usize, grad: usize) {
    slot("scalar_to_grad", slots, s, 1);
    ensure!("scalar_to_grad", grad >= 1, "the gradient is empty");
}

#[track_caller]
pub fn gemm(spec: GemmSpec, a: usize, b: usize, c: usize) {
    let GemmSpec { m, n, k, .. } = spec;
    let op = "gemm";
    ensure!(
        op,
        a == product(op, m, k),
        "A has {a} elements, expected {m}×{k}"
    );
    ensure!(
        op,
        b == product(op, k, n),
        "B has {b} elements, expected {k}×{n}"
    );
    ensure!(
        op,
        c == product(op, m, n),
        "C has {c} elements, expected {m}×{n}"
    );
}

#[track_caller]
pub fn bias_act(y: usize, bias: Option<usize>, rows: usize, cols: usize) {
    let op = "bias_act";
    same(op, "y", y, product(op, rows, cols));
    if let Some(b) = bias {
        same(op, "the bias", b, cols);
    }
}

/// Element-wise ops: every buffer as long as the first.
#[track_caller]
pub fn elementwise(op: &str, lens: &[usize]) {
    if let Some((&first, rest)) = lens.split_first() {
        for (i, &l) in rest.iter().enumerate() {
            ensure!(
                op,
                l == first,
                "operand {} has {l} elements, operand 1 has {first}",
                i + 2
            );
        }
    }
}

#[track_caller]
pub fn col_sums(dz: usize, rows: usize, cols: usize, db: usize) {
    let op = "col_sums_acc";
    same(op, "dz", dz, product(op, rows, cols));
    same(op, "db", db, cols);
}

/// Row-wise ops over `rows`×`cols` matrices (`mats`) with one value per row (`per_row`).
#[track_caller]
pub fn rowwise(op: &str, rows: usize, cols: usize, mats: &[usize], per_row: &[usize]) {
    let n = product(op, rows, cols);
    for &m in mats {
        same(op, "a matrix", m, n);
    }
    for &r in per_row {
        same(op, "a per-row vector", r, rows);
    }
}

/// Pair ops: rows a_i, b_i of a matrix of `u` elements with `cols` columns.
#[track_caller]
pub fn pairs(op: &str, u: usize, cols: usize, a: IxShape, b: IxShape, per_pair: &[usize]) {
    ensure!(
        op,
        a.len == b.len,
        "{} first and {} second indices",
        a.len,
        b.len
    );
    let rows = rows_of(op, "u", u, cols);
    index(op, "the first indices", a, rows);
    index(op, "the second indices", b, rows);
    for &p in per_pair {
        same(op, "a per-pair vector", p, a.len);
    }
}

/// Gathers and scatters: `rowsbuf` is the matrix indexed, `dense` the idx.len × cols side.
#[track_caller]
pub fn rows_indexed(op: &str, indexed: usize, cols: usize, idx: IxShape, dense: usize) {
    let rows = rows_of(op, "the indexed matrix", indexed, cols);
    index(op, "the indices", idx, rows);
    same(op, "the gathered rows", dense, product(op, idx.len, cols));
}

/// Fused losses over n values: every per-value buffer has n elements, `count` slots from
/// `first`, and the 1×1 parameters are there.
#[track_caller]
pub fn loss(op: &str, lens: &[usize], params: &[usize], slots: usize, first: usize, count: usize) {
    elementwise(op, lens);
    for &p in params {
        ensure!(op, p >= 1, "a 1×1 parameter is empty");
    }
    slot(op, slots, first, count);
}

#[track_caller]
pub fn softmax_ce(
    logits: usize,
    rows: usize,
    cols: usize,
    labels: IxShape,
    dlogits: usize,
    slots: usize,
    s: usize,
) {
    let op = "softmax_ce";
    rowwise(op, rows, cols, &[logits, dlogits], &[]);
    same(op, "the labels", labels.len, rows);
    // Labels are column numbers.
    index(op, "the labels", labels, cols);
    slot(op, slots, s, 2);
}

#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn pair_cobce(
    q: usize,
    shape: CoBce,
    b_raw: Option<usize>,
    y: usize,
    w: usize,
    dq: usize,
    db_raw: Option<usize>,
    slots: usize,
    s: usize,
) {
    let op = "pair_cobce";
    let CoBce { c, n, .. } = shape;
    let need = product(op, product(op, 2, n), c);
    ensure!(op, q >= need, "q has {q} elements, fewer than 2·{n}×{c}");
    same(op, "dq", dq, q);
    same(op, "y", y, n);
    same(op, "w", w, n);
    for (what, m) in [("B'", b_raw), ("dB'", db_raw)] {
        if let Some(m) = m {
            same(op, what, m, product(op, c, c));
        }
    }
    ensure!(
        op,
        b_raw.is_some() || db_raw.is_none(),
        "dB' is asked for without B'"
    );
    slot(op, slots, s, 1);
}

#[track_caller]
pub fn spd(m: usize, c: usize, minv: usize, slots: usize, s: usize) {
    let op = "spd_logdet_inverse";
    same(op, "the matrix", m, product(op, c, c));
    same(op, "the inverse", minv, product(op, c, c));
    slot(op, slots, s, 1);
}

#[track_caller]
pub fn student_t(op: &str, st: StudentT, z: usize, mu: usize, qs: &[usize], dz: Option<usize>) {
    let StudentT { rows, d, k, .. } = st;
    same(op, "z", z, product(op, rows, d));
    same(op, "mu", mu, product(op, k, d));
    for &q in qs {
        same(op, "q", q, product(op, rows, k));
    }
    if let Some(dz) = dz {
        same(op, "dz", dz, z);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ix(off: usize, len: usize, buf_len: usize, bound: usize) -> IxShape {
        IxShape {
            off,
            len,
            buf_len,
            bound,
        }
    }

    #[test]
    #[should_panic(expected = "gather: the indices holds index 10 but there are only 10 rows")]
    fn an_index_past_the_rows_is_refused() {
        rows_indexed("gather", 10 * 3, 3, ix(0, 2, 2, 11), 6);
    }

    #[test]
    #[should_panic(expected = "exceeds its 4 elements")]
    fn a_range_past_the_buffer_is_refused() {
        pairs("pair_dot", 30, 3, ix(3, 2, 4, 1), ix(0, 2, 4, 1), &[2]);
    }

    #[test]
    #[should_panic(expected = "slot 2 is both a term and the destination")]
    fn aliased_scalar_slots_are_refused() {
        scalars_combine(4, 2, &[(0, 1.0), (2, 1.0)]);
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn shapes_that_overflow_are_refused() {
        rowwise("l2norm", usize::MAX, 2, &[4], &[]);
    }

    #[test]
    fn consistent_shapes_pass() {
        rows_indexed("gather", 10 * 3, 3, ix(1, 2, 5, 10), 6);
        rows_indexed("gather", 0, 0, ix(0, 0, 0, 0), 0);
        pairs("pair_dot", 30, 3, ix(2, 2, 4, 10), ix(0, 2, 4, 3), &[2]);
        softmax_ce(12, 4, 3, ix(0, 4, 4, 3), 12, 2, 0);
        scalars_combine(4, 3, &[(0, 1.0), (2, 1.0)]);
    }
}
