//! The calibrator's lanes (pure Rust, no driver): which stream, and which slot
//! of the pinned ping-pong memory, the next calibration kernel uses, and the
//! lanes given up on.
//!
//! A calibration kernel that does not answer in time may be queued, not failed:
//! on the H200 none answered while a persistent kernel ran on another stream
//! (not for want of hardware queues: with `CUDA_DEVICE_MAX_CONNECTIONS=32` as
//! well; why is not known). Its stream must not be waited on (that may take as
//! long as the other kernel), and its slot must not be used again or freed: the
//! kernel will start one day, read its slot's flag (STOP, written by the
//! calibrator) and return. So the lane is abandoned, and the next launch opens
//! a new one: a fresh stream and a free slot. An abandoned lane's slot is free
//! again once its stream has nothing left to run.
//!
//! The slots are fixed ([`Lanes::new`]), so at most `slots` lanes are
//! abandoned at once; when all are, no kernel is launched until one has run.

/// A stream and the slot of mapped memory its calibration kernels use.
#[derive(Debug)]
pub(super) struct Lane<S> {
    pub stream: S,
    pub slot: usize,
}

/// The current lane (if any) and the abandoned ones, each on its own slot.
#[derive(Debug)]
pub(super) struct Lanes<S> {
    current: Option<Lane<S>>,
    abandoned: Vec<Lane<S>>,
    slots: usize,
}

impl<S> Lanes<S> {
    /// `slots` slots (at least one), the first taken by a lane on `stream`.
    pub fn new(stream: S, slots: usize) -> Lanes<S> {
        assert!(slots > 0, "the calibrator needs a slot");
        Lanes {
            current: Some(Lane { stream, slot: 0 }),
            abandoned: Vec::with_capacity(slots),
            slots,
        }
    }

    /// The lane the next launch uses: the current one, or else a new one on a
    /// free slot with the stream `open` makes (called only then). `Ok(None)`
    /// when every slot is held by an abandoned lane.
    pub fn current_or_open<E>(
        &mut self,
        open: impl FnOnce() -> Result<S, E>,
    ) -> Result<Option<&Lane<S>>, E> {
        if self.current.is_none() {
            let Some(slot) = self.free_slot() else {
                return Ok(None);
            };
            self.current = Some(Lane {
                stream: open()?,
                slot,
            });
        }
        Ok(self.current.as_ref())
    }

    /// Gives up on the current lane: its stream and slot are kept until
    /// [`Lanes::reap`] finds the stream done.
    pub fn abandon(&mut self) {
        if let Some(lane) = self.current.take() {
            self.abandoned.push(lane);
        }
    }

    /// Lanes abandoned and not yet found done.
    pub fn abandoned(&self) -> usize {
        self.abandoned.len()
    }

    /// Whether a lane can be opened or is open (a launch can be made).
    #[cfg(test)]
    pub fn can_launch(&self) -> bool {
        self.current.is_some() || self.free_slot().is_some()
    }

    /// Frees the slots of the abandoned lanes whose stream `done` says has
    /// nothing left to run, and returns their streams. `done` must answer
    /// `false` when unsure: a slot used again while its old kernel may still
    /// start would mix two kernels' answers.
    pub fn reap(&mut self, mut done: impl FnMut(&S) -> bool) -> Vec<S> {
        let mut freed = Vec::new();
        let mut i = 0;
        while i < self.abandoned.len() {
            if done(&self.abandoned[i].stream) {
                freed.push(self.abandoned.swap_remove(i).stream);
            } else {
                i += 1;
            }
        }
        freed
    }

    fn free_slot(&self) -> Option<usize> {
        let held = |slot| {
            self.current.as_ref().is_some_and(|l| l.slot == slot)
                || self.abandoned.iter().any(|l| l.slot == slot)
        };
        (0..self.slots).find(|&slot| !held(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A stream stand-in: its name, and whether it has run dry.
    type Stream = (&'static str, bool);

    fn open(lanes: &mut Lanes<Stream>, stream: Stream) -> Option<usize> {
        lanes
            .current_or_open(|| Ok::<_, Infallible>(stream))
            .unwrap()
            .map(|l| l.slot)
    }

    #[test]
    fn the_current_lane_is_kept_until_abandoned() {
        let mut lanes = Lanes::new(("first", false), 4);
        let mut opened = false;
        let lane = lanes
            .current_or_open(|| {
                opened = true;
                Ok::<_, Infallible>(("unused", false))
            })
            .unwrap()
            .unwrap();
        assert_eq!((lane.stream.0, lane.slot), ("first", 0));
        assert!(!opened, "no stream is made while a lane is open");
        lanes.abandon();
        assert_eq!(lanes.abandoned(), 1);
        assert!(lanes.current.is_none());
        // The next launch gets a fresh stream on another slot.
        assert_eq!(open(&mut lanes, ("second", false)), Some(1));
        assert_eq!(lanes.current.as_ref().unwrap().stream.0, "second");
    }

    #[test]
    fn abandoned_lanes_are_bounded_by_the_slots() {
        let mut lanes = Lanes::new(("s0", false), 4);
        for (i, name) in ["s1", "s2", "s3"].into_iter().enumerate() {
            lanes.abandon();
            assert_eq!(open(&mut lanes, (name, false)), Some(i + 1));
        }
        lanes.abandon();
        assert_eq!(lanes.abandoned(), 4);
        assert!(!lanes.can_launch());
        // No slot: no stream is made, nothing can be launched.
        let made = lanes.current_or_open(|| -> Result<Stream, &str> { Err("must not be called") });
        assert!(matches!(made, Ok(None)));
        // Streams still busy keep their slots.
        assert!(lanes.reap(|s| s.1).is_empty());
        assert_eq!(lanes.abandoned(), 4);
    }

    #[test]
    fn a_done_stream_frees_its_slot() {
        let mut lanes = Lanes::new(("s0", false), 2);
        lanes.abandon();
        assert_eq!(open(&mut lanes, ("s1", false)), Some(1));
        lanes.abandon();
        assert!(!lanes.can_launch());
        // s0's kernel has run (after the kernel it queued behind): slot 0 is free.
        lanes.abandoned[0].stream.1 = true;
        assert_eq!(lanes.reap(|s| s.1), [("s0", true)]);
        assert_eq!(lanes.abandoned(), 1);
        assert!(lanes.can_launch());
        assert_eq!(open(&mut lanes, ("s2", false)), Some(0));
        // s1 is still queued: its slot stays out of use.
        lanes.abandon();
        assert_eq!(open(&mut lanes, ("s3", false)), None);
    }

    #[test]
    fn a_failed_open_leaves_no_lane() {
        let mut lanes = Lanes::new(("s0", false), 2);
        lanes.abandon();
        let made = lanes.current_or_open(|| -> Result<Stream, &str> { Err("no stream") });
        assert_eq!(made.unwrap_err(), "no stream");
        assert!(lanes.current.is_none());
        assert_eq!(open(&mut lanes, ("s1", false)), Some(1));
    }
}
