//! A blob's chunks coded by several threads at once and placed in the blob in order.
//!
//! A chunk's place in the blob is known only once every chunk before it is coded. The threads
//! therefore take *pieces* (runs of chunks of about [`PIECE_BYTES`] of input) in order, code each
//! into a buffer of their own, and put it in place as soon as the pieces before it are placed:
//! usually straight after coding it, while its bytes are still in the thread's cache, so that the
//! copy costs an L2 read and the write into the blob that coding in place would have made anyway.
//! (The version before coded the blob's second half on another thread into a buffer that had long
//! left the caches when it was copied in: the copy was ~8% of a two-thread compress of 64 MiB
//! fp32, and half the payload crossed memory three times.) A piece that is done before the one
//! before it waits; whoever places that one places it too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Codes chunks `from..to` of a blob, appending their payloads to a buffer and their directory
/// entries to another.
pub(crate) type CodeRun<'a> = dyn Fn(usize, usize, &mut Vec<u8>, &mut Vec<u8>) + Sync + 'a;

/// Input bytes per piece: its payload stays in a core's L2 until it is placed, and a tensor of
/// 64 MiB has 64 of them, so that the threads end within a piece of each other.
pub(crate) const PIECE_BYTES: usize = 1 << 20;

/// What the placing threads share.
struct Placed {
    /// The next piece to place.
    next: usize,
    /// The blob's length once the placed pieces are in.
    end: usize,
    /// Pieces coded before the one before them was placed: payload and directory entries.
    waiting: BTreeMap<usize, (Vec<u8>, Vec<u8>)>,
    /// Directory entries of the placed pieces, in order.
    dir: Vec<u8>,
}

/// The blob's spare capacity, written by several threads at ranges [`Placed`] hands out.
struct Spare(*mut u8);

// SAFETY: `Spare` is only a base address; every write through it goes to a range of the blob's
// spare capacity that one thread was given under the `Placed` lock, and the ranges do not overlap.
unsafe impl Send for Spare {}
// SAFETY: as for `Send`.
unsafe impl Sync for Spare {}

impl Spare {
    /// The address `at` bytes past the base (a method, so that closures capture the whole `Spare`).
    fn at(&self, at: usize) -> *mut u8 {
        self.0.wrapping_add(at)
    }
}

/// Codes chunks `0..n_chunks` with `code`, pieces of `piece_chunks` chunks on the pool's threads,
/// appending their payloads to `out` and their directory entries to `dir` in chunk order. Stops
/// placing once the blob would reach `limit` bytes (it will then be stored: `dir` lacks entries).
/// `max_payload` bounds the payload of all the chunks (their input size: a chunk's payload never
/// exceeds it); `streaming` writes the blob past the caches ([`crate::streaming`]). `pool` lends
/// the piece buffers. The bytes equal those of `code(0, n_chunks, out, dir)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn code_pieces(
    out: &mut Vec<u8>,
    dir: &mut Vec<u8>,
    (n_chunks, piece_chunks): (usize, usize),
    limit: usize,
    max_payload: usize,
    streaming: bool,
    pool: &Mutex<Vec<Vec<u8>>>,
    code: &CodeRun<'_>,
) {
    let piece_chunks = piece_chunks.max(1);
    let n_pieces = n_chunks.div_ceil(piece_chunks);
    out.reserve(max_payload);
    let cap_end = out.len() + max_payload;
    let spare = Spare(out.as_mut_ptr());
    let placed = Mutex::new(Placed {
        next: 0,
        end: out.len(),
        waiting: BTreeMap::new(),
        dir: std::mem::take(dir),
    });
    let claim = AtomicUsize::new(0);
    let full = AtomicBool::new(false);
    let work = || loop {
        let i = claim.fetch_add(1, Ordering::Relaxed);
        if i >= n_pieces || full.load(Ordering::Relaxed) {
            return;
        }
        let mut buf = pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        buf.clear();
        let mut d = Vec::new();
        code(
            i * piece_chunks,
            ((i + 1) * piece_chunks).min(n_chunks),
            &mut buf,
            &mut d,
        );
        // Take this piece's place and those of the waiting pieces after it, if it is next.
        let mut places: Vec<(usize, Vec<u8>)> = Vec::new();
        {
            let mut st = placed.lock().unwrap_or_else(|e| e.into_inner());
            st.waiting.insert(i, (buf, d));
            loop {
                let next = st.next;
                let Some((b, d)) = st.waiting.remove(&next) else {
                    break;
                };
                if st.end + b.len() >= limit || st.end + b.len() > cap_end {
                    full.store(true, Ordering::Relaxed);
                    places.push((usize::MAX, b));
                    break;
                }
                st.dir.extend_from_slice(&d);
                let at = st.end;
                st.end += b.len();
                st.next += 1;
                places.push((at, b));
            }
        }
        for (at, b) in places {
            if at != usize::MAX {
                // SAFETY: `[at, at + b.len())` was handed to this thread alone under the lock,
                // inside the capacity `reserve` made (`<= cap_end`); `b` is our own buffer.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        spare.at(at).cast::<std::mem::MaybeUninit<u8>>(),
                        b.len(),
                    )
                };
                match streaming {
                    true => crate::streaming::copy(dst, &b),
                    false => {
                        // SAFETY: as above; the lengths are equal and the buffers distinct.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                b.as_ptr(),
                                dst.as_mut_ptr().cast(),
                                b.len(),
                            )
                        }
                    }
                }
            }
            pool.lock().unwrap_or_else(|e| e.into_inner()).push(b);
        }
        if streaming {
            crate::streaming::fence();
        }
    };
    let workers = rayon::current_num_threads().min(n_pieces);
    rayon::scope(|s| {
        for _ in 1..workers {
            s.spawn(|_| work());
        }
        work();
    });
    let st = placed.into_inner().unwrap_or_else(|e| e.into_inner());
    // SAFETY: every byte below `st.end` was written: the prefix before the call, and each placed
    // piece's range by the thread that placed it, inside the scope that has ended.
    unsafe { out.set_len(st.end) };
    *dir = st.dir;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in coder: chunk `c`'s payload is `c % 7` bytes of value `c`, its entry one byte.
    fn fake(from: usize, to: usize, buf: &mut Vec<u8>, dir: &mut Vec<u8>) {
        for c in from..to {
            buf.extend(std::iter::repeat_n(c as u8, c % 7));
            dir.push(c as u8);
        }
    }

    #[test]
    fn pieces_land_in_chunk_order_on_any_number_of_threads() {
        for threads in [1, 2, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (n, per) in [(0, 4), (1, 1), (5, 1), (37, 4), (200, 3), (64, 64)] {
                let (mut want, mut want_dir) = (vec![9u8; 5], Vec::new());
                fake(0, n, &mut want, &mut want_dir);
                for streaming in [false, true] {
                    let (mut out, mut dir) = (vec![9u8; 5], Vec::new());
                    let bufs = Mutex::new(Vec::new());
                    pool.install(|| {
                        code_pieces(
                            &mut out,
                            &mut dir,
                            (n, per),
                            usize::MAX,
                            6 * n,
                            streaming,
                            &bufs,
                            &fake,
                        )
                    });
                    assert_eq!(out, want, "{threads} threads, {n} chunks by {per}");
                    assert_eq!(dir, want_dir, "{threads} threads, {n} chunks by {per}");
                }
            }
        }
    }

    #[test]
    fn placing_stops_before_the_limit() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let (mut out, mut dir) = (Vec::new(), Vec::new());
        let bufs = Mutex::new(Vec::new());
        pool.install(|| code_pieces(&mut out, &mut dir, (100, 2), 50, 600, false, &bufs, &fake));
        let (mut want, mut want_dir) = (Vec::new(), Vec::new());
        fake(0, 100, &mut want, &mut want_dir);
        assert!(out.len() < 50, "{} bytes placed", out.len());
        assert!(dir.len() < 100);
        // What was placed is a prefix of the whole, in order.
        assert_eq!(out[..], want[..out.len()]);
        assert_eq!(dir[..], want_dir[..dir.len()]);
    }
}
