//! How a run looks on stderr: the engine reports events ([`RunEvent`]); this renders them as
//! live bars (a terminal), plain lines (logs, CI) or nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use upcc_engine::{Observer, Outcome, RunEvent};

/// How progress is shown on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Live bars (a terminal).
    Bars,
    /// One line per finished node and a progress line per running node every 15 s.
    Plain,
    /// Nothing.
    Quiet,
}

/// Renders a run's events; `total` is the number of nodes of the run.
pub struct Progress {
    mode: ProgressMode,
    mp: Option<MultiProgress>,
    overall: Option<ProgressBar>,
    bars: HashMap<usize, ProgressBar>,
    last_plain: HashMap<usize, Instant>,
    total: usize,
    finished: usize,
}

impl Progress {
    pub fn new(mode: ProgressMode, total: usize) -> Self {
        let (mp, overall) = if mode == ProgressMode::Bars {
            let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8));
            let bar = mp.add(ProgressBar::new(total as u64));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} nodes {msg}",
                )
                .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            (Some(mp), Some(bar))
        } else {
            (None, None)
        };
        Progress {
            mode,
            mp,
            overall,
            bars: HashMap::new(),
            last_plain: HashMap::new(),
            total,
            finished: 0,
        }
    }

    fn line(&self, text: &str) {
        match (&self.mp, self.mode) {
            (Some(mp), _) => {
                let _ = mp.println(text);
            }
            (None, ProgressMode::Plain) => eprintln!("{text}"),
            _ => {}
        }
    }

    fn finished(
        &mut self,
        node: usize,
        id: &str,
        outcome: Outcome,
        seconds: Option<f64>,
        error: Option<&str>,
    ) {
        self.finished += 1;
        if let Some(bar) = self.bars.remove(&node) {
            bar.finish_and_clear();
            if let Some(mp) = &self.mp {
                mp.remove(&bar);
            }
        }
        if let Some(o) = &self.overall {
            o.set_position(self.finished as u64);
        }
        let n = format!(
            "[{:>w$}/{}]",
            self.finished,
            self.total,
            w = self.total.to_string().len()
        );
        match outcome {
            Outcome::Executed => self.line(&format!(
                "upcc: {n} ran      {id} ({:.1} s)",
                seconds.unwrap_or(0.0)
            )),
            Outcome::Downloaded => self.line(&format!(
                "upcc: {n} fetched  {id} (from the remote cache, {:.1} s)",
                seconds.unwrap_or(0.0)
            )),
            Outcome::ComputedElsewhere => self.line(&format!(
                "upcc: {n} shared   {id} (computed by another process)"
            )),
            Outcome::Failed => {
                self.line(&format!("upcc: {n} FAILED   {id}: {}", error.unwrap_or("")))
            }
            Outcome::Cached | Outcome::Skipped => {}
        }
    }

    /// Clear the live display (call once the run returns).
    pub fn done(&self) {
        if let Some(o) = &self.overall {
            o.finish_and_clear();
        }
    }
}

impl Observer for Progress {
    fn event(&mut self, event: RunEvent<'_>) {
        match event {
            RunEvent::Started { node, id } => {
                if let Some(mp) = &self.mp {
                    let bar = mp.add(ProgressBar::new(0));
                    bar.set_style(
                        ProgressStyle::with_template("  {prefix:.bold} {bar:20} {pos}/{len} {msg}")
                            .expect("valid template"),
                    );
                    bar.set_prefix(id.to_string());
                    self.bars.insert(node, bar);
                }
            }
            RunEvent::Progress {
                node,
                id,
                done,
                total,
                message,
            } => {
                if let Some(bar) = self.bars.get(&node) {
                    bar.set_length(total);
                    bar.set_position(done);
                    bar.set_message(message.to_string());
                } else if self.mode == ProgressMode::Plain {
                    let now = Instant::now();
                    let due = self
                        .last_plain
                        .get(&node)
                        .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(15));
                    if due || done == total {
                        self.last_plain.insert(node, now);
                        eprintln!("upcc:   {id}: {done}/{total} {message}");
                    }
                }
            }
            RunEvent::Finished {
                node,
                id,
                outcome,
                seconds,
                error,
            } => self.finished(node, id, outcome, seconds, error),
            RunEvent::Reopened { .. } => self.finished = self.finished.saturating_sub(1),
            RunEvent::Waiting { id, holder } => {
                let by = holder
                    .map(|h| format!(" (pid {} on {})", h.pid, h.host))
                    .unwrap_or_default();
                self.line(&format!(
                    "upcc: waiting  {id} is being computed by another process{by}"
                ));
            }
            RunEvent::Corrupt { digest, message } => self.line(&format!(
                "upcc: corrupt object {} ({message}); quarantined, recomputing its producer",
                digest.short()
            )),
            RunEvent::Uploading { left } => self.line(&format!(
                "upcc: uploading {left} result{} to the remote cache (computed here; Ctrl-C leaves {} for `upcc push`)",
                if left == 1 { "" } else { "s" },
                if left == 1 { "it" } else { "them" }
            )),
        }
    }
}
