//! A snapshot told: its running warps grouped by what they are doing (the same
//! open ranges, after the same closed range and payload), longest first, so
//! that a few warps stuck where the others are not stand out; then the blocks
//! that never started and the warps that are done.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::snapshot::{Last, Snapshot, State};
use crate::registry::EventRegistry;

/// At most this many groups are told one by one; the rest are counted.
pub(crate) const MAX_GROUPS: usize = 16;

/// Running warps that do the same thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    /// The open ranges' events, outermost first.
    pub(crate) open: Vec<u16>,
    /// The latest closed range (or instant) and its payload.
    pub(crate) last: Option<Last>,
    pub(crate) warps: u32,
    /// The longest and shortest time the group's warps have done it (ns).
    pub(crate) longest_ns: u64,
    pub(crate) shortest_ns: u64,
}

/// The blocks of a snapshot by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub(crate) never_started: u32,
    pub(crate) done: u32,
    pub(crate) running: u32,
    /// Warps done in blocks still running.
    pub(crate) warps_done: u32,
}

impl Snapshot {
    /// The running warps grouped, longest first, then the largest.
    pub(crate) fn groups(&self) -> Vec<Group> {
        type Key = (Vec<u16>, Option<Last>);
        let mut by: HashMap<Key, Group> = HashMap::new();
        for w in &self.warps {
            let State::Running { open, last, .. } = &w.state else {
                continue;
            };
            let for_ns = self
                .now_ns
                .saturating_sub(w.since_ns().unwrap_or(self.now_ns));
            let ids: Vec<u16> = open.iter().map(|o| o.id).collect();
            let key = (ids.clone(), *last);
            let g = by.entry(key).or_insert_with(|| Group {
                open: ids,
                last: *last,
                warps: 0,
                longest_ns: for_ns,
                shortest_ns: for_ns,
            });
            g.warps += 1;
            g.longest_ns = g.longest_ns.max(for_ns);
            g.shortest_ns = g.shortest_ns.min(for_ns);
        }
        let mut groups: Vec<Group> = by.into_values().collect();
        groups.sort_by(|a, b| {
            (
                b.longest_ns,
                b.warps,
                &a.open,
                a.last.map(|l| (l.id, l.payload)),
            )
                .cmp(&(
                    a.longest_ns,
                    a.warps,
                    &b.open,
                    b.last.map(|l| (l.id, l.payload)),
                ))
        });
        groups
    }

    /// The blocks that never started, are done or run.
    pub(crate) fn blocks(&self) -> Blocks {
        let per = self.warps_per_block.max(1) as usize;
        let mut b = Blocks::default();
        for block in self.warps.chunks(per) {
            let done = block
                .iter()
                .filter(|w| matches!(w.state, State::Done { .. }))
                .count();
            if block.iter().all(|w| w.state == State::NotStarted) {
                b.never_started += 1;
            } else if done == block.len() {
                b.done += 1;
            } else {
                b.running += 1;
                b.warps_done += done as u32;
            }
        }
        b
    }

    /// The snapshot as text: a first line for the launch, then a line per group
    /// (at most [`MAX_GROUPS`]), then the blocks. Names and payload names come from
    /// `registry`.
    pub(crate) fn text(&self, registry: &EventRegistry) -> String {
        let mut out = String::new();
        let [x, y, z] = self.grid;
        let _ = write!(
            out,
            "launch {} ({}, grid {x}x{y}x{z}, {} per block) still running after {}",
            self.launch_id,
            self.kernel,
            count(self.warps_per_block, "warp"),
            duration(self.running_ns)
        );
        if self.index > 0 {
            let _ = write!(out, " (snapshot {})", self.index + 1);
        }
        out.push(':');
        let groups = self.groups();
        for g in groups.iter().take(MAX_GROUPS) {
            out.push_str("\n  ");
            group_line(&mut out, g, registry);
        }
        if groups.len() > MAX_GROUPS {
            let rest = &groups[MAX_GROUPS..];
            let warps: u32 = rest.iter().map(|g| g.warps).sum();
            let _ = write!(
                out,
                "\n  and {} more groups ({})",
                rest.len(),
                count(warps, "warp")
            );
        }
        let b = self.blocks();
        let mut tail = Vec::new();
        if b.never_started > 0 {
            tail.push(format!("{} never started", count(b.never_started, "block")));
        }
        if b.done > 0 {
            tail.push(format!("{} done", count(b.done, "block")));
        }
        if b.warps_done > 0 {
            tail.push(format!(
                "{} done in blocks still running",
                count(b.warps_done, "warp")
            ));
        }
        if !tail.is_empty() {
            out.push_str("\n  ");
            out.push_str(&tail.join("; "));
        }
        out
    }
}

/// "1,055 warps in load > wait for 3.1 s, after load (k_tile 17)".
pub(crate) fn group_line(out: &mut String, g: &Group, registry: &EventRegistry) {
    let _ = write!(out, "{} ", count(g.warps, "warp"));
    if g.open.is_empty() {
        out.push_str("between ranges");
    } else {
        out.push_str("in ");
        for (i, id) in g.open.iter().enumerate() {
            if i > 0 {
                out.push_str(" > ");
            }
            out.push_str(&registry.display_name(*id));
        }
    }
    let _ = write!(out, " for {}", duration(g.longest_ns));
    if g.shortest_ns < g.longest_ns && duration(g.shortest_ns) != duration(g.longest_ns) {
        let _ = write!(out, " (the least {})", duration(g.shortest_ns));
    }
    if let Some(l) = g.last {
        let _ = write!(out, ", after {}", registry.display_name(l.id));
        if let Some(p) = l.payload {
            let name = registry.payload_name(l.id).unwrap_or("payload");
            let _ = write!(out, " ({name} {p})");
        }
    }
}

/// `n` things, with thousands separated: "1 warp", "1,055 warps".
pub(crate) fn count(n: u32, what: &str) -> String {
    let digits = n.to_string();
    let mut s = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    if n == 1 {
        format!("{s} {what}")
    } else {
        format!("{s} {what}s")
    }
}

/// A duration as people read it, rounded: "3.1 s", "250 ms", "12 µs", "80 ns".
pub(crate) fn duration(ns: u64) -> String {
    let f = ns as f64;
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..999_500 => format!("{:.0} µs", f / 1e3),
        999_500..999_500_000 => format!("{:.0} ms", f / 1e6),
        _ => format!("{:.1} s", f / 1e9),
    }
}
