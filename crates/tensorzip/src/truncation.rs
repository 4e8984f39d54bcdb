//! Mapped files truncated by another process while they are read: an error instead of a crash.
//!
//! A read of a page of a file mapping past the file's end raises `SIGBUS`, whose default action
//! ends the process — a training job whose loader maps a checkpoint that the trainer is saving
//! again in place dies with "Bus error". With [`guard`] installed, a `SIGBUS` whose address lies in
//! a live [`crate::mapped::MappedFile`] is handled instead: the handler maps zeros over the
//! faulting page and the rest of the mapping (so the read that faulted, retried on return, reads
//! zeros), and marks the mapping; the caller asks [`crate::mapped::MappedFile::changed`] after its
//! work and reports the file as changed under it. (A file cut inside its last page raises no
//! signal at all: the page's tail reads as zeros. `changed` also compares the file's size and
//! modification time with those it had when mapped, which catches that.) The decoders are safe
//! on any bytes (zeros included), and a wrong result is never returned: the flag is checked
//! before any result is.
//!
//! A `SIGBUS` anywhere else (another library's mapping, a signal sent by `kill`) goes to the
//! handler that was installed before, or takes the default action as it would have. The handler
//! calls only `mmap` and uses atomics; it allocates nothing and takes no lock.
//!
//! Linux only (the address of the fault, `MAP_FIXED` over part of a mapping); elsewhere [`guard`]
//! does nothing and no mapping is ever marked. The command line has its own handler (it removes
//! its temporary output and exits: `tensorzip-cli/src/sigbus.rs`); the Python package installs
//! this one, since a handler that ends the process is what it must avoid.

/// Installs the process-wide `SIGBUS` handler (once; later calls do nothing). Returns whether
/// the guard is active (false where the system has none).
pub fn guard() -> bool {
    imp::guard()
}

/// A mapping's range registered with the handler while it lives.
pub(crate) struct Slot(#[cfg_attr(not(target_os = "linux"), allow(dead_code))] usize);

impl Slot {
    /// Registers `len` bytes at `start` (`None` when every slot is taken, or there is no guard
    /// on this system: the mapping then has no protection, as before).
    pub(crate) fn register(start: usize, len: usize) -> Option<Slot> {
        imp::register(start, len).map(Slot)
    }

    /// Whether a read of the range faulted (the file was shorter than its mapping).
    pub(crate) fn hit(&self) -> bool {
        imp::hit(self.0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        imp::unregister(self.0);
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Mappings registered at once (a reader holds one or two; more go unprotected). 4096: a
    /// Python program may keep a `safe_open` reader per shard of many models open (256 before
    /// 2026-12-05; 18 bytes of statics a slot, and the handler's scan only runs on a fault).
    const SLOTS: usize = 4096;
    static START: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    /// Zero: the slot is free.
    static LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static HIT: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
    /// Slot taken (set before `START`/`LEN` are written, cleared after `LEN` is zeroed).
    static TAKEN: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
    /// A sequence count per slot, odd while `START`/`LEN` are being written: the handler reads
    /// the pair between two equal even counts, so that a slot unregistered and registered again
    /// by another thread meanwhile never shows one mapping's start with another's length.
    static SEQ: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    /// The handler installed before ours, set once before ours is installed.
    static PREVIOUS: OnceLock<Previous> = OnceLock::new();
    /// The page size, read before the handler is installed (`sysconf` is not async-signal-safe).
    static PAGE: AtomicUsize = AtomicUsize::new(4096);

    struct Previous(libc::sigaction);
    // SAFETY: a plain C struct of a function pointer, flags and a signal mask, never mutated.
    unsafe impl Sync for Previous {}
    // SAFETY: as above.
    unsafe impl Send for Previous {}

    pub fn guard() -> bool {
        PREVIOUS.get_or_init(|| {
            // SAFETY: sysconf has no memory preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if let Ok(p) = usize::try_from(page) {
                if p > 0 {
                    PAGE.store(p, Ordering::Release);
                }
            }
            // SAFETY: sigaction with a zeroed struct filled with our SA_SIGINFO handler; the
            // previous action is written into `old` before ours takes effect.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, &mut old);
                Previous(old)
            }
        });
        true
    }

    pub fn register(start: usize, len: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        for k in 0..SLOTS {
            if TAKEN[k]
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                write(k, || {
                    HIT[k].store(false, Ordering::Relaxed);
                    START[k].store(start, Ordering::Relaxed);
                    LEN[k].store(len, Ordering::Relaxed);
                });
                return Some(k);
            }
        }
        None
    }

    pub fn hit(k: usize) -> bool {
        HIT[k].load(Ordering::Acquire)
    }

    pub fn unregister(k: usize) {
        write(k, || {
            LEN[k].store(0, Ordering::Relaxed);
            START[k].store(0, Ordering::Relaxed);
        });
        TAKEN[k].store(false, Ordering::Release);
    }

    /// Slot `k`'s fields written by `f` between an odd and an even sequence count (only the
    /// slot's owner writes them: `TAKEN`).
    fn write(k: usize, f: impl FnOnce()) {
        let s = SEQ[k].load(Ordering::Relaxed);
        SEQ[k].store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f();
        SEQ[k].store(s.wrapping_add(2), Ordering::Release);
    }

    /// Slot `k`'s range as one registration wrote it, or `None` while it is being written or
    /// changed under the read (async-signal-safe: loads and fences only).
    fn read(k: usize) -> Option<(usize, usize)> {
        let s0 = SEQ[k].load(Ordering::Acquire);
        if s0 % 2 == 1 {
            return None;
        }
        let (start, len) = (
            START[k].load(Ordering::Relaxed),
            LEN[k].load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        (SEQ[k].load(Ordering::Relaxed) == s0).then_some((start, len))
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; si_code > 0 means
        // a fault raised by the kernel (not `kill`), whose si_addr is the faulting address.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        if code > 0 {
            for k in 0..SLOTS {
                let Some((start, len)) = read(k) else {
                    continue;
                };
                if len == 0 || addr < start || addr - start >= len {
                    continue;
                }
                // Marked before the zeros are mapped: another thread that reads the zeros
                // without faulting cannot finish and ask `truncated` before the mark.
                HIT[k].store(true, Ordering::Release);
                let page = PAGE.load(Ordering::Acquire);
                // From the faulting page to the mapping's end: every page after one past the
                // file's end is past it too, so one signal and one new mapping serve the rest
                // of the read (a page at a time, a reader of a large truncated tail took a
                // signal per page and split the mapping into as many pieces).
                let (first, end) = (addr / page * page, (start + len).next_multiple_of(page));
                // SAFETY: mmap is an async-signal-safe system call with no memory
                // preconditions; the pages lie inside a live mapping of ours (registered until
                // its MappedFile is dropped, and being read now), which MAP_FIXED replaces by
                // private pages of zeros: the retried read reads zeros, and munmap of the
                // mapping removes them too.
                let mapped = unsafe {
                    libc::mmap(
                        first as *mut libc::c_void,
                        end - first,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if mapped != libc::MAP_FAILED {
                    return;
                }
            }
        }
        // Not ours: what would have happened without us.
        // SAFETY: the previous action as the kernel gave it back; a handler is called as it was
        // registered (with siginfo if SA_SIGINFO), and the default action is restored for the
        // retried fault (or the signal raised again, for a signal that was sent).
        unsafe {
            match PREVIOUS.get() {
                // A signal sent (not a fault) to a process that ignored SIGBUS: still ignored.
                Some(Previous(old)) if old.sa_sigaction == libc::SIG_IGN && code <= 0 => {}
                Some(Previous(old))
                    if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN =>
                {
                    if old.sa_flags & libc::SA_SIGINFO != 0 {
                        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                            std::mem::transmute(old.sa_sigaction);
                        f(sig, info, ctx);
                    } else {
                        let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
                        f(sig);
                    }
                }
                _ => {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigemptyset(&mut dfl.sa_mask);
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                    if code <= 0 {
                        libc::raise(sig);
                    }
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub fn guard() -> bool {
        false
    }
    pub fn register(_start: usize, _len: usize) -> Option<usize> {
        None
    }
    pub fn hit(_k: usize) -> bool {
        false
    }
    pub fn unregister(_k: usize) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use crate::mapped::MappedFile;

    /// A mapped file truncated under its reader: with the guard, reading past the new end gives
    /// zeros and marks the mapping, and the process goes on (without it, this test dies).
    #[test]
    fn a_truncated_mapping_is_marked_not_fatal() {
        assert!(super::guard());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..64 * 4096).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: the test truncates the file on purpose: that is what the guard is for.
        let map = unsafe { MappedFile::map(&f) }.unwrap();
        assert_eq!(map[100], bytes[100]);
        assert!(!map.truncated());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192)
            .unwrap();
        let tail: u64 = map[8192..].iter().map(|&b| b as u64).sum();
        assert_eq!(tail, 0, "pages past the new end read as zeros");
        assert_eq!(map[100], bytes[100], "pages before it are the file's");
        assert!(map.truncated());
        // Another mapping of the file, made now, is not marked.
        let again = unsafe { MappedFile::map(&f) }.unwrap();
        assert_eq!(again.len(), 8192);
        assert!(!again.truncated());
        assert!(!again.changed());
        assert!(map.changed());
    }

    /// A blob decoded from a mapping that another thread truncates meanwhile (the case the guard
    /// exists for: a checkpoint saved again in place while a reader decodes it) ends in a result
    /// or an error, never a panic: the pages past the cut read as zeros from then on, so the
    /// decoder must not read a byte twice and trust the second read for what it checked in the
    /// first. (Selectors were read again after their check: 189 panics in 200 such decodes of a
    /// 16 MiB blob, "index out of bounds", when a selector checked against the plane's tables
    /// read 0 from the zero pages of a plane with none.) Half the blocks constant, half random:
    /// a plane of mode `Blocks` without tables, selectors 254 / 255 only.
    #[test]
    fn a_blob_truncated_while_it_is_decoded_gives_an_error_or_bytes() {
        use crate::{CompressOptions, CpuEngine, DType};
        assert!(super::guard());
        let n = 4usize << 20;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut data = vec![7u8; n];
        for blk in data.chunks_mut(32).skip(1).step_by(2) {
            for v in blk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
        }
        let opts = CompressOptions {
            chunk_bytes: n,
            block_units: 32,
            ..CompressOptions::default()
        };
        let blob = crate::compress(&data, DType::U8, &[n as u64], &opts).unwrap();
        let engine = CpuEngine::new(1).unwrap();
        let t = std::time::Instant::now();
        assert_eq!(engine.decompress(&blob).unwrap().data, data);
        let once = t.elapsed();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        for i in 0..24u32 {
            std::fs::write(&path, &blob).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: the test truncates the file on purpose: that is what the guard is for.
            let map = unsafe { MappedFile::map(&f) }.unwrap();
            let cut = path.clone();
            let delay = once * (i % 12) / 12;
            let cutter = std::thread::spawn(move || {
                std::thread::sleep(delay);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(cut)
                    .unwrap()
                    .set_len(0)
                    .unwrap();
            });
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.decompress(&map)));
            cutter.join().unwrap();
            let r = r.unwrap_or_else(|_| panic!("decode {i} (cut after {delay:?}) panicked"));
            // Bytes only where the cut came after the decoder's last read or the zeros it read
            // happened to decode; the mapping says it was cut either way.
            if let Ok(out) = r {
                assert!(out.data == data || map.truncated());
            }
            assert!(map.changed());
        }
    }

    /// A file cut inside its last page raises no signal (the page's tail reads as zeros), and
    /// bytes rewritten in place raise none either: `changed` reports both from the file's size
    /// and modification time; a file replaced by a rename is not the mapped one.
    #[test]
    fn changes_without_a_signal_are_reported() {
        assert!(super::guard());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..3 * 4096 + 1000).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: the test changes the file on purpose.
        let map = unsafe { MappedFile::map(&f) }.unwrap();
        assert!(!map.changed());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3 * 4096 + 500)
            .unwrap();
        assert_eq!(map[3 * 4096 + 700], 0, "the cut tail reads as zeros");
        assert!(!map.truncated(), "no signal for a cut inside the last page");
        assert!(map.changed());
        drop(map);

        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: as above.
        let map = unsafe { MappedFile::map(&f) }.unwrap();
        // Past the file system's timestamp granularity (the kernel's coarse clock, a few ms).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::io::Write::write_all(&mut w, &[0xEE; 16]).unwrap();
        drop(w);
        assert_eq!(map[0], 0xEE, "a shared mapping shows the rewrite");
        assert!(map.changed());
        drop(map);

        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: as above.
        let map = unsafe { MappedFile::map(&f) }.unwrap();
        let other = dir.path().join("g");
        std::fs::write(&other, b"another file").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!map.changed(), "the mapping keeps the file it mapped");
        assert_eq!((map[1], map[20]), (0xEE, bytes[20]));
    }
}
