//! Output files that are complete or absent.
//!
//! Every file the crate writes (a Perfetto trace, a capture, the CLI's SVG) is
//! written into a temporary file in the destination's folder, synced, then
//! renamed over the destination. A reader never sees half a file, a failed or
//! abandoned write leaves any earlier file as it was and removes its temporary
//! file, and of two writers racing to one path the destination ends up holding
//! one whole output (the last rename wins).
//!
//! # Temporary files
//!
//! The temporary file is `.NAME.XXXXXX.tmp` beside `NAME` (`XXXXXX` random;
//! `NAME` cut to what fits a file name's 255 bytes), created by `tempfile` with `O_EXCL`: no existing file or symbolic link is
//! ever followed, truncated or renamed away, whatever its name. It gets the
//! permissions `File::create` would give (0666 less the umask), not
//! `tempfile`'s 0600. While it is open it is listed in a process-wide registry,
//! so that [`remove_temporary_files`] can remove it when the process is
//! interrupted. The library installs no signal handler (a library does not
//! take over a program's signals); a program calls that function from its own
//! (the `tracing-gpu` CLI does on SIGINT, SIGTERM and SIGHUP). SIGKILL cannot
//! be caught: a killed writer leaves its temporary file, recognisable by its
//! name, and nothing at the destination changes.
//!
//! # Destinations
//!
//! [`AtomicFile::create`] refuses, before creating anything, a path that names
//! a folder (it ends in `/` or `/.`, or is `..`) and a destination that exists
//! and is not a regular file, symbolic links followed: a directory, a device,
//! a FIFO, a socket, or a link to one: renaming over those would replace them
//! with a regular file. [`AtomicFile::commit`] checks again, since the write
//! may take seconds. A symbolic link to a regular file, or a
//! dangling one, is replaced by the new file, as `rename` does: its target is
//! never written. Following it would write outside the folder named (the
//! classic symbolic-link attack on shared folders such as `/tmp`).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use tempfile::TempPath;

/// The temporary files being written, each under its [`AtomicFile`]'s id. An
/// entry lives as long as its `AtomicFile` (commit and drop take it out), so
/// the list never holds more than the files open at once.
struct Pending {
    next_id: u64,
    files: Vec<(u64, TempPath)>,
    /// Set by [`remove_temporary_files`]: no new file after it.
    closed: bool,
}

impl Pending {
    fn take(&mut self, id: u64) -> Option<TempPath> {
        let i = self.files.iter().position(|(i, _)| *i == id)?;
        Some(self.files.swap_remove(i).1)
    }
}

// Every creation, rename and removal of a temporary file happens under this
// lock, so that `remove_temporary_files` sees each file either before it exists,
// while it is pending, or once it is gone: a signal arriving at any moment
// leaves no temporary file behind.
static PENDING: Mutex<Pending> = Mutex::new(Pending {
    next_id: 0,
    files: Vec::new(),
    closed: false,
});

fn exiting() -> io::Error {
    io::Error::other("the process is exiting: its output files were removed")
}

/// Removes the temporary file of every [`AtomicFile`] still being written, for
/// a program that is exiting on a signal. It is meant for the process's last
/// moments: from then on, [`AtomicFile::create`] fails and no file being
/// written can be committed, so that nothing the process writes afterwards is
/// left behind.
///
/// It takes a lock and removes files, which a signal handler must not do: call
/// it from a thread that waits for signals, such as `signal-hook`'s
/// `Signals::forever` loop, then exit.
pub fn remove_temporary_files() {
    let mut pending = PENDING.lock();
    pending.closed = true;
    // Dropping a `TempPath` removes its file.
    pending.files.clear();
}

/// A file being written to `path`; it appears there, whole, on
/// [`AtomicFile::commit`]. Dropped without a commit, it leaves nothing behind.
/// The module's documentation says which destinations it refuses and how
/// symbolic links are treated.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    /// Its temporary file's entry in [`PENDING`].
    id: u64,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`. Refuses (`InvalidInput`) a path that names a
    /// folder, and a destination that exists and is not a regular file (a
    /// directory, a device, a FIFO, or a symbolic link to one): renaming over it
    /// would replace it.
    pub fn create(path: impl AsRef<Path>) -> io::Result<AtomicFile> {
        let path = path.as_ref();
        let name = file_name(path)?;
        check_destination(path)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(temporary_stem(name));
        prefix.push(".");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let mut pending = PENDING.lock();
        if pending.closed {
            return Err(exiting());
        }
        let (file, tmp) = builder.tempfile_in(dir)?.into_parts();
        let id = pending.next_id;
        pending.next_id += 1;
        pending.files.push((id, tmp));
        Ok(AtomicFile {
            file,
            id,
            path: path.to_path_buf(),
        })
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs the data and renames the file into place; returns its path. Fails,
    /// leaving nothing behind, if the destination has meanwhile become
    /// something other than a regular file, or if [`remove_temporary_files`]
    /// has run.
    pub fn commit(self) -> io::Result<PathBuf> {
        self.file.sync_all()?;
        check_destination(&self.path)?;
        {
            let mut pending = PENDING.lock();
            let tmp = pending.take(self.id).ok_or_else(exiting)?;
            // On failure the `TempPath` comes back in the error and is dropped
            // here, removing the file.
            tmp.persist(&self.path).map_err(|e| e.error)?;
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Make the rename itself durable; not every file system allows it.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(self.path.clone())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        let mut pending = PENDING.lock();
        // Removed with the lock held (see `PENDING`); already gone if committed.
        drop(pending.take(self.id));
    }
}

/// What a temporary name keeps of `name`: all of it, unless `.NAME.XXXXXX.tmp` would
/// pass the 255 bytes a file name may have, when the start of it that fits (cut at a
/// character if the name is UTF-8): a legal name of 244 to 255 bytes is written too.
/// (`OsStr::len` is the length of its encoding: bytes, on Unix.)
fn temporary_stem(name: &OsStr) -> &OsStr {
    // ".", ".", six random characters, ".tmp".
    const ROOM: usize = 255 - 12;
    if name.len() <= ROOM {
        return name;
    }
    match name.to_str() {
        Some(s) => {
            let mut end = ROOM;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            OsStr::new(&s[..end])
        }
        #[cfg(unix)]
        None => std::os::unix::ffi::OsStrExt::from_bytes(
            &std::os::unix::ffi::OsStrExt::as_bytes(name)[..ROOM],
        ),
        #[cfg(not(unix))]
        None => name,
    }
}

/// The file name `path` ends with; an error if it names a folder: `out/` and
/// `out/.` (whose `file_name` is `out`), `..`, `/`.
fn file_name(path: &Path) -> io::Result<&OsStr> {
    let raw = path.as_os_str().as_encoded_bytes();
    let last = raw
        .rsplit(|&b| std::path::is_separator(char::from(b)))
        .next()
        .unwrap_or(raw);
    match path.file_name() {
        Some(name) if name.as_encoded_bytes() == last => Ok(name),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "names a folder, not a file",
        )),
    }
}

/// Refuses a destination that exists and is not a regular file (links
/// followed); anything else, including nothing there, is fine.
fn check_destination(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory",
        )),
        Ok(m) if !m.is_file() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "exists and is not a regular file (a device, a FIFO or a socket)",
        )),
        _ => Ok(()),
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
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
    /// The folder's entries, sorted.
    fn listing(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_names_up_to_the_longest_legal_one() {
        let dir = tempfile::tempdir().unwrap();
        // 255 bytes: ASCII, and UTF-8 whose cut falls inside a character.
        for name in [
            "a".repeat(255),
            format!("{}{}", "b".repeat(242), "é".repeat(6)),
            "c".repeat(244),
        ] {
            let path = dir.path().join(&name);
            let mut f = AtomicFile::create(&path).unwrap();
            f.write_all(b"whole").unwrap();
            f.commit().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            3,
            "no temporary file left"
        );
    }

    #[test]
    fn refuses_paths_that_name_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let before = listing(dir.path());
        let d = dir.path().to_str().unwrap();
        for path in [
            format!("{d}/sub/"),
            format!("{d}/new/"),
            format!("{d}/new/."),
            format!("{d}/sub/.."),
            "/".to_string(),
        ] {
            let e = AtomicFile::create(&path).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{path}: {e}");
        }
        assert_eq!(listing(dir.path()), before, "nothing created");
        assert!(listing(&dir.path().join("sub")).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn refuses_devices_fifos_and_links_to_folders() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        std::os::unix::fs::symlink(dir.path(), dir.path().join("to-dir")).unwrap();
        let before = listing(dir.path());
        for path in [fifo.clone(), dir.path().join("to-dir")] {
            let e = AtomicFile::create(&path).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{path:?}: {e}");
        }
        assert_eq!(listing(dir.path()), before, "nothing created");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        // Refused before anything is created in /dev, whoever runs it.
        let e = AtomicFile::create("/dev/null").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn commit_refuses_a_destination_that_became_a_fifo() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"trace").unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let e = f.commit().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_fifo());
        assert_eq!(listing(dir.path()), ["out"], "no temporary file left");
    }

    #[cfg(unix)]
    #[test]
    fn replaces_links_at_the_destination_without_following_them() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling");
        let nowhere = dir.path().join("nowhere");
        std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
        for path in [&link, &dangling] {
            let mut f = AtomicFile::create(path).unwrap();
            f.write_all(b"trace").unwrap();
            f.commit().unwrap();
            let m = std::fs::symlink_metadata(path).unwrap();
            assert!(m.is_file(), "{path:?}: the link is replaced by the file");
            assert_eq!(std::fs::read(path).unwrap(), b"trace");
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(!nowhere.exists(), "a dangling link's target is not created");
    }

    #[cfg(unix)]
    #[test]
    fn files_get_the_permissions_file_create_gives() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        File::create(&plain).unwrap();
        let mut f = AtomicFile::create(dir.path().join("atomic")).unwrap();
        f.write_all(b"x").unwrap();
        let atomic = f.commit().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&atomic), mode(&plain));
    }

    #[test]
    fn the_registry_forgets_committed_and_dropped_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut ids = Vec::new();
        for i in 0..100 {
            let f = AtomicFile::create(dir.path().join(format!("f{}", i % 3))).unwrap();
            ids.push(f.id);
            if i % 2 == 0 {
                f.commit().unwrap();
            }
        }
        let pending = PENDING.lock();
        assert!(!pending.files.iter().any(|(id, _)| ids.contains(id)));
        drop(pending);
        assert_eq!(listing(dir.path()), ["f0", "f1", "f2"]);
    }
}
