//! Model directories: a directory given to a command stands for the files under it.
//!
//! A model as users keep it is a directory (a Hugging Face snapshot: the shards, their index, the
//! config, the tokenizer; a diffusers pipeline: one such folder per component). The commands take
//! one in two ways:
//!
//! * **Expanded** (no `-o`): the directory stands for the files under it that the command works on
//!   — `.safetensors` for `compress`, `.tz` for `decompress`, `verify` and `info` — each done as
//!   if it had been named on the command line (its output next to it, or in `--output-dir`).
//! * **Mirrored** (`compress DIR -o OUT`, `decompress DIR -o OUT`): OUT becomes a copy of the
//!   whole directory with those files compressed (restored) and every other file copied as it is,
//!   so that a compressed model directory travels complete and `decompress` gives back the
//!   original directory. OUT is built as a hidden temporary directory next to it and renamed
//!   into place only once every file is done; on any failure, interrupt or truncated input
//!   nothing is left (on a truncated input, whose `SIGBUS` handler removes only what it was told
//!   of, a tree of more than 4096 entries leaves the rest of its hidden temporary behind). OUT
//!   must not exist: a directory output is never replaced, not even with `--force` (replacing
//!   would mean deleting a tree the user named). Empty directories are not copied. A directory
//!   to compress that already holds `.tz` archives is refused: they would be copied, and the
//!   mirror's `decompress` would then restore them too. `verify DIR --against ORIG` checks such
//!   a mirror file by file against the original directory.
//!
//! Walking a directory: entries in name order, depth first; names that begin with `.` are
//! skipped (`.git`, `.cache`, `.gitattributes`; named as skipped by the commands that copy or
//! compare a whole directory, but for our own temporaries and `.tensorzip-copies.json`); symbolic
//! links to files are followed (a Hugging Face cache snapshot is links into `blobs/`), links to
//! directories are not (they may form loops) and are reported as skipped, as are broken links and
//! special files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::commands::{archive_name, restored_name, Totals, EXT};

/// Deepest nesting walked (a guard against pathological trees; models use two or three levels).
const MAX_DEPTH: usize = 64;

/// The regular files under a directory, by their paths relative to it, and what was skipped.
pub struct Walk {
    pub files: Vec<PathBuf>,
    pub skipped: Vec<String>,
    /// Entries skipped for their names beginning with `.` (but our temporaries): said by the
    /// commands that copy or compare a whole directory, where a missing `.gitattributes` would
    /// otherwise go unnoticed (`verify --against` saying OK), not by those that only take its
    /// .safetensors files.
    pub hidden: Vec<String>,
}

/// Walks `root` (see the module's note for what is taken and skipped).
pub fn walk(root: &Path) -> Result<Walk, String> {
    let mut w = Walk {
        files: Vec::new(),
        skipped: Vec::new(),
        hidden: Vec::new(),
    };
    walk_into(root, Path::new(""), 0, &mut w)?;
    Ok(w)
}

fn walk_into(root: &Path, rel: &Path, depth: usize, w: &mut Walk) -> Result<(), String> {
    let dir = root.join(rel);
    if depth > MAX_DEPTH {
        return Err(format!(
            "{}: directories nested more than {MAX_DEPTH} deep",
            dir.display()
        ));
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        names.push(
            entry
                .map_err(|e| format!("{}: {e}", dir.display()))?
                .file_name(),
        );
    }
    names.sort();
    for name in names {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        if name.as_encoded_bytes().starts_with(b".") {
            // Said, so that `verify --against` saying OK is not taken for "everything is
            // there" (`.gitattributes` of a Hugging Face repository); a temporary of ours is
            // not worth a line.
            let ours = name == crate::copies::NAME
                || tensorzip::mapped::is_temporary(name.as_encoded_bytes());
            if !ours {
                w.hidden.push(format!(
                    "{}: hidden (names beginning with \".\" are not taken)",
                    path.display()
                ));
            }
            continue;
        }
        let own =
            std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let link = own.file_type().is_symlink();
        let meta = match link {
            false => own,
            true => match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    w.skipped
                        .push(format!("{}: a broken link ({e})", path.display()));
                    continue;
                }
            },
        };
        if meta.is_dir() && link {
            w.skipped.push(format!(
                "{}: a link to a directory (not followed)",
                path.display()
            ));
        } else if meta.is_dir() {
            walk_into(root, &rel, depth + 1, w)?;
        } else if meta.is_file() {
            w.files.push(rel);
        } else {
            w.skipped
                .push(format!("{}: not a regular file", path.display()));
        }
    }
    Ok(())
}

/// Whether `path` names a directory (following links).
pub fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

/// What a command works on in a directory: `.safetensors` files for `compress`, archives for
/// the others.
#[derive(Clone, Copy)]
pub enum Wanted {
    Models,
    Archives,
}

impl Wanted {
    /// Whether a file of this name is one the command works on.
    fn takes(self, file: &Path) -> bool {
        let ext = match self {
            Wanted::Models => "safetensors",
            Wanted::Archives => EXT,
        };
        // `extension` is `None` for a name that is only the suffix (".tz").
        file.extension().is_some_and(|e| e == ext)
    }

    fn what(self) -> &'static str {
        match self {
            Wanted::Models => ".safetensors",
            Wanted::Archives => ".tz",
        }
    }
}

/// Prints what a walk skipped, one note a line.
fn report(skipped: &[String]) {
    for s in skipped {
        status!("tensorzip: skipped {s}");
    }
}

/// The inputs with each directory replaced by the files under it that the command works on
/// (files named directly are kept as they are). A directory with none is an error: nothing is
/// done then.
pub fn expand(inputs: &[PathBuf], wanted: Wanted) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for input in inputs {
        if !is_dir(input) {
            out.push(input.clone());
            continue;
        }
        let w = walk(input)?;
        report(&w.skipped);
        let before = out.len();
        out.extend(
            w.files
                .iter()
                .filter(|f| wanted.takes(f))
                .map(|f| input.join(f)),
        );
        if out.len() == before {
            return Err(format!(
                "{}: no {} file in this directory",
                input.display(),
                wanted.what()
            ));
        }
    }
    Ok(out)
}

/// A directory output being built under a hidden temporary name next to its destination; it
/// becomes the destination on [`Staged::commit`] and is removed otherwise (on drop, by the
/// interrupt handler, and by the `SIGBUS` handler, which learns each entry as it is created).
pub struct Staged {
    dest: PathBuf,
    tmp: PathBuf,
    /// The directory it mirrors (whose directories' permissions its own take).
    src: PathBuf,
    done: bool,
}

impl Staged {
    /// Starts the copy of `src` that becomes `dest`.
    pub fn create(dest: &Path, src: &Path) -> Result<Staged, String> {
        exists_refused(dest)?;
        let dest = &parent_not_shared(dest)?;
        let (tmp, ()) =
            crate::output::create_pending(dest, "directory", |tmp| std::fs::create_dir(tmp))?;
        crate::sigbus::created(&tmp);
        let staged = Staged {
            dest: dest.to_path_buf(),
            tmp,
            src: src.to_path_buf(),
            done: false,
        };
        like_source(&staged.tmp, src)?;
        Ok(staged)
    }

    /// Where `rel` is written, its parent directories created (and recorded) first, each with the
    /// permissions of its namesake in the source.
    pub fn place(&self, rel: &Path) -> Result<PathBuf, String> {
        let mut dir = self.tmp.clone();
        let mut from = self.src.clone();
        if let Some(parent) = rel.parent() {
            for part in parent.components() {
                dir.push(part);
                from.push(part);
                match std::fs::create_dir(&dir) {
                    Ok(()) => {
                        crate::sigbus::created(&dir);
                        like_source(&dir, &from)?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("{}: {e}", dir.display())),
                }
            }
        }
        Ok(self.tmp.join(rel))
    }

    /// Records a file written at `path` (from [`Staged::place`]).
    pub fn written(&self, path: &Path) {
        crate::sigbus::created(path);
    }

    /// Renames the finished directory into place (never over anything created at its name
    /// meanwhile; under the interrupt handler's lock, so that an interrupt cannot be removing
    /// its entries as it takes its name).
    pub fn commit(mut self) -> Result<(), String> {
        let (tmp, dest) = (&self.tmp, &self.dest);
        crate::output::pending_commit(tmp, || {
            exists_refused(dest)?;
            rename_no_replace(tmp, dest).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    exists_refused(dest).err().unwrap_or_else(|| e.to_string())
                }
                _ => format!("{}: {e}", dest.display()),
            })
        })?;
        self.done = true;
        tensorzip::mapped::sync_parent(&self.dest);
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        crate::sigbus::tree_done();
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
        crate::output::pending_remove(&self.tmp);
    }
}

/// Renames `from` to `to` unless `to` exists (an empty directory made at `to` after the check
/// would otherwise be replaced by `rename`): `renameat2(RENAME_NOREPLACE)` where the C library
/// has it, else (another system, or a file system that refuses the flag) a plain rename after a
/// check that `to` does not exist.
pub(crate) fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        };
        let (a, b) = (c(from)?, c(to)?);
        // SAFETY: two NUL-terminated paths that outlive the call; no memory is written.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    // No atomic way: refuse an existing `to`, then rename (a name created in between is
    // replaced; nothing closes that window where the system has no RENAME_NOREPLACE).
    if std::fs::symlink_metadata(to).is_ok() {
        return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
    }
    std::fs::rename(from, to)
}

/// A directory output's destination must not exist.
fn exists_refused(dest: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dest) {
        Ok(_) => Err(format!(
            "{}: already exists (a directory output is never replaced, not even with --force; \
             remove it or choose another -o)",
            dest.display()
        )),
        Err(_) => Ok(()),
    }
}

/// What a mirrored command does with each file of the input directory.
enum Step {
    /// Compress or restore it (the command's own files).
    Convert,
    /// Copy it as it is.
    Copy,
}

/// The plan of a mirror: each input file (relative), its output's relative name, and the step.
/// Refused if two inputs would be written as one output (`a.safetensors.tz` beside an
/// `a.safetensors` already there, when restoring), if a directory to compress holds an archive
/// already, or if the directory holds none of the command's files.
fn plan(src: &Path, w: &Walk, wanted: Wanted) -> Result<Vec<(PathBuf, PathBuf, Step)>, String> {
    let mut plan = Vec::new();
    let mut outputs: BTreeMap<PathBuf, &Path> = BTreeMap::new();
    for rel in &w.files {
        // An archive among the files to compress would be copied as it is, and `decompress` of
        // the result would then restore it too: the directory would not come back as it was.
        if matches!(wanted, Wanted::Models) && Wanted::Archives.takes(rel) {
            return Err(format!(
                "{}: a tensorzip archive in the directory to compress (the mirror's decompress \
                 would restore it, so the directory would not come back as it is); move it out, \
                 or name the .safetensors files to compress",
                src.join(rel).display()
            ));
        }
        let (out, step) = match (wanted.takes(rel), wanted) {
            (true, Wanted::Models) => (archive_name(rel), Step::Convert),
            (true, Wanted::Archives) => match restored_name(rel) {
                Some(r) => (r, Step::Convert),
                None => (rel.clone(), Step::Copy),
            },
            (false, _) => (rel.clone(), Step::Copy),
        };
        if let Some(other) = outputs.insert(out.clone(), rel) {
            return Err(format!(
                "{} and {} would both be written as {}",
                src.join(other).display(),
                src.join(rel).display(),
                out.display()
            ));
        }
        plan.push((rel.clone(), out, step));
    }
    if !plan.iter().any(|(_, _, s)| matches!(s, Step::Convert)) {
        return Err(format!(
            "{}: no {} file in this directory",
            src.display(),
            wanted.what()
        ));
    }
    Ok(plan)
}

/// Where a model directory is built for `dest`. Run as root: `dest`'s parent resolved (links
/// followed once, here), every directory from it up to `/` root's and not writable by group or
/// others (a sticky one, as `/tmp`, allowed: `tensorzip::mapped::only_ours_above`), and the
/// resolved path returned, which the build uses from then on. Otherwise another user could swap
/// the hidden staging directory, or a directory or link above it, while root writes there —
/// files of the model's names and contents written as root wherever they point (reviews'
/// findings, 2026-12-05; a link checked and then followed again was the second). Any other user
/// writes with its own rights only: `dest` as it is.
fn parent_not_shared(dest: &Path) -> Result<PathBuf, String> {
    #[cfg(unix)]
    {
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(dest.to_path_buf());
        }
        let (parent, name) = match (dest.parent(), dest.file_name()) {
            (Some(p), Some(n)) if !p.as_os_str().is_empty() => (p, n),
            (_, Some(n)) => (Path::new("."), n),
            _ => return Err(format!("{}: not a directory name", dest.display())),
        };
        use tensorzip::mapped::NotOurs;
        let real = tensorzip::mapped::only_ours_above(parent, true).map_err(|e| match e {
            NotOurs::Io(m) => m,
            NotOurs::Shared(why) => format!(
                "{}: {why}: another user can write there, above where root would build {}, and \
                 could redirect root's writes; build it under directories of root's only, or run \
                 the command as that user",
                dest.display(),
                dest.display()
            ),
        })?;
        Ok(real.join(name))
    }
    #[cfg(not(unix))]
    {
        Ok(dest.to_path_buf())
    }
}

/// Gives the directory `dir` (just made, still empty) the permissions of `src`, but always
/// writable and searchable by its owner, who fills it next, and never writable by group or others
/// nor set-ID (the staging tree is the running user's alone while it is built; a source made 0777
/// by its owner let that user plant links in root's staging tree — a review's finding): a private
/// model (0700) is mirrored private, not with the process's default mode (0755). Not its owner
/// (`output::take_owner`).
fn like_source(dir: &Path, src: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(src)
            .map_err(|e| format!("{}: {e}", src.display()))?
            .permissions()
            .mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode((mode & 0o755) | 0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    #[cfg(not(unix))]
    let _ = (dir, src);
    Ok(())
}

/// Copies `from` to `to` (a new file, named `shown` in messages) and syncs it; returns the
/// length and CRC-32 of the bytes copied.
/// A file whose size changed while it was copied (another process writing it) is an error, as a
/// mapped input truncated under a command is.
fn copy_file(from: &Path, to: &Path, shown: &Path) -> Result<crate::copies::Record, String> {
    // Opened here so that an error says which side failed (`fs::copy` reports either as one); its
    // size and permissions from the descriptor, not a second lookup of the path.
    let mut r = std::fs::File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let before = r
        .metadata()
        .map_err(|e| format!("{}: {e}", from.display()))?;
    // The source's permissions, as `fs::copy` gives them (a script in a model directory stays
    // executable), but not its set-ID bits: the copy is the running user's, and a user's setuid
    // file copied by root became a setuid-root one (a review's finding, 2026-12-05); run as root,
    // at most 0600 for a source named through a link.
    let perms = tensorzip::mapped::plain_mode(from, &before);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    // Made with them (less the umask) before a byte is in it — the 0600 cap too, so that the
    // copy is never more open while it is written than once it is done; set exactly below.
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        o.mode(perms.mode());
    }
    let mut w = o
        .open(to)
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    let rec = copy_reporting(&mut r, &mut w, from, shown)?;
    let n = rec.bytes;
    drop(w);
    if let Err(e) = std::fs::set_permissions(to, perms) {
        return Err(format!("{}: {e}", shown.display()));
    }
    let after = std::fs::metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if n != before.len() || n != after.len() {
        return Err(format!(
            "{}: changed while it was copied ({} bytes before, {n} copied, {} after)",
            from.display(),
            before.len(),
            after.len()
        ));
    }
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    Ok(rec)
}

/// `io::copy` with a read error named by `from` and a write error by `shown`; the length and
/// CRC-32 of what it copied (to `io::sink()`, those of a file: [`crate::copies::record_of`]).
pub(crate) fn copy_reporting(
    r: &mut std::fs::File,
    w: &mut impl std::io::Write,
    from: &Path,
    shown: &Path,
) -> Result<crate::copies::Record, String> {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    let mut crc = crc32fast::Hasher::new();
    loop {
        let k = match r.read(&mut buf) {
            Ok(0) => {
                return Ok(crate::copies::Record {
                    bytes: n,
                    crc32: crc.finalize(),
                })
            }
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("{}: {e}", from.display())),
        };
        w.write_all(&buf[..k])
            .map_err(|e| format!("{}: {e}", shown.display()))?;
        crc.update(&buf[..k]);
        n += k as u64;
    }
}

/// `compress DIR -o OUT` / `decompress DIR -o OUT`: OUT built as a copy of `src` whose
/// `wanted` files go through `convert(input, output)` (which returns the sizes the totals
/// count: original, then compressed) and whose other files are copied. Stops at the first
/// failure, leaving nothing. `compress` records its copies in OUT's manifest
/// ([`crate::copies`]); `decompress` checks its copies against `src`'s manifest where there is
/// one.
pub fn mirror(
    src: &Path,
    dest: &Path,
    wanted: Wanted,
    mut convert: impl FnMut(&Path, crate::commands::Output<'_>) -> Result<(u64, u64), String>,
) -> Result<(), String> {
    let w = walk(src)?;
    let plan = plan(src, &w, wanted)?;
    let manifest = match wanted {
        Wanted::Models => None,
        Wanted::Archives => crate::copies::Copies::read(src)?,
    };
    let staged = Staged::create(dest, src)?;
    // Said once the copy is under way (not before a refusal, which is then the only line).
    report(&w.skipped);
    report(&w.hidden);
    let mut totals = Totals::default();
    let (mut copied, mut copied_bytes) = (0usize, 0u64);
    let mut records = crate::copies::Copies::default();
    let mut unlisted = Vec::new();
    let unwritten = |msg: String| format!("{msg} ({} was not written)", dest.display());
    for (rel, out, step) in &plan {
        let input = src.join(rel);
        let write = staged.place(out).map_err(unwritten)?;
        match step {
            Step::Convert => {
                let shown = dest.join(out);
                let (original, compressed) = convert(
                    &input,
                    crate::commands::Output::Staged {
                        write: &write,
                        shown: &shown,
                    },
                )
                .map_err(unwritten)?;
                totals.add(original, compressed);
            }
            Step::Copy => {
                let rec = copy_file(&input, &write, &dest.join(out)).map_err(unwritten)?;
                match &manifest {
                    Some(m) => match m.get(rel) {
                        Some(want) => crate::copies::check(&input, want, rec).map_err(unwritten)?,
                        None => unlisted.push(input.display().to_string()),
                    },
                    None => {
                        if !records.add(rel, rec) {
                            unlisted.push(input.display().to_string());
                        }
                    }
                }
                copied_bytes += rec.bytes;
                copied += 1;
            }
        }
        staged.written(&write);
    }
    let checked = close_manifest(
        src,
        dest,
        &plan,
        wanted,
        manifest.as_ref(),
        &records,
        &staged,
    )
    .map_err(unwritten)?;
    for u in &unlisted {
        status!(
            "tensorzip: {u}: copied without a checksum (not listed in {})",
            crate::copies::NAME
        );
    }
    staged.commit()?;
    let line = match wanted {
        Wanted::Models => totals.line("files compressed", totals.files()),
        Wanted::Archives => totals.restored_line(totals.files()),
    };
    status!(
        "{} -> {}: {line}; {copied} other files copied ({copied_bytes} bytes{checked})",
        src.display(),
        dest.display(),
    );
    Ok(())
}

/// The end of [`mirror`]'s manifest work: with `src`'s manifest (`decompress`), every file it
/// lists must have been in the plan; for `compress` (`wanted` models), OUT's manifest of
/// `records` is written into `staged`. Returns what the final line says of the copies'
/// checksums; an error is one the caller reports as leaving nothing written.
fn close_manifest(
    src: &Path,
    dest: &Path,
    plan: &[(PathBuf, PathBuf, Step)],
    wanted: Wanted,
    manifest: Option<&crate::copies::Copies>,
    records: &crate::copies::Copies,
    staged: &Staged,
) -> Result<String, String> {
    if let Some(m) = manifest {
        let present: BTreeSet<String> = plan
            .iter()
            .filter_map(|(rel, _, _)| crate::copies::key(rel))
            .collect();
        if let Some(n) = m.iter().map(|(n, _)| n).find(|n| !present.contains(*n)) {
            return Err(format!(
                "{}: listed in {} but missing",
                src.join(n).display(),
                src.join(crate::copies::NAME).display()
            ));
        }
        return Ok(format!(
            ", each matching its checksum in {}",
            crate::copies::NAME
        ));
    }
    if matches!(wanted, Wanted::Archives) {
        // Restored from a mirror without a manifest (an older one): nothing to write or say.
        return Ok(String::new());
    }
    let write = staged.place(Path::new(crate::copies::NAME))?;
    // A new file (never through a link that might be there), synced through its own handle.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&write)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, &records.to_json())?;
            f.sync_all()
        })
        .map_err(|e| format!("{}: {e}", write.display()))?;
    staged.written(&write);
    Ok(format!(
        ", their checksums in {}",
        dest.join(crate::copies::NAME).display()
    ))
}

/// `verify DIR` of a compressed model directory: its copied files against its manifest
/// ([`crate::copies`]), where it has one — each listed file read and compared, each other file
/// not an archive named as unchecked. Nothing to do (and nothing said) without a manifest.
pub fn verify_copies(dir: &Path) -> Result<(), String> {
    let Some(m) = crate::copies::Copies::read(dir)? else {
        return Ok(());
    };
    let mut failed = 0usize;
    for (n, want) in m.iter() {
        let path = dir.join(n);
        if let Err(msg) =
            crate::copies::record_of(&path).and_then(|got| crate::copies::check(&path, want, got))
        {
            status!("tensorzip: {msg}");
            failed += 1;
        }
    }
    let w = walk(dir)?;
    for rel in &w.files {
        if !Wanted::Archives.takes(rel) && m.get(rel).is_none() {
            status!(
                "tensorzip: {}: not listed in {} (unchecked)",
                dir.join(rel).display(),
                crate::copies::NAME
            );
        }
    }
    match failed {
        0 => {
            status!(
                "{}: OK ({} copied files match their checksums in {})",
                dir.display(),
                m.len(),
                crate::copies::NAME
            );
            Ok(())
        }
        n => Err(format!(
            "{n} of {} copied files of {} do not match {}",
            m.len(),
            dir.display(),
            crate::copies::NAME
        )),
    }
}

/// `verify DIR --against ORIG`: every archive under `dir` is verified against the file of its
/// restored name under `orig`, every other file compared with its namesake byte for byte, and
/// every file of either side without a counterpart reported. Each problem is reported on its own
/// line and the others are still checked; the result counts them.
pub fn verify_mirror(
    dir: &Path,
    orig: &Path,
    mut verify: impl FnMut(&Path, &Path) -> Result<(), String>,
) -> Result<(), String> {
    if !is_dir(orig) {
        return Err(format!(
            "--against {}: not a directory, but {} is one",
            orig.display(),
            dir.display()
        ));
    }
    let a = walk(dir)?;
    let b = walk(orig)?;
    for list in [&a.skipped, &a.hidden, &b.skipped, &b.hidden] {
        report(list);
    }
    let mut unmatched: BTreeSet<&PathBuf> = b.files.iter().collect();
    let (mut failed, mut checked) = (0usize, 0usize);
    let mut fail = |msg: String| {
        status!("tensorzip: error: {msg}");
        failed += 1;
    };
    for rel in &a.files {
        checked += 1;
        let archive = Wanted::Archives.takes(rel);
        let counterpart = match archive {
            true => restored_name(rel).unwrap_or_else(|| rel.clone()),
            false => rel.clone(),
        };
        if !unmatched.remove(&counterpart) {
            fail(format!(
                "{}: {} does not exist",
                dir.join(rel).display(),
                orig.join(&counterpart).display()
            ));
            continue;
        }
        let result = match archive {
            true => verify(&dir.join(rel), &orig.join(&counterpart)),
            false => same_bytes(&dir.join(rel), &orig.join(&counterpart)),
        };
        if let Err(msg) = result {
            fail(msg);
        }
    }
    for rel in &unmatched {
        checked += 1;
        fail(format!(
            "{}: has no counterpart in {}",
            orig.join(rel).display(),
            dir.display()
        ));
    }
    match failed {
        0 => {
            // What was not compared is said in the same line: OK must not read as "the whole
            // directory is there" when hidden entries of the original were left out.
            let hidden = match b.hidden.len() {
                0 => String::new(),
                n => format!("; {n} hidden entries of {} not compared", orig.display()),
            };
            status!(
                "{}: OK ({checked} files, each archive identical to its original and every other \
                 file to its namesake in {}{hidden})",
                dir.display(),
                orig.display()
            );
            Ok(())
        }
        n => Err(format!(
            "{n} of {checked} files of {} and {} failed",
            dir.display(),
            orig.display()
        )),
    }
}

/// Whether two files hold the same bytes (an error naming the first difference otherwise).
fn same_bytes(a: &Path, b: &Path) -> Result<(), String> {
    let x = crate::output::map_file(a)?;
    let y = crate::output::map_file(b)?;
    if x.len() != y.len() {
        return Err(format!(
            "{}: {} bytes but {} has {}",
            a.display(),
            x.len(),
            b.display(),
            y.len()
        ));
    }
    // Compared in 8 MiB windows, each given back once compared (the files may be large).
    const STEP: usize = 8 << 20;
    for start in (0..x.len()).step_by(STEP) {
        let end = (start + STEP).min(x.len());
        if x[start..end] != y[start..end] {
            let at = start
                + x[start..end]
                    .iter()
                    .zip(&y[start..end])
                    .position(|(p, q)| p != q)
                    .unwrap_or(0);
            return Err(format!(
                "{}: differs from {} at byte {at}",
                a.display(),
                b.display()
            ));
        }
        x.release(start..end);
        y.release(start..end);
    }
    Ok(())
}
