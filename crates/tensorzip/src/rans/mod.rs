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
//!   After the last symbol every lane's state is exactly `2^16` and every word has been read; decoders
//!   check both.
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
