//! An input truncated by another process while it is read.
//!
//! The commands map their inputs. If another process truncates a mapped file (a training job
//! saving a checkpoint again in place, say), the next read of a page past its new end raises
//! `SIGBUS`, which ends the process without destructors: the partial output stayed behind as a
//! hidden `.NAME.tmp-PID-N`, and the only message was the shell's "Bus error". The handler here
//! removes the temporary output, says which inputs were being read, and exits with status 1.
//!
//! A signal handler may only call async-signal-safe functions (`unlink`, `write`, `_exit`) and
//! may not take locks or allocate, so everything it needs is prepared beforehand as C strings
//! behind atomic pointers: the temporary output's path, and the message naming the inputs mapped
//! now. Replaced strings are leaked, not freed (a handler running on another thread could still
//! be reading one); that is one short string per file a command opens.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

/// The temporary output being written (a NUL-terminated path), or null.
static TEMP: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// The message written before exiting (NUL-terminated), or null.
static MESSAGE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// The inputs mapped now (the message is rebuilt from them when they change).
static INPUTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

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
    // SAFETY: `temp` and `message` are null or leaked NUL-terminated strings, never freed;
    // unlink, strlen, write and _exit are async-signal-safe.
    unsafe {
        if !temp.is_null() {
            libc::unlink(temp);
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
