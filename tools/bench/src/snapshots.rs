//! The watchdog's snapshots as a benchmark sees them (issue #32): a layer that keeps
//! each ERROR event of target `tracing_gpu::watchdog` (its text and when it came),
//! and a check of a snapshot's groups against the phases a kernel can be in.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// The watchdog's events, kept.
#[derive(Clone, Default)]
pub struct Snapshots(pub Arc<Mutex<Vec<(String, Instant)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Snapshots {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        if event.metadata().target() == "tracing_gpu::watchdog" {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().push((m.0, Instant::now()));
        }
    }
}

/// One group line of a snapshot: how many warps, their open ranges (outermost first)
/// and what they closed last (its name and payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLine {
    pub warps: u64,
    pub open: Vec<String>,
    pub last: Option<(String, Option<u64>)>,
}

/// The group lines of a snapshot's text, and the warps of the groups it only counts
/// ("and N more groups (M warps)").
pub fn groups(text: &str) -> (Vec<GroupLine>, u64) {
    let mut lines = Vec::new();
    let mut more = 0;
    for l in text.lines().skip(1).map(str::trim) {
        if let Some(rest) = l.strip_prefix("and ") {
            // "and 5 more groups (1,234 warps)"
            more = rest
                .split('(')
                .nth(1)
                .and_then(|w| w.split_whitespace().next())
                .map_or(0, number);
            continue;
        }
        let Some((count, rest)) = l.split_once(' ') else {
            continue;
        };
        let Some(rest) = rest
            .strip_prefix("warps ")
            .or_else(|| rest.strip_prefix("warp "))
        else {
            continue;
        };
        let (what, after) = match rest.split_once(", after ") {
            Some((w, a)) => (w, Some(a)),
            None => (rest, None),
        };
        let open = match what.strip_prefix("in ") {
            Some(path) => path
                .split(" for ")
                .next()
                .unwrap_or_default()
                .split(" > ")
                .map(String::from)
                .collect(),
            None => Vec::new(),
        };
        let last = after.map(|a| match a.split_once(" (") {
            Some((name, p)) => (
                name.to_string(),
                p.trim_end_matches(')')
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok()),
            ),
            None => (a.to_string(), None),
        });
        lines.push(GroupLine {
            warps: number(count),
            open,
            last,
        });
    }
    (lines, more)
}

/// "1,055" as 1055.
fn number(s: &str) -> u64 {
    s.replace(',', "").parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_back_as_groups() {
        let text = "launch 3 (stream_bench, grid 132x1x1, 4 warps per block) still running after 2.0 s (snapshot 2):\n  \
                    1,055 warps in mainloop > wait for 3.1 s, after load (k_tile 17)\n  \
                    1 warp between ranges for 12 µs, after issue (payload 8)\n  \
                    2 warps in load for 1 ms\n  \
                    and 5 more groups (1,234 warps)\n  \
                    12 blocks never started";
        let (lines, more) = groups(text);
        assert_eq!(more, 1234);
        assert_eq!(
            lines,
            [
                GroupLine {
                    warps: 1055,
                    open: vec!["mainloop".into(), "wait".into()],
                    last: Some(("load".into(), Some(17))),
                },
                GroupLine {
                    warps: 1,
                    open: vec![],
                    last: Some(("issue".into(), Some(8))),
                },
                GroupLine {
                    warps: 2,
                    open: vec!["load".into()],
                    last: None,
                },
            ]
        );
    }
}
