//! Compression options. Their meaning follows cuZipNN's `compress_tensor` where the names match.

use crate::blob::{MAX_BLOCK_UNITS, MAX_CHUNK_BYTES, MAX_TABLES, MIN_BLOCK_UNITS};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Options of the lossless encoder. Every engine given the same options writes the same bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressOptions {
    /// Bytes of original data per independently coded chunk: a multiple of 8, at most 16 MiB.
    /// Chunks are the unit of parallelism and of random access.
    pub chunk_bytes: usize,
    /// Units per table-selection block: a power of two in 32..=65536. Each block of each plane picks
    /// one of its plane's frequency tables, or is stored raw, or as a single repeated byte.
    pub block_units: u32,
    /// A block stays coded only if its estimated coded size is below this fraction of its raw size;
    /// otherwise it is stored raw. In (0, 1].
    pub passthrough_threshold: f64,
    /// Tensors smaller than this many bytes are stored uncompressed.
    pub min_compress_bytes: usize,
    /// Most frequency tables per byte plane (1..=64).
    pub max_tables: usize,
    /// Most blocks per plane sampled to build the tables: 1..=65536, and at most 2^30 units
    /// (`sample_blocks × block_units`).
    pub sample_blocks: usize,
    /// Which dtypes may code the byte below the exponent conditioned on the exponent (where that
    /// saves at least 1/64 of those bytes; better ratio, and decoding them costs a second rANS
    /// step). See [`Condition`].
    pub condition: Condition,
    /// Format version 2's paired exponent plane (docs/FORMAT.md, "Version 2"): the exponent bytes
    /// of bf16 tensors coded two units a symbol, halving the decoder's steps on that plane (a
    /// one-thread bf16 decode 1.1-1.2x faster, a whole small model on the GPU 1.08-1.12x, a
    /// compress as fast, blobs ~0.01-0.1 points larger: docs/BENCHMARKS.md). Both engines read
    /// and write it, the same bytes. On by default since 2026-12-06 (docs/DESIGN.md, "Version 2
    /// as the default"); `false` writes version 1 only, for readers older than 2026-12-05. Other
    /// dtypes, and tensors the encoder finds no pairs for or whose pairing would cost more than
    /// 1/32 of their exponent plane, stay version 1 either way.
    pub pair_exponents: bool,
}

/// Which float dtypes the encoder considers coding conditioned (format v1 allows it for bf16,
/// fp16, fp32, complex64 and fp64: `DType::conditioned_plane`; every decoder reads it for all of
/// them, whatever this option said when the blob was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Condition {
    /// None: every plane is coded on its own (fastest to decode; 0.1-0.3 points larger on float
    /// weights).
    Off,
    /// bf16, fp32, complex64 and fp64, whose byte below the exponent byte holds the sign and the
    /// top mantissa bits, which the exponent skews. Not fp16: its byte below the top byte is the
    /// low eight mantissa bits, which the exponent does not tell anything about. Measured
    /// 2026-12-04 (docs/DESIGN.md, "Conditioned plane"): conditioning saved 0.0007 points on
    /// all-MiniLM-L6-v2's fp16 cast and lost 0.0001 on synthetic fp16 weights, for a one-thread
    /// MiniLM fp16 compress 13-22% and decode 5-7% slower (the whole model on the H200: 12%).
    #[default]
    Auto,
    /// Every dtype the format allows, fp16 included.
    All,
}

impl Default for CompressOptions {
    fn default() -> Self {
        CompressOptions {
            // 128 KiB (cuZipNN's default too): against 256 KiB, +0.017-0.019 pp of size on
            // all-MiniLM-L6-v2, the same CPU speed, and a whole model decodes ~1.7x faster on the
            // GPU, where every chunk is one sequential chain (docs/DESIGN.md, "Chunk size").
            chunk_bytes: 128 << 10,
            block_units: 4096,
            passthrough_threshold: 0.95,
            min_compress_bytes: 1024,
            max_tables: 8,
            sample_blocks: 1024,
            condition: Condition::Auto,
            pair_exponents: true,
        }
    }
}

/// The most blocks per plane the model samples. Its histograms take 1 KiB per sampled block per
/// plane (and the table search walks them `2 × max_tables` times), so the option has a bound: 64
/// MiB of histograms per plane at most, a few seconds of search.
pub const MAX_SAMPLE_BLOCKS: usize = 1 << 16;

/// The most units per plane the model samples (`sample_blocks × block_units`): keeps the joint
/// counts of the conditioned plane (32-bit per exponent and byte) and their sums from overflowing.
pub const MAX_SAMPLED_UNITS: u64 = 1 << 30;

impl CompressOptions {
    /// Checks every field; the error names the field and the accepted range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidOption(m));
        if self.chunk_bytes == 0
            || !self.chunk_bytes.is_multiple_of(8)
            || self.chunk_bytes > MAX_CHUNK_BYTES
        {
            return bad(format!(
                "chunk_bytes = {} must be a positive multiple of 8, at most {MAX_CHUNK_BYTES}",
                self.chunk_bytes
            ));
        }
        if !self.block_units.is_power_of_two()
            || !(MIN_BLOCK_UNITS..=MAX_BLOCK_UNITS).contains(&self.block_units)
        {
            return bad(format!(
                "block_units = {} must be a power of two in 32..=65536",
                self.block_units
            ));
        }
        if !(self.passthrough_threshold > 0.0 && self.passthrough_threshold <= 1.0) {
            return bad(format!(
                "passthrough_threshold = {} must be in (0, 1]",
                self.passthrough_threshold
            ));
        }
        if self.max_tables == 0 || self.max_tables > MAX_TABLES {
            return bad(format!(
                "max_tables = {} must be in 1..={MAX_TABLES}",
                self.max_tables
            ));
        }
        let sampled_units = (self.sample_blocks as u64).saturating_mul(self.block_units.into());
        if self.sample_blocks == 0
            || self.sample_blocks > MAX_SAMPLE_BLOCKS
            || sampled_units > MAX_SAMPLED_UNITS
        {
            return bad(format!(
                "sample_blocks = {} must be in 1..={MAX_SAMPLE_BLOCKS}, and sample_blocks x \
                 block_units at most {MAX_SAMPLED_UNITS}",
                self.sample_blocks
            ));
        }
        Ok(())
    }

    /// The plane the encoder may code conditioned for a tensor of `dtype`, and the plane it is
    /// conditioned on (`DType::conditioned_plane`, where [`CompressOptions::condition`] allows
    /// it). Every engine's encoder asks this, so that they write the same bytes.
    pub fn conditioned_plane(&self, dtype: DType) -> Option<(usize, usize)> {
        match (self.condition, dtype) {
            (Condition::Off, _) | (Condition::Auto, DType::F16) => None,
            _ => dtype.conditioned_plane(),
        }
    }

    /// The threshold as an integer fraction of 65536 (what the encoder decisions use).
    pub fn threshold_q16(&self) -> u64 {
        ((self.passthrough_threshold * 65536.0).round() as u64).clamp(1, 65536)
    }
}
