//! The device port: what the collector needs of a device, and the device it
//! gets on CUDA.
//!
//! - `port.rs`: the port itself, with nothing of CUDA: trace memory with its
//!   host mirror ([`Memory`]), a launch's place in it ([`Place`]), the mark
//!   that says a launch has finished ([`Mark`]) and the [`Device`] operations
//!   the collector calls in bulk. The collector's tests implement it on host
//!   memory, which is how a device (or a second one) is simulated without a GPU.
//! - `arena.rs`: the arena's bookkeeping on the host, which bytes belong to
//!   which launch ([`Arena`], [`Region`]); no driver either.
//! - `cuda.rs`: [`Device`] on the driver ([`CudaDevice`]): device memory with a
//!   pinned mirror, the events, the bulk copy back and the zeroing.

mod arena;
mod cuda;
mod port;

pub(crate) use arena::{Arena, Region, ALIGN};
pub(crate) use cuda::{allocate, allocate_mapped, device_info, CudaDevice, Events};
#[cfg(test)]
pub(crate) use port::TAKEN;
pub(crate) use port::{
    replay_taken, Device, Kind, Mark, Memory, Place, Shape, StreamMark, ARMED, PER_THREAD,
    REPLAY_HEADER,
};
