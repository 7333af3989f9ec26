//! A launch's trace buffer read from the body: only what its slots hold is
//! kept, and charged to the reader's budget before it is read, so that a
//! buffer that declares a gigabyte of empty slots costs its flushed slots.

use std::io::BufRead;

use super::body::{Body, Budget};
use super::CaptureError;
use crate::decode::sparse::Sparse;
use crate::decode::{DecodeError, OwnedBuffer};
use crate::format::{slot_offsets as so, BUFFER_HEADER_SIZE, SLOT_HEADER_SIZE};

/// What reading a trace buffer met: a fault of the body, or of the buffer
/// (which the caller places at its launch).
pub(super) enum TraceError {
    Capture(CaptureError),
    Decode(DecodeError),
}

impl From<CaptureError> for TraceError {
    fn from(e: CaptureError) -> TraceError {
        TraceError::Capture(e)
    }
}

impl From<DecodeError> for TraceError {
    fn from(e: DecodeError) -> TraceError {
        TraceError::Decode(e)
    }
}

/// What keeping a flushed slot's place in the index costs, besides its bytes
/// (its index and offset, and a v2 slot's rebuilt header).
const SLOT_INDEX_COST: usize = 96;

/// Reads the `n`-byte trace buffer that comes next and decodes it, as
/// [`OwnedBuffer::decode`] does the same bytes: a packed buffer (all of whose
/// bytes are events) whole, an unpacked one a slot at a time, each empty slot
/// checked as it passes and kept nowhere ([`Sparse`]). Bytes past the buffer
/// are not read.
pub(super) fn read_trace_buffer<R: BufRead>(
    b: &mut Body<R>,
    n: u64,
    budget: &mut Budget,
) -> Result<OwnedBuffer, TraceError> {
    let at = b.pos();
    let mut head = vec![0; n.min(BUFFER_HEADER_SIZE as u64) as usize];
    b.fill(&mut head)?;
    // A sampled buffer's header goes on with its sampling.
    let more = (Sparse::header_size(&head) as u64).min(n) as usize - head.len();
    if more > 0 {
        let have = head.len();
        head.resize(have + more, 0);
        b.fill(&mut head[have..])?;
    }
    let Some(mut sparse) = Sparse::begin(&head, n)? else {
        let rest = n - head.len() as u64;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        budget.take(n.saturating_mul(5) / 4, at)?;
        // Within the budget: sized at once, rather than grown by doubling
        // (which would take half as much again, copying).
        let mut bytes = Vec::with_capacity(n);
        bytes.extend_from_slice(&head);
        b.append(&mut bytes, rest)?;
        return Ok(OwnedBuffer::decode(bytes, None)?);
    };
    budget.take(head.len(), at)?;
    let stride = sparse.stride() as u64;
    let after_header = stride - SLOT_HEADER_SIZE as u64;
    let mut slot = Vec::new();
    for i in 0..sparse.slot_count() {
        let at = b.pos();
        slot.resize(SLOT_HEADER_SIZE, 0);
        b.fill(&mut slot)?;
        if slot[so::MAGIC..so::MAGIC + 4] == [0; 4] {
            // Never flushed: zero throughout.
            let in_header = slot.iter().position(|&x| x != 0);
            let nonzero = match in_header {
                Some(k) => Some(k as u64),
                None => b.zeros(after_header)?.map(|k| SLOT_HEADER_SIZE as u64 + k),
            };
            if let Some(k) = nonzero {
                return Err(Sparse::not_empty(i, k as usize).into());
            }
            continue;
        }
        let held = sparse.held(&slot);
        budget.take(SLOT_HEADER_SIZE + held + SLOT_INDEX_COST, at)?;
        slot.resize(SLOT_HEADER_SIZE + held, 0);
        b.fill(&mut slot[SLOT_HEADER_SIZE..])?;
        b.skip(after_header - held as u64)?;
        sparse.push(i, &slot)?;
    }
    b.skip(n - sparse.wire_size() as u64)?;
    Ok(sparse.finish())
}
