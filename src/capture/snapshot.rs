//! A watchdog's snapshot kept whole in a capture (issue #32), so that a reader can
//! tell it again and draw it: every warp's state, in a metadata note that follows
//! the snapshot's text note. A note needs no new capture version, and a reader that
//! does not know this one still shows the text. Its value is a line format
//! (docs/capture.md, "Watchdog snapshots"), read strictly and in bounded memory:
//!
//! ```text
//! tgpu-watch 1
//! launch 7 snapshot 0 grid 64 1 1 warps_per_block 4 now_ns 1700000003100000000 running_ns 3100000000 warps 256
//! kernel gemm_tma
//! r 12 -3100200000 -3100000000 3:16 1@-3100150000 2@-3100000000
//! d 13 -2900000000
//! - 254
//! ```
//!
//! A warp a line, in slot order: `r` running (SM, start, latest entry or `-`, last
//! close `id` or `id:payload` or `-`, then each open range `id@since`, outermost
//! first), `d` done (SM, when), `- n` n warps not started. Times are ns from `now_ns`.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{Capture, CaptureError, MAX_NAME_LEN};
use crate::format::WATCH_RECORDS;
use crate::watch::{Last, Open, Snapshot, State, Warp};

/// The key prefix of a snapshot's text note: `watchdog <launch id>.<n>`.
const TEXT: &str = "watchdog ";
/// The key prefix of a snapshot's warps note: `watchdog-warps <launch id>.<n>`.
const WARPS: &str = "watchdog-warps ";
/// A warps note's first line: the format and its version.
const FORMAT: &str = "tgpu-watch 1";

/// The most warps one snapshot note may hold (every warp of 8,192 blocks of 32 warps): a
/// reader makes a record of each (tens of bytes), whatever few bytes declare them (`- n`).
pub(crate) const MAX_SNAPSHOT_WARPS: usize = 1 << 18;
/// The most warps the snapshot notes of one capture may hold together (62 snapshots of
/// every warp an H100 holds at once), so that reading, telling and drawing them all is
/// bounded in time as well. Past it a writer keeps the text only.
pub(crate) const MAX_CAPTURE_SNAPSHOT_WARPS: usize = 1 << 19;

/// Why a warps note does not read: the line (from 1; 0: the note as a whole) and what.
type Bad = (usize, &'static str);

/// The key of snapshot `index` (from 0) of launch `launch_id`'s text.
pub(crate) fn text_key(launch_id: u64, index: u32) -> String {
    format!("{TEXT}{launch_id}.{index}")
}

/// The launch id and snapshot number a key of `prefix` names, written as
/// [`text_key`] writes them (digits only).
fn parse_key(key: &str, prefix: &str) -> Option<(u64, u32)> {
    let (launch, index) = key.strip_prefix(prefix)?.split_once('.')?;
    Some((unsigned(launch)?, unsigned(index)?))
}

/// A number of decimal digits only: no sign, no space.
fn unsigned<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The snapshot as a warps note: its key and value.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn warps_note(s: &Snapshot) -> (String, String) {
    // About 40 bytes a running warp; runs of warps not started are one line.
    let mut v = String::with_capacity(256 + 40 * s.warps.len());
    let [x, y, z] = s.grid;
    let _ = write!(
        v,
        "{FORMAT}\nlaunch {} snapshot {} grid {x} {y} {z} warps_per_block {} now_ns {} running_ns {} warps {}\nkernel ",
        s.launch_id,
        s.index,
        s.warps_per_block,
        s.now_ns,
        s.running_ns,
        s.warps.len()
    );
    escape(&s.kernel, &mut v);
    v.push('\n');
    // Times from now: short, and any u64 fits.
    let rel = |t: u64| i128::from(t) - i128::from(s.now_ns);
    let mut i = 0;
    while i < s.warps.len() {
        let w = &s.warps[i];
        debug_assert_eq!(w.slot as usize, i, "warps in slot order, one a slot");
        match &w.state {
            State::NotStarted => {
                let n = s.warps[i..]
                    .iter()
                    .take_while(|w| w.state == State::NotStarted)
                    .count();
                let _ = writeln!(v, "- {n}");
                i += n;
                continue;
            }
            State::Done { at_ns } => {
                let _ = writeln!(v, "d {} {}", w.sm, rel(*at_ns));
            }
            State::Running {
                open,
                last,
                last_entry_ns,
                started_ns,
            } => {
                let _ = write!(v, "r {} {} ", w.sm, rel(*started_ns));
                match last_entry_ns {
                    Some(t) => {
                        let _ = write!(v, "{}", rel(*t));
                    }
                    None => v.push('-'),
                }
                match last {
                    Some(Last {
                        id,
                        payload: Some(p),
                    }) => {
                        let _ = write!(v, " {id}:{p}");
                    }
                    Some(Last { id, payload: None }) => {
                        let _ = write!(v, " {id}");
                    }
                    None => v.push_str(" -"),
                }
                for o in open {
                    let _ = write!(v, " {}@{}", o.id, rel(o.since_ns));
                }
                v.push('\n');
            }
        }
        i += 1;
    }
    (format!("{WARPS}{}.{}", s.launch_id, s.index), v)
}

/// A kernel name on one line: `\` and line breaks escaped.
fn escape(name: &str, out: &mut String) {
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// [`escape`] undone; any other escape is refused.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            'n' => '\n',
            'r' => '\r',
            _ => return None,
        });
    }
    Some(out)
}

/// The space-separated words of one line, taken in order.
struct Words<'a> {
    words: std::str::Split<'a, char>,
    line: usize,
}

impl<'a> Words<'a> {
    fn new(line: usize, text: &'a str) -> Words<'a> {
        Words {
            words: text.split(' '),
            line,
        }
    }

    fn bad(&self, what: &'static str) -> Bad {
        (self.line, what)
    }

    fn next(&mut self) -> Result<&'a str, Bad> {
        self.words
            .next()
            .ok_or((self.line, "the line ends too soon"))
    }

    /// The word `w`, as it must come here.
    fn word(&mut self, w: &'static str) -> Result<(), Bad> {
        match self.next()? == w {
            true => Ok(()),
            false => Err(self.bad("a field is not the one expected here")),
        }
    }

    fn num<T: std::str::FromStr>(&mut self) -> Result<T, Bad> {
        let w = self.next()?;
        unsigned(w).ok_or(self.bad("not a number in range"))
    }

    /// A time written from `now`.
    fn time(&mut self, now: u64) -> Result<u64, Bad> {
        let w = self.next()?;
        time(w, now).ok_or(self.bad("not a time in range"))
    }

    /// The line has no more words.
    fn end(&mut self) -> Result<(), Bad> {
        match self.words.next() {
            None => Ok(()),
            Some(_) => Err(self.bad("more fields than the line takes")),
        }
    }
}

/// A time written as ns from `now` (`-3100000000`), made whole.
fn time(w: &str, now: u64) -> Option<u64> {
    let d: i128 = match w.strip_prefix('-') {
        Some(digits) => -unsigned::<i128>(digits)?,
        None => unsigned(w)?,
    };
    u64::try_from(i128::from(now).checked_add(d)?).ok()
}

/// A warps note's value read back, holding at most `max_warps` warps.
pub(crate) fn parse(value: &str, max_warps: usize) -> Result<Snapshot, Bad> {
    let body = value
        .strip_suffix('\n')
        .ok_or((0, "the note does not end with a line break"))?;
    let mut lines = (1..).zip(body.split('\n'));
    let mut line = |what| lines.next().ok_or((0, what));
    let (_, first) = line("the note is empty")?;
    if first != FORMAT {
        return Err((1, "not a snapshot of this format (`tgpu-watch 1`)"));
    }
    let (n, head) = line("no launch line")?;
    let mut w = Words::new(n, head);
    w.word("launch")?;
    let launch_id = w.num()?;
    w.word("snapshot")?;
    let index = w.num()?;
    w.word("grid")?;
    let grid = [w.num()?, w.num()?, w.num()?];
    w.word("warps_per_block")?;
    let warps_per_block = w.num()?;
    w.word("now_ns")?;
    let now_ns = w.num()?;
    w.word("running_ns")?;
    let running_ns = w.num()?;
    w.word("warps")?;
    let count: usize = w.num()?;
    w.end()?;
    if warps_per_block == 0 {
        return Err((n, "no warps per block"));
    }
    if count > max_warps.min(MAX_SNAPSHOT_WARPS) {
        return Err((n, "more warps than a reader takes (docs/capture.md)"));
    }
    let (n, kernel) = line("no kernel line")?;
    let kernel = kernel
        .strip_prefix("kernel ")
        .and_then(unescape)
        .ok_or((n, "not a kernel name"))?;
    if kernel.len() > MAX_NAME_LEN {
        return Err((n, "a kernel name longer than a name may be"));
    }
    let mut warps: Vec<Warp> = Vec::with_capacity(count.min(1024));
    for (n, text) in lines {
        if warps.len() == count {
            return Err((n, "more warps than the launch line says"));
        }
        let mut w = Words::new(n, text);
        let slot = warps.len() as u32;
        match w.next()? {
            "-" => {
                let run: usize = w.num()?;
                if run == 0 || run > count - warps.len() {
                    return Err(w.bad("a run of warps not started out of range"));
                }
                warps.extend((slot..).take(run).map(|slot| Warp {
                    slot,
                    sm: 0,
                    state: State::NotStarted,
                }));
            }
            "d" => {
                let sm = w.num()?;
                let at_ns = w.time(now_ns)?;
                warps.push(Warp {
                    slot,
                    sm,
                    state: State::Done { at_ns },
                });
            }
            "r" => {
                let sm = w.num()?;
                let started_ns = w.time(now_ns)?;
                let last_entry_ns = match w.next()? {
                    "-" => None,
                    t => Some(time(t, now_ns).ok_or(w.bad("not a time in range"))?),
                };
                let last = match w.next()? {
                    "-" => None,
                    l => Some(last(l).ok_or(w.bad("not a closed event (`id` or `id:payload`)"))?),
                };
                let mut open = Vec::new();
                for o in w.words.by_ref() {
                    if open.len() == WATCH_RECORDS {
                        return Err((n, "more open ranges than a warp has"));
                    }
                    let (id, since) = o
                        .split_once('@')
                        .ok_or((n, "not an open range (`id@since`)"))?;
                    open.push(Open {
                        id: unsigned(id).ok_or((n, "not an event id"))?,
                        since_ns: time(since, now_ns).ok_or((n, "not a time in range"))?,
                    });
                }
                warps.push(Warp {
                    slot,
                    sm,
                    state: State::Running {
                        open,
                        last,
                        last_entry_ns,
                        started_ns,
                    },
                });
            }
            _ => return Err(w.bad("not a warp (`r`, `d` or `-`)")),
        }
        w.end()?;
    }
    if warps.len() != count {
        return Err((0, "fewer warps than the launch line says"));
    }
    Ok(Snapshot {
        launch_id,
        kernel,
        grid,
        warps_per_block,
        now_ns,
        running_ns,
        index,
        warps,
    })
}

/// `id` or `id:payload`.
fn last(w: &str) -> Option<Last> {
    Some(match w.split_once(':') {
        Some((id, p)) => Last {
            id: unsigned(id)?,
            payload: Some(unsigned(p)?),
        },
        None => Last {
            id: unsigned(w)?,
            payload: None,
        },
    })
}

/// Every warps note of `metadata` reads, follows its snapshot's text note and names the
/// same snapshot, and all of them hold at most [`MAX_CAPTURE_SNAPSHOT_WARPS`] warps.
pub(super) fn check(metadata: &[(String, String)]) -> Result<(), CaptureError> {
    let mut left = MAX_CAPTURE_SNAPSHOT_WARPS;
    for (note, (key, value)) in metadata.iter().enumerate() {
        if !key.starts_with(WARPS) {
            continue;
        }
        let bad = |(line, what): Bad| CaptureError::BadSnapshot { note, line, what };
        let (launch_id, index) = parse_key(key, WARPS)
            .ok_or(bad((0, "its key is not `watchdog-warps <launch>.<n>`")))?;
        let after_text = note
            .checked_sub(1)
            .is_some_and(|t| metadata[t].0 == text_key(launch_id, index));
        if !after_text {
            return Err(bad((0, "it does not follow its snapshot's text note")));
        }
        let s = parse(value, left).map_err(bad)?;
        if (s.launch_id, s.index) != (launch_id, index) {
            return Err(bad((2, "its launch or snapshot number is not its key's")));
        }
        left -= s.warps.len();
    }
    Ok(())
}

impl Capture {
    /// The watchdog's snapshots of launches that ran past their deadline (issue #32), in
    /// the order taken: (launch id, which snapshot of it, from 0, the text). The text is
    /// told again from every warp's state where the capture keeps it, as the live run
    /// told it, else it is the text the run logged (captures before those states were
    /// kept, or a snapshot past the bound of docs/capture.md).
    pub fn snapshots(&self) -> impl Iterator<Item = (u64, u32, Cow<'_, str>)> + '_ {
        self.metadata
            .iter()
            .enumerate()
            .filter_map(|(i, (key, text))| {
                let (launch, index) = parse_key(key, TEXT)?;
                let told = match self.kept_snapshot(i + 1) {
                    Some(s) if (s.launch_id, s.index) == (launch, index) => {
                        Cow::Owned(s.text(&self.registry))
                    }
                    _ => Cow::Borrowed(text.as_str()),
                };
                Some((launch, index, told))
            })
    }

    /// The snapshot whose warps note is metadata note `note`, if it is one that reads.
    pub(crate) fn kept_snapshot(&self, note: usize) -> Option<Snapshot> {
        let (key, value) = self.metadata.get(note)?;
        parse_key(key, WARPS)?;
        parse(value, MAX_SNAPSHOT_WARPS).ok()
    }

    /// The snapshots whose warps the capture keeps, in the order taken: the note of each
    /// ([`Capture::kept_snapshot`]) and its launch id, from its key (nothing is parsed).
    pub(crate) fn kept_snapshots(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let keys = self.metadata.iter().map(|(k, _)| parse_key(k, WARPS));
        keys.enumerate()
            .filter_map(|(note, key)| key.map(|(launch, _)| (note, launch)))
    }

    /// Keeps a watchdog's snapshot: its text, then its warps unless, with those kept
    /// already, they would pass [`MAX_CAPTURE_SNAPSHOT_WARPS`] (what a reader takes).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn push_snapshot(&mut self, kept: KeptSnapshot) {
        let before: usize = self
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with(WARPS))
            .filter_map(|(_, v)| declared_warps(v))
            .sum();
        self.metadata.push(kept.text);
        if let Some((note, warps)) = kept.warps {
            if before.saturating_add(warps) <= MAX_CAPTURE_SNAPSHOT_WARPS {
                self.metadata.push(note);
            }
        }
    }
}

/// A watchdog's snapshot as a capture keeps it, made before the capture is locked (a
/// recorder's layer takes that lock on the application's threads): its text note, and
/// its warps note with their count unless they pass [`MAX_SNAPSHOT_WARPS`].
#[derive(Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct KeptSnapshot {
    text: (String, String),
    warps: Option<((String, String), usize)>,
}

impl KeptSnapshot {
    /// Snapshot `s`, told as `text`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn new(s: &Snapshot, text: &str) -> KeptSnapshot {
        let n = s.warps.len();
        KeptSnapshot {
            text: (text_key(s.launch_id, s.index), text.to_string()),
            warps: (n <= MAX_SNAPSHOT_WARPS).then(|| (warps_note(s), n)),
        }
    }
}

/// The warps a warps note declares on its launch line (the last word).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn declared_warps(value: &str) -> Option<usize> {
    let head = value.split('\n').nth(1)?;
    unsigned(head.rsplit(' ').next()?)
}
