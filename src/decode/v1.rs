//! A v1 slot header: read, and checked against its place in the grid (for
//! device buffers and packed ones alike).

use super::bytes::{u32_at, u64_at};
use super::error::DecodeError;
use crate::format::{slot_offsets as so, SlotHeader};

pub(super) fn xyz_at(b: &[u8], at: usize) -> [u32; 3] {
    [u32_at(b, at), u32_at(b, at + 4), u32_at(b, at + 8)]
}

/// Reads a slot header from at least [`SLOT_HEADER_SIZE`] bytes.
pub(super) fn read_slot_header(b: &[u8]) -> SlotHeader {
    SlotHeader {
        magic: u32_at(b, so::MAGIC),
        flags: u32_at(b, so::FLAGS),
        first_ts: u64_at(b, so::FIRST_TS),
        last_ts: u64_at(b, so::LAST_TS),
        sm_first: u32_at(b, so::SM_FIRST),
        sm_last: u32_at(b, so::SM_LAST),
        block_linear: u32_at(b, so::BLOCK_LINEAR),
        block: xyz_at(b, so::BLOCK_XYZ),
        warp: u32_at(b, so::WARP),
        cluster_rank: u32_at(b, so::CLUSTER_RANK),
        record_count: u32_at(b, so::RECORD_COUNT),
        events_lost: u32_at(b, so::EVENTS_LOST),
    }
}

/// The checks of a v1 slot header against its place, `[block_linear, x, y, z, warp]`.
pub(super) fn check_v1_slot(
    i: u32,
    h: &SlotHeader,
    capacity: u32,
    place: [u32; 5],
) -> Result<(), DecodeError> {
    if h.record_count > capacity {
        return Err(DecodeError::CountOverCapacity {
            slot: i,
            count: h.record_count,
            capacity,
        });
    }
    let [bl, x, y, z, warp] = place;
    if h.block_linear != bl || h.block != [x, y, z] || h.warp != warp {
        return Err(DecodeError::Misplaced {
            slot: i,
            expected_block: bl,
            expected_xyz: [x, y, z],
            expected_warp: warp,
            found_block: h.block_linear,
            found_xyz: h.block,
            found_warp: h.warp,
        });
    }
    if h.last_ts < h.first_ts {
        return Err(DecodeError::SlotTimesBackwards {
            slot: i,
            first_ts: h.first_ts,
            last_ts: h.last_ts,
        });
    }
    Ok(())
}
