//! `kind: experts`: the test accuracy of the simulated experts of each setting (the mean over
//! a multi-expert setting's experts), mean ± std over the experts' seeds.

use super::{check_per_setting, Cells, CheckCx, PublishedAs, TableSource, Target, View};
use crate::specs::axis::Axis;
use crate::specs::source::Problems;

/// The experts' test accuracy.
pub struct Experts;

impl Target for Experts {
    fn name(&self) -> &'static str {
        "experts"
    }
    fn summary(&self) -> &'static str {
        "test accuracy of the simulated experts (group mean for multi-expert settings)"
    }
    fn cells(&self) -> Cells {
        Cells::Experts {
            first_seed_only: false,
        }
    }
    fn view(&self) -> View {
        View::Table
    }
    fn table_source(&self) -> TableSource {
        TableSource::Experts
    }
    fn default_columns(&self) -> Option<&'static [Axis]> {
        Some(&[Axis::Supervision])
    }
    fn published(&self) -> Option<PublishedAs> {
        Some(PublishedAs::PrintedScores)
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        check_per_setting(cx, p, false, true);
    }
}
