//! Device batches → TrackEvent packets: the encoding core that both
//! [`super::TraceWriter`] and the layer's writer thread run. The warps'
//! events, the hot path, are `warps.rs`'s.

use std::sync::Arc;

use super::error::PerfettoError;
use super::flows::{launch_flow_id, FlowOrigins};
use super::parts::{KernelSum, LaunchParts};
use super::proto::{
    Clock, ClockSnapshot, Data, DebugAnnotation, Enc, EventType, TracePacket, TracePacketDefaults,
    TrackEvent, CLOCK_BOOTTIME, CLOCK_MONOTONIC, CLOCK_REALTIME, SEQ_INCREMENTAL_STATE_CLEARED,
};
use super::stats::WriteStats;
use super::tracks::{DeviceTracks, Ids, MISC_SEQUENCE};
use super::unfinished::Unfinished;
use super::warps::{WarpEncoder, FLUSH_AT};
use crate::batch::Batch;
use crate::clock::HostClock;
use crate::deliver::watched::Watched;
use crate::watch::State;

/// The encoder state of one trace: tracks, sequences, interned names. Writes
/// into an in-memory buffer; [`super::TraceWriter`] drains that to its output.
///
/// A batch is encoded in two parts: the part above the warps
/// ([`DeviceEncoder::head`], [`DeviceEncoder::kernel`]: GPU and SM tracks, the kernel slice, the
/// events-lost counter), which this core always writes, and the warps' events
/// ([`WarpEncoder`]), which it writes itself ([`DeviceEncoder::batch`]) or which
/// encoder threads share ([`super::parallel`]).
#[derive(Debug)]
pub(crate) struct DeviceEncoder {
    pub(crate) ids: Arc<Ids>,
    /// Launch ids whose host span carries a flow origin not yet terminated.
    pub(crate) flow_origins: Arc<FlowOrigins>,
    pub(crate) enc: Enc,
    pub(crate) stats: WriteStats,
    tracks: DeviceTracks,
    warps: WarpEncoder,
    /// Launches delivered in parts whose last part is still to come.
    parts: LaunchParts,
    /// The latest snapshot of each launch still running.
    unfinished: Unfinished,
}

/// What [`DeviceEncoder::head`] learnt of a batch from its slots' headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    gpu: usize,
    /// The device time window of the batch's records (`u64::MAX, 0`: none).
    pub(crate) window: (u64, u64),
    slots: u64,
    events_lost: u64,
}

impl DeviceEncoder {
    pub(crate) fn new(ids: Arc<Ids>, flow_origins: Arc<FlowOrigins>) -> DeviceEncoder {
        let mut enc = Enc::with_capacity(FLUSH_AT + (64 << 10));
        // The trace clock, and what the other host clocks read at the same time.
        let boot = HostClock::Boottime.now_ns();
        let clock = |id, c: HostClock| Clock {
            clock_id: Some(id),
            timestamp: Some(c.now_ns()),
            is_incremental: None,
        };
        enc.packet(&TracePacket {
            trusted_packet_sequence_id: Some(MISC_SEQUENCE),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            trace_packet_defaults: Some(TracePacketDefaults {
                timestamp_clock_id: Some(CLOCK_BOOTTIME),
                track_event_defaults: None,
            }),
            data: Some(Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![
                    Clock {
                        clock_id: Some(CLOCK_BOOTTIME),
                        timestamp: Some(boot),
                        is_incremental: None,
                    },
                    clock(CLOCK_MONOTONIC, HostClock::Monotonic),
                    clock(CLOCK_REALTIME, HostClock::Realtime),
                ],
                primary_trace_clock: Some(CLOCK_BOOTTIME as i32),
            })),
            ..Default::default()
        });
        DeviceEncoder {
            ids,
            flow_origins,
            enc,
            stats: WriteStats::default(),
            tracks: DeviceTracks::default(),
            warps: WarpEncoder::default(),
            parts: LaunchParts::default(),
            unfinished: Unfinished::default(),
        }
    }

    /// Encodes one batch: its warps' events, its kernel slice, its drops.
    /// Whenever more than [`FLUSH_AT`] bytes are buffered after a warp, they
    /// go to `sink` (which returns the bytes it wrote), so a large batch
    /// streams through a bounded buffer instead of growing it.
    pub(crate) fn batch(
        &mut self,
        b: &Batch,
        sink: &mut dyn FnMut(&[u8]) -> Result<u64, PerfettoError>,
    ) -> Result<(), PerfettoError> {
        let head = self.head(b);
        let DeviceEncoder {
            ids,
            enc,
            stats,
            warps,
            ..
        } = self;
        stats.device_events += warps.batch(ids, enc, b, head.window, &mut |enc| {
            stats.bytes += sink(&enc.buf)?;
            enc.clear();
            Ok(())
        })?;
        self.kernel(b, &head);
        Ok(())
    }

    /// Declares the batch's GPU and SMs (those not declared yet), before any
    /// of its warps is written; reads its time window and its events lost.
    pub(crate) fn head(&mut self, b: &Batch) -> Head {
        let DeviceEncoder {
            ids, enc, tracks, ..
        } = self;
        let gpu = tracks.gpu(ids, b.device.ordinal, &b.device.name, enc);
        let g = tracks.get(gpu);
        let (mut first, mut last) = (u64::MAX, 0u64);
        let (mut slots, mut events_lost) = (0u64, 0u64);
        let mut sm = None;
        for slot in b.buffer.view().slots() {
            let h = &slot.header;
            first = first.min(h.first_ts);
            last = last.max(h.last_ts);
            slots += 1;
            events_lost += u64::from(h.events_lost);
            // Neighbouring slots are mostly on one SM: look it up once.
            if sm != Some(h.sm_first) {
                sm = Some(h.sm_first);
                g.declare_sm(h.sm_first, enc);
            }
        }
        Head {
            gpu,
            window: (first, last),
            slots,
            events_lost,
        }
    }

    /// Writes the batch's kernel slice and its events lost on the GPU's counter; for
    /// a launch delivered in parts, once, at its last part, over every part
    /// ([`LaunchParts`]).
    pub(crate) fn kernel(&mut self, b: &Batch, head: &Head) {
        let map = b.calibration.mapper(head.window.0, head.window.1);
        let sum = KernelSum {
            extent: (head.slots > 0)
                .then(|| (map.boottime(head.window.0), map.boottime(head.window.1))),
            events: b.buffer.event_count(),
            warps: head.slots,
            events_lost: head.events_lost,
        };
        if b.launch.part.is_none_or(|p| p.last) {
            self.unfinished.finished(b.launch.launch_id);
        }
        let sum = match b.launch.part {
            None => sum,
            Some(part) => {
                let buffer = b.buffer.view();
                let warps = buffer
                    .slots()
                    .map(|s| (s.header.block_linear, s.header.warp));
                match self.parts.add(b.launch.launch_id, part, sum, warps) {
                    Some(sum) => sum,
                    None => return,
                }
            }
        };
        self.stats.events_lost += sum.events_lost;
        let (start, end) = sum
            .extent
            .unwrap_or((b.launch.host_launch_ns, b.launch.host_complete_ns));
        if start == 0 || end < start {
            return; // Nothing recorded and no host times: no kernel to draw.
        }
        // The flow of a launch whose host span started one ([`FlowOrigins::start`]).
        let flow = self
            .flow_origins
            .end(b.launch.launch_id)
            .then(|| launch_flow_id(b.launch.launch_id));
        self.kernel_slice(b, head.gpu, &sum, (start, end), flow);
    }

    /// Writes a watchdog's snapshot as an instant on its GPU's `watchdog` track, at
    /// the snapshot's time, with its text and counts, and keeps it until its launch
    /// finishes ([`Unfinished`]).
    pub(crate) fn snapshot(&mut self, w: Arc<Watched>) {
        let s = &w.snapshot;
        let DeviceEncoder {
            ids, enc, tracks, ..
        } = self;
        let gpu = tracks.gpu(ids, w.device.ordinal, &w.device.name, enc);
        let track = tracks.get(gpu).watchdog_track(ids, enc);
        let running = s.warps.iter().filter(|w| w.since_ns().is_some()).count();
        let blocks = s.blocks();
        let uint = |name: &str, v: u64| DebugAnnotation {
            name: Some(name.into()),
            uint_value: Some(v),
            ..Default::default()
        };
        let args = vec![
            DebugAnnotation {
                name: Some("summary".into()),
                string_value: Some(w.text.clone()),
                ..Default::default()
            },
            uint("launch_id", s.launch_id),
            uint("running_ns", s.running_ns),
            uint("warps_running", running as u64),
            uint("blocks_running", u64::from(blocks.running)),
            uint("blocks_done", u64::from(blocks.done)),
            uint("blocks_never_started", u64::from(blocks.never_started)),
        ];
        enc.packet(&TracePacket {
            timestamp: Some(w.clock.to_host(s.now_ns)),
            trusted_packet_sequence_id: Some(MISC_SEQUENCE),
            data: Some(Data::TrackEvent(TrackEvent {
                r#type: Some(EventType::Instant as i32),
                track_uuid: Some(track),
                // Counted from 1, as the text counts them.
                name: Some(format!("watchdog snapshot {} of {}", s.index + 1, s.kernel)),
                debug_annotations: args,
                ..Default::default()
            })),
            ..Default::default()
        });
        self.unfinished.keep(w);
    }

    /// The launches still running at the trace's end, with their latest
    /// snapshots: writes each one's kernel slice, begun and never ended, and
    /// returns them, for
    /// their warps' open ranges ([`WarpEncoder::open`]) to be written.
    pub(crate) fn unfinished(&mut self) -> Vec<Arc<Watched>> {
        let all = self.unfinished.take();
        for w in &all {
            let s = &w.snapshot;
            let now = w.clock.to_host(s.now_ns);
            // From the earliest of its launch (as the host saw it), its first warp's
            // start and its first event delivered: the ranges still open began
            // before any event delivered ended.
            let launched = now.saturating_sub(s.running_ns);
            let warps = s.warps.iter().filter_map(|w| match w.state {
                State::Running { started_ns, .. } => Some(started_ns),
                _ => None,
            });
            let start = self
                .parts
                .arriving(s.launch_id)
                .and_then(|sum| sum.extent)
                .map(|(first, _)| first)
                .into_iter()
                .chain(warps.map(|t| w.clock.to_host(t)))
                .fold(launched, u64::min);
            let flow = self
                .flow_origins
                .end(s.launch_id)
                .then(|| launch_flow_id(s.launch_id));
            let DeviceEncoder {
                ids, enc, tracks, ..
            } = self;
            let gpu = tracks.gpu(ids, w.device.ordinal, &w.device.name, enc);
            let g = tracks.get(gpu);
            // The SMs of the warps left open, before their tracks: a launch may hang
            // before its first part declared them.
            for warp in &s.warps {
                if matches!(&warp.state, State::Running { open, .. } if !open.is_empty()) {
                    g.declare_sm(warp.sm, enc);
                }
            }
            let uuid = g.kernel_lane(ids, (start, u64::MAX), enc);
            enc.packet(&TracePacket {
                timestamp: Some(start),
                trusted_packet_sequence_id: Some(MISC_SEQUENCE),
                data: Some(Data::TrackEvent(TrackEvent {
                    r#type: Some(EventType::SliceBegin as i32),
                    track_uuid: Some(uuid),
                    name: Some(if s.kernel.is_empty() {
                        format!("launch {}", s.launch_id)
                    } else {
                        s.kernel.clone()
                    }),
                    debug_annotations: vec![
                        DebugAnnotation {
                            name: Some("launch_id".into()),
                            uint_value: Some(s.launch_id),
                            ..Default::default()
                        },
                        DebugAnnotation {
                            name: Some("unfinished".into()),
                            string_value: Some("still running when the trace ended".into()),
                            ..Default::default()
                        },
                    ],
                    terminating_flow_ids: flow.into_iter().collect(),
                    ..Default::default()
                })),
                ..Default::default()
            });
            self.stats.kernels += 1;
            self.stats.flows += u64::from(flow.is_some());
        }
        all
    }

    /// Writes the ranges each warp of `w` had open, left open ([`WarpEncoder::open`]),
    /// through a bounded buffer, as [`DeviceEncoder::batch`].
    pub(crate) fn open_warps(
        &mut self,
        w: &Watched,
        sink: &mut dyn FnMut(&[u8]) -> Result<u64, PerfettoError>,
    ) -> Result<(), PerfettoError> {
        let DeviceEncoder {
            ids,
            enc,
            warps,
            stats,
            ..
        } = self;
        warps.open(ids, enc, w, &mut |enc| {
            stats.bytes += sink(&enc.buf)?;
            enc.clear();
            Ok(())
        })
    }

    fn kernel_slice(
        &mut self,
        b: &Batch,
        gpu: usize,
        sum: &KernelSum,
        (start, end): (u64, u64),
        flow: Option<u64>,
    ) {
        let lost = sum.events_lost;
        let DeviceEncoder {
            ids, enc, tracks, ..
        } = self;
        let g = tracks.get(gpu);
        let uuid = g.kernel_lane(ids, (start, end), enc);
        let l = &b.launch;
        let arg = |name: &str| DebugAnnotation {
            name: Some(name.into()),
            ..Default::default()
        };
        let dims = |d: [u32; 3]| format!("{}×{}×{}", d[0], d[1], d[2]);
        let mut args = vec![
            DebugAnnotation {
                uint_value: Some(l.launch_id),
                ..arg("launch_id")
            },
            DebugAnnotation {
                string_value: Some(dims(l.grid)),
                ..arg("grid")
            },
            DebugAnnotation {
                string_value: Some(dims(l.block)),
                ..arg("block")
            },
            DebugAnnotation {
                uint_value: Some(sum.events),
                ..arg("events")
            },
            DebugAnnotation {
                uint_value: Some(sum.warps),
                ..arg("warps")
            },
            DebugAnnotation {
                uint_value: Some(lost),
                ..arg("events_lost")
            },
        ];
        if l.host_launch_ns != 0 && start >= l.host_launch_ns {
            args.push(DebugAnnotation {
                uint_value: Some(start - l.host_launch_ns),
                ..arg("launch_to_start_ns")
            });
        }
        // What the slots cover, so that a statistic over them is not read as
        // the whole kernel's.
        let h = b.buffer.header();
        if h.is_sampled() {
            args.push(DebugAnnotation {
                string_value: Some(h.sampling.describe(h.warps_per_block)),
                ..arg("sampled")
            });
        }
        let packet = |ts: u64, ev: TrackEvent| TracePacket {
            timestamp: Some(ts),
            trusted_packet_sequence_id: Some(MISC_SEQUENCE),
            data: Some(Data::TrackEvent(ev)),
            ..Default::default()
        };
        enc.packet(&packet(
            start,
            TrackEvent {
                r#type: Some(EventType::SliceBegin as i32),
                track_uuid: Some(uuid),
                name: Some(if l.kernel.is_empty() {
                    format!("launch {}", l.launch_id)
                } else {
                    l.kernel.to_string()
                }),
                debug_annotations: args,
                terminating_flow_ids: flow.into_iter().collect(),
                ..Default::default()
            },
        ));
        enc.packet(&packet(
            end,
            TrackEvent {
                r#type: Some(EventType::SliceEnd as i32),
                track_uuid: Some(uuid),
                ..Default::default()
            },
        ));
        self.stats.kernels += 1;
        self.stats.flows += u64::from(flow.is_some());
        if lost > 0 {
            let g = tracks.get(gpu);
            let counter = g.lost_track(ids, enc);
            let before = g.lost_total;
            g.lost_total += lost;
            for (ts, v) in [(start, before), (end, g.lost_total)] {
                enc.packet(&packet(
                    ts,
                    TrackEvent {
                        r#type: Some(EventType::Counter as i32),
                        track_uuid: Some(counter),
                        counter_value: Some(v.min(i64::MAX as u64) as i64),
                        ..Default::default()
                    },
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{DeviceInfo, LaunchInfo};
    use crate::clock::Calibration;
    use crate::decode::OwnedBuffer;
    use crate::format::BufferBuilder;
    use crate::perfetto::{proto, TraceWriter};
    use crate::registry::EventRegistry;
    use prost::Message;

    /// The trace written of launch 3 of kernel "k" whose buffer is `buffer`, with an
    /// exact clock: its bytes and the writer's stats.
    fn written(buffer: Vec<u8>, registry: EventRegistry) -> (Vec<u8>, WriteStats) {
        let batch = Batch {
            device: Arc::new(DeviceInfo::default()),
            launch: LaunchInfo {
                launch_id: 3,
                kernel: "k".into(),
                ..Default::default()
            },
            buffer: Arc::new(OwnedBuffer::decode(buffer, None).unwrap()),
            calibration: Arc::new(Calibration::exact(0, 1_000_000, 0.0)),
            registry: Arc::new(registry),
        };
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        w.write_batch(&batch).unwrap();
        w.finish().unwrap()
    }

    /// The hot path's hand-built packets, read back with the prost messages.
    #[test]
    fn hot_packets_decode_as_perfetto_messages() {
        let mut cb = BufferBuilder::new([1, 1, 1], [32, 1, 1], 4);
        cb.warp(0, 0)
            .unwrap()
            .sm(5, 5)
            .range(1, 1_000, 1_300, 7)
            .range(2, 1_332, 1_500, 300)
            .instant(1, 1_600, 9);
        // mma declares its payload (the k-tile), wait does not.
        let reg = EventRegistry::from_pairs([(1, "mma"), (2, "wait")])
            .unwrap()
            .with_payload(1, "k_tile")
            .unwrap();
        let (bytes, stats) = written(cb.finish(), reg);
        assert_eq!(stats.device_events, 3);
        assert_eq!(stats.kernels, 1);
        let trace = proto::Trace::decode(&bytes[..]).unwrap();
        let start = trace
            .packet
            .iter()
            .position(|p| {
                p.trace_packet_defaults.is_some()
                    && p.trusted_packet_sequence_id != Some(MISC_SEQUENCE)
            })
            .expect("the warp's sequence starts");
        let seq = trace.packet[start].trusted_packet_sequence_id;
        let events: Vec<_> = trace.packet[start + 1..]
            .iter()
            .filter(|p| p.trusted_packet_sequence_id == seq)
            .map(|p| {
                let Some(proto::Data::TrackEvent(e)) = &p.data else {
                    panic!("not an event: {p:?}")
                };
                (p.timestamp.unwrap(), e.clone(), p.interned_data.clone())
            })
            .collect();
        let kinds: Vec<_> = events
            .iter()
            .map(|(t, e, _)| (*t, e.r#type.unwrap()))
            .collect();
        let (b, e, i) = (
            EventType::SliceBegin as i32,
            EventType::SliceEnd as i32,
            EventType::Instant as i32,
        );
        // Deltas on the lane's incremental clock: 0, +300, +32, +168, +100.
        assert_eq!(kinds, [(0, b), (300, e), (32, b), (168, e), (100, i)]);
        // The first use of a name interns it, with its payload's name.
        let (_, first, interned) = &events[0];
        let names = interned.as_ref().expect("the first use interns the name");
        assert_eq!(names.event_names[0].name.as_deref(), Some("mma"));
        assert_eq!(first.name_iid, names.event_names[0].iid);
        let k_tile = &names.debug_annotation_names[0];
        assert_eq!(k_tile.name.as_deref(), Some("k_tile"));
        let (_, wait, interned) = &events[2];
        let names = interned.as_ref().expect("wait is new on the lane");
        assert_eq!(names.event_names[0].name.as_deref(), Some("wait"));
        assert!(names.debug_annotation_names.is_empty());
        assert!(
            wait.debug_annotations.is_empty(),
            "wait declares no payload: none is written"
        );
        assert!(events[4].2.is_none(), "mma and k_tile are interned already");
        let payloads: Vec<_> = [0, 4]
            .iter()
            .map(|&k| {
                let a = &events[k].1.debug_annotations[0];
                assert_eq!(a.name_iid, k_tile.iid);
                a.uint_value.unwrap()
            })
            .collect();
        assert_eq!(payloads, [7, 9]);
        assert!(
            events[1].1.track_uuid.is_none(),
            "the track comes from the defaults"
        );
    }

    #[test]
    fn a_sampled_kernel_slice_says_what_it_sampled() {
        let slice_args = |sampling: crate::format::Sampling| {
            let mut b = BufferBuilder::new([4, 1, 1], [64, 1, 1], 4);
            b.sampling(sampling);
            b.warp(0, 1).unwrap().sm(1, 1).range(1, 1_000, 1_300, 0);
            let registry = EventRegistry::from_pairs([(1, "mma")]).unwrap();
            let (bytes, _) = written(b.finish(), registry);
            let trace = proto::Trace::decode(&bytes[..]).unwrap();
            let slice = trace
                .packet
                .iter()
                .find_map(|p| match &p.data {
                    Some(proto::Data::TrackEvent(e)) if e.name.as_deref() == Some("k") => {
                        Some(e.clone())
                    }
                    _ => None,
                })
                .expect("the kernel slice");
            slice
                .debug_annotations
                .iter()
                .map(|a| (a.name.clone().unwrap_or_default(), a.string_value.clone()))
                .collect::<Vec<_>>()
        };
        let sampled = slice_args(crate::format::Sampling::default().warps(0b10).blocks(2, 0));
        let said: Vec<_> = sampled.iter().filter(|(n, _)| n == "sampled").collect();
        assert_eq!(
            said,
            [&(
                "sampled".to_string(),
                Some("1 of 2 warps per block (mask 0x2), 1 block in 2".to_string())
            )]
        );
        let whole = slice_args(crate::format::Sampling::default());
        assert!(whole.iter().all(|(n, _)| n != "sampled"), "{whole:?}");
    }
}
