//! An input truncated by another process while it is read.
//!
//! The commands map their inputs. If another process truncates a mapped file (a training job
//! saving a checkpoint again in place, say), the next read of a page past its new end raises
//! `SIGBUS`, which ends the process without destructors: the partial output stayed behind as a
//! hidden `.NAME.tmp-PID-N`, and the only message was the shell's "Bus error". The handler here
//! removes the temporary output (and, for a directory output, the temporary directory's files and
//! sub-directories written so far), says which inputs were being read, and exits with status 1.
//!
//! A signal handler may only call async-signal-safe functions (`unlink`, `write`, `_exit`) and
//! may not take locks or allocate, so everything it needs is prepared beforehand as C strings
//! behind atomic pointers: the temporary output's path, and the message naming the inputs mapped
//! now. Replaced strings are leaked, not freed (a handler running on another thread could still
//! be reading one); that is one short string per file a command opens.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The temporary output being written (a NUL-terminated path), or null.
static TEMP: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// The message written before exiting (NUL-terminated), or null.
static MESSAGE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// The inputs mapped now (the message is rebuilt from them when they change).
static INPUTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Most entries of a temporary directory output the handler removes (a model directory of more
/// files leaves the rest behind on a `SIGBUS`; the interrupt handler and errors remove them all).
const TREE_CAP: usize = 4096;
/// The files and directories created in a temporary directory output, in creation order
/// (NUL-terminated paths; the first [`TREE_LEN`] are set). The handler removes them in reverse —
/// a directory's files before it — and the directory itself is the first entry.
static TREE: [AtomicPtr<libc::c_char>; TREE_CAP] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; TREE_CAP];
/// How many entries of [`TREE`] are set.
static TREE_LEN: AtomicUsize = AtomicUsize::new(0);

/// Installs the handler (once, at start-up).
pub fn install() {
    set_message();
    // SAFETY: `sigaction` with a zeroed struct (no flags, an empty mask) and a handler that calls
    // only async-signal-safe functions and reads atomics.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_signal: libc::c_int) {
    let temp = TEMP.load(Ordering::Acquire);
    let message = MESSAGE.load(Ordering::Acquire);
    // SAFETY: `temp`, `message` and the tree's entries are null or leaked NUL-terminated strings,
    // never freed; unlink, rmdir, strlen, write and _exit are async-signal-safe.
    unsafe {
        if !temp.is_null() {
            libc::unlink(temp);
        }
        let n = TREE_LEN.load(Ordering::Acquire).min(TREE_CAP);
        for entry in TREE[..n].iter().rev() {
            let path = entry.load(Ordering::Acquire);
            if !path.is_null() && libc::unlink(path) != 0 {
                libc::rmdir(path);
            }
        }
        if !message.is_null() {
            libc::write(2, message as *const libc::c_void, libc::strlen(message));
        }
        libc::_exit(1);
    }
}

/// A leaked NUL-terminated copy of `bytes` (never freed: see the module's note).
fn leak(mut bytes: Vec<u8>) -> *mut libc::c_char {
    bytes.retain(|&b| b != 0);
    bytes.push(0);
    Box::leak(bytes.into_boxed_slice()).as_mut_ptr() as *mut libc::c_char
}

/// Rebuilds the handler's message from the inputs mapped now.
fn set_message() {
    let inputs = INPUTS.lock().unwrap_or_else(|e| e.into_inner());
    let names: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
    let text = match names.len() {
        0 => "\ntensorzip: error: bus error (SIGBUS)\n".to_string(),
        _ => format!(
            "\ntensorzip: error: {}: the file was truncated while it was read (changed by \
             another process?); the partial output was removed\n",
            names.join(", ")
        ),
    };
    MESSAGE.store(leak(text.into_bytes()), Ordering::Release);
}

/// An input mapped for the life of this guard: the handler's message names it.
pub struct Reading(PathBuf);

impl Reading {
    pub fn new(path: &Path) -> Reading {
        INPUTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
        set_message();
        Reading(path.to_path_buf())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        {
            let mut inputs = INPUTS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = inputs.iter().position(|p| p == &self.0) {
                inputs.remove(k);
            }
        }
        set_message();
    }
}

/// The temporary output the handler removes (`None`: none now).
pub fn writing(temp: Option<&Path>) {
    use std::os::unix::ffi::OsStrExt;
    let ptr = match temp {
        None => std::ptr::null_mut(),
        Some(p) => leak(p.as_os_str().as_bytes().to_vec()),
    };
    TEMP.store(ptr, Ordering::Release);
}

/// Records `path` (a file or directory just created in a temporary directory output; the first
/// call names the directory itself) for the handler to remove.
pub fn created(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let n = TREE_LEN.load(Ordering::Acquire);
    if n < TREE_CAP {
        TREE[n].store(
            leak(path.as_os_str().as_bytes().to_vec()),
            Ordering::Release,
        );
        TREE_LEN.store(n + 1, Ordering::Release);
    }
}

/// Forgets the temporary directory output's entries (it was renamed into place, or removed).
pub fn tree_done() {
    TREE_LEN.store(0, Ordering::Release);
}
