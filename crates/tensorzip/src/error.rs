//! Typed errors. Every failure a caller can meet — bad options, a blob that is not ours, a truncated or
//! corrupted blob, an unknown version — is one of these variants; decoding never panics.

use thiserror::Error;

/// Everything that can go wrong in the core crate.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A compression option is out of range (the message names the option and the accepted range).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The input to the encoder does not match what was declared (length vs dtype and shape, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The bytes do not start with a tensorzip magic number.
    #[error("not a tensorzip blob (bad magic number)")]
    BadMagic,
    /// The bytes do not start with the archive magic number; the text says what they look like
    /// instead, when that is recognisable (a safetensors file, a single blob), else is empty.
    #[error("not a tensorzip archive (bad magic number){0}")]
    NotAnArchive(String),
    /// A blob or archive of a format version this build does not read.
    #[error("unsupported format version {found} (this build reads versions up to {supported})")]
    UnsupportedVersion { found: u16, supported: u16 },
    /// The data ends before a field or section that the header says is there.
    #[error("truncated: {0}")]
    Truncated(String),
    /// A field holds a value the format does not allow, or the data is inconsistent with itself.
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// A checksum did not match: the data was changed after it was written.
    #[error("checksum mismatch: {0}")]
    Checksum(String),
    /// The caller's output buffer has the wrong size.
    #[error("output buffer is {got} bytes, {expected} are needed")]
    OutputSize { expected: usize, got: usize },
    /// Reading or writing a file failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// The input is not a valid safetensors file.
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    /// Another engine (the GPU's) failed for a reason of its own (driver, kernel compilation).
    #[error("engine: {0}")]
    Engine(String),
    /// A requested element range lies outside the tensor.
    #[error("element range {start}..{end} is outside a tensor of {numel} elements")]
    Range { start: u64, end: u64, numel: u64 },
    /// The allocator refused a buffer for decoded bytes. A valid blob may describe a tensor far
    /// larger than itself (a chunk of constant planes is one directory entry for up to 16 MiB of
    /// output), so decoding untrusted input into new buffers can ask for more memory than the
    /// machine has: this is that case, as an error rather than an abort. Callers who want a lower
    /// bound check [`crate::blob::peek_header`]'s `nbytes()` first, or decode with
    /// [`crate::CpuEngine::decompress_to`], whose memory is bounded whatever the size.
    #[error("cannot allocate {bytes} bytes for the decoded data")]
    OutOfMemory { bytes: u64 },
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

pub(crate) fn truncated<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Truncated(msg.into()))
}
