//! The axes of a target's grid: what a grid varies, what a cell's coordinates and a node's
//! labels name, what selectors pick and published-value files index by. One type instead of
//! the axis names spelled out wherever they are read.

use std::fmt;

use super::schema::GridSpec;

/// One axis of a grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Axis {
    Dataset,
    Supervision,
    Corruption,
    Budget,
    Method,
    Pretrain,
}

impl Axis {
    /// Every axis, in the order tables show them (left to right).
    pub const ALL: [Axis; 6] = [
        Axis::Dataset,
        Axis::Supervision,
        Axis::Corruption,
        Axis::Budget,
        Axis::Method,
        Axis::Pretrain,
    ];

    /// The name specs, coordinates, labels and selectors use.
    pub fn name(self) -> &'static str {
        match self {
            Axis::Dataset => "dataset",
            Axis::Supervision => "supervision",
            Axis::Corruption => "corruption",
            Axis::Budget => "budget",
            Axis::Method => "method",
            Axis::Pretrain => "pretrain",
        }
    }

    /// The axis of a name.
    pub fn parse(name: &str) -> Option<Axis> {
        Axis::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Every axis's name, in table order.
    pub fn names() -> Vec<&'static str> {
        Axis::ALL.iter().map(|a| a.name()).collect()
    }

    /// Whether the grid lists values on this axis (`corruption`, `budget` and `pretrain` are
    /// optional; a kind without methods lists none).
    pub fn in_grid(self, g: &GridSpec) -> bool {
        match self {
            Axis::Dataset | Axis::Supervision => true,
            Axis::Method => !g.method.is_empty(),
            Axis::Corruption => g.corruption.is_some(),
            Axis::Budget => g.budget.is_some(),
            Axis::Pretrain => g.pretrain.is_some(),
        }
    }

    /// The grid's values on this axis, as coordinates write them (`0.3`, `9000`, `true`).
    pub fn values(self, g: &GridSpec) -> Vec<String> {
        match self {
            Axis::Dataset => g.dataset.clone(),
            Axis::Supervision => g.supervision.clone(),
            Axis::Method => g.method.clone(),
            Axis::Corruption => g.corruption.iter().flatten().map(|c| fmt_f(*c)).collect(),
            Axis::Budget => g.budget.iter().flatten().map(|b| b.to_string()).collect(),
            Axis::Pretrain => g.pretrain.iter().flatten().map(|b| b.to_string()).collect(),
        }
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A number as coordinates, labels and node ids write it (`0.3`, `1.0`).
pub fn fmt_f(x: f64) -> String {
    let s = format!("{x}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_in_table_order() {
        for a in Axis::ALL {
            assert_eq!(Axis::parse(a.name()), Some(a));
        }
        assert_eq!(Axis::parse("methods"), None);
        let mut sorted = Axis::ALL;
        sorted.sort();
        assert_eq!(sorted, Axis::ALL, "the enum's order is the tables' order");
        assert_eq!(fmt_f(1.0), "1.0");
        assert_eq!(fmt_f(0.3), "0.3");
    }
}
