#!/usr/bin/env python3
"""Checks a tracing-gpu Perfetto trace with Perfetto's own protobuf schema.

    check_perfetto.py TRACE [--expect-slices N] [--expect-device-slices N]
                            [--expect-kernels N] [--expect-host-slices N]
                            [--expect-gpus N] [--expect-flows N]
                            [--expect-events-lost N] [--expect-payload EVENT=ARG ...]
                            [--allow-open-flows] [--allow-open-slices]
                            [--clock-tolerance-ns NS] [--json]
                            [--slices-out FILE]
    check_perfetto.py --self-test

The file is parsed with `perfetto_trace_pb2` from PyPI's `perfetto` package and
replayed the way Perfetto's trace processor reads it: sequences, interning,
packet defaults, incremental clocks. Then it checks:

- the track tree: every parent exists; each GPU is a process with a
  "kernels" track, an "SMs" track whose children are "SM n" in numeric rank
  order, and under each SM, "block B warp W" tracks (lanes "#k") in rank order;
- slices: every end closes a begin on its own track, nothing stays open
  (with --allow-open-slices, slices begun and never ended are counted instead,
  as Perfetto draws them "did not end": a launch still running when the trace
  ended), so slices nest strictly on each track; device slices only on warp tracks,
  kernel slices only on kernel tracks, counters only on counter tracks;
- payloads: a device slice has no argument, or one: its payload (an unsigned
  32-bit value) under the name its event type declares; all device slices of
  one name agree (all carry the same argument, or none does; one that never
  ends, --allow-open-slices, may carry none: its payload comes with its end);
- flows: each flow has one origin (a host thread slice) and one end (a
  kernel slice), and the kernel starts after the launch span does;
- one clock: a ClockSnapshot names BOOTTIME the trace clock, and every
  timestamp resolves to BOOTTIME (directly, or through a sequence's
  incremental clock anchored to BOOTTIME); every device slice lies within a
  kernel slice of its GPU;
- the counts given with --expect-*.

--slices-out writes every slice and counter value as JSON, one per line, sorted:
[track path, name, start, end, arguments] (the path: the track's and its
ancestors' names; the end of a slice that never ends is null), so that two traces of the same events compare equal
whatever their uuids, sequences and packet order).

Exit status 0 and a one-line summary (or --json) when everything holds;
1 with one line per failure on stderr otherwise; 2 on usage errors.
"""

import argparse
import json
import re
import sys
import zlib
from collections import defaultdict

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        f"check_perfetto: cannot import perfetto_trace_pb2 ({e}); "
        "install PyPI's `perfetto` package (scripts/requirements-test.txt)\n"
    )
    sys.exit(2)

BOOTTIME = 6
GPU_PID_BASE = 0x4000_0000
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
EXPLICIT = 3
KERNELS_RE = re.compile(r"^kernels(?: #(\d+))?$")
SM_RE = re.compile(r"^SM (\d+)$")
# The instant that marks a warp's events lost (its `events` argument: how many).
LOST_MARK = "events lost"
# The end of a slice that never ends (--allow-open-slices): after every other time.
OPEN = 1 << 64
WARP_RE = re.compile(r"^block (\d+) warp (\d+)(?: #(\d+))?$")


class Failure(Exception):
    pass


class Checker:
    def __init__(self, tolerance_ns):
        self.errors = []
        self.tolerance = tolerance_ns
        self.tracks = {}  # uuid -> TrackDescriptor
        self.events = []  # (ts, order, uuid, type, name, args, flows, term_flows, counter)
        self.seqs = {}
        self.snapshot_boot = {}  # clock set -> BOOTTIME of its last snapshot
        self.primary_clock = None
        self.packets = 0
        self.lost_marks = 0
        self.marked_lost = 0
        self.compressed = 0
        self.listed = []  # (path, name, start, end, args): for --slices-out
        self.allow_open_flows = False
        self.allow_open_slices = False
        self.open_slices = defaultdict(int)  # track kind -> slices that never end

    def err(self, msg):
        if len(self.errors) < 50:
            self.errors.append(msg)
        elif len(self.errors) == 50:
            self.errors.append("... (more errors not shown)")

    # ---- reading -------------------------------------------------------
    def packets_of(self, data):
        trace = pb.Trace()
        trace.ParseFromString(data)
        for p in trace.packet:
            if p.HasField("compressed_packets"):
                self.compressed += 1
                yield from self.packets_of(zlib.decompress(p.compressed_packets))
            else:
                yield p

    def seq_state(self, seq):
        s = self.seqs.get(seq)
        if s is None:
            s = self.seqs[seq] = {
                "valid": False,
                "names": {},
                "dnames": {},
                "defaults": None,
                "clocks": {},
            }
        return s

    def read(self, data):
        for order, p in enumerate(self.packets_of(data)):
            self.packets += 1
            seq = p.trusted_packet_sequence_id if p.HasField("trusted_packet_sequence_id") else 0
            st = self.seq_state(seq)
            if p.incremental_state_cleared or (p.sequence_flags & 1):
                if not seq:
                    self.err(f"packet {order}: clears incremental state without a sequence id")
                st.update(valid=True, names={}, dnames={}, defaults=None)
            if p.HasField("trace_packet_defaults"):
                st["defaults"] = p.trace_packet_defaults
            if p.HasField("interned_data"):
                for n in p.interned_data.event_names:
                    self.intern(st["names"], n, order, "event name")
                for n in p.interned_data.debug_annotation_names:
                    self.intern(st["dnames"], n, order, "argument name")
            if p.HasField("clock_snapshot"):
                self.snapshot(p.clock_snapshot, st, order, seq)
                continue
            if p.HasField("track_descriptor"):
                self.descriptor(p.track_descriptor, order)
            if p.HasField("track_event"):
                self.track_event(p, st, seq, order)

    def intern(self, table, entry, order, what):
        if not entry.iid:
            self.err(f"packet {order}: interned {what} without iid")
        elif entry.iid in table and table[entry.iid] != entry.name:
            self.err(f"packet {order}: {what} iid {entry.iid} re-interned as {entry.name!r}")
        table[entry.iid] = entry.name

    def snapshot(self, snap, st, order, seq):
        if snap.HasField("primary_trace_clock"):
            self.primary_clock = snap.primary_trace_clock
        boot = [c.timestamp for c in snap.clocks if c.clock_id == BOOTTIME]
        # The trace processor keeps one time series per set of clocks (a
        # sequence-scoped clock counts with its sequence) and rejects a
        # snapshot whose trace clock is earlier than the previous one's.
        key = frozenset((c.clock_id, seq if 64 <= c.clock_id < 128 else 0) for c in snap.clocks)
        if boot:
            last = self.snapshot_boot.get(key)
            if last is not None and boot[0] < last:
                self.err(f"packet {order}: clock snapshot goes back on BOOTTIME ({boot[0]} < {last} "
                         "in the previous one of the same clocks): the trace processor rejects it")
            self.snapshot_boot[key] = boot[0]
        for c in snap.clocks:
            if 64 <= c.clock_id < 128:
                if not boot:
                    self.err(f"packet {order}: sequence clock {c.clock_id} not anchored to BOOTTIME")
                    continue
                mult = c.unit_multiplier_ns or 1
                st["clocks"][c.clock_id] = {
                    "incremental": c.is_incremental,
                    "mult": mult,
                    "value": c.timestamp,
                    "v0": c.timestamp,
                    "b0": boot[0],
                }

    def descriptor(self, d, order):
        if not d.HasField("uuid"):
            self.err(f"packet {order}: track descriptor without uuid")
            return
        old = self.tracks.get(d.uuid)
        if old is not None and old.SerializeToString() != d.SerializeToString():
            self.err(f"track {d.uuid} described twice, differently")
        self.tracks[d.uuid] = d

    def timestamp(self, p, st, order):
        if not p.HasField("timestamp"):
            self.err(f"packet {order}: track event without timestamp")
            return None
        clock = BOOTTIME
        d = st["defaults"]
        if p.HasField("timestamp_clock_id"):
            clock = p.timestamp_clock_id
        elif d is not None and d.HasField("timestamp_clock_id"):
            clock = d.timestamp_clock_id
        ts = p.timestamp
        if clock == BOOTTIME:
            return ts
        if 64 <= clock < 128:
            c = st["clocks"].get(clock)
            if c is None:
                self.err(f"packet {order}: clock {clock} used before its snapshot on this sequence")
                return None
            if c["incremental"]:
                if ts >= 1 << 62:
                    self.err(f"packet {order}: incremental delta {ts} (a negative step?)")
                c["value"] += ts
                v = c["value"]
            else:
                v = ts
            return c["b0"] + (v - c["v0"]) * c["mult"]
        self.err(f"packet {order}: timestamp on clock {clock}, not on BOOTTIME")
        return None

    def track_event(self, p, st, seq, order):
        ev = p.track_event
        if seq and not st["valid"]:
            self.err(f"packet {order}: sequence {seq} used before its state was cleared")
        ts = self.timestamp(p, st, order)
        d = st["defaults"]
        if ev.HasField("track_uuid"):
            uuid = ev.track_uuid
        elif d is not None and d.track_event_defaults.HasField("track_uuid"):
            uuid = d.track_event_defaults.track_uuid
        else:
            self.err(f"packet {order}: track event with no track")
            return
        name = None
        if ev.HasField("name_iid"):
            name = st["names"].get(ev.name_iid)
            if name is None:
                self.err(f"packet {order}: event name iid {ev.name_iid} not interned on sequence {seq}")
        elif ev.HasField("name"):
            name = ev.name
        args = {}
        for a in ev.debug_annotations:
            if a.HasField("name_iid"):
                an = st["dnames"].get(a.name_iid)
                if an is None:
                    self.err(f"packet {order}: argument name iid {a.name_iid} not interned")
                    continue
            else:
                an = a.name
            for f in ("uint_value", "int_value", "bool_value", "double_value", "string_value"):
                if a.HasField(f):
                    args[an] = getattr(a, f)
        if ts is None:
            return
        self.events.append(
            (ts, order, uuid, ev.type, name, args, list(ev.flow_ids),
             list(ev.terminating_flow_ids), ev.counter_value if ev.HasField("counter_value") else None)
        )

    # ---- checking ------------------------------------------------------
    def name_of(self, d):
        if d.HasField("name"):
            return d.name
        if d.HasField("thread"):
            return d.thread.thread_name
        if d.HasField("process"):
            return d.process.process_name
        return ""

    def check(self):
        if self.primary_clock != BOOTTIME:
            self.err(f"no ClockSnapshot declares BOOTTIME the trace clock (primary: {self.primary_clock})")
        children = defaultdict(list)
        for u, d in self.tracks.items():
            if d.HasField("parent_uuid"):
                if d.parent_uuid not in self.tracks:
                    self.err(f"track {u} ({self.name_of(d)!r}): parent {d.parent_uuid} not declared")
                children[d.parent_uuid].append(d)
        for u in self.tracks:  # cycles
            seen, cur = set(), u
            while cur in self.tracks and self.tracks[cur].HasField("parent_uuid"):
                if cur in seen:
                    self.err(f"track {u}: parent cycle")
                    break
                seen.add(cur)
                cur = self.tracks[cur].parent_uuid

        kind = {}  # uuid -> "thread" | "kernel" | "warp" | "counter" | "other"
        gpu_of = {}  # uuid -> gpu process uuid
        gpus = [d for d in self.tracks.values()
                if d.HasField("process") and d.process.pid >= GPU_PID_BASE]
        summary = {"gpus": len(gpus), "sms": 0, "warp_tracks": 0, "lanes": 0}
        for u, d in self.tracks.items():
            if d.HasField("thread"):
                kind[u] = "thread"
            elif d.HasField("counter"):
                kind[u] = "counter"
            else:
                kind[u] = "other"
        for g in gpus:
            kids = children[g.uuid]
            kernels = [k for k in kids if KERNELS_RE.match(self.name_of(k))]
            sms_group = [k for k in kids if self.name_of(k) == "SMs"]
            if not sms_group:
                self.err(f"GPU {self.name_of(g)!r}: no 'SMs' track")
            for k in kernels:
                kind[k.uuid] = "kernel"
                gpu_of[k.uuid] = g.uuid
            for k in kids:
                gpu_of.setdefault(k.uuid, g.uuid)
            for grp in sms_group:
                if grp.child_ordering != EXPLICIT:
                    self.err(f"GPU {self.name_of(g)!r}: SMs not explicitly ordered")
                sms = children[grp.uuid]
                summary["sms"] += len(sms)
                self.ordered(sms, SM_RE, lambda m: (int(m.group(1)),), f"{self.name_of(g)} SMs")
                for sm in sms:
                    if sm.child_ordering != EXPLICIT:
                        self.err(f"{self.name_of(sm)!r}: warps not explicitly ordered")
                    warps = children[sm.uuid]
                    summary["lanes"] += len(warps)
                    for w in warps:
                        m = WARP_RE.match(self.name_of(w))
                        if m and m.group(3) is None:  # a warp's first lane
                            summary["warp_tracks"] += 1
                    self.ordered(warps, WARP_RE,
                                 lambda m: (int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)),
                                 f"{self.name_of(g)} {self.name_of(sm)}")
                    for w in warps:
                        kind[w.uuid] = "warp"
                        gpu_of[w.uuid] = g.uuid

        # Slices, per track, in timeline order (stable: file order breaks ties).
        per_track = defaultdict(list)
        for e in self.events:
            per_track[e[2]].append(e)
        counts = defaultdict(int)
        slices = {}  # (uuid, order) -> (ts, end)
        origins, ends = defaultdict(list), defaultdict(list)
        kernel_spans = defaultdict(list)
        device_slices = []
        self.payload_args = defaultdict(set)  # device slice name -> argument names (None: none)
        lost = defaultdict(int)
        for uuid, evs in per_track.items():
            if uuid not in self.tracks:
                self.err(f"{len(evs)} events on undeclared track {uuid}")
                continue
            k = kind[uuid]
            evs.sort(key=lambda e: (e[0], e[1]))
            stack = []
            for e in evs:
                ts, order, _, typ, name, args, flows, terms, cval = e
                if typ == COUNTER:
                    self.listed.append((self.path(uuid), "counter", ts, ts, {"value": cval}))
                    if k != "counter":
                        self.err(f"counter value on non-counter track {self.name_of(self.tracks[uuid])!r}")
                    elif self.name_of(self.tracks[uuid]) == "events lost":
                        lost[gpu_of.get(uuid)] = max(lost[gpu_of.get(uuid)], cval or 0)
                    continue
                if k == "counter":
                    self.err(f"slice event on counter track {uuid}")
                    continue
                if typ == SLICE_BEGIN:
                    if name is None:
                        self.err(f"packet {order}: slice without a name")
                    stack.append(e)
                    continue
                if typ == SLICE_END:
                    if not stack:
                        self.err(f"packet {order}: slice end with nothing open on track "
                                 f"{self.name_of(self.tracks[uuid])!r}")
                        continue
                    b = stack.pop()
                    start, end = b[0], ts
                    self.slice(k, uuid, b, start, end, counts, origins, ends, kernel_spans, device_slices)
                    continue
                if typ == INSTANT:
                    self.slice(k, uuid, e, ts, ts, counts, origins, ends, kernel_spans, device_slices)
                    continue
                self.err(f"packet {order}: event of type {typ}")
            for b in stack:
                if self.allow_open_slices:
                    self.open_slices[k] += 1
                    self.slice(k, uuid, b, b[0], OPEN, counts, origins, ends, kernel_spans, device_slices)
                    continue
                self.err(f"packet {b[1]}: slice {b[4]!r} on {self.name_of(self.tracks[uuid])!r} never ends")

        for name, found in sorted(self.payload_args.items(), key=lambda kv: str(kv[0])):
            if len(found) > 1:
                self.err(f"device slices {name!r} disagree on their payload argument: "
                         f"{sorted(str(a) for a in found)} (a type declares one payload name, or none)")

        # Flows: one host origin, one kernel end each.
        flows = 0
        for fid in set(origins) | set(ends):
            o, t = origins.get(fid, []), ends.get(fid, [])
            if len(o) != 1 or len(t) > 1:
                self.err(f"flow {fid}: {len(o)} origins and {len(t)} ends")
                continue
            if not t:
                if not self.allow_open_flows:
                    self.err(f"flow {fid}: starts at {o[0][2]!r} but never ends")
                continue
            (ok, ots, oname), (tk, tts, tname) = o[0], t[0]
            if ok != "thread" or tk != "kernel":
                self.err(f"flow {fid}: from a {ok} slice to a {tk} slice (want thread → kernel)")
            if tts + self.tolerance < ots:
                self.err(f"flow {fid}: kernel {tname!r} starts {ots - tts} ns before its launch span {oname!r}")
            flows += 1

        # Every event lost is marked on its warp's track.
        if self.marked_lost != sum(lost.values()):
            self.err(f"{self.marked_lost} events lost marked on warp tracks, "
                     f"but the counters say {sum(lost.values())}")

        # Device slices inside a kernel slice of their GPU.
        for g in kernel_spans:
            kernel_spans[g].sort()
        outside = 0
        for g, s, e, name, _ in device_slices:
            ks = kernel_spans.get(g, [])
            if not any(ks_s - self.tolerance <= s and e <= ks_e + self.tolerance for ks_s, ks_e in ks):
                outside += 1
                if outside <= 5:
                    self.err(f"device slice {name!r} [{s}, {e}] lies outside every kernel slice of its GPU")

        summary.update(
            packets=self.packets,
            tracks=len(self.tracks),
            slices=sum(counts.values()),
            host_slices=counts["thread"],
            device_slices=counts["warp"],
            kernel_slices=counts["kernel"],
            other_slices=counts["other"],
            flows=flows,
            device_payloads=sum(1 for d in device_slices if d[4]),
            events_lost=sum(lost.values()),
            lost_marks=self.lost_marks,
            sequences=len(self.seqs),
            open_slices=sum(self.open_slices.values()),
            open_device_slices=self.open_slices["warp"],
            open_kernel_slices=self.open_slices["kernel"],
            compressed=self.compressed,
        )
        return summary

    def path(self, uuid):
        names = []
        while uuid in self.tracks:
            names.append(self.name_of(self.tracks[uuid]))
            if not self.tracks[uuid].HasField("parent_uuid"):
                break
            uuid = self.tracks[uuid].parent_uuid
        return "/".join(reversed(names))

    def slice(self, k, uuid, e, start, end, counts, origins, ends, kernel_spans, device_slices):
        name, flows, terms = e[4], e[6], e[7]
        self.listed.append((self.path(uuid), name, start, None if end == OPEN else end, e[5]))
        if k == "warp" and name == LOST_MARK:
            # Not a device event: the instant that marks a warp's events lost.
            args = e[5]
            n = args.get("events")
            if start != end or type(n) is not int or n < 1:
                self.err(f"packet {e[1]}: {LOST_MARK!r} must be an instant with events >= 1, got {args}")
            self.lost_marks += 1
            self.marked_lost += n if type(n) is int else 0
            return
        counts[k] += 1
        for f in flows:
            origins[f].append((k, start, name))
        for f in terms:
            ends[f].append((k, start, name))
        if k == "kernel":
            kernel_spans[self.gpu_of_track(uuid)].append((start, end))
        elif k == "warp":
            args = e[5]
            device_slices.append((self.gpu_of_track(uuid), start, end, name, bool(args)))
            if len(args) > 1:
                self.err(f"packet {e[1]}: device slice {name!r} has {len(args)} arguments "
                         f"({sorted(args)}); it carries at most its payload")
            for an, v in args.items():
                if type(v) is not int or not 0 <= v < 1 << 32:
                    self.err(f"packet {e[1]}: device slice {name!r}: payload {an!r} = {v!r} "
                             "is not an unsigned 32-bit value")
            # A range that never ended has no payload yet (it comes with the end).
            if args or end != OPEN:
                self.payload_args[name].add(min(args) if args else None)

    def expect_payload(self, spec):
        """`EVENT=ARG`: every device slice named EVENT carries argument ARG;
        `EVENT=`: none carries one."""
        event, _, arg = spec.partition("=")
        want = arg or None
        found = self.payload_args.get(event)
        if not found:
            self.err(f"--expect-payload {spec}: no device slice named {event!r}")
        elif found != {want}:
            got = ", ".join(repr(a) if a else "None" for a in sorted(found, key=str))
            self.err(f"device slices {event!r}: payload {got}, expected {want!r}")

    def gpu_of_track(self, uuid):
        cur = uuid
        while cur in self.tracks:
            d = self.tracks[cur]
            if d.HasField("process"):
                return cur
            if not d.HasField("parent_uuid"):
                return None
            cur = d.parent_uuid
        return None

    def ordered(self, tracks, pattern, key, where):
        parsed = []
        for t in tracks:
            m = pattern.match(self.name_of(t))
            if not m:
                self.err(f"{where}: unexpected track {self.name_of(t)!r}")
                continue
            parsed.append((key(m), t.sibling_order_rank, self.name_of(t)))
        parsed.sort()
        ranks = [r for _, r, _ in parsed]
        if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
            self.err(f"{where}: sibling ranks do not follow the numeric order: "
                     f"{[(n, r) for _, r, n in parsed][:8]}")


# ---- self-test: the checker must reject broken traces -----------------------
def _good_trace():
    """A small valid trace: host thread with a launch span, one GPU, SM 2 and
    SM 10, one warp each, a kernel slice, a flow."""
    t = pb.Trace()

    def pkt(seq=1, **kw):
        p = t.packet.add()
        p.trusted_packet_sequence_id = seq
        return p

    p = pkt()
    p.sequence_flags = 1
    p.trace_packet_defaults.timestamp_clock_id = BOOTTIME
    c = p.clock_snapshot.clocks.add()
    c.clock_id, c.timestamp = BOOTTIME, 1000
    p.clock_snapshot.primary_trace_clock = BOOTTIME

    def track(uuid, name, parent=None, rank=None, explicit=False, pid=None, tid=None):
        d = pkt().track_descriptor
        d.uuid, d.name = uuid, name
        if parent is not None:
            d.parent_uuid = parent
        if rank is not None:
            d.sibling_order_rank = rank
        if explicit:
            d.child_ordering = EXPLICIT
        if pid is not None and tid is None:
            d.process.pid, d.process.process_name = pid, name
        if tid is not None:
            d.thread.pid, d.thread.tid, d.thread.thread_name = pid, tid, name

    track(1, "host", pid=100)
    track(2, "main", pid=100, tid=100)
    track(10, "GPU 0", pid=GPU_PID_BASE)
    track(11, "SMs", parent=10, explicit=True)
    track(12, "kernels", parent=10)
    track(20, "SM 2", parent=11, rank=2, explicit=True)
    track(21, "SM 10", parent=11, rank=10, explicit=True)
    track(30, "block 0 warp 0", parent=20, rank=0)
    track(31, "block 1 warp 0", parent=21, rank=64)

    def ev(seq, ts, typ, uuid, name=None, flows=(), terms=(), payload=None):
        p = pkt(seq)
        p.timestamp = ts
        e = p.track_event
        e.type, e.track_uuid = typ, uuid
        if name:
            e.name = name
        e.flow_ids.extend(flows)
        e.terminating_flow_ids.extend(terms)
        if payload is not None:
            a = e.debug_annotations.add()
            a.name, a.uint_value = "k_tile", payload
        return p

    ev(1, 2000, SLICE_BEGIN, 2, "launch", flows=[7])
    ev(1, 2100, SLICE_END, 2)
    ev(1, 3000, SLICE_BEGIN, 12, "gemm", terms=[7])
    ev(1, 4000, SLICE_END, 12)
    # Warp 0 on its own sequence, with an incremental clock and interning.
    p = pkt(5)
    p.sequence_flags = 1
    p.trace_packet_defaults.timestamp_clock_id = 64
    p.trace_packet_defaults.track_event_defaults.track_uuid = 30
    p.interned_data.event_names.add(iid=1, name="load")
    for cid, ts, inc in [(BOOTTIME, 3100, False), (64, 3100, True)]:
        c = p.clock_snapshot.clocks.add()
        c.clock_id, c.timestamp = cid, ts
        if inc:
            c.is_incremental = True
    for delta, typ in [(0, SLICE_BEGIN), (100, SLICE_END)]:
        q = pkt(5)
        q.timestamp = delta
        q.track_event.type = typ
        if typ == SLICE_BEGIN:
            q.track_event.name_iid = 1
            a = q.track_event.debug_annotations.add()
            a.name, a.uint_value = "k_tile", 0
    ev(1, 3200, INSTANT, 31, "mma", payload=3)
    return t


def _run(trace, *args):
    import os
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".perfetto-trace")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(trace.SerializeToString())
        c = Checker(0)
        c.allow_open_flows = "--allow-open-flows" in args
        c.allow_open_slices = "--allow-open-slices" in args
        c.read(open(path, "rb").read())
        s = c.check()
        for a in args:
            if a.startswith("slices="):
                want = int(a.split("=")[1])
                if s["slices"] != want:
                    c.err(f"slices: {s['slices']}, expected {want}")
            if a.startswith("payload="):
                c.expect_payload(a.split("=", 1)[1])
        return c.errors, s
    finally:
        os.unlink(path)


def self_test():
    errors, s = _run(_good_trace())
    assert not errors, errors
    assert (s["host_slices"], s["kernel_slices"], s["device_slices"], s["flows"]) == (1, 1, 2, 1), s
    assert (s["gpus"], s["sms"], s["warp_tracks"]) == (1, 2, 2), s

    def broken(mutate, expect, *args):
        t = _good_trace()
        mutate(t)
        errors, _ = _run(t, *args)
        assert any(expect in e for e in errors), f"expected {expect!r}, got {errors}"

    def pk(t, pred):
        return next(p for p in t.packet if pred(p))

    def pkt_like(t, seq):
        p = t.packet.add()
        p.trusted_packet_sequence_id = seq
        return p

    def drop(t, pred):
        keep = [p for p in t.packet if not pred(p)]
        del t.packet[:]
        t.packet.extend(keep)

    is_end_on = lambda uuid: lambda p: p.HasField("track_event") and p.track_event.type == SLICE_END \
        and p.track_event.track_uuid == uuid
    broken(lambda t: drop(t, is_end_on(2)), "never ends")
    # Allowed, a slice that never ends is counted, and lies in its kernel if that never ends.
    t = _good_trace()
    drop(t, is_end_on(2))
    errors, s = _run(t, "--allow-open-slices")
    assert not errors and s["open_slices"] == 1, (errors, s)
    broken(lambda t: drop(t, lambda p: p.HasField("track_event") and p.track_event.name == "launch"),
           "nothing open")
    broken(lambda t: setattr(pk(t, lambda p: p.track_descriptor.name == "SM 10").track_descriptor,
                             "sibling_order_rank", 1), "numeric order")
    broken(lambda t: setattr(pk(t, lambda p: p.track_event.name_iid == 1).track_event, "name_iid", 9),
           "not interned")
    broken(lambda t: pk(t, lambda p: p.track_event.name == "gemm").track_event.ClearField(
        "terminating_flow_ids"), "never ends")
    broken(lambda t: pk(t, lambda p: p.track_event.name == "launch").track_event.ClearField("flow_ids"),
           "0 origins")
    broken(lambda t: setattr(pk(t, lambda p: p.track_event.name == "launch"), "timestamp_clock_id", 1),
           "not on BOOTTIME")
    broken(lambda t: pk(t, lambda p: p.HasField("clock_snapshot")).clock_snapshot.ClearField(
        "primary_trace_clock"), "trace clock")
    broken(lambda t: setattr(pk(t, lambda p: p.track_event.name == "mma"), "timestamp", 9000),
           "outside every kernel")
    broken(lambda t: setattr(pk(t, lambda p: p.track_event.name == "gemm"), "timestamp", 1500),
           "before its launch span")
    broken(lambda t: setattr(pk(t, lambda p: p.track_descriptor.name == "block 1 warp 0").track_descriptor,
                             "parent_uuid", 99), "not declared")
    def second_load_without_payload(t):
        # A second load on warp 0's sequence, after the first, with no payload.
        for delta, typ in [(10, SLICE_BEGIN), (50, SLICE_END)]:
            q = pkt_like(t, 5)
            q.timestamp = delta
            q.track_event.type = typ
            if typ == SLICE_BEGIN:
                q.track_event.name_iid = 1
    broken(second_load_without_payload, "disagree on their payload")
    # A load begun and never ended (a watchdog's snapshot) carries no payload yet (its
    # kernel here ends: the only fault).
    t = _good_trace()
    q = pkt_like(t, 5)
    q.timestamp = 10
    q.track_event.type = SLICE_BEGIN
    q.track_event.name_iid = 1
    errors, s = _run(t, "--allow-open-slices")
    assert len(errors) == 1 and "outside every kernel" in errors[0], errors
    assert s["open_device_slices"] == 1, s

    def two_arguments(t):
        a = pk(t, lambda p: p.track_event.name == "mma").track_event.debug_annotations.add()
        a.name, a.uint_value = "stage", 1
    broken(two_arguments, "at most its payload")
    broken(lambda t: setattr(pk(t, lambda p: p.track_event.name == "mma").track_event.debug_annotations[0],
                             "int_value", -1), "not an unsigned 32-bit")
    broken(lambda t: None, "'mma': payload 'k_tile', expected None", "payload=mma=")
    broken(lambda t: None, "'load': payload 'k_tile', expected 'stage'", "payload=load=stage")
    errors, s = _run(_good_trace(), "payload=mma=k_tile", "payload=load=k_tile")
    assert not errors and s["device_payloads"] == 2, (errors, s)
    # Device slices without payloads are fine when their type declares none.
    t = _good_trace()
    pk(t, lambda p: p.track_event.name == "mma").track_event.ClearField("debug_annotations")
    errors, s = _run(t, "payload=mma=")
    assert not errors and s["device_payloads"] == 1, (errors, s)
    broken(lambda t: None, "slices: 4, expected 5", "slices=5")

    def restart_earlier(t):
        # Warp 0's sequence restarted, its clock re-anchored before the first anchor.
        p = t.packet.add()
        p.CopyFrom(pk(t, lambda p: p.trusted_packet_sequence_id == 5 and p.HasField("clock_snapshot")))
        for c in p.clock_snapshot.clocks:
            c.timestamp = 3000
    broken(restart_earlier, "goes back on BOOTTIME")
    print("check_perfetto: self-test passed (1 good trace, 18 broken ones rejected)")
    return 0


def main(argv=None):
    if argv is None and sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--expect-slices", type=int, help="all slices (host + kernel + device + other)")
    ap.add_argument("--expect-device-slices", type=int, help="slices on warp tracks (device events)")
    ap.add_argument("--expect-kernels", type=int, help="kernel slices")
    ap.add_argument("--expect-host-slices", type=int, help="slices on host thread tracks")
    ap.add_argument("--expect-gpus", type=int, help="GPU process tracks")
    ap.add_argument("--expect-flows", type=int, help="host launch → kernel flows")
    ap.add_argument("--expect-events-lost", type=int, help="events lost, summed over GPUs")
    ap.add_argument("--expect-lost-marks", type=int, help="warps marked with an 'events lost' instant")
    ap.add_argument("--expect-payload", action="append", default=[], metavar="EVENT=ARG",
                    help="device slices named EVENT carry their payload as argument ARG "
                         "(EVENT= : no payload argument); repeatable")
    ap.add_argument("--allow-open-flows", action="store_true",
                    help="accept flows that start on the host and never reach a kernel")
    ap.add_argument("--allow-open-slices", action="store_true",
                    help="accept slices that never end (a launch still running at the end), counted")
    ap.add_argument("--clock-tolerance-ns", type=int, default=0,
                    help="slack for the kernel-after-launch and device-in-kernel checks")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--slices-out", metavar="FILE",
                    help="write every slice and counter value to FILE (JSON lines, sorted)")
    a = ap.parse_args(argv)
    try:
        with open(a.trace, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.stderr.write(f"check_perfetto: {e}\n")
        return 2
    c = Checker(a.clock_tolerance_ns)
    c.allow_open_flows = a.allow_open_flows
    c.allow_open_slices = a.allow_open_slices
    try:
        c.read(data)
    except Exception as e:  # a parse error is a failed check
        sys.stderr.write(f"check_perfetto: {a.trace}: not a valid trace: {e}\n")
        return 1
    s = c.check()
    s["bytes"] = len(data)
    for opt, key in [("expect_slices", "slices"), ("expect_device_slices", "device_slices"),
                     ("expect_kernels", "kernel_slices"), ("expect_host_slices", "host_slices"),
                     ("expect_gpus", "gpus"), ("expect_flows", "flows"),
                     ("expect_events_lost", "events_lost"), ("expect_lost_marks", "lost_marks")]:
        want = getattr(a, opt)
        if want is not None and s[key] != want:
            c.err(f"{key}: {s[key]}, expected {want}")
    for spec in a.expect_payload:
        c.expect_payload(spec)
    if c.errors:
        for e in c.errors:
            sys.stderr.write(f"check_perfetto: {a.trace}: {e}\n")
        return 1
    if a.slices_out:
        lines = sorted(json.dumps([p, n, b, e, args], sort_keys=True) for p, n, b, e, args in c.listed)
        with open(a.slices_out, "w") as f:
            f.write("".join(line + "\n" for line in lines))
    if a.json:
        print(json.dumps(s, sort_keys=True))
    else:
        print(f"check_perfetto: {a.trace}: OK: " + ", ".join(f"{k}={v}" for k, v in sorted(s.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
