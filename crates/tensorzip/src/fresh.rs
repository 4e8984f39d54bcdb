//! New output buffers that fill fast.
//!
//! Decoding into memory the process has never touched costs a page fault per 4 KiB page; on the VMs
//! we measure on that caps filling a fresh buffer at ~1-1.5 GB/s, below the decoder's speed. With
//! transparent huge pages in `madvise` mode (the common default) a region advised `MADV_HUGEPAGE`
//! faults 2 MiB at a time: 4-6 GB/s measured on the same machine (docs/BENCHMARKS.md). Large
//! buffers from the allocator are fresh `mmap`s, so advising their 2 MiB-aligned interior before the
//! first write is enough; the advice changes no contents and is a no-op where THP is off.
//! `TENSORZIP_NO_HUGEPAGES=1` (any value but `0`) turns the advice off (for comparisons, or where
//! compaction stalls).
//!
//! It can also lose: on a VM with free page reporting (the 2-core Intel VM's kernel logs "Free page
//! reporting enabled"), free 2 MiB blocks are handed back to the host, and a huge page taken from
//! one is backed again fault by fault in the host while the kernel zeroes it (`clear_page_erms`
//! under `do_huge_pmd_anonymous_page`, 53% of the samples). One thread decoding MiniLM fp32 into
//! fresh buffers, each run's freed before the next (2026-12-03, after another process had used
//! and freed a few GB): 0.52-0.58 GB/s advised against 1.65-1.87 not, until the freed blocks were
//! in use again (2.0-2.3 advised); two threads 4.18 advised against 3.37 not. The advice stays on
//! by default (a win on the machines without reporting, and on this one most of the time).

use crate::error::{Error, Result};

/// Buffers below this size are left alone (the allocator's heap, already touched, serves them).
#[cfg(target_os = "linux")]
const MIN_ADVISE: usize = 4 << 20;
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// Advises a buffer the caller owns and has not written yet (e.g. a new tensor from another
/// allocator) for huge pages, so that filling it faults 2 MiB at a time. Harmless on any buffer.
pub fn advise_huge(buf: &mut [u8]) {
    advise(buf.as_mut_ptr(), buf.len());
}

/// A zeroed buffer of `n` bytes, advised for huge pages when large.
pub fn zeroed(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    advise(v.as_mut_ptr(), n);
    v
}

/// An empty buffer with room for `n` bytes, advised for huge pages when large.
pub fn with_capacity(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    advise(v.as_mut_ptr(), n);
    v
}

/// The size `n` (a claim read from input bytes) as a `usize`, or [`Error::OutOfMemory`].
fn claimed(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::OutOfMemory { bytes: n })
}

/// [`zeroed`] for a size that input bytes chose (a decoded tensor's): an allocation the allocator
/// refuses is [`Error::OutOfMemory`] instead of an abort. Zeroed by the allocator (`calloc`: fresh
/// pages from the kernel are not written twice), as `vec![0; n]` is.
pub fn try_zeroed(n: u64) -> Result<Vec<u8>> {
    let refused = || Error::OutOfMemory { bytes: n };
    let n = claimed(n)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).map_err(|_| refused())?;
    // SAFETY: the layout's size is n > 0, as `alloc_zeroed` requires.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[u8; n]` (alignment 1,
    // size n = capacity), and its n bytes are initialised (zeroed); the Vec takes ownership.
    let mut v = unsafe { Vec::from_raw_parts(ptr, n, n) };
    advise(v.as_mut_ptr(), n);
    Ok(v)
}

/// [`with_capacity`] for a size that input bytes chose: a refused allocation is
/// [`Error::OutOfMemory`] instead of an abort.
pub fn try_with_capacity(n: u64) -> Result<Vec<u8>> {
    let refused = Error::OutOfMemory { bytes: n };
    let n = claimed(n)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| refused)?;
    advise(v.as_mut_ptr(), n);
    Ok(v)
}

#[cfg(target_os = "linux")]
fn advise(ptr: *mut u8, len: usize) {
    // Read as the other switches (before 2026-12-04 any value, "0" included, turned it off).
    if len < MIN_ADVISE || crate::cpu::switch_on("TENSORZIP_NO_HUGEPAGES") {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: [start, end) lies inside the allocation of `len` bytes at `ptr`, which we own;
        // MADV_HUGEPAGE only changes how its pages are backed, never their contents. A failure
        // (THP unsupported) leaves the buffer as it was, so the result is ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_ptr: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_have_the_asked_size_and_contents() {
        for n in [0, 1, 4 << 20, (8 << 20) + 3] {
            let v = super::zeroed(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&b| b == 0));
            let w = super::with_capacity(n);
            assert!(w.is_empty() && w.capacity() >= n);
            let v = super::try_zeroed(n as u64).unwrap();
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&b| b == 0));
            let w = super::try_with_capacity(n as u64).unwrap();
            assert!(w.is_empty() && w.capacity() >= n);
        }
    }

    #[test]
    fn sizes_no_allocator_gives_are_errors() {
        // Past isize::MAX no layout exists; just under it no allocator has the memory.
        for n in [u64::MAX, isize::MAX as u64, 1 << 62] {
            let want = super::Error::OutOfMemory { bytes: n };
            assert_eq!(super::try_zeroed(n).unwrap_err(), want);
            assert_eq!(super::try_with_capacity(n).unwrap_err(), want);
        }
    }
}
