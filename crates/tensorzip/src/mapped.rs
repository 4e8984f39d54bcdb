//! Files read through a memory map that give their pages back once they have been read.
//!
//! Every page of a mapped file that the process touches counts in its resident memory until the
//! mapping ends. The file commands read their input once, in order, yet `tensorzip compress` of a
//! 4.8 GB file peaked at the file's size plus its working memory and `decompress` at the
//! archive's size (BENCHMARKS.md, "Tensors past 2^31 elements"). `MADV_DONTNEED` on a range of a
//! shared file mapping drops those pages from the process only: the bytes stay in the page cache,
//! and a later read of the range maps them again (a minor fault) with the same contents, so
//! giving back a page still in use costs time, never correctness. On anonymous memory the same
//! call would discard the bytes, which is why the call is reached only through [`MappedFile`],
//! a mapping of a file.

use std::ops::{Deref, Range};
use std::sync::Mutex;

/// A file mapped read-only.
pub struct MappedFile {
    // Dropped before the mapping (fields drop in order): the handler forgets the range first.
    slot: Option<crate::truncation::Slot>,
    map: memmap2::Mmap,
    /// The file (a duplicate of the caller's descriptor) and its size and modification time when
    /// it was mapped, for [`MappedFile::changed`].
    file: std::fs::File,
    stamp: Option<Stamp>,
}

/// What [`MappedFile::changed`] compares: the file's size and modification time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    fn of(file: &std::fs::File) -> Option<Stamp> {
        let m = file.metadata().ok()?;
        Some(Stamp {
            len: m.len(),
            modified: m.modified().ok(),
        })
    }
}

impl MappedFile {
    /// Maps `file` read-only (shared: the mapping shows the file's pages in the page cache).
    ///
    /// # Safety
    /// As `memmap2::Mmap::map`: the file must not be changed or truncated while it is mapped. A
    /// change made by another process shows as changed bytes (which the archive's checksums
    /// catch, and [`MappedFile::changed`] reports afterwards), a truncation as `SIGBUS` (or as
    /// zeros, with [`crate::truncation::guard`] installed) — the usual caveat of mapped input.
    pub unsafe fn map(file: &std::fs::File) -> std::io::Result<MappedFile> {
        let file = file.try_clone()?;
        let stamp = Stamp::of(&file);
        // SAFETY: forwarded to the caller.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let slot = crate::truncation::Slot::register(map.as_ptr() as usize, map.len());
        Ok(MappedFile {
            slot,
            map,
            file,
            stamp,
        })
    }

    /// Whether the file is not as it was when mapped, as far as can be told: a read of the mapping
    /// found it truncated ([`MappedFile::truncated`]), or its size or modification time now
    /// differ from those it had then — a truncation inside its last page (which raises no
    /// signal: the page's tail reads as zeros) or bytes rewritten in place. Bytes read from a
    /// changed file may be any mix of old and new: a caller that sees this after its work must
    /// discard what it made from them. (A file replaced by a rename is not changed: the mapping
    /// keeps the old one. A rewrite within the file system's timestamp granularity that keeps
    /// the size goes unseen.) One `fstat`.
    pub fn changed(&self) -> bool {
        self.truncated() || Stamp::of(&self.file) != self.stamp
    }

    /// The mapped file's metadata, from its descriptor (`fstat`): what an output derived from it
    /// takes its permissions (and owner) from. Not a second lookup by path, which another user
    /// could point at another file in between (a review reproduced root's archive of a root-only
    /// file handed to that user, 2026-12-05).
    pub fn metadata(&self) -> std::io::Result<std::fs::Metadata> {
        self.file.metadata()
    }

    /// Whether a read of the mapping found the file shorter than it was when mapped (truncated by
    /// another process) — only with [`crate::truncation::guard`] installed; without it such a
    /// read ends the process. The bytes read past the new end were zeros: a caller that sees
    /// this after its work must discard what it made from them.
    pub fn truncated(&self) -> bool {
        self.slot.as_ref().is_some_and(|s| s.hit())
    }

    /// Gives back the whole pages inside `range` (clamped to the file): they leave the process's
    /// resident memory and are mapped again from the page cache if read later. A hint: it does
    /// nothing where the system has no such call, and its errors are ignored.
    pub fn release(&self, range: Range<usize>) {
        #[cfg(target_os = "linux")]
        {
            let page = page_size();
            let base = self.map.as_ptr() as usize;
            let end = range.end.min(self.map.len());
            let begin = range.start.min(end);
            // Whole pages only: the partial ones at either end may hold bytes still being read
            // (those would only be mapped again, but there is no point).
            let start = (base + begin).next_multiple_of(page) - base;
            let stop = (base + end) / page * page;
            if stop <= base || start >= stop - base {
                return;
            }
            let stop = stop - base;
            // SAFETY: the range lies inside the mapping, a read-only shared mapping of a file
            // (`MappedFile::map`): after MADV_DONTNEED a read of these pages maps the file's
            // page-cache pages again, so a slice borrowed from the mapping reads the file's
            // bytes before and after — the same values while the file is not changed (the
            // caveat of `map`; a page the guard zeroed reads the file again, as it is now).
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    stop - start,
                )
            };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = range;
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Whether `a` and `b` name the same file: the same device and inode on Unix, the same canonical
/// path elsewhere. The command line and the Python package refuse an output that is the input
/// (the temporary file would be renamed over it).
pub fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (a.canonicalize(), b.canonicalize()) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

/// Why [`MappedFile::open`] could not map a file. Its message names no file: callers prefix the
/// path as they show it.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Opening, inspecting or mapping the file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The path is a directory.
    #[error("is a directory")]
    Directory,
    /// The path is neither a regular file nor a directory (a pipe, a socket, a device).
    #[error("not a regular file (pipes and devices cannot be read; copy it to a file first)")]
    NotRegular,
}

impl MappedFile {
    /// Opens the regular file at `path` and maps it read-only ([`MappedFile::map`]). The open does
    /// not block on what is not a regular file — a FIFO's open otherwise waits for a writer
    /// (`tensorzip compress pipe`, Python `load_file(fifo)` hung with the GIL held), so on Unix it
    /// is non-blocking, which changes nothing for a regular file's reads or mappings — and the
    /// file's type is checked on the handle before mapping (a directory or a device gave "No such
    /// device (os error 19)").
    ///
    /// # Safety
    /// As [`MappedFile::map`].
    pub unsafe fn open(path: &std::path::Path) -> Result<MappedFile, OpenError> {
        let mut o = std::fs::OpenOptions::new();
        o.read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.custom_flags(libc::O_NONBLOCK);
        }
        let file = o.open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(OpenError::Directory);
        }
        if !meta.is_file() {
            return Err(OpenError::NotRegular);
        }
        // SAFETY: forwarded to the caller.
        Ok(unsafe { MappedFile::map(&file) }?)
    }
}

/// Makes a rename or link into `dest`'s directory durable: `fsync` of that directory (Unix; a
/// hint elsewhere, and on file systems that refuse to sync a directory). Without it a crash soon
/// after the rename may leave the old name, or none, although the file's data was synced.
pub fn sync_parent(dest: &std::path::Path) {
    #[cfg(unix)]
    {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = dest;
}

/// Creates a hidden temporary `.NAME.tmp-PID-N` next to `dest` with `make`, which must fail with
/// `AlreadyExists` when the name is taken (`create_new`, `create_dir`): the next `N` is tried, so
/// two writers of one destination — two threads of a process included — never share a temporary.
/// The command line's outputs and the Python package's files are written this way and renamed
/// into place once complete.
pub fn create_beside<T>(
    dest: &std::path::Path,
    make: impl Fn(&std::path::Path) -> std::io::Result<T>,
) -> std::io::Result<(std::path::PathBuf, T)> {
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = dest
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    for attempt in 0..1000u32 {
        let tmp = dir.join(format!(
            ".{}.tmp-{}-{attempt}",
            name.to_string_lossy(),
            std::process::id()
        ));
        match make(&tmp) {
            Ok(made) => return Ok((tmp, made)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free temporary name",
    ))
}

/// Whether, run as root, `path` names another file than the one read (`read`: the metadata of its
/// open descriptor, e.g. [`MappedFile::metadata`]) — a link, or a name swapped in between. The
/// command line's and the Python package's outputs of such an input are at most 0600: another
/// user's link to a root file readable only through a private directory gave that user root's
/// copy of it (a review's finding, 2026-12-05).
pub fn linked_as_root(path: &std::path::Path, read: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        std::fs::symlink_metadata(path)
            .ok()
            .is_none_or(|n| (n.dev(), n.ino()) != (read.dev(), read.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, read);
        false
    }
}

/// The permissions an output written for an input takes from it (`read`: the metadata of the
/// input's open descriptor, e.g. [`MappedFile::metadata`]; `path`: the name it was opened by):
/// [`plain_permissions`] of its mode, private where [`linked_as_root`] — the command line's
/// outputs and the Python package's file writers alike.
pub fn plain_mode(path: &std::path::Path, read: &std::fs::Metadata) -> std::fs::Permissions {
    plain_permissions(read.permissions(), linked_as_root(path, read))
}

/// `perms` without the set-user-ID, set-group-ID and sticky bits, and at most 0600 where
/// `private`. An output is written by the running user (root, say) and is its until committed:
/// a user's setuid file compressed or restored by root came out setuid root; and run as root, an
/// input named through a link (`private`) gives at most 0600 — a link made by another user to a
/// root file readable only through a private directory (0644 in a 0700 one) gave that user
/// root's copy of it, 0644 in their own directory (reviews' findings, 2026-12-05). Off Unix,
/// `perms` as they are.
pub fn plain_permissions(perms: std::fs::Permissions, private: bool) -> std::fs::Permissions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let keep = if private { 0o600 } else { 0o777 };
        std::fs::Permissions::from_mode(perms.mode() & keep)
    }
    #[cfg(not(unix))]
    {
        let _ = private;
        perms
    }
}

/// Whether no user but this process's (or root) can change what `meta` describes: `Err` says why
/// not. `sticky_ok` lets a directory writable by others pass if it has the sticky bit (as `/tmp`:
/// others cannot rename or remove what is not theirs in it) — right for a directory *above*
/// what is checked, not for the directory or file itself. Always `Ok` off Unix.
pub fn only_ours(meta: &std::fs::Metadata, sticky_ok: bool) -> Result<(), &'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err("owned by another user");
        }
        if meta.mode() & 0o022 != 0 && !(sticky_ok && meta.mode() & 0o1000 != 0) {
            return Err("writable by other users");
        }
    }
    #[cfg(not(unix))]
    let _ = (meta, sticky_ok);
    Ok(())
}

/// Why [`only_ours_above`] refused a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOurs {
    /// The path could not be resolved or examined (missing, not searchable, ...): the message
    /// names the path and the error.
    Io(String),
    /// A directory on the way can be changed by another user: the message names it and says
    /// why ([`only_ours`]).
    Shared(String),
}

impl std::fmt::Display for NotOurs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOurs::Io(m) | NotOurs::Shared(m) => f.write_str(m),
        }
    }
}

/// `dir` resolved (no links left), if it and every directory above it pass [`only_ours`]
/// (`dir` itself as sticky-exempt only with `dir_sticky_ok`, the ones above always). No other
/// user can then swap the *returned* path, or anything on the way to it, for a link or a
/// directory of theirs: callers must go on with that path, not `dir` (a link in `dir` may be
/// repointed after the check). Where `dir` itself may be sticky, others can still create names
/// in it, so writes there must create their files exclusively. Used where a process writes or
/// reads files another user must not redirect or plant: the GPU engine's kernel cache, and the
/// command line and Python's `save_dir` building a model directory as root.
pub fn only_ours_above(
    dir: &std::path::Path,
    dir_sticky_ok: bool,
) -> Result<std::path::PathBuf, NotOurs> {
    let real =
        std::fs::canonicalize(dir).map_err(|e| NotOurs::Io(format!("{}: {e}", dir.display())))?;
    for (i, d) in real.ancestors().enumerate() {
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| NotOurs::Io(format!("{}: {e}", d.display())))?;
        only_ours(&meta, i > 0 || dir_sticky_ok)
            .map_err(|why| NotOurs::Shared(format!("{} is {why}", d.display())))?;
    }
    Ok(real)
}

/// Whether a file name is one of the temporaries [`create_beside`] makes (`.NAME.tmp-PID-N`):
/// what a directory walk leaves out without a word.
pub fn is_temporary(name: &[u8]) -> bool {
    let Some(at) = name.windows(5).rposition(|w| w == b".tmp-") else {
        return false;
    };
    let mut parts = name[at + 5..].split(|&b| b == b'-');
    let digits =
        |p: Option<&[u8]>| p.is_some_and(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
    name.starts_with(b".") && digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
}

/// Pages are given back in steps of at least this many bytes (one system call each).
pub const RELEASE_STEP_BYTES: usize = 8 << 20;

/// Gives back a mapped file's pages as a command's progress passes them: the progress callbacks
/// of `write_archive` and `Archive::decode_all_to` (and the GPU engine's) report the original
/// bytes done so far, in order, and [`Spent::reached`] is called with each report.
pub struct Spent<'m> {
    file: &'m MappedFile,
    /// `None`: the progress counts bytes of the file itself, all of them below it spent (the
    /// input of `compress`, the original `verify` compares with). Otherwise the file's ranges in
    /// the order they are spent, each with the progress that spends it (an archive's blobs,
    /// spent when their segment's original bytes are written).
    steps: Option<Vec<(u64, Range<usize>)>>,
    /// Bytes given back at a time ([`RELEASE_STEP_BYTES`]; smaller in tests).
    step: usize,
    state: Mutex<State>,
}

/// What [`Spent`] has seen: the next step, and the range spent but not yet given back.
struct State {
    next: usize,
    from: usize,
    to: usize,
}

impl<'m> Spent<'m> {
    /// Progress counts bytes of `file`: every byte below it is spent.
    pub fn prefix(file: &'m MappedFile) -> Spent<'m> {
        Spent::new(file, None)
    }

    /// Range `steps[k].1` of `file` is spent once the progress reaches `steps[k].0`; the steps
    /// come in the order the progress reaches them.
    pub fn steps(file: &'m MappedFile, steps: Vec<(u64, Range<usize>)>) -> Spent<'m> {
        Spent::new(file, Some(steps))
    }

    /// The blobs of `ar`, an archive parsed from `file`: each blob is spent once the progress of
    /// decoding the archive (original bytes written, in order) passes the end of its segment.
    pub fn blobs(file: &'m MappedFile, ar: &crate::archive::Archive<'_>) -> Spent<'m> {
        let steps = ar
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| (s.orig_offset + s.orig_len, ar.blob_range(i)))
            .collect();
        Spent::steps(file, steps)
    }

    fn new(file: &'m MappedFile, steps: Option<Vec<(u64, Range<usize>)>>) -> Spent<'m> {
        Spent {
            file,
            steps,
            step: RELEASE_STEP_BYTES,
            state: Mutex::new(State {
                next: 0,
                from: 0,
                to: 0,
            }),
        }
    }

    /// Gives back `step` bytes at a time instead of [`RELEASE_STEP_BYTES`] (for tests on small
    /// files).
    #[cfg(test)]
    fn with_step(mut self, step: usize) -> Spent<'m> {
        self.step = step;
        self
    }

    /// The progress has reached `done`: gives back what it spent, once that is at least
    /// [`RELEASE_STEP_BYTES`] (or where the spent ranges stop following one another).
    pub fn reached(&self, done: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &self.steps {
            None => st.to = st.to.max(usize::try_from(done).unwrap_or(usize::MAX)),
            Some(steps) => {
                while let Some((at, r)) = steps.get(st.next) {
                    if *at > done {
                        break;
                    }
                    st.next += 1;
                    if r.start != st.to {
                        let (from, to) = (st.from, st.to);
                        self.file.release(from..to);
                        st.from = r.start;
                    }
                    st.to = r.end;
                }
            }
        }
        if st.to.saturating_sub(st.from) >= self.step {
            self.file.release(st.from..st.to);
            // The partial page at the end was kept; it goes with the next step.
            st.from = st.to;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The temporaries `create_beside` makes are told from other hidden names by their whole
    /// `.tmp-PID-N` tail.
    #[test]
    fn temporaries_are_told_from_other_hidden_names() {
        let dir = tempfile::tempdir().unwrap();
        let (made, ()) = super::create_beside(&dir.path().join("m.tz"), |t| {
            std::fs::File::create_new(t).map(drop)
        })
        .unwrap();
        let name = made.file_name().unwrap().as_encoded_bytes();
        assert!(super::is_temporary(name), "{}", made.display());
        for yes in [
            ".m.safetensors.tz.tmp-12-0",
            ".out.tmp-4242-999",
            ".a.tmp-b.tmp-1-2",
        ] {
            assert!(super::is_temporary(yes.as_bytes()), "{yes}");
        }
        for no in [
            ".gitattributes",
            ".cache",
            ".x.tmp-12",
            ".x.tmp-12-",
            ".x.tmp--1",
            ".x.tmp-1-2-3",
            ".x.tmp-a-1",
            "x.tmp-1-2",
            ".tensorzip-save-abc",
        ] {
            assert!(!super::is_temporary(no.as_bytes()), "{no}");
        }
    }

    /// Temporaries beside one destination never share a name: each takes the next free one.
    #[test]
    fn temporaries_beside_a_destination_are_distinct() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.tz");
        let make = |t: &std::path::Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(t)
        };
        let (a, _) = super::create_beside(&dest, make).unwrap();
        let (b, _) = super::create_beside(&dest, make).unwrap();
        let (c, ()) = super::create_beside(&dest, |t| std::fs::create_dir(t)).unwrap();
        assert!(a != b && b != c && a != c);
        for t in [&a, &b, &c] {
            assert_eq!(t.parent(), Some(dir.path()));
            let name = t.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with(".out.tz.tmp-"), "{name}");
        }
        let e = super::create_beside(std::path::Path::new("/"), make).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    use super::*;
    use std::io::Write;

    /// Pages of `m` mapped into this process (its mapping's `Rss` in `/proc/self/smaps`;
    /// `mincore` would tell the page cache's pages, which giving back leaves alone).
    #[cfg(target_os = "linux")]
    fn resident_pages(m: &MappedFile) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", m.as_ptr() as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        assert!(lines.next().is_some(), "the mapping is in smaps");
        let rss = lines
            .find_map(|l| l.strip_prefix("Rss:"))
            .expect("an Rss line");
        let kib: usize = rss.trim().trim_end_matches("kB").trim().parse().unwrap();
        kib * 1024 / page_size()
    }

    fn file_of(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any steps (ranges reversed, overlapping, past the end, out of order) and any sequence
        /// of progress reports: no panic, and the file reads back the same bytes.
        #[test]
        fn any_steps_and_progress_leave_the_bytes_alone(
            steps in proptest::collection::vec((0u64..200, 0usize..80_000, 0usize..80_000), 0..12),
            reports in proptest::collection::vec(0u64..220, 0..12),
            prefix in proptest::bool::ANY,
            step in 1usize..20_000,
        ) {
            let bytes: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
            let f = file_of(&bytes);
            // SAFETY: a temporary file nobody else changes.
            let m = unsafe { MappedFile::map(&f) }.unwrap();
            let s = match prefix {
                true => Spent::prefix(&m),
                false => Spent::steps(
                    &m,
                    steps.iter().map(|&(at, a, b)| (at, Range { start: a, end: b })).collect(),
                ),
            }
            .with_step(step);
            for r in reports {
                s.reached(r * 1000);
            }
            s.reached(u64::MAX);
            proptest::prop_assert!(m[..] == bytes[..]);
        }
    }

    /// Released pages read back the same bytes, in whole or in part, at any alignment; ranges
    /// past the end or empty are ignored.
    #[test]
    fn released_pages_read_back_the_same_bytes() {
        let bytes: Vec<u8> = (0..(3 << 20) + 123u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let f = file_of(&bytes);
        // SAFETY: a temporary file nobody else changes.
        let m = unsafe { MappedFile::map(&f) }.unwrap();
        assert!(m[..] == bytes[..]);
        for r in [
            0..bytes.len(),
            5..4095,
            4097..1 << 20,
            1000..bytes.len() + 99,
            7..7,
            Range { start: 9, end: 3 },
        ] {
            m.release(r.clone());
            assert!(m[..] == bytes[..], "after releasing {r:?}");
        }
        m.release(usize::MAX - 10..usize::MAX);
        assert!(m[..] == bytes[..]);
    }

    /// What `Spent` gives back leaves the process (fewer resident pages), and only once the
    /// progress passes it.
    #[cfg(target_os = "linux")]
    #[test]
    fn spent_ranges_leave_the_process_as_the_progress_passes_them() {
        let len = 6 * RELEASE_STEP_BYTES + 4096 * 3 + 17;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let f = file_of(&bytes);
        // SAFETY: a temporary file nobody else changes.
        let m = unsafe { MappedFile::map(&f) }.unwrap();
        let touch = |m: &MappedFile| m.iter().step_by(512).map(|&b| b as u64).sum::<u64>();
        let sum = touch(&m);
        let all = resident_pages(&m);
        assert_eq!(all, len.div_ceil(page_size()), "every page read");
        let s = Spent::prefix(&m);
        s.reached(RELEASE_STEP_BYTES as u64 - 1);
        assert_eq!(
            resident_pages(&m),
            all,
            "less than a step: nothing given back"
        );
        s.reached(3 * RELEASE_STEP_BYTES as u64 + 5);
        let left = resident_pages(&m);
        assert!(
            all - left >= 3 * RELEASE_STEP_BYTES / page_size(),
            "{all} -> {left} pages"
        );
        assert_eq!(touch(&m), sum, "the bytes read again");
        // Steps: the middle third spent at progress 10, the rest at 20, in two ranges that do
        // not follow one another (each given back as it stops).
        touch(&m);
        let third = len / 3;
        let s = Spent::steps(
            &m,
            vec![(10, third..2 * third), (20, 0..third), (20, 2 * third..len)],
        );
        s.reached(9);
        assert_eq!(resident_pages(&m), all);
        s.reached(10);
        let after_middle = resident_pages(&m);
        assert!(
            all - after_middle >= third / page_size() - 2,
            "{all} -> {after_middle}"
        );
        s.reached(u64::MAX);
        assert!(
            resident_pages(&m) <= after_middle - (third / page_size() - 2),
            "the first third"
        );
        assert_eq!(touch(&m), sum);
    }
}
