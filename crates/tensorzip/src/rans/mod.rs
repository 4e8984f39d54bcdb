//! Our interleaved static-model rANS coder.
//!
//! Why our own: the format fixes the lane count, word size, state range and the order in which lanes
//! read words, so that a GPU warp (one lane per thread) and the CPU (one lane per SIMD slot) decode the
//! same stream and encode the same bytes. No published crate has that layout.
//!
//! * 32 lanes, each a 32-bit state in `[2^16, 2^32)`; 16-bit renormalisation words.
//! * Probabilities in units of `1/4096` (12 bits).
//! * Symbol `i` of a stream belongs to lane `i % 32`; steps of 32 symbols (one per lane) are decoded in
//!   order, and after each step the lanes whose state fell below `2^16` read one word each, in
//!   ascending lane order, from a single forward stream.
//! * A stream starts with the 32 final encoder states (little-endian `u32`), then the words.
//!   The encoder starts lane `l` at `2^16 + v_l`, where the `v_l` carry up to 64 bytes of the chunk
//!   (the "stash", two bytes a lane); after the last symbol every lane's state is back at its start
//!   and every word has been read. Decoders check both and read the stash from the final states.
//!
//! `docs/FORMAT.md` ("The rANS stream") is the normative description.

pub mod decode;
pub mod encode;
pub mod log2;
pub mod table;

/// Number of interleaved lanes (one GPU warp).
pub const LANES: usize = 32;
/// Precision of the probabilities, in bits.
pub const PROB_BITS: u32 = 12;
/// Sum of the frequencies of every table.
pub const PROB_SCALE: u32 = 1 << PROB_BITS;
/// Lower bound of a lane's state; also the encoder's initial state and the decoder's final one.
pub const STATE_LOWER: u32 = 1 << 16;
/// Bytes of the state header at the start of every stream.
pub const STATE_BYTES: usize = LANES * 4;
/// Most bytes a stream's initial states carry (two per lane; see [`stash_states`]).
pub const MAX_STASH: usize = 2 * LANES;

/// The encoder's initial states carrying the stash bytes `stash` (at most 64): lane `l` starts at
/// `2^16 + stash[2l] + 256 * stash[2l + 1]` (missing bytes are 0), lanes past the stash at `2^16`.
/// The decoder ends in exactly these states and reads the bytes back.
pub fn stash_states(stash: &[u8]) -> [u32; LANES] {
    debug_assert!(stash.len() <= MAX_STASH);
    std::array::from_fn(|l| {
        let lo = stash.get(2 * l).copied().unwrap_or(0) as u32;
        let hi = stash.get(2 * l + 1).copied().unwrap_or(0) as u32;
        STATE_LOWER + lo + (hi << 8)
    })
}

/// Inputs of the coder's SIMD-against-scalar tests (`encode`, `decode`).
#[cfg(test)]
pub(crate) mod test_input {
    /// A xorshift64 generator from `seed` (not 0).
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Counts for a table of 2..=256 symbols from 0 up, skewed to flat by `case % 3` (counts
    /// 1..=3, 1..=100 or 1..=100000; the first also gives frequency-1 symbols).
    pub(crate) fn table_counts(next: &mut impl FnMut() -> u64, case: usize) -> [u64; 256] {
        let width = 2 + (next() % 255) as usize;
        std::array::from_fn(|s| {
            if s < width {
                1 + next() % [3, 100, 100_000][case % 3]
            } else {
                0
            }
        })
    }

    /// Counts for a table of 2..=64 symbols from a random first symbol, as an exponent plane's:
    /// a third of them (all, every fifth case) rare (1..=3: frequency 1 or 2 once normalised),
    /// the others 1..=100000, so that rare symbols lie side by side in some tables.
    pub(crate) fn narrow_counts(next: &mut impl FnMut() -> u64, case: usize) -> [u64; 256] {
        let width = 2 + (next() % 63) as usize;
        let first = (next() % (257 - width as u64)) as usize;
        std::array::from_fn(|s| {
            if s < first || s >= first + width {
                0
            } else if case.is_multiple_of(5) || next().is_multiple_of(3) {
                1 + next() % 3
            } else {
                1 + next() % 100_000
            }
        })
    }
}
