//! A group of device events summed up for a span's attributes: count, total,
//! percentiles.

use opentelemetry::KeyValue;

/// Durations of one group of events, and its extent (device ns).
pub(crate) struct Group {
    pub(crate) first_start: u64,
    pub(crate) last_end: u64,
    pub(crate) total: u64,
    /// Events in the group.
    pub(crate) count: u64,
    /// Their durations: every one, but in a group summed over the parts of a
    /// streamed launch ([`Group::merge`]), which keeps a uniform sample of
    /// [`KEPT_DURATIONS`] once it has more.
    pub(crate) durations: Vec<u64>,
}

/// Durations a group summed over a streamed launch's parts keeps for its
/// percentiles: its parts add up without bound while the launch runs.
pub(crate) const KEPT_DURATIONS: usize = 1 << 16;

impl Group {
    pub(crate) fn new() -> Group {
        Group {
            first_start: u64::MAX,
            last_end: 0,
            total: 0,
            count: 0,
            durations: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, start: u64, end: u64) {
        self.first_start = self.first_start.min(start);
        self.last_end = self.last_end.max(end);
        self.total += end - start;
        self.count += 1;
        self.durations.push(end - start);
    }

    /// Adds a later part's group of the same events: counts and extent
    /// exactly; durations by reservoir sampling (each of the `count` seen so
    /// far is kept with the same chance) past [`KEPT_DURATIONS`].
    pub(crate) fn merge(&mut self, other: Group) {
        self.first_start = self.first_start.min(other.first_start);
        self.last_end = self.last_end.max(other.last_end);
        self.total += other.total;
        // Events the other group counted but did not keep (it was sampled).
        let unkept = other.count - other.durations.len() as u64;
        for d in other.durations {
            self.count += 1;
            if self.durations.len() < KEPT_DURATIONS {
                self.durations.push(d);
                continue;
            }
            // A fixed mix of the count: reproducible, and as good as random here.
            let mut x = self.count.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 31;
            if let Some(kept) = self.durations.get_mut((x % self.count) as usize) {
                *kept = d;
            }
        }
        self.count += unkept;
    }

    /// count, total, p50 and p99 (nearest rank), under `prefix`.
    pub(crate) fn summary(&mut self, prefix: &str, out: &mut Vec<KeyValue>) {
        self.durations.sort_unstable();
        let rank = |p: f64| crate::report::nearest_rank(&self.durations, p) as i64;
        out.push(KeyValue::new(format!("{prefix}.count"), self.count as i64));
        out.push(KeyValue::new(
            format!("{prefix}.total_ns"),
            self.total as i64,
        ));
        out.push(KeyValue::new(format!("{prefix}.p50_ns"), rank(50.0)));
        out.push(KeyValue::new(format!("{prefix}.p99_ns"), rank(99.0)));
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::Value;

    use super::*;

    #[test]
    fn summaries_use_nearest_rank_percentiles() {
        let mut g = Group::new();
        for d in 1..=100u64 {
            g.add(1_000 - d, 1_000);
        }
        let mut kv = Vec::new();
        g.summary("x", &mut kv);
        let get = |k: &str| {
            kv.iter()
                .find(|a| a.key.as_str() == k)
                .unwrap()
                .value
                .clone()
        };
        assert_eq!(get("x.count"), Value::I64(100));
        assert_eq!(get("x.total_ns"), Value::I64(5050));
        assert_eq!(get("x.p50_ns"), Value::I64(50));
        assert_eq!(get("x.p99_ns"), Value::I64(99));
        assert_eq!((g.first_start, g.last_end), (900, 1_000));

        let mut one = Group::new();
        one.add(5, 12);
        let mut kv = Vec::new();
        one.summary("y", &mut kv);
        let values: Vec<_> = kv.iter().map(|a| a.value.clone()).collect();
        assert_eq!(values, [1, 7, 7, 7].map(Value::I64));
    }

    #[test]
    fn merged_durations_are_bounded_and_counted() {
        let mut g = Group::new();
        for part in 0..3u64 {
            let mut p = Group::new();
            for i in 0..KEPT_DURATIONS as u64 {
                p.add(part * 10, part * 10 + i);
            }
            g.merge(p);
        }
        assert_eq!(g.count, 3 * KEPT_DURATIONS as u64);
        assert_eq!(g.durations.len(), KEPT_DURATIONS);
        assert_eq!(
            (g.first_start, g.last_end),
            (0, 20 + KEPT_DURATIONS as u64 - 1)
        );
    }
}
