//! Host threads: one track and one writer sequence per thread, and the packets
//! of its slices. The live [`super::PerfettoLayer`] keeps one [`HostThread`] per
//! thread that emits spans; the replay of a capture's host spans
//! ([`super::TraceWriter::write_host_spans`]) makes one per recorded thread, so
//! both write the same packets.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::proto::{
    field, Enc, EventType, Open, ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor,
};
use super::tracks::{descriptor, sequence_start, Ids, GPU_PID_BASE};
use crate::batch::HostSpan;

/// The pid of the host process of a replayed capture: a capture does not store
/// the recorded process's pid, and this one is below the GPUs' and above
/// Linux's largest.
pub(crate) const REPLAY_PID: i32 = GPU_PID_BASE - 1;

/// The descriptor of a host process (its threads name it by `pid`).
pub(crate) fn process(ids: &Ids, pid: i32, name: String) -> TracePacket {
    descriptor(TrackDescriptor {
        uuid: Some(ids.uuid()),
        name: Some(name.clone()),
        process: Some(ProcessDescriptor {
            pid: Some(pid),
            process_name: Some(name),
            process_labels: Vec::new(),
        }),
        ..Default::default()
    })
}

/// Hashes a key (a callsite's address, an index; a warp's place, for
/// [`super::owners`]) with one multiply a word.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
    fn write_u128(&mut self, v: u128) {
        // A round a half. One fold of the halves by XOR alone would hash warps
        // of mirrored places alike (block b on SM s, block s on SM b): a grid
        // of many blocks would put hundreds of warps on one hash.
        self.write_usize((v >> 64) as usize);
        self.write_usize(self.0 as usize ^ v as usize);
    }
}

/// One host thread's track, its writer sequence, and the packets not yet
/// handed to the output.
#[derive(Debug)]
pub(crate) struct HostThread {
    pub(crate) enc: Enc,
    seq: u32,
    uuid: u64,
    pid: i32,
    tid: i32,
    name: String,
    last_ts: Option<u64>,
    /// Name key → interned name id on this sequence. The key is the caller's:
    /// a callsite's address (live), an index into a name table (replay).
    names: HashMap<usize, u64, BuildHasherDefault<KeyHasher>>,
    next_iid: u64,
    /// Slices open on this thread's track.
    pub(crate) depth: u32,
    /// Slices begun (and instants) since the owner last took the count.
    pub(crate) slices: u64,
}

impl HostThread {
    pub(crate) fn new(ids: &Ids, pid: i32, tid: i32, name: String, capacity: usize) -> HostThread {
        HostThread {
            enc: Enc::with_capacity(capacity),
            seq: ids.sequence(),
            uuid: ids.uuid(),
            pid,
            tid,
            name,
            last_ts: None,
            names: HashMap::default(),
            next_iid: 1,
            depth: 0,
            slices: 0,
        }
    }

    /// Opens a packet at `ts` (declaring the track and starting the sequence
    /// on the first one).
    fn packet(&mut self, ts: u64) -> Open {
        let prev = match self.last_ts {
            Some(t) => t,
            None => {
                self.enc.packet(&descriptor(TrackDescriptor {
                    uuid: Some(self.uuid),
                    thread: Some(ThreadDescriptor {
                        pid: Some(self.pid),
                        tid: Some(self.tid),
                        thread_name: Some(self.name.clone()),
                    }),
                    ..Default::default()
                }));
                self.enc
                    .packet(&sequence_start(self.seq, self.uuid, ts, None));
                ts
            }
        };
        // One thread's clock reads never go back; if they did, a zero delta
        // keeps the sequence valid.
        let ts = ts.max(prev);
        self.last_ts = Some(ts);
        let p = self.enc.open(field::TRACE_PACKET);
        self.enc.uint(field::PACKET_TIMESTAMP, ts - prev);
        self.enc
            .uint(field::PACKET_SEQUENCE_ID, u64::from(self.seq));
        p
    }

    /// The iid of the name with this key, and whether this packet must intern it.
    fn iid(&mut self, key: usize) -> (u64, bool) {
        if let Some(&iid) = self.names.get(&key) {
            return (iid, false);
        }
        let iid = self.next_iid;
        self.next_iid += 1;
        self.names.insert(key, iid);
        (iid, true)
    }

    fn intern(&mut self, iid: u64, name: &str) {
        let i = self.enc.open(field::PACKET_INTERNED_DATA);
        let n = self.enc.open(field::INTERNED_EVENT_NAMES);
        self.enc.uint(field::INTERNED_IID, iid);
        self.enc.bytes(field::INTERNED_NAME, name.as_bytes());
        self.enc.close(n);
        self.enc.close(i);
    }

    /// Opens a slice named `name` (interned under `key`) with `args`
    /// (encoded `debug_annotations`), starting flow `flow` if given.
    pub(crate) fn begin(
        &mut self,
        ts: u64,
        key: usize,
        name: &str,
        args: &[u8],
        flow: Option<u64>,
    ) {
        let (iid, new) = self.iid(key);
        let p = self.packet(ts);
        if new {
            self.intern(iid, name);
        }
        let t = self.enc.open(field::PACKET_TRACK_EVENT);
        self.enc
            .uint(field::EVENT_TYPE, EventType::SliceBegin as u64);
        self.enc.uint(field::EVENT_NAME_IID, iid);
        self.enc.buf.extend_from_slice(args);
        if let Some(f) = flow {
            self.enc.fixed64(field::EVENT_FLOW_IDS, f);
        }
        self.enc.close(t);
        self.enc.close(p);
        self.depth += 1;
        self.slices += 1;
    }

    /// Closes the innermost open slice.
    pub(crate) fn end(&mut self, ts: u64) {
        if self.depth == 0 {
            return; // The matching begin was before this thread's buffer existed.
        }
        self.depth -= 1;
        let p = self.packet(ts);
        let t = self.enc.open(field::PACKET_TRACK_EVENT);
        self.enc.uint(field::EVENT_TYPE, EventType::SliceEnd as u64);
        self.enc.close(t);
        self.enc.close(p);
    }

    /// An instant named by `message`, or, if that is empty, by `name`
    /// (interned under `key`), with `args`.
    pub(crate) fn instant(&mut self, ts: u64, key: usize, name: &str, message: &str, args: &[u8]) {
        let named = message.is_empty().then(|| self.iid(key));
        let p = self.packet(ts);
        if let Some((iid, true)) = named {
            self.intern(iid, name);
        }
        let t = self.enc.open(field::PACKET_TRACK_EVENT);
        self.enc.uint(field::EVENT_TYPE, EventType::Instant as u64);
        match named {
            Some((iid, _)) => self.enc.uint(field::EVENT_NAME_IID, iid),
            None => self.enc.bytes(field::EVENT_NAME, message.as_bytes()),
        }
        self.enc.buf.extend_from_slice(args);
        self.enc.close(t);
        self.enc.close(p);
        self.slices += 1;
    }
}

/// Appends one argument (`TrackEvent.debug_annotations`) named `name`, whose
/// value `value` writes.
pub(crate) fn annotation(args: &mut Enc, name: &str, value: impl FnOnce(&mut Enc)) {
    let a = args.open(field::EVENT_DEBUG_ANNOTATIONS);
    args.bytes(field::ANNOTATION_NAME, name.as_bytes());
    value(args);
    args.close(a);
}

/// Recorded host spans (a capture's) as slices on their threads' tracks: the process
/// descriptor first, then each thread's packets. `flow` is called for each
/// span that wraps a launch (with the launch id) and returns its flow id.
///
/// Each span is one slice, from its recorded start to its recorded end, so
/// that slices nest strictly on each thread's track:
/// - spans are placed in start order, an enclosing one before what it
///   encloses (longer first at equal starts);
/// - a span that ends after the slice enclosing it (their times overlap
///   without nesting) is cut at that slice's end;
/// - a span recorded with no duration (`end == start`) whose descendants on
///   its thread end later was still open when the capture was written (the
///   recorder sets the end at the last exit): it lasts until they end.
///
/// Returns the encoded packets and the number of slices.
pub(crate) fn replay(
    ids: &Ids,
    process_name: &str,
    spans: &[HostSpan],
    flow: &mut dyn FnMut(u64) -> u64,
) -> (Enc, u64) {
    let mut out = Enc::default();
    if spans.is_empty() {
        return (out, 0);
    }
    out.packet(&process(ids, REPLAY_PID, process_name.to_string()));
    // Ends, with still-open spans extended over their descendants (a child
    // always comes after its parent in a capture, so one backward pass does it).
    let mut end: Vec<u64> = spans.iter().map(|s| s.end_ns).collect();
    let mut cover: Vec<u64> = vec![0; spans.len()];
    for i in (0..spans.len()).rev() {
        let s = &spans[i];
        if s.end_ns == s.start_ns {
            end[i] = end[i].max(cover[i]);
        }
        if let Some(p) = s.parent.map(|p| p as usize) {
            if spans[p].thread_id == s.thread_id {
                cover[p] = cover[p].max(end[i]);
            }
        }
    }
    // Names are interned per thread under their index in one table.
    let mut name_keys: HashMap<&str, usize> = HashMap::new();
    let mut threads: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, s) in spans.iter().enumerate() {
        let n = name_keys.len();
        name_keys.entry(s.name.as_str()).or_insert(n);
        threads.entry(s.thread_id).or_default().push(i);
    }
    let mut slices = 0;
    let mut args = Enc::default();
    for (tid, mut order) in threads {
        let first = &spans[order[0]];
        let mut t = HostThread::new(ids, REPLAY_PID, tid as i32, first.thread_name.clone(), 1024);
        order.sort_by_key(|&i| (spans[i].start_ns, Reverse(end[i]), i));
        let mut open: Vec<u64> = Vec::new();
        for i in order {
            let s: &HostSpan = &spans[i];
            while open.last().is_some_and(|&e| e <= s.start_ns) {
                t.end(open.pop().expect("not empty"));
            }
            let e = open.last().map_or(end[i], |&outer| end[i].min(outer));
            args.clear();
            for (k, v) in &s.fields {
                annotation(&mut args, k, |a| {
                    a.bytes(field::ANNOTATION_STRING, v.as_bytes())
                });
            }
            let f = s.launch_id.map(&mut *flow);
            t.begin(
                s.start_ns,
                name_keys[s.name.as_str()],
                &s.name,
                &args.buf,
                f,
            );
            open.push(e);
        }
        while let Some(e) = open.pop() {
            t.end(e);
        }
        slices += t.slices;
        out.buf.extend_from_slice(&t.enc.buf);
    }
    (out, slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perfetto::proto::{self, Data};
    use crate::perfetto::TraceWriter;
    use prost::Message;
    use std::collections::HashSet;

    fn span(name: &str, tid: u64, start: u64, end: u64, parent: Option<u32>) -> HostSpan {
        HostSpan {
            name: name.into(),
            target: "test".into(),
            thread_name: format!("thread {tid}"),
            thread_id: tid,
            start_ns: start,
            end_ns: end,
            parent,
            launch_id: None,
            fields: vec![],
        }
    }

    /// Slices per thread id: (name, start, end, flow ids, string arguments).
    type Slices = BTreeMap<i32, Vec<(String, u64, u64, Vec<u64>, Vec<(String, String)>)>>;

    /// Reads the host threads' slices back from a trace, as the trace
    /// processor would: per sequence, incremental clock, interned names.
    fn host_slices(bytes: &[u8]) -> Slices {
        let trace = proto::Trace::decode(bytes).unwrap();
        let mut tid_of = HashMap::new();
        let mut seqs: HashMap<u32, (i32, u64, HashMap<u64, String>)> = HashMap::new();
        let mut open: HashMap<u32, Vec<usize>> = HashMap::new();
        let mut out = Slices::new();
        for p in &trace.packet {
            let seq = p.trusted_packet_sequence_id.unwrap_or(0);
            match &p.data {
                Some(Data::TrackDescriptor(d)) => {
                    if let Some(t) = &d.thread {
                        tid_of.insert(d.uuid.unwrap(), t.tid.unwrap());
                    }
                }
                Some(Data::ClockSnapshot(c)) => {
                    let track = p
                        .trace_packet_defaults
                        .as_ref()
                        .and_then(|d| d.track_event_defaults.as_ref())
                        .and_then(|d| d.track_uuid);
                    if let Some(tid) = track.and_then(|u| tid_of.get(&u)) {
                        let t0 = c.clocks[1].timestamp.unwrap();
                        seqs.insert(seq, (*tid, t0, HashMap::new()));
                    }
                }
                Some(Data::TrackEvent(e)) => {
                    let Some((tid, clock, names)) = seqs.get_mut(&seq) else {
                        continue;
                    };
                    if let Some(i) = &p.interned_data {
                        for n in &i.event_names {
                            names.insert(n.iid.unwrap(), n.name.clone().unwrap());
                        }
                    }
                    *clock += p.timestamp.unwrap();
                    let slices = out.entry(*tid).or_default();
                    if e.r#type == Some(proto::EventType::SliceBegin as i32) {
                        let args = e
                            .debug_annotations
                            .iter()
                            .map(|a| (a.name.clone().unwrap(), a.string_value.clone().unwrap()))
                            .collect();
                        let name = names[&e.name_iid.unwrap()].clone();
                        open.entry(seq).or_default().push(slices.len());
                        slices.push((name, *clock, 0, e.flow_ids.clone(), args));
                    } else {
                        let i = open.get_mut(&seq).unwrap().pop().expect("an open slice");
                        slices[i].2 = *clock;
                    }
                }
                _ => {}
            }
        }
        assert!(open.values().all(Vec::is_empty), "every slice ends");
        out
    }

    #[test]
    fn replayed_spans_nest_strictly_with_flows_from_launch_spans() {
        let mut launch = span("launch", 7, 120, 150, Some(1));
        launch.launch_id = Some(4);
        launch.fields = vec![("gpu.launch_id".into(), "4".into())];
        let spans = vec![
            // Still open when the capture was written: no duration.
            span("root", 7, 100, 100, None),
            span("a", 7, 110, 200, Some(0)),
            launch,
            // Starts inside a and ends after it: cut at a's end.
            span("c", 7, 180, 260, Some(0)),
            span("d", 7, 300, 310, Some(0)),
            span("worker", 8, 150, 170, None),
            // Its own zero-length slice: no descendants.
            span("mark", 8, 180, 180, None),
        ];
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        w.write_host_spans("quickstart", &spans).unwrap();
        let (bytes, stats) = w.finish().unwrap();
        assert_eq!(stats.host_slices, 7);
        let slices = host_slices(&bytes);
        let main: Vec<_> = slices[&7]
            .iter()
            .map(|(n, s, e, f, _)| (n.as_str(), *s, *e, f.len()))
            .collect();
        assert_eq!(
            main,
            [
                ("root", 100, 310, 0),
                ("a", 110, 200, 0),
                ("launch", 120, 150, 1),
                ("c", 180, 200, 0),
                ("d", 300, 310, 0),
            ]
        );
        assert_eq!(slices[&7][2].4, [("gpu.launch_id".into(), "4".into())]);
        let worker: Vec<_> = slices[&8]
            .iter()
            .map(|(n, s, e, _, _)| (n.as_str(), *s, *e))
            .collect();
        assert_eq!(worker, [("worker", 150, 170), ("mark", 180, 180)]);
        // The process has the name it was given.
        let trace = proto::Trace::decode(&bytes[..]).unwrap();
        let processes: HashSet<_> = trace
            .packet
            .iter()
            .filter_map(|p| match &p.data {
                Some(Data::TrackDescriptor(d)) => d.process.as_ref(),
                _ => None,
            })
            .map(|p| (p.pid.unwrap(), p.process_name.clone().unwrap()))
            .collect();
        assert_eq!(
            processes,
            HashSet::from([(REPLAY_PID, "quickstart".to_string())])
        );
    }
}
