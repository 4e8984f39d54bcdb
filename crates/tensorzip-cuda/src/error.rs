//! Errors of the GPU engine.

use thiserror::Error;

/// Everything that can go wrong on the GPU side.
#[derive(Debug, Error)]
pub enum Error {
    /// No usable CUDA: the driver or NVRTC library is missing, or there is no device.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// NVRTC could not compile the kernels (the log follows).
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// A valid blob this GPU engine has no kernel for (the CPU engine decodes it).
    #[error("not supported on the GPU: {0}")]
    Unsupported(String),
    /// A kernel's output failed the host's checks (a bug of the engine, never a blob's fault).
    #[error("kernel output rejected: {0}")]
    Kernel(String),
    /// The blob or the options are invalid (as the CPU engine would say).
    #[error(transparent)]
    Format(#[from] tensorzip::Error),
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Driver(e.to_string())
    }
}

impl From<cudarc::nvrtc::result::NvrtcError> for Error {
    fn from(e: cudarc::nvrtc::result::NvrtcError) -> Self {
        Error::Compile(e.to_string())
    }
}

impl Error {
    /// The core crate's error for this one: format errors as they are, the others as
    /// [`tensorzip::Error::Engine`].
    pub fn into_core(self) -> tensorzip::Error {
        match self {
            Error::Format(e) => e,
            e => tensorzip::Error::Engine(format!("GPU: {e}")),
        }
    }
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;
