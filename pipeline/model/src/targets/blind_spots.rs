//! `kind: blind-spots`: the unfamiliar-class counts of each setting's experts, e.g. `(4,3,3)`:
//! the paper's Table 2, read from the trained experts (the first seed's).

use upcc_report::published::Comparison;

use super::{check_per_setting, Cells, CheckCx, PublishedAs, TableSource, Target, View};
use crate::specs::axis::Axis;
use crate::specs::source::Problems;

/// The experts' unfamiliar-class counts.
pub struct BlindSpots;

impl Target for BlindSpots {
    fn name(&self) -> &'static str {
        "blind-spots"
    }
    fn summary(&self) -> &'static str {
        "the unfamiliar-class counts of each setting's experts, read from the trained experts"
    }
    fn cells(&self) -> Cells {
        Cells::Experts {
            first_seed_only: true,
        }
    }
    fn view(&self) -> View {
        View::Table
    }
    fn table_source(&self) -> TableSource {
        TableSource::BlindSpots
    }
    fn default_columns(&self) -> Option<&'static [Axis]> {
        Some(&[Axis::Supervision])
    }
    fn published(&self) -> Option<PublishedAs> {
        Some(PublishedAs::Printed(Comparison::Exact))
    }
    fn check(&self, cx: &CheckCx<'_>, p: &mut Problems<'_>) {
        check_per_setting(cx, p, false, true);
    }
}
