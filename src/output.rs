//! Output files that are complete or absent.
//!
//! Every file the crate writes (a Perfetto trace, a capture, the CLI's SVG) is
//! written into a temporary file with a unique name in the destination's
//! folder (`tempfile`: created with `O_EXCL`, so no existing file or symbolic
//! link is ever followed or truncated), synced, then renamed over the
//! destination. A reader never sees half a file, a failed or abandoned write
//! leaves any earlier file as it was and removes its temporary file, and of
//! two writers racing to one path the destination ends up holding one whole
//! output.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// A file being written to `path`; it appears there, whole, on
/// [`AtomicFile::commit`]. Dropped without a commit, it leaves nothing behind.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: NamedTempFile,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`. Refuses a destination that exists and is not a
    /// regular file (a directory, a device, a FIFO): renaming over it would
    /// replace it.
    pub fn create(path: impl AsRef<Path>) -> io::Result<AtomicFile> {
        let path = path.as_ref();
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "exists and is not a regular file",
                ))
            }
            _ => {}
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempfile_in(dir)?;
        Ok(AtomicFile {
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs the data and renames the file into place; returns its path.
    pub fn commit(self) -> io::Result<PathBuf> {
        self.tmp.as_file().sync_all()?;
        self.tmp.persist(&self.path).map_err(|e| e.error)?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Make the rename itself durable; not every file system allows it.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(self.path)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tmp.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.tmp.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tmp.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_or_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"old",
            "not before the commit"
        );
        drop(f);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"old",
            "a dropped write changes nothing"
        );
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(f.commit().unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = AtomicFile::create(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(dir.path().exists());
    }

    #[cfg(unix)]
    #[test]
    fn never_follows_a_link_at_a_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // The old scheme's fixed temporary name, as a trap.
        std::os::unix::fs::symlink(&victim, dir.path().join("out.tmp")).unwrap();
        let mut f = AtomicFile::create(dir.path().join("out")).unwrap();
        f.write_all(b"trace").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), b"trace");
    }
}
