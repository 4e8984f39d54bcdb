//! Safe output files and progress bars.
//!
//! Output goes to a temporary file in the destination's directory and is renamed into place only once
//! complete and synced, so no half-written output is ever left behind. Without `--force` an existing
//! destination is never replaced (the final step is a hard link, which fails if the name exists).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tensorzip::mapped::MappedFile;

/// The temporary files (and directories: [`crate::tree::Staged`]) of the outputs being written,
/// removed by [`on_interrupt`]'s handler.
static PENDING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Runs `f` on the list of pending temporary files (a poisoned lock is taken as it is: the list
/// is only ever pushed to and filtered).
fn pending(f: impl FnOnce(&mut Vec<PathBuf>)) {
    let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g);
}

/// Runs `make`, which creates a temporary output and returns its path, and adds that path for the
/// interrupt handler to remove, both under the handler's lock: an interrupt either comes first
/// (and the process ends before anything is created) or finds the temporary registered. Created
/// and registered in two steps, a signal in between left it behind
/// (`an_interrupted_run_leaves_no_temporary_file` caught it once in five runs).
pub fn pending_create<T, E>(
    make: impl FnOnce() -> Result<(PathBuf, T), E>,
) -> Result<(PathBuf, T), E> {
    let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let (tmp, made) = make()?;
    g.push(tmp.clone());
    Ok((tmp, made))
}

/// The temporary output is gone (renamed into place or removed).
pub fn pending_remove(tmp: &Path) {
    pending(|p| p.retain(|t| t != tmp));
}

/// Runs `commit` (which moves the temporary output `tmp` into place) under the lock the interrupt
/// handler takes, and forgets `tmp` if it succeeds: an interrupt either removes the temporary
/// before the commit (which then fails, and the process is ending) or finds it gone, never
/// removing a directory's entries while it is being renamed into place.
pub fn pending_commit<T>(
    tmp: &Path,
    commit: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let out = commit()?;
    g.retain(|t| t != tmp);
    Ok(out)
}

/// Installs the handler of Ctrl-C, SIGTERM and SIGHUP (and ignores SIGXFSZ): it removes the
/// temporary files of the outputs being written (a signal ends the process without running
/// destructors, which left a hidden `.NAME.tmp-PID-N` of the partial output behind) and exits
/// with status 130. The handler runs on a thread of its own (the `ctrlc` crate), not in the
/// signal's context, so it may take the lock and touch the file system.
pub fn on_interrupt() {
    // A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, whose default action ends
    // the process at once and left the partial temporary output behind; ignored, the write fails
    // with EFBIG and the command's error path removes it.
    #[cfg(unix)]
    // SAFETY: setting a standard signal's disposition to SIG_IGN has no memory preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let _ = ctrlc::set_handler(|| {
        let mut removed = false;
        // The lock is held until the process exits: a directory output cannot be renamed into
        // place while it is being removed (`pending_commit` renames under the lock), and no new
        // temporary is registered after the list was read.
        let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        for t in p.iter() {
            if std::fs::remove_file(t).is_ok() {
                removed = true;
                continue;
            }
            // A staged directory: the main thread may still be creating entries in it (a file
            // being copied, a shard's temporary), which makes the last `rmdir` of a removal fail;
            // removed again until it is gone (the main thread's next creation then fails, as its
            // parent is gone).
            for _ in 0..100 {
                match std::fs::remove_dir_all(t) {
                    Ok(()) => {
                        removed = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        }
        p.clear();
        match removed {
            true => status!("\ntensorzip: interrupted; the partial output was removed"),
            false => status!("\ntensorzip: interrupted"),
        }
        std::process::exit(130);
    });
}

/// [`create_temp`], registered for the interrupt handler ([`pending_create`]).
pub fn create_pending<T>(
    dest: &Path,
    what: &str,
    make: impl Fn(&Path) -> std::io::Result<T>,
) -> Result<(PathBuf, T), String> {
    pending_create(|| create_temp(dest, what, make))
}

/// [`tensorzip::mapped::create_beside`] with the command's messages; `what` names the temporary
/// in errors ("file", "directory").
pub fn create_temp<T>(
    dest: &Path,
    what: &str,
    make: impl Fn(&Path) -> std::io::Result<T>,
) -> Result<(PathBuf, T), String> {
    if dest.file_name().is_none() {
        return Err(format!("{}: not a {what} name", dest.display()));
    }
    tensorzip::mapped::create_beside(dest, make).map_err(|e| {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        format!("{}: cannot create a temporary {what}: {e}", dir.display())
    })
}

/// Gives the open output `file` the owner and group of `source`, as gzip gives its outputs: a
/// file root compresses or restores (or replaces with `--force`) keeps its owner instead of
/// becoming root's. Called once the output is complete and synced, on the open file (no path is
/// followed), so its new owner never shares a file this process still writes or reads. Best
/// effort: a user who is not root cannot give a file away, so then only the group is tried
/// (allowed where the user is in it), and a refusal of both leaves the user's own. The caller
/// sets the permissions after it ([`tensorzip::mapped::plain_mode`]: never set-ID bits).
///
/// Model directories (`compress DIR -o OUT`) keep the running user's ownership: handing their
/// entries over while they are built let the new owner plant links that root's later writes
/// followed (a review's finding, 2026-12-05); doing it safely needs a last pass that does not
/// follow links, bottom-up, which is not written.
pub fn take_owner(file: &File, source: &std::fs::Metadata) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let chown = |uid: Option<u32>| std::os::unix::fs::fchown(file, uid, Some(source.gid()));
        if chown(Some(source.uid())).is_err() {
            let _ = chown(None);
        }
    }
    #[cfg(not(unix))]
    let _ = (file, source);
}

/// A temporary output file that becomes `dest` on [`SafeOutput::commit`] and vanishes otherwise.
pub struct SafeOutput {
    dest: PathBuf,
    /// The name messages give the output (`dest`'s final name when `dest` is inside a model
    /// directory being built under a temporary name).
    shown: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    force: bool,
    /// The input's metadata, whose owner and group the output takes at `commit` (not for a file
    /// inside a model directory being built: see [`take_owner`]).
    owner: Option<std::fs::Metadata>,
    /// The permissions the output takes ([`tensorzip::mapped::plain_mode`]), set again after a
    /// change of owner.
    perms: std::fs::Permissions,
}

impl SafeOutput {
    /// Creates the temporary file next to `dest`; fails if `dest` exists and `force` is false, and
    /// even with `force` if `dest` is not a regular file (the rename would replace a directory
    /// entry such as `/dev/null` itself, not write into it) or is the command's `input` (mapped as
    /// `mapped`, whose descriptor gives the permissions and owner: [`MappedFile::metadata`]).
    /// Messages name the output `shown`. With `take_owner`, the output takes the input's owner
    /// when it is committed ([`take_owner`]).
    pub fn create(
        dest: &Path,
        shown: &Path,
        force: bool,
        input: &Path,
        mapped: &MappedFile,
        take_owner: bool,
    ) -> Result<SafeOutput, String> {
        // `-o -`: not standard output, which the temporary file and its rename cannot be (the
        // archive was written to a file named `-`).
        if dest.as_os_str() == "-" {
            return Err(format!(
                "{}: writing to standard output is not supported (the output is written to a \
                 temporary file and renamed into place); name a file (./- for one called -)",
                shown.display()
            ));
        }
        // `-o newdir/`: a file cannot take that name (the rename at the end failed, after all
        // the work).
        if dest
            .as_os_str()
            .to_string_lossy()
            .ends_with(std::path::MAIN_SEPARATOR)
        {
            return Err(format!(
                "{}: names a directory (--output-dir writes into one, which must exist)",
                shown.display()
            ));
        }
        if let Ok(meta) = std::fs::metadata(dest) {
            // What --force cannot overwrite first: a hint to use it would only lead to these.
            if meta.is_dir() {
                return Err(format!(
                    "{}: is a directory (--output-dir writes into one)",
                    shown.display()
                ));
            }
            if !meta.is_file() {
                return Err(format!(
                    "{}: not a regular file; the output is written to a temporary file and \
                     renamed into place, which would replace it",
                    dest.display()
                ));
            }
            if tensorzip::mapped::same_file(dest, input) {
                return Err(format!(
                    "{}: is the input file; give another output with -o",
                    dest.display()
                ));
            }
            if !force {
                return Err(format!(
                    "{}: already exists (use --force to overwrite)",
                    shown.display()
                ));
            }
        }
        // The output takes the input's permissions, before any byte is written (a private
        // checkpoint's archive, and the file restored from it, stay private), as gzip and zstd
        // give theirs; also over a file --force replaces. On an error the temporary goes with
        // `out`. Its owner and group at `commit`, where the user may give them (`take_owner`).
        let meta = mapped
            .metadata()
            .map_err(|e| format!("{}: {e}", input.display()))?;
        let (tmp, file) = create_pending(dest, "file", |tmp| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(tmp)
        })?;
        crate::sigbus::writing(Some(&tmp));
        let mut out = SafeOutput {
            dest: dest.to_path_buf(),
            shown: shown.to_path_buf(),
            tmp,
            file: Some(file),
            force,
            owner: None,
            perms: tensorzip::mapped::plain_mode(input, &meta),
        };
        let perms = out.perms.clone();
        out.file()
            .set_permissions(perms)
            .map_err(|e| format!("{}: {e}", out.tmp.display()))?;
        out.owner = take_owner.then_some(meta);
        Ok(out)
    }

    /// The temporary file.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("file is open until commit")
    }

    /// Syncs the data and moves the file to its destination.
    pub fn commit(mut self) -> Result<(), String> {
        let file = self.file.take().expect("file is open until commit");
        // The inputs have been read: a SIGBUS now is not theirs, and the output is complete.
        crate::sigbus::writing(None);
        file.sync_all()
            .map_err(|e| format!("{}: {e}", self.shown.display()))?;
        if let Some(meta) = &self.owner {
            take_owner(&file, meta);
            file.set_permissions(self.perms.clone())
                .map_err(|e| format!("{}: {e}", self.shown.display()))?;
        }
        drop(file);
        let exists = || {
            format!(
                "{}: already exists (use --force to overwrite)",
                self.shown.display()
            )
        };
        if self.force {
            std::fs::rename(&self.tmp, &self.dest)
                .map_err(|e| format!("{}: {e}", self.shown.display()))?;
        } else {
            match std::fs::hard_link(&self.tmp, &self.dest) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&self.tmp);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(exists()),
                // File systems without hard links (FAT, exFAT, some FUSE and SMB mounts): a
                // rename that refuses to replace.
                Err(_) => {
                    crate::tree::rename_no_replace(&self.tmp, &self.dest).map_err(|e| {
                        match e.kind() {
                            std::io::ErrorKind::AlreadyExists => exists(),
                            _ => format!("{}: {e}", self.shown.display()),
                        }
                    })?
                }
            }
        }
        tensorzip::mapped::sync_parent(&self.dest);
        Ok(())
    }
}

impl Drop for SafeOutput {
    fn drop(&mut self) {
        crate::sigbus::writing(None);
        if self.file.take().is_some() || self.tmp.exists() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        pending_remove(&self.tmp);
    }
}

/// A byte-count progress bar on stderr, drawn only when stderr is a terminal.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// An input file mapped into memory; while it is, a `SIGBUS` (the file truncated by another
/// process) is reported as naming it ([`crate::sigbus`]).
pub struct Input {
    map: MappedFile,
    path: std::path::PathBuf,
    _reading: crate::sigbus::Reading,
}

impl Input {
    /// An error naming the file if it was shortened or changed since it was mapped
    /// ([`MappedFile::changed`]: a cut inside its last page raises no `SIGBUS` and reads as
    /// zeros; bytes rewritten in place read as a mix). Asked after the work and before its
    /// result is kept or reported.
    pub fn unchanged(&self) -> Result<(), String> {
        match self.map.changed() {
            false => Ok(()),
            true => Err(format!(
                "{}: the file was truncated or changed while it was read (by another process?)",
                self.path.display()
            )),
        }
    }
}

impl std::ops::Deref for Input {
    type Target = MappedFile;
    fn deref(&self) -> &MappedFile {
        &self.map
    }
}

/// Maps the input file into memory.
pub fn map_file(path: &Path) -> Result<Input, String> {
    if path.as_os_str() == "-" && !path.exists() {
        return Err(
            "-: reading standard input is not supported (inputs are mapped files); give a file"
                .to_string(),
        );
    }
    // SAFETY: the mapping is read-only; tensorzip treats its contents as untrusted bytes, and the
    // documentation warns that a file changed by another process while it is read gives wrong output
    // (caught by the checksums) — the usual caveat of memory-mapped input.
    let map = unsafe { MappedFile::open(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Input {
        map,
        path: path.to_path_buf(),
        _reading: crate::sigbus::Reading::new(path),
    })
}
