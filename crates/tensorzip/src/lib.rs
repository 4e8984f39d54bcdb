//! # tensorzip
//!
//! Lossless compression of neural-network tensors. Each tensor becomes a self-describing *blob*:
//! ZipNN's exponent bit reordering, byte planes, and an interleaved 32-lane rANS coder whose
//! frequency tables adapt block by block. The CPU engine here and the CUDA engine
//! (`tensorzip-cuda`) read and write the same bytes; `docs/FORMAT.md` is the specification.
//!
//! ```
//! use tensorzip::{compress, decompress, CompressOptions, DType};
//!
//! let values: Vec<u8> = (0..4096u32).flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes()).collect();
//! let blob = compress(&values, DType::F32, &[64, 64], &CompressOptions::default())?;
//! let back = decompress(&blob)?;
//! assert_eq!(back.data, values);
//! assert_eq!(back.shape, vec![64, 64]);
//! # Ok::<(), tensorzip::Error>(())
//! ```
//!
//! Decoding never panics on any input: truncated, corrupted or hostile bytes give an [`Error`].
//! A valid blob can describe far more bytes than it holds (a chunk of constant planes is a
//! 10-byte directory entry for up to 16 MiB), so the functions that allocate the decoded tensor
//! ([`decompress`], [`CpuEngine::decompress`], `Archive::decode_segment`) allocate what the blob
//! claims, and a claim the allocator refuses is [`Error::OutOfMemory`]. For untrusted input, check
//! [`blob::peek_header`]'s `nbytes()` against a limit of your own first, decode into a buffer you
//! own ([`CpuEngine::decompress_into`]) or stream ([`CpuEngine::decompress_to`]).

// Loops over planes and lanes index several parallel arrays at once (modes, selectors, states, SIMD
// registers); an explicit index reads better there than zipped iterators.
#![allow(clippy::needless_range_loop)]

// First: its macros serve the modules below.
#[macro_use]
mod cpu;
pub mod archive;
pub mod blob;
pub mod checksum;
pub mod cluster;
pub mod compare;
pub mod decoder;
pub mod dtype;
pub mod encoder;
pub mod engine;
pub mod error;
pub mod fresh;
pub mod histogram;
pub mod joint;
pub mod mapped;
pub mod model;
pub mod options;
pub mod pairs;
mod pieces;
pub mod rans;
mod raw_bound;
pub mod sample;
pub mod select;
pub mod stats;
mod streaming;

pub mod transform;
pub mod truncation;

pub use blob::{BlobHeader, Scheme};
pub use checksum::{crc32, crc32_pieces, DEFAULT_CHECKSUM_CHUNK_BYTES};
pub use dtype::DType;
pub use engine::{CpuEngine, Tensor};
pub use error::{Error, Result};
pub use options::{CompressOptions, Condition, MAX_SAMPLED_UNITS, MAX_SAMPLE_BLOCKS};

/// Compresses a tensor's bytes on all cores (see [`CpuEngine::compress`]).
pub fn compress(
    data: &[u8],
    dtype: DType,
    shape: &[u64],
    opts: &CompressOptions,
) -> Result<Vec<u8>> {
    CpuEngine::default().compress(data, dtype, shape, opts)
}

/// Decompresses a blob on all cores (see [`CpuEngine::decompress`]).
pub fn decompress(blob: &[u8]) -> Result<Tensor> {
    CpuEngine::default().decompress(blob)
}

/// Decompresses a blob into a caller-owned buffer on all cores (see [`CpuEngine::decompress_into`]).
pub fn decompress_into(blob: &[u8], out: &mut [u8]) -> Result<BlobHeader> {
    CpuEngine::default().decompress_into(blob, out)
}
