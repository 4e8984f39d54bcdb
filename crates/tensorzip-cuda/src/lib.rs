//! # tensorzip-cuda
//!
//! The GPU engine of tensorzip: it reads (and writes) exactly the format of the core crate
//! (`docs/FORMAT.md`), with CUDA kernels that are `.cu` sources compiled at run time by NVRTC for the
//! device's architecture — each unit size's kernels when first needed — and cached on disk. CUDA is loaded dynamically, so this crate builds, and its
//! tests skip with a visible reason, on machines without CUDA.

pub mod archive;
pub mod checksum;
mod compile;
pub mod encode;
pub mod engine;
pub mod error;
mod pair_model;
pub mod plan;
mod search;
mod side_streams;
pub mod transfer;

use std::sync::OnceLock;

pub use encode::DeviceBlob;
pub use engine::{DecodeLayout, GpuEngine, HostBatch};
pub use error::{Error, Result};

/// Whether CUDA can be used here: the driver and NVRTC libraries load and a device exists. Checked
/// once per process (cudarc panics when a library is missing, so this must run first).
pub fn available() -> std::result::Result<(), String> {
    static CHECK: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            // SAFETY: these only try to open the shared libraries.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda) was not found".into());
            }
            // SAFETY: as above.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err("the NVRTC library (libnvrtc) was not found".into());
            }
            match cudarc::driver::CudaContext::device_count() {
                Ok(n) if n > 0 => Ok(()),
                Ok(_) => Err("no CUDA device".into()),
                Err(e) => Err(format!("CUDA driver: {e}")),
            }
        })
        .clone()
}
