//! `kind: selection`: the hyperparameter each cell's search chose by validation ACC
//! (VolMaxDCC's λ, the ensembles' α: the paper's Tables 5 and 6); one value per cell, no
//! trials.

use upcc_report::published::Comparison;

use super::{Cells, CheckCx, PublishedAs, TableSource, Target, View};
use crate::specs::axis::Axis;
use crate::specs::source::Problems;

/// What each cell's search chose.
pub struct Selection;

impl Target for Selection {
    fn name(&self) -> &'static str {
        "selection"
    }
    fn summary(&self) -> &'static str {
        "the hyperparameter each cell's search chose by validation ACC"
    }
    fn cells(&self) -> Cells {
        Cells::Selections
    }
    fn view(&self) -> View {
        View::Table
    }
    fn table_source(&self) -> TableSource {
        TableSource::Selection
    }
    fn default_columns(&self) -> Option<&'static [Axis]> {
        Some(&[Axis::Supervision])
    }
    fn published(&self) -> Option<PublishedAs> {
        Some(PublishedAs::Printed(Comparison::Number))
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        let t = cx.name;
        for (m, r) in cx.grid_methods() {
            if !r.method.needs_validation(&r.settings) {
                p.add(&cx.grid("method"), format!("target `{t}` (kind: selection) shows what a hyperparameter search chose; method `{m}` ({}) searches none with these settings", r.method.kind()), Some("list methods with a search (volmax-dcc, sp-ea, wpp-ea, without a fixed `volmax.lambda` / `ensemble.alpha`)".into()));
            }
        }
    }
}
