//! The buffer header read and checked: its fixed 64 bytes and, in a sampled
//! buffer, the sampling after them (docs/format.md, "The buffer", "Sampling").

use super::bytes::{u16_at, u32_at, u64_at};
use super::error::DecodeError;
use super::v1::xyz_at;
use crate::format::{
    self, buffer_offsets as bo, BufferHeader, Sampling, BUFFER_FLAG_PACKED, BUFFER_FLAG_SAMPLED,
    BUFFER_HEADER_SIZE, BUFFER_MAGIC, PACKED_RECORD_SIZE, RECORD_SIZE, SAMPLED_HEADER_SIZE,
    SLOT_HEADER_SIZE, VERSION,
};

/// Reads and checks the buffer header at the start of `bytes`, of a buffer read
/// from `len` bytes (`bytes.len()`, or more when only its header is at hand:
/// [`sparse`]); returns it and the buffer's size.
pub(super) fn read_buffer_header(
    bytes: &[u8],
    len: usize,
) -> Result<(BufferHeader, usize), DecodeError> {
    if bytes.len() < BUFFER_HEADER_SIZE {
        return Err(DecodeError::Truncated {
            len: bytes.len(),
            needed: BUFFER_HEADER_SIZE as u64,
        });
    }
    let b = &bytes[..BUFFER_HEADER_SIZE];
    let magic = u32_at(b, bo::MAGIC);
    if magic != BUFFER_MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let version = u16_at(b, bo::VERSION);
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion { found: version });
    }
    let exact = |field, at: usize, expected: usize, wide: bool| {
        let found = if wide {
            u32_at(b, at) as u64
        } else {
            u16_at(b, at) as u64
        };
        if found == expected as u64 {
            Ok(())
        } else {
            Err(DecodeError::BadHeaderField {
                field,
                found,
                expected: expected as u64,
            })
        }
    };
    let flags = u32_at(b, bo::FLAGS);
    let packed = flags & BUFFER_FLAG_PACKED != 0;
    let sampled = flags & BUFFER_FLAG_SAMPLED != 0;
    if flags & !(BUFFER_FLAG_PACKED | BUFFER_FLAG_SAMPLED) != 0 {
        exact(
            "flags",
            bo::FLAGS,
            (flags & BUFFER_FLAG_PACKED) as usize,
            true,
        )?;
    }
    let header_size = match sampled {
        true => SAMPLED_HEADER_SIZE,
        false => BUFFER_HEADER_SIZE,
    };
    exact("header_size", bo::HEADER_SIZE, header_size, false)?;
    exact(
        "slot_header_size",
        bo::SLOT_HEADER_SIZE,
        SLOT_HEADER_SIZE,
        false,
    )?;
    let record_size = if packed {
        PACKED_RECORD_SIZE
    } else {
        RECORD_SIZE
    };
    exact("record_size", bo::RECORD_SIZE, record_size, false)?;
    exact("reserved", bo::RESERVED, 0, true)?;
    let sampling = match sampled {
        true => read_sampling(bytes)?,
        false => Sampling::default(),
    };
    let header = BufferHeader {
        version,
        slot_capacity: u32_at(b, bo::SLOT_CAPACITY),
        slot_count: u32_at(b, bo::SLOT_COUNT),
        warps_per_block: u32_at(b, bo::WARPS_PER_BLOCK),
        launch_id: u64_at(b, bo::LAUNCH_ID),
        grid: xyz_at(b, bo::GRID),
        block: xyz_at(b, bo::BLOCK),
        flags: flags & !BUFFER_FLAG_SAMPLED,
        sampling,
    };
    if header.grid.contains(&0) || header.block.contains(&0) {
        return Err(DecodeError::EmptyLaunch {
            grid: header.grid,
            block: header.block,
        });
    }
    // Three u32 dimensions multiply to up to 2⁹⁶: u128 cannot overflow.
    let threads: u128 = header.block.iter().map(|&d| d as u128).product();
    let wpb = threads.div_ceil(32);
    if header.warps_per_block as u128 != wpb {
        return Err(DecodeError::BadHeaderField {
            field: "warps_per_block",
            found: header.warps_per_block as u64,
            expected: u64::try_from(wpb).unwrap_or(u64::MAX),
        });
    }
    if packed {
        // Its slots' sizes are in their headers: packed::walk finds its size.
        return Ok((header, header_size));
    }
    let size = header.buffer_size().ok_or(DecodeError::SizeOverflow {
        slot_count: header.slot_count,
        capacity: header.slot_capacity,
    })?;
    if len < size {
        return Err(DecodeError::Truncated {
            len,
            needed: size as u64,
        });
    }
    Ok((header, size))
}

/// A sampled buffer's sampling, after its first 64 bytes: what it says must be
/// sampling (a buffer of every warp is not flagged sampled), and the rest of
/// its 64 bytes zero.
fn read_sampling(bytes: &[u8]) -> Result<Sampling, DecodeError> {
    use format::sampling_offsets as o;
    if bytes.len() < SAMPLED_HEADER_SIZE {
        return Err(DecodeError::Truncated {
            len: bytes.len(),
            needed: SAMPLED_HEADER_SIZE as u64,
        });
    }
    let sampling = Sampling {
        warp_mask: u32_at(bytes, o::WARP_MASK),
        block_stride: u32_at(bytes, o::BLOCK_STRIDE),
        block_offset: u32_at(bytes, o::BLOCK_OFFSET),
        launch_every: u32_at(bytes, o::LAUNCH_EVERY),
    };
    if sampling.is_all() {
        return Err(DecodeError::BadHeaderField {
            field: "sampling",
            found: 0,
            expected: 1,
        });
    }
    if let Some(k) = bytes[o::RESERVED..SAMPLED_HEADER_SIZE]
        .iter()
        .position(|&x| x != 0)
    {
        return Err(DecodeError::BadHeaderField {
            field: "sampling reserved",
            found: (o::RESERVED + k) as u64,
            expected: 0,
        });
    }
    Ok(sampling)
}
