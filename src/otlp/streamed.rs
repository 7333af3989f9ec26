//! Launches delivered in parts ([`crate::batch::Part`]): one kernel span for
//! the launch, whose children are exported part by part.
//!
//! A part's spans (phases, warps, events) are exported as the part arrives,
//! under the launch's kernel span; the kernel span itself can end only at the
//! last part, when the launch's extent and counts are known. So its identity
//! is chosen at the launch's first part (the launch span's trace, a new span
//! id) and kept, with a summary of the parts so far, until the last: the
//! early parts' spans name it as their parent before it is exported (OTLP
//! allows that), and the SDK is made to give it that id when it is built at
//! the end ([`PresetIds`]).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context as OtelContext;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use super::group::Group;

/// Launches with parts still to come that are followed at once; past that,
/// the one updated longest ago is forgotten (a later part of it then starts
/// a kernel span of its own). Streamed launches are long-running kernels, a
/// handful at a time: this bounds what launches whose last part never comes
/// (their run ended first) can hold.
pub(crate) const MAX_STREAMING: usize = 1024;

thread_local! {
    /// The ids the next span built on this thread gets ([`PresetIds`]).
    static PRESET: Cell<(Option<TraceId>, Option<SpanId>)> = const { Cell::new((None, None)) };
}

/// The layer's id generator: random ids, as the SDK's default, except for
/// the span built inside [`PresetIds::build`], which gets the ids given
/// there. (The SDK ignores a `SpanBuilder`'s own span id.)
#[derive(Debug, Default)]
pub(crate) struct PresetIds(RandomIdGenerator);

impl PresetIds {
    /// Runs `build` (which builds one span) so that the span gets span id
    /// `span` and, if it has no parent to take one from, trace id `trace`.
    pub(crate) fn build<T>(trace: TraceId, span: SpanId, build: impl FnOnce() -> T) -> T {
        PRESET.set((Some(trace), Some(span)));
        let built = build();
        PRESET.set((None, None));
        built
    }
}

impl IdGenerator for PresetIds {
    fn new_trace_id(&self) -> TraceId {
        let (trace, span) = PRESET.get();
        PRESET.set((None, span));
        trace.unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        let (trace, span) = PRESET.get();
        PRESET.set((trace, None));
        span.unwrap_or_else(|| self.0.new_span_id())
    }
}

/// What the kernel span of a launch says: gathered from one batch, or from
/// every part of a streamed launch.
pub(crate) struct KernelSum {
    /// The device extent, on the wall clock: first timer read, last flush.
    pub(crate) extent: Option<(SystemTime, SystemTime)>,
    /// The clock mapping's bound at the launch's first event (ns).
    pub(crate) bound_ns: Option<i64>,
    pub(crate) events: u64,
    pub(crate) events_lost: u64,
    /// Warps (block, warp) and SMs that recorded.
    pub(crate) warps: HashSet<(u32, u32)>,
    pub(crate) sms: HashSet<u32>,
    /// Per event type ([`super::Detail::Kernel`] only).
    pub(crate) by_type: BTreeMap<u16, Group>,
    pub(crate) parts: u32,
}

impl KernelSum {
    /// Adds a later part's sum.
    fn merge(&mut self, part: KernelSum) {
        self.extent = match (self.extent, part.extent) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
        self.bound_ns = self.bound_ns.or(part.bound_ns);
        self.events += part.events;
        self.events_lost += part.events_lost;
        self.warps.extend(part.warps);
        self.sms.extend(part.sms);
        for (id, group) in part.by_type {
            match self.by_type.get_mut(&id) {
                Some(g) => g.merge(group),
                None => {
                    self.by_type.insert(id, group);
                }
            }
        }
        self.parts += part.parts;
    }
}

/// One launch streaming in.
struct Streaming {
    /// The launch span's context, from the first part.
    parent: OtelContext,
    /// The kernel span's ids and flags.
    kernel: SpanContext,
    sum: KernelSum,
    /// When it was last updated (parts taken so far, all launches).
    touched: u64,
}

/// The launches streaming in, by launch id: the conversion thread's.
#[derive(Default)]
pub(crate) struct StreamedKernels {
    open: HashMap<u64, Streaming>,
    parts: u64,
}

impl StreamedKernels {
    /// The context a part of launch `launch_id` is converted under: the
    /// launch span's (`parent` at its first part) with the launch's kernel
    /// span active (chosen then; exported at the last part, or never if that
    /// part never comes).
    pub(crate) fn part(&mut self, launch_id: u64, parent: &OtelContext) -> OtelContext {
        self.parts += 1;
        if !self.open.contains_key(&launch_id) && self.open.len() >= MAX_STREAMING {
            let stalest = self.open.iter().min_by_key(|(_, s)| s.touched);
            if let Some(&id) = stalest.map(|(id, _)| id) {
                self.open.remove(&id);
            }
        }
        let s = self.open.entry(launch_id).or_insert_with(|| {
            let ids = RandomIdGenerator::default();
            let up = parent.span().span_context().clone();
            let (trace, flags, state) = match up.is_valid() {
                true => (up.trace_id(), up.trace_flags(), up.trace_state().clone()),
                false => (ids.new_trace_id(), TraceFlags::SAMPLED, TraceState::NONE),
            };
            Streaming {
                parent: parent.clone(),
                kernel: SpanContext::new(trace, ids.new_span_id(), flags, false, state),
                sum: KernelSum {
                    extent: None,
                    bound_ns: None,
                    events: 0,
                    events_lost: 0,
                    warps: HashSet::new(),
                    sms: HashSet::new(),
                    by_type: BTreeMap::new(),
                    parts: 0,
                },
                touched: 0,
            }
        });
        s.touched = self.parts;
        s.parent.with_remote_span_context(s.kernel.clone())
    }

    /// Adds a part's sum. At the launch's last part (`last`), forgets the
    /// launch and returns what its kernel span needs: the launch span's
    /// context, the kernel span's ids, the sum over every part.
    pub(crate) fn add(
        &mut self,
        launch_id: u64,
        sum: KernelSum,
        last: bool,
    ) -> Option<(OtelContext, SpanContext, KernelSum)> {
        let s = self.open.get_mut(&launch_id)?;
        s.sum.merge(sum);
        if !last {
            return None;
        }
        let s = self.open.remove(&launch_id)?;
        Some((s.parent, s.kernel, s.sum))
    }

    /// Launches streaming in now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum() -> KernelSum {
        KernelSum {
            extent: None,
            bound_ns: None,
            events: 2,
            events_lost: 0,
            warps: [(0, 1)].into(),
            sms: HashSet::new(),
            by_type: BTreeMap::new(),
            parts: 1,
        }
    }

    #[test]
    fn a_launch_keeps_one_kernel_identity_until_its_last_part() {
        let mut s = StreamedKernels::default();
        let root = OtelContext::new();
        let a = s.part(5, &root).span().span_context().clone();
        assert!(s.add(5, sum(), false).is_none());
        let b = s.part(5, &root).span().span_context().clone();
        assert_eq!(a, b, "every part names the same kernel span");
        let (_, kernel, total) = s.add(5, sum(), true).unwrap();
        assert_eq!(kernel, a);
        assert_eq!((total.events, total.warps.len(), total.parts), (4, 1, 2));
        assert_eq!(s.len(), 0, "the last part frees the launch");
        // The SDK builds the kernel span with those ids.
        let ids = PresetIds::default();
        let (trace, span) = PresetIds::build(kernel.trace_id(), kernel.span_id(), || {
            (ids.new_trace_id(), ids.new_span_id())
        });
        assert_eq!((trace, span), (kernel.trace_id(), kernel.span_id()));
        assert_ne!(ids.new_span_id(), kernel.span_id(), "then random again");
    }

    #[test]
    fn launches_whose_last_part_never_comes_are_bounded() {
        let mut s = StreamedKernels::default();
        for id in 0..(MAX_STREAMING as u64 * 3) {
            s.part(id, &OtelContext::new());
            s.add(id, sum(), false);
        }
        assert_eq!(s.len(), MAX_STREAMING);
    }
}
