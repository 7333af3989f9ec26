//! The capture body as a stream: inflated as it is read and never whole in
//! memory, every field read at a position checked against the declared
//! length, and a budget for what a reader keeps.

use std::io::{self, BufRead, BufReader, Read};
use std::mem::size_of;

use flate2::bufread::ZlibDecoder;

use super::{CaptureError, CAPTURE_MEMORY_LIMIT, MAX_NAME_LEN};

/// Inflated bytes buffered at a time; small fields are copied out of them.
const CHUNK: usize = 64 << 10;

/// The most items a list reserves room for before they have been read: past
/// it, a list grows as its items arrive, so a count that the stream does not
/// back allocates nothing.
const RESERVE: usize = 1024;

/// The inflated body of a capture, read front to back.
pub(super) struct Body<R> {
    z: BufReader<ZlibDecoder<R>>,
    /// Bytes of the body read so far.
    pos: u64,
    /// The length the header declares (untrusted: it bounds reads, never sizes
    /// an allocation).
    len: u64,
    /// A fault of the stream itself has been reported: it says nothing more.
    broken: bool,
}

impl<R: BufRead> Body<R> {
    /// The body of the zlib stream starting at `r`, declared `len` bytes long.
    pub(super) fn new(r: R, len: u64) -> Body<R> {
        Body {
            z: BufReader::with_capacity(CHUNK, ZlibDecoder::new(r)),
            pos: 0,
            len,
            broken: false,
        }
    }

    /// The body offset of the next byte.
    pub(super) fn pos(&self) -> u64 {
        self.pos
    }

    /// `pos` for an error's offset.
    fn offset(pos: u64) -> usize {
        usize::try_from(pos).unwrap_or(usize::MAX)
    }

    /// A parse error at body offset `at`.
    pub(super) fn corrupt_at(at: u64, what: &'static str) -> CaptureError {
        CaptureError::Corrupt {
            offset: Body::<R>::offset(at),
            what,
        }
    }

    /// A parse error here.
    pub(super) fn corrupt(&self, what: &'static str) -> CaptureError {
        Self::corrupt_at(self.pos, what)
    }

    /// The inflater failed: the file ends inside the stream, or the stream is
    /// not zlib (or fails its check).
    fn stream_fault(&mut self, e: io::Error) -> CaptureError {
        self.broken = true;
        match e.kind() {
            io::ErrorKind::UnexpectedEof => CaptureError::Truncated {
                what: "inside the compressed body".into(),
            },
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
                CaptureError::CorruptStream(e)
            }
            _ => CaptureError::Io(e),
        }
    }

    /// The stream ended, whole, after `at` bytes: fewer than declared.
    fn short(&mut self, at: u64) -> CaptureError {
        self.broken = true;
        CaptureError::Truncated {
            what: format!("body has {at} of {} bytes", self.len),
        }
    }

    /// Refuses a field of `n` bytes that would pass the declared length.
    fn need(&self, n: u64) -> Result<(), CaptureError> {
        let left = self.len - self.pos;
        if n > left {
            return Err(CaptureError::Truncated {
                what: format!("body needs {n} bytes at offset {}, has {left}", self.pos),
            });
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes.
    pub(super) fn fill(&mut self, buf: &mut [u8]) -> Result<(), CaptureError> {
        self.need(buf.len() as u64)?;
        // Most fields are already inflated: copied straight out.
        if let Some(b) = self.z.buffer().get(..buf.len()) {
            buf.copy_from_slice(b);
            self.z.consume(buf.len());
            self.pos += buf.len() as u64;
            return Ok(());
        }
        let mut done = 0;
        while done < buf.len() {
            match self.z.read(&mut buf[done..]) {
                Ok(0) => return Err(self.short(self.pos + done as u64)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.stream_fault(e)),
            }
        }
        self.pos += done as u64;
        Ok(())
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], CaptureError> {
        let mut a = [0u8; N];
        self.fill(&mut a)?;
        Ok(a)
    }
    pub(super) fn u8(&mut self) -> Result<u8, CaptureError> {
        Ok(self.arr::<1>()?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, CaptureError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, CaptureError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, CaptureError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub(super) fn i64(&mut self) -> Result<i64, CaptureError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    pub(super) fn xyz(&mut self) -> Result<[u32; 3], CaptureError> {
        Ok([self.u32()?, self.u32()?, self.u32()?])
    }

    /// `opt<T>`: a tag, then `T` if it is 1.
    pub(super) fn opt<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, CaptureError>,
    ) -> Result<Option<T>, CaptureError> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => Err(Self::corrupt_at(
                self.pos - 1,
                "option tag is neither 0 nor 1",
            )),
        }
    }

    /// A count of items, each at least `min_size` bytes: refused at once if
    /// the rest of the declared body cannot hold them.
    pub(super) fn count(&mut self, min_size: usize) -> Result<usize, CaptureError> {
        let n = self.u32()? as usize;
        if (n as u64).saturating_mul(min_size as u64) > self.len - self.pos {
            return Err(Self::corrupt_at(
                self.pos - 4,
                "count larger than the rest of the body",
            ));
        }
        Ok(n)
    }

    /// A count of items of type `T` that the reader keeps: charged to `budget`
    /// at once, and an empty list for them that reserves room for a few only.
    pub(super) fn list<T>(
        &mut self,
        min_size: usize,
        budget: &mut Budget,
    ) -> Result<(usize, Vec<T>), CaptureError> {
        let n = self.count(min_size)?;
        budget.take(n.saturating_mul(size_of::<T>()), self.pos - 4)?;
        Ok((n, Vec::with_capacity(n.min(RESERVE))))
    }

    /// `str`, its bytes charged to `budget` before they are read.
    pub(super) fn str(&mut self, budget: &mut Budget) -> Result<String, CaptureError> {
        let n = self.u32()?;
        self.str_after(n, budget)
    }

    /// The bytes of a `str` whose length `n` was just read.
    fn str_after(&mut self, n: u32, budget: &mut Budget) -> Result<String, CaptureError> {
        self.need(n.into())?;
        budget.take(heap(n as usize), self.pos - 4)?;
        let at = self.pos;
        String::from_utf8(self.vec(n.into())?)
            .map_err(|_| Self::corrupt_at(at, "string is not UTF-8"))
    }

    /// A `str` that names something (`what`: a kernel, a thread, an event
    /// type...): refused past [`MAX_NAME_LEN`] bytes before they are read, so
    /// that no name read costs more than that wherever it is used.
    pub(super) fn name(
        &mut self,
        budget: &mut Budget,
        what: &'static str,
    ) -> Result<String, CaptureError> {
        let at = self.pos;
        let len = self.u32()?;
        if len as usize > MAX_NAME_LEN {
            return Err(CaptureError::LongName {
                offset: Self::offset(at),
                what,
                len,
            });
        }
        self.str_after(len, budget)
    }

    /// The length of a `bytes` field.
    pub(super) fn bytes_len(&mut self) -> Result<u64, CaptureError> {
        let n = self.u64()?;
        self.need(n)?;
        Ok(n)
    }

    /// The next `n` bytes, in a vector that grows as they arrive (a length
    /// is untrusted until its bytes are there).
    pub(super) fn vec(&mut self, n: u64) -> Result<Vec<u8>, CaptureError> {
        self.need(n)?;
        if n <= CHUNK as u64 {
            // Small (names, most strings): one allocation of the right size.
            let mut v = vec![0; n as usize];
            self.fill(&mut v)?;
            return Ok(v);
        }
        let mut v = Vec::with_capacity(CHUNK);
        self.append(&mut v, n)?;
        Ok(v)
    }

    /// Appends the next `n` bytes to `v` (which the caller may have sized for
    /// them: pages the stream does not fill are never touched).
    pub(super) fn append(&mut self, v: &mut Vec<u8>, n: u64) -> Result<(), CaptureError> {
        self.need(n)?;
        match (&mut self.z).take(n).read_to_end(v) {
            Ok(got) if got as u64 == n => {
                self.pos += n;
                Ok(())
            }
            Ok(got) => Err(self.short(self.pos + got as u64)),
            Err(e) => Err(self.stream_fault(e)),
        }
    }

    /// Passes over the next `n` bytes, which must be zero: the offset among
    /// them of the first that is not, if one is not.
    pub(super) fn zeros(&mut self, n: u64) -> Result<Option<u64>, CaptureError> {
        self.need(n)?;
        let mut done = 0;
        while done < n {
            let buf = match self.z.fill_buf() {
                Ok([]) => return Err(self.short(self.pos)),
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.stream_fault(e)),
            };
            let take = buf
                .len()
                .min(usize::try_from(n - done).unwrap_or(usize::MAX));
            let nonzero = first_nonzero(&buf[..take]);
            self.z.consume(take);
            self.pos += take as u64;
            if let Some(k) = nonzero {
                return Ok(Some(done + k as u64));
            }
            done += take as u64;
        }
        Ok(None)
    }

    /// Passes over the next `n` bytes.
    pub(super) fn skip(&mut self, n: u64) -> Result<(), CaptureError> {
        self.need(n)?;
        match io::copy(&mut (&mut self.z).take(n), &mut io::sink()) {
            Ok(got) if got == n => {
                self.pos += n;
                Ok(())
            }
            Ok(got) => Err(self.short(self.pos + got)),
            Err(e) => Err(self.stream_fault(e)),
        }
    }

    /// After the last section: the body must end here, and so must the stream
    /// and the file.
    pub(super) fn end(&mut self) -> Result<(), CaptureError> {
        if self.pos < self.len {
            return Err(self.corrupt("bytes after the last section"));
        }
        self.rest().map_or(Ok(()), Err)
    }

    /// Reads the stream to its end: the fault of the stream or of the file
    /// around it, if there is one (its length against the declared one,
    /// then anything after it).
    fn rest(&mut self) -> Option<CaptureError> {
        let more = match io::copy(&mut self.z, &mut io::sink()) {
            Ok(n) => n,
            Err(e) => return Some(self.stream_fault(e)),
        };
        let total = self.pos.saturating_add(more);
        if total < self.len {
            return Some(self.short(total));
        }
        self.broken = true;
        if total > self.len {
            return Some(Self::corrupt_at(
                self.len,
                "body longer than its declared length",
            ));
        }
        // The bufread inflater takes only the stream's own bytes: what is
        // left in the file after it is not ours.
        match self.z.get_mut().get_mut().fill_buf() {
            Ok([]) => None,
            Ok(_) => Some(Self::corrupt_at(
                self.len,
                "bytes after the compressed body",
            )),
            Err(e) => Some(CaptureError::Io(e)),
        }
    }

    /// The error to report for `e`, met while parsing: a fault of the stream
    /// (truncated, corrupt, longer or shorter than declared, followed by
    /// other bytes) comes first, as it explains a parse error; the stream is
    /// read to its end to find one.
    pub(super) fn settle(&mut self, e: CaptureError) -> CaptureError {
        if self.broken || matches!(e, CaptureError::Io(_) | CaptureError::File { .. }) {
            return e;
        }
        self.rest().unwrap_or(e)
    }
}

/// The offset of the first byte of `b` that is not zero, since a trace buffer's
/// empty slots can be gigabytes of zeros: compared a block at a time with a block of
/// zeros, a `memcmp` (fast in a debug build too, where the CLI's tests run it: std is
/// built optimized), then the byte found in the block that differs.
fn first_nonzero(b: &[u8]) -> Option<usize> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let block = b.chunks(ZEROS.len()).position(|c| c != &ZEROS[..c.len()])?;
    let at = block * ZEROS.len();
    b[at..].iter().position(|&x| x != 0).map(|k| at + k)
}

/// What a reader may still keep ([`CAPTURE_MEMORY_LIMIT`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    left: usize,
}

impl Budget {
    pub(super) fn new() -> Budget {
        Budget {
            left: CAPTURE_MEMORY_LIMIT,
        }
    }

    /// Charges `bytes`, for the count or string at body offset `at`.
    pub(super) fn take(&mut self, bytes: usize, at: u64) -> Result<(), CaptureError> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(CaptureError::OverLimit {
                offset: usize::try_from(at).unwrap_or(usize::MAX),
                limit: CAPTURE_MEMORY_LIMIT,
            }),
        }
    }
}

/// What the allocator takes for a string of `n` bytes: nothing when it is
/// empty, else its bytes and an 8-byte chunk header rounded up to 16, at
/// least 32 (glibc's malloc), so that many tiny strings are not undercounted.
pub(super) fn heap(n: usize) -> usize {
    match n {
        0 => 0,
        n => n.saturating_add(8).next_multiple_of(16).max(32),
    }
}
