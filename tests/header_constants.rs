//! The header's wire-format constants against `src/format/wire.rs`: the same names, in the same
//! namespaces, with the same values. Pure text and constants: runs with no features and no
//! tools.

use std::collections::BTreeMap;

use tracing_gpu::format::wire::{
    self, buffer_offsets, chunk_offsets, entry_offsets, record_offsets, slot_offsets,
    slot_stream_offsets, slot_v2_offsets, watch_head_offsets, watch_offsets,
};
use tracing_gpu::format::{KernelArg, Sampling};

const HEADER: &str = include_str!("../kernels/include/tracing_gpu.cuh");
const FORMAT_RS: &str = include_str!("../src/format/wire.rs");

/// Every `enum : unsigned int { NAME = VALUE };` at namespace scope in the header (such lines
/// are not indented there), keyed `NAME` or `namespace::NAME` (the enclosing `tgpu` dropped).
fn header_constants() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut inner: Option<String> = None;
    for line in HEADER.lines() {
        if let Some(rest) = line.strip_prefix("namespace ") {
            let name = rest.trim_end_matches('{').trim();
            if name != "tgpu" && name != "detail" {
                inner = Some(name.to_string());
            }
            continue;
        }
        if line.starts_with("}  // namespace ") {
            let name = line.trim_start_matches("}  // namespace ").trim();
            if inner.as_deref() == Some(name) {
                inner = None;
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("enum : unsigned int { ") else {
            continue;
        };
        let (name, value) = rest
            .trim_end_matches(" };")
            .split_once(" = ")
            .unwrap_or_else(|| panic!("unexpected constant line in the header: {line}"));
        let value = value.trim_end_matches('u');
        let value = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .unwrap_or_else(|e| panic!("bad value in {line}: {e}"));
        let key = match &inner {
            Some(ns) => format!("{ns}::{name}"),
            None => name.to_string(),
        };
        assert!(
            out.insert(key.clone(), value).is_none(),
            "{key} is defined twice in the header"
        );
    }
    out
}

/// Every `pub const NAME` of src/format/wire.rs, keyed as in the header.
fn format_rs_names() -> Vec<String> {
    let mut names = Vec::new();
    let mut module: Option<String> = None;
    for line in FORMAT_RS.lines() {
        if let Some(rest) = line.strip_prefix("pub mod ") {
            module = Some(rest.trim_end_matches('{').trim().to_string());
            continue;
        }
        if line == "}" {
            module = None;
            continue;
        }
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix("pub const ") else {
            continue;
        };
        // `pub const fn` is code, not a constant.
        if rest.starts_with("fn ") {
            continue;
        }
        let name = rest.split(':').next().unwrap().trim();
        names.push(match &module {
            Some(m) => format!("{m}::{name}"),
            None => name.to_string(),
        });
    }
    names.sort();
    names
}

/// The Rust values, by the header's names.
fn rust_constants() -> BTreeMap<String, u64> {
    let top: [(&str, u64); 40] = [
        ("BUFFER_MAGIC", wire::BUFFER_MAGIC.into()),
        ("SLOT_MAGIC", wire::SLOT_MAGIC.into()),
        ("VERSION", wire::VERSION.into()),
        ("BUFFER_HEADER_SIZE", wire::BUFFER_HEADER_SIZE as u64),
        ("SLOT_HEADER_SIZE", wire::SLOT_HEADER_SIZE as u64),
        ("RECORD_SIZE", wire::RECORD_SIZE as u64),
        ("KIND_RANGE", wire::KIND_RANGE.into()),
        ("KIND_INSTANT", wire::KIND_INSTANT.into()),
        ("SLOT_FLAG_MIGRATED", wire::SLOT_FLAG_MIGRATED.into()),
        (
            "SLOT_FLAG_OPEN_AT_FLUSH",
            wire::SLOT_FLAG_OPEN_AT_FLUSH.into(),
        ),
        ("NO_CLUSTER", wire::NO_CLUSTER.into()),
        ("TRACE_INDIRECT", wire::TRACE_INDIRECT.into()),
        ("SLOT_MAGIC_V2", wire::SLOT_MAGIC_V2.into()),
        ("ENTRY_SIZE", wire::ENTRY_SIZE as u64),
        ("ENTRY_BEGIN", wire::ENTRY_BEGIN.into()),
        ("ENTRY_END", wire::ENTRY_END.into()),
        ("ENTRY_SWITCH", wire::ENTRY_SWITCH.into()),
        ("ENTRY_INSTANT", wire::ENTRY_INSTANT.into()),
        ("ENTRY_PAYLOAD", wire::ENTRY_PAYLOAD.into()),
        ("MAX_DEPTH", wire::MAX_DEPTH as u64),
        ("TRACE_STREAM", wire::TRACE_STREAM.into()),
        ("SLOT_MAGIC_STREAM", wire::SLOT_MAGIC_STREAM.into()),
        ("CHUNK_SIZE", wire::CHUNK_SIZE as u64),
        ("CHUNK_ENTRIES", wire::CHUNK_ENTRIES as u64),
        ("STREAM_MARK", wire::STREAM_MARK.into()),
        ("CHUNK_GAP", wire::CHUNK_GAP.into()),
        ("CHUNK_COUNT_MASK", wire::CHUNK_COUNT_MASK.into()),
        ("CHUNK_SM_SHIFT", wire::CHUNK_SM_SHIFT.into()),
        ("CHUNK_SM_MASK", wire::CHUNK_SM_MASK.into()),
        ("WATCH_MAGIC", wire::WATCH_MAGIC.into()),
        ("WATCH_MAGIC_DONE", wire::WATCH_MAGIC_DONE.into()),
        ("WATCH_RECORD_SIZE", wire::WATCH_RECORD_SIZE as u64),
        ("WATCH_RECORDS", wire::WATCH_RECORDS as u64),
        ("WATCH_CELL_SIZE", wire::WATCH_CELL_SIZE as u64),
        ("WATCH_MARK", wire::WATCH_MARK.into()),
        ("WATCH_KIND_MASK", wire::WATCH_KIND_MASK.into()),
        ("WATCH_CLOSED", wire::WATCH_CLOSED.into()),
        ("WATCH_PAYLOAD", wire::WATCH_PAYLOAD.into()),
        ("WATCH_SEQ_SHIFT", wire::WATCH_SEQ_SHIFT.into()),
        ("WATCH_SEQ_MASK", wire::WATCH_SEQ_MASK.into()),
    ];
    let buffer: [(&str, usize); 13] = [
        ("MAGIC", buffer_offsets::MAGIC),
        ("VERSION", buffer_offsets::VERSION),
        ("HEADER_SIZE", buffer_offsets::HEADER_SIZE),
        ("SLOT_HEADER_SIZE", buffer_offsets::SLOT_HEADER_SIZE),
        ("RECORD_SIZE", buffer_offsets::RECORD_SIZE),
        ("SLOT_CAPACITY", buffer_offsets::SLOT_CAPACITY),
        ("SLOT_COUNT", buffer_offsets::SLOT_COUNT),
        ("WARPS_PER_BLOCK", buffer_offsets::WARPS_PER_BLOCK),
        ("LAUNCH_ID", buffer_offsets::LAUNCH_ID),
        ("GRID", buffer_offsets::GRID),
        ("BLOCK", buffer_offsets::BLOCK),
        ("FLAGS", buffer_offsets::FLAGS),
        ("RESERVED", buffer_offsets::RESERVED),
    ];
    let slot: [(&str, usize); 12] = [
        ("MAGIC", slot_offsets::MAGIC),
        ("FLAGS", slot_offsets::FLAGS),
        ("FIRST_TS", slot_offsets::FIRST_TS),
        ("LAST_TS", slot_offsets::LAST_TS),
        ("SM_FIRST", slot_offsets::SM_FIRST),
        ("SM_LAST", slot_offsets::SM_LAST),
        ("BLOCK_LINEAR", slot_offsets::BLOCK_LINEAR),
        ("BLOCK_XYZ", slot_offsets::BLOCK_XYZ),
        ("WARP", slot_offsets::WARP),
        ("CLUSTER_RANK", slot_offsets::CLUSTER_RANK),
        ("RECORD_COUNT", slot_offsets::RECORD_COUNT),
        ("EVENTS_LOST", slot_offsets::EVENTS_LOST),
    ];
    let slot_v2: [(&str, usize); 10] = [
        ("MAGIC", slot_v2_offsets::MAGIC),
        ("ENTRY_COUNT", slot_v2_offsets::ENTRY_COUNT),
        ("LAST_TS", slot_v2_offsets::LAST_TS),
        ("ANCHOR_TS", slot_v2_offsets::ANCHOR_TS),
        ("ENTRIES_LOST", slot_v2_offsets::ENTRIES_LOST),
        ("SM", slot_v2_offsets::SM),
        ("SLOT", slot_v2_offsets::SLOT),
        ("CLUSTER_RANK", slot_v2_offsets::CLUSTER_RANK),
        ("EVENTS_LOST", slot_v2_offsets::EVENTS_LOST),
        ("RESERVED", slot_v2_offsets::RESERVED),
    ];
    let entry: [(&str, usize); 3] = [
        ("TIME_LO", entry_offsets::TIME_LO),
        ("EVENT_ID", entry_offsets::EVENT_ID),
        ("KIND", entry_offsets::KIND),
    ];
    let slot_stream: [(&str, usize); 11] = [
        ("MAGIC", slot_stream_offsets::MAGIC),
        ("CHUNKS", slot_stream_offsets::CHUNKS),
        ("LAST_TS", slot_stream_offsets::LAST_TS),
        ("ENTRY_COUNT", slot_stream_offsets::ENTRY_COUNT),
        ("EVENTS_LOST", slot_stream_offsets::EVENTS_LOST),
        ("SM", slot_stream_offsets::SM),
        ("SLOT", slot_stream_offsets::SLOT),
        ("CLUSTER_RANK", slot_stream_offsets::CLUSTER_RANK),
        ("RESERVED", slot_stream_offsets::RESERVED),
        ("READ", slot_stream_offsets::READ),
        (
            "RESERVED_AFTER_READ",
            slot_stream_offsets::RESERVED_AFTER_READ,
        ),
    ];
    let chunk: [(&str, usize); 3] = [
        ("STAMP_LO", chunk_offsets::STAMP_LO),
        ("STAMP_MID", chunk_offsets::STAMP_MID),
        ("INFO", chunk_offsets::INFO),
    ];
    let record: [(&str, usize); 5] = [
        ("END_LO", record_offsets::END_LO),
        ("DURATION", record_offsets::DURATION),
        ("EVENT_ID", record_offsets::EVENT_ID),
        ("KIND", record_offsets::KIND),
        ("PAYLOAD", record_offsets::PAYLOAD),
    ];
    let watch_head: [(&str, usize); 3] = [
        ("MAGIC", watch_head_offsets::MAGIC),
        ("SM", watch_head_offsets::SM),
        ("TIME", watch_head_offsets::TIME),
    ];
    let watch: [(&str, usize); 6] = [
        ("TIME_LO", watch_offsets::TIME_LO),
        ("TIME_MID", watch_offsets::TIME_MID),
        ("FLAGS", watch_offsets::FLAGS),
        ("EVENT_ID", watch_offsets::EVENT_ID),
        ("CLOSED_ID", watch_offsets::CLOSED_ID),
        ("PAYLOAD", watch_offsets::PAYLOAD),
    ];
    let mut out: BTreeMap<String, u64> = top.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    for (module, table) in [
        ("buffer_offsets", &buffer[..]),
        ("slot_offsets", &slot[..]),
        ("record_offsets", &record[..]),
        ("slot_v2_offsets", &slot_v2[..]),
        ("entry_offsets", &entry[..]),
        ("slot_stream_offsets", &slot_stream[..]),
        ("chunk_offsets", &chunk[..]),
        ("watch_head_offsets", &watch_head[..]),
        ("watch_offsets", &watch[..]),
    ] {
        for (k, v) in table {
            out.insert(format!("{module}::{k}"), *v as u64);
        }
    }
    out
}

#[test]
fn header_and_format_rs_define_the_same_names() {
    let header: Vec<String> = header_constants().into_keys().collect();
    assert_eq!(
        header,
        format_rs_names(),
        "the header and src/format/wire.rs must define the same constants"
    );
}

#[test]
fn every_name_is_checked_by_value() {
    let checked: Vec<String> = rust_constants().into_keys().collect();
    assert_eq!(
        checked,
        format_rs_names(),
        "a constant of src/format/wire.rs is missing from this test's table"
    );
}

#[test]
fn header_values_match_format_rs() {
    let header = header_constants();
    for (name, value) in rust_constants() {
        assert_eq!(
            header.get(&name),
            Some(&value),
            "{name}: header vs src/format/wire.rs"
        );
    }
}

#[test]
fn kernel_arg_layout_matches_the_header_struct() {
    // The header declares the fields in this order and asserts size 32 and alignment 8,
    // which puts them at 0, 8, 12, 16, 20, 24 and 28.
    assert_eq!(std::mem::offset_of!(KernelArg, base), 0);
    assert_eq!(std::mem::offset_of!(KernelArg, capacity), 8);
    assert_eq!(std::mem::offset_of!(KernelArg, slot_count), 12);
    let sampling = std::mem::offset_of!(KernelArg, sampling);
    assert_eq!(sampling, 16);
    assert_eq!(sampling + std::mem::offset_of!(Sampling, warp_mask), 16);
    assert_eq!(sampling + std::mem::offset_of!(Sampling, block_stride), 20);
    assert_eq!(sampling + std::mem::offset_of!(Sampling, block_offset), 24);
    assert_eq!(sampling + std::mem::offset_of!(Sampling, launch_every), 28);
    assert_eq!(std::mem::size_of::<KernelArg>(), 32);
    assert_eq!(std::mem::align_of::<KernelArg>(), 8);
    let body = HEADER
        .split_once("struct Trace {")
        .and_then(|(_, rest)| rest.split_once("};"))
        .expect("no struct Trace in the header")
        .0;
    let fields: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect();
    assert_eq!(
        fields,
        [
            "unsigned long long base;",
            "unsigned int capacity;",
            "unsigned int slot_count;",
            "unsigned int warp_mask;",
            "unsigned int block_stride;",
            "unsigned int block_offset;",
            "unsigned int launch_every;"
        ]
    );
    assert!(HEADER.contains("sizeof(Trace) == 32 && alignof(Trace) == 8"));
}
