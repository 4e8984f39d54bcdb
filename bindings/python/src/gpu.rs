//! The GPU engine on torch's tensors and stream.
//!
//! One engine per device, kept for the life of the process: it holds the device's primary context
//! (the one torch uses) and the loaded kernels. Each call wraps the caller's stream handle (torch's
//! current stream; 0 is the legacy default stream) without owning it, so the work is ordered with
//! the caller's own work on that stream. Device addresses are plain integers from torch tensors that
//! the Python layer keeps alive; they are never wrapped in cudarc buffers (whose drop would free
//! them). The thread's current CUDA context is restored after each call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, DevicePtr};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tensorzip::blob::BlobLayout;
use tensorzip_cuda::{DeviceBlob, GpuEngine};

use crate::{dtype, to_py, OptionArgs};

/// A GPU engine error as a Python exception: problems with the data as `ValueError`, the rest
/// (driver, compilation) as `RuntimeError`.
pub(crate) fn gpu_err(e: tensorzip_cuda::Error) -> PyErr {
    match e {
        tensorzip_cuda::Error::Format(e) => to_py(e),
        e => PyRuntimeError::new_err(format!("tensorzip GPU engine: {e}")),
    }
}

/// Runs `f`, then makes the thread's previous CUDA context current again (cudarc binds its own).
pub(crate) fn restoring<R>(f: impl FnOnce() -> R) -> R {
    let mut prev: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: plain driver calls on a local out-parameter; the library was checked present first
    // (callers reach here only after `engine` succeeded).
    unsafe {
        let _ = sys::cuCtxGetCurrent(&mut prev);
    }
    let r = f();
    // SAFETY: as above; `prev` is the context that was current (or null).
    unsafe {
        let _ = sys::cuCtxSetCurrent(prev);
    }
    r
}

/// The engines made so far, by device ordinal.
fn engines() -> PyResult<std::sync::MutexGuard<'static, HashMap<usize, Arc<GpuEngine>>>> {
    static ENGINES: OnceLock<Mutex<HashMap<usize, Arc<GpuEngine>>>> = OnceLock::new();
    ENGINES
        .get_or_init(Default::default)
        .lock()
        // Engines are inserted whole: a panic elsewhere while the map was locked left it usable.
        .or_else(|poisoned| Ok(poisoned.into_inner()))
}

/// The engine of device `ordinal` (created on first use, never dropped).
pub(crate) fn engine(ordinal: usize) -> PyResult<Arc<GpuEngine>> {
    tensorzip_cuda::available().map_err(|e| PyRuntimeError::new_err(format!("CUDA: {e}")))?;
    let mut m = engines()?;
    if let Some(e) = m.get(&ordinal) {
        return Ok(e.clone());
    }
    let e = restoring(|| GpuEngine::new(ordinal)).map_err(gpu_err)?;
    // SAFETY: every buffer of this engine is used on one stream per call, and the call waits for
    // that stream before returning a result that depends on it; torch's memory is never wrapped.
    unsafe { e.context().disable_event_tracking() };
    let e = Arc::new(e);
    m.insert(ordinal, e.clone());
    Ok(e)
}

/// The engine of `device` working on the caller's stream `stream` (a `CUstream` handle).
fn on(device: usize, stream: usize) -> PyResult<GpuEngine> {
    let e = engine(device)?;
    // SAFETY: the handle is torch's current stream of that device (or 0, the legacy default
    // stream), alive for the call; the wrapper does not destroy it.
    let s = unsafe {
        e.context()
            .wrap_borrowed_stream(stream as *mut std::ffi::c_void as sys::CUstream)
    };
    Ok(e.on_stream(s))
}

/// `None` when the GPU engine can run here, else why not.
#[pyfunction]
fn gpu_unavailable_reason() -> Option<String> {
    tensorzip_cuda::available().err()
}

/// The piece size of a CRC-32 list asked from Python: positive, as the CPU's `crc32_pieces` wants
/// (the GPU engine's piece 0 means one CRC of everything, the archive's semantics, not cuZipNN's).
fn positive_piece(piece: u64) -> PyResult<()> {
    match piece {
        0 => Err(PyValueError::new_err(
            "checksum_chunk_bytes must be positive",
        )),
        _ => Ok(()),
    }
}

/// A blob the GPU encoder produced, still in device memory: its length, then its download.
#[pyclass(module = "tensorzip._tensorzip")]
pub struct GpuBlob {
    blob: Option<DeviceBlob>,
    engine: GpuEngine,
}

impl Drop for GpuBlob {
    /// A blob never downloaded (an exception between the encode and the download) is freed with
    /// the engine's context current: cudarc frees on the blob's stream without making its context
    /// current, and on torch's legacy default stream (handle 0) a thread with no current context
    /// would fail the free (leaking the memory, and leaving an error that cudarc reports at the
    /// next unrelated call).
    fn drop(&mut self) {
        if let Some(b) = self.blob.take() {
            restoring(|| {
                let ctx = self.engine.context();
                // An error an earlier free recorded would make `bind_to_thread` return it before
                // binding (cudarc checks first): cleared here, it cannot keep this free unbound.
                let _ = ctx.check_err();
                let _ = ctx.bind_to_thread();
                drop(b);
            });
        }
    }
}

#[pymethods]
impl GpuBlob {
    fn __len__(&self) -> usize {
        self.blob.as_ref().map_or(0, |b| b.len)
    }

    /// Copies the blob to the host address `ptr` (room for `len(self)` bytes: a CPU tensor;
    /// `pinned` if it is page-locked, which is copied to directly, else through the engine's
    /// staging buffers), waits for the copy, and frees the device copy.
    fn download(&mut self, py: Python<'_>, ptr: usize, pinned: bool) -> PyResult<()> {
        let taken = || PyValueError::new_err("blob already downloaded");
        let len = self.blob.as_ref().ok_or_else(taken)?.len;
        // SAFETY: the torch layer passes a CPU uint8 tensor of exactly `len` bytes.
        let dst = unsafe { crate::host_mut(ptr, len) }?;
        let b = self.blob.take().ok_or_else(taken)?;
        let eng = &self.engine;
        restoring(|| {
            py.detach(|| -> tensorzip_cuda::Result<()> {
                let s = eng.stream();
                if !dst.is_empty() {
                    if pinned {
                        s.memcpy_dtoh(&b.buf.slice(0..b.len), dst)?;
                    } else {
                        let (p, _g) = b.buf.device_ptr(s);
                        // SAFETY: the blob's buffer holds at least `len` bytes.
                        unsafe { eng.download_from(p, dst)? };
                    }
                }
                s.synchronize()?;
                drop(b);
                Ok(())
            })
        })
        .map_err(gpu_err)
    }

    /// CRC-32 (zlib) of each `piece` bytes of the blob, computed on the GPU, into the `n_out`
    /// u32s at host address `out` (`crate::put_u32s`).
    fn crc32(&self, py: Python<'_>, piece: u64, out: usize, n_out: usize) -> PyResult<()> {
        positive_piece(piece)?;
        let Some(b) = self.blob.as_ref() else {
            return Err(PyValueError::new_err("blob already downloaded"));
        };
        // SAFETY: the torch layer passes a new uint32 CPU tensor of `n_out` elements.
        let out = unsafe { crate::host_mut(out, n_out.saturating_mul(4)) }?;
        let eng = &self.engine;
        let crcs = restoring(|| {
            py.detach(|| {
                let (p, _g) = b.buf.device_ptr(eng.stream());
                // SAFETY: the blob's buffer holds at least `len` bytes and lives during the call.
                unsafe { eng.crc32_pieces_device(p, b.len as u64, piece) }
            })
        })
        .map_err(gpu_err)?;
        crate::put_u32s(out, &crcs).map_err(to_py)
    }
}

/// Compresses the tensor at device address `ptr` (`nbytes` bytes of `dtype_name` and `shape`, on
/// device `device`) on the stream `stream`; the blob stays on the device until downloaded.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_compress(
    py: Python<'_>,
    device: usize,
    stream: usize,
    ptr: u64,
    nbytes: usize,
    dtype_name: &str,
    shape: Vec<u64>,
    opts: OptionArgs,
) -> PyResult<GpuBlob> {
    let dt = dtype(dtype_name)?;
    let opts = opts.options()?;
    let eng = on(device, stream)?;
    let blob = restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes a live contiguous CUDA tensor of `nbytes` bytes on
            // `device`, kept alive and unmodified during the call.
            unsafe { eng.compress_device(ptr, nbytes, dt, &shape, &opts) }
        })
    })
    .map_err(gpu_err)?;
    Ok(GpuBlob {
        blob: Some(blob),
        engine: eng,
    })
}

/// Decodes the blob at device address `blob_ptr` (`blob_len` bytes; a host copy of at least its
/// prefix — header, tables, directory — is at host address `prefix_ptr`, `prefix_len` bytes) into
/// the `out_len` bytes at device address `out_ptr`, on `stream`; waits for the stream to report a
/// corrupted blob as `ValueError`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_decompress(
    py: Python<'_>,
    device: usize,
    stream: usize,
    blob_ptr: u64,
    blob_len: usize,
    prefix_ptr: usize,
    prefix_len: usize,
    out_ptr: u64,
    out_len: usize,
) -> PyResult<()> {
    // SAFETY: the torch layer passes a live contiguous CPU uint8 tensor of `prefix_len` bytes.
    let prefix = unsafe { crate::host(prefix_ptr, prefix_len) }?;
    let layout = layout_for(prefix, blob_len, out_len)?;
    let eng = on(device, stream)?;
    restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes the blob (a live CUDA uint8 tensor of `blob_len`
            // bytes whose first bytes are the prefix) and a fresh output tensor of `out_len` bytes
            // on the same device, both kept alive during the call.
            unsafe { eng.decode_device(&[(&layout, blob_ptr, out_ptr)]) }
        })
    })
    .map_err(gpu_err)
}

/// The validated layout of a blob of `blob_len` bytes from its first bytes `prefix`, checked to
/// decode to exactly `out_len` bytes (`ValueError` otherwise).
fn layout_for(prefix: &[u8], blob_len: usize, out_len: usize) -> PyResult<BlobLayout> {
    let layout = BlobLayout::parse(prefix, blob_len).map_err(to_py)?;
    check_out_len(&layout, out_len)?;
    Ok(layout)
}

/// `ValueError` unless the blob of `layout` decodes to exactly `out_len` bytes.
fn check_out_len(layout: &BlobLayout, out_len: usize) -> PyResult<()> {
    match layout.header.nbytes() == out_len as u64 {
        true => Ok(()),
        false => Err(PyValueError::new_err(format!(
            "output holds {out_len} bytes, the blob decodes to {}",
            layout.header.nbytes()
        ))),
    }
}

/// One blob of [`gpu_decompress_batch`], as [`gpu_decompress`] takes it: (blob_ptr, blob_len,
/// prefix_ptr, prefix_len, out_ptr, out_len).
type BatchJob = (u64, usize, usize, usize, u64, usize);

/// Decodes every blob of `jobs` (each as [`gpu_decompress`] takes one: a device blob, a host copy
/// of at least its prefix, a device output of its decoded size) in one launch on `stream`, and
/// waits. Every prefix is parsed and every output size checked before anything is launched; the
/// first blob (in order) that fails raises `ValueError` naming its index.
#[pyfunction]
fn gpu_decompress_batch(
    py: Python<'_>,
    device: usize,
    stream: usize,
    jobs: Vec<BatchJob>,
) -> PyResult<()> {
    let mut prefixes = Vec::with_capacity(jobs.len());
    for &(_, _, prefix_ptr, prefix_len, _, _) in &jobs {
        // SAFETY: the torch layer passes, for each job, a live contiguous CPU uint8 tensor of
        // `prefix_len` bytes, kept alive during the call.
        prefixes.push(unsafe { crate::host(prefix_ptr, prefix_len) }?);
    }
    let parsed: Vec<PyResult<BlobLayout>> = py.detach(|| {
        use rayon::prelude::*;
        prefixes
            .par_iter()
            .zip(&jobs)
            .map(|(prefix, &(_, blob_len, .., out_len))| layout_for(prefix, blob_len, out_len))
            .collect()
    });
    let mut layouts = Vec::with_capacity(jobs.len());
    for (k, layout) in parsed.into_iter().enumerate() {
        layouts.push(layout.map_err(|e| crate::indexed(py, k, e))?);
    }
    if jobs.is_empty() {
        return Ok(());
    }
    let eng = on(device, stream)?;
    let batch: Vec<(&BlobLayout, u64, u64)> = layouts
        .iter()
        .zip(&jobs)
        .map(|(l, &(blob_ptr, _, _, _, out_ptr, _))| (l, blob_ptr, out_ptr))
        .collect();
    restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes, for each job, the blob (a live CUDA uint8 tensor of
            // `blob_len` bytes whose first bytes are the prefix) and a fresh output tensor of
            // `out_len` bytes, all on this device, distinct, and kept alive during the call.
            unsafe { eng.decode_device(&batch) }
        })
    })
    .map_err(gpu_err)
}

/// The layouts of a batch of blobs in device memory, read back and validated by
/// [`gpu_read_layouts`] and decoded by [`gpu_decode_layouts`]; opaque to Python. It holds the
/// blobs' device addresses, which the torch layer keeps alive between the two calls.
#[pyclass(module = "tensorzip._tensorzip", frozen)]
pub struct GpuLayouts {
    device: usize,
    blobs: Vec<(u64, usize)>,
    layouts: Vec<BlobLayout>,
}

/// What [`gpu_read_layouts`] gives Python for each blob: as `inspect` (scheme, dtype name, shape,
/// decoded bytes).
type Described = (String, String, Vec<u64>, u64);

/// Reads back the prefixes (header, tables, directory) of the blobs `(device address, length)`,
/// all on `device`, and parses them (`GpuEngine::read_layouts`: one gathering launch and one copy
/// a round, the first 4 KiB and 1/4096 of each, then for the few whose prefix is longer what
/// `BlobLayout::parse_prefix` asks; the parses in parallel); returns the layouts and, per blob, what
/// `inspect` tells. The first blob (in order) that is not a valid blob raises `ValueError`
/// naming its index (with `indexed`; without, the error alone: `decompress_tensor`'s one blob).
/// This is `decompress_tensors`' path for a batch wholly on one GPU (in Python each blob's prefix
/// took a slice, a copy, and two parses: ~37 us a blob on an H100 host) and `decompress_tensor`'s
/// for a blob on its target GPU (whose prefix was parsed three times).
#[pyfunction]
#[pyo3(signature = (device, stream, blobs, indexed = true))]
fn gpu_read_layouts(
    py: Python<'_>,
    device: usize,
    stream: usize,
    blobs: Vec<(u64, usize)>,
    indexed: bool,
) -> PyResult<(GpuLayouts, Vec<Described>)> {
    let name = |k: usize, e: PyErr| match indexed {
        true => crate::indexed(py, k, e),
        false => e,
    };
    let n = blobs.len();
    let eng = on(device, stream)?;
    let parsed = restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes, for each blob, a live CUDA uint8 tensor on this
            // device of the given length.
            unsafe { eng.read_layouts(&blobs) }
        })
    })
    .map_err(gpu_err)?;
    let mut layouts = Vec::with_capacity(n);
    let mut described = Vec::with_capacity(n);
    for (k, layout) in parsed.into_iter().enumerate() {
        let layout = layout.map_err(|e| name(k, to_py(e)))?;
        described.push(crate::describe(&layout.header));
        layouts.push(layout);
    }
    Ok((
        GpuLayouts {
            device,
            blobs,
            layouts,
        },
        described,
    ))
}

/// Decodes the blobs of `layouts` (from [`gpu_read_layouts`], on the same device) into `outs`
/// `(device address, length)`, one a blob, each exactly its tensor's bytes, in one launch on
/// `stream`, and waits; a corrupted payload raises `ValueError`.
#[pyfunction]
fn gpu_decode_layouts(
    py: Python<'_>,
    device: usize,
    stream: usize,
    layouts: &GpuLayouts,
    outs: Vec<(u64, usize)>,
) -> PyResult<()> {
    if device != layouts.device || outs.len() != layouts.layouts.len() {
        return Err(PyValueError::new_err(format!(
            "{} outputs on device {device} for {} blobs read on device {}",
            outs.len(),
            layouts.layouts.len(),
            layouts.device
        )));
    }
    for (k, (l, &(_, out_len))) in layouts.layouts.iter().zip(&outs).enumerate() {
        check_out_len(l, out_len).map_err(|e| crate::indexed(py, k, e))?;
    }
    if outs.is_empty() {
        return Ok(());
    }
    let eng = on(device, stream)?;
    let batch: Vec<(&BlobLayout, u64, u64)> = layouts
        .layouts
        .iter()
        .zip(&layouts.blobs)
        .zip(&outs)
        .map(|((l, &(blob_ptr, _)), &(out_ptr, _))| (l, blob_ptr, out_ptr))
        .collect();
    restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer keeps every blob of `gpu_read_layouts` alive and unchanged
            // until this returns (their prefixes are the parsed layouts), and passes a fresh
            // output tensor of each blob's decoded size, all on this device and distinct.
            unsafe { eng.decode_device(&batch) }
        })
    })
    .map_err(gpu_err)
}

/// Copies the `len` bytes at host address `ptr` (pageable memory) to device address `dst`, through
/// the engine's page-locked staging buffers with all host cores, and waits.
#[pyfunction]
fn gpu_upload(
    py: Python<'_>,
    device: usize,
    stream: usize,
    ptr: usize,
    len: usize,
    dst: u64,
) -> PyResult<()> {
    let eng = on(device, stream)?;
    // SAFETY: the torch layer passes a live contiguous CPU tensor of `len` bytes.
    let src = unsafe { crate::host(ptr, len) }?;
    restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes a fresh CUDA uint8 tensor of `len` bytes.
            unsafe { eng.upload_to(src, dst) }
        })
    })
    .map_err(gpu_err)
}

/// CRC-32 (zlib) of each `piece` bytes of the `len` bytes at device address `ptr`, on the GPU,
/// into the `n_out` u32s at host address `out` (`crate::put_u32s`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_crc32(
    py: Python<'_>,
    device: usize,
    stream: usize,
    ptr: u64,
    len: u64,
    piece: u64,
    out: usize,
    n_out: usize,
) -> PyResult<()> {
    positive_piece(piece)?;
    // SAFETY: the torch layer passes a new uint32 CPU tensor of `n_out` elements.
    let out = unsafe { crate::host_mut(out, n_out.saturating_mul(4)) }?;
    let eng = on(device, stream)?;
    let crcs = restoring(|| {
        py.detach(|| {
            // SAFETY: the torch layer passes a live contiguous CUDA tensor of `len` bytes.
            unsafe { eng.crc32_pieces_device(ptr, len, piece) }
        })
    })
    .map_err(gpu_err)?;
    crate::put_u32s(out, &crcs).map_err(to_py)
}

/// What the engine keeps in the device's memory pool after a file-level call (`load_file`,
/// `save_file`, `safe_open` reads on a GPU): their batches are the size of a model, and a
/// reserve that torch's allocator can neither use nor see would be a surprise; a few small calls'
/// buffers stay, so that reading tensors one by one does not map memory again each time.
pub(crate) const FILE_CALL_POOL_KEEP: u64 = 64 << 20;

/// After a file-level GPU call on `eng`: the pool trimmed to [`FILE_CALL_POOL_KEEP`] (best
/// effort: a failure only leaves the memory reserved, the call's result stands).
pub(crate) fn trim_after_file_call(eng: &GpuEngine) {
    let _ = restoring(|| eng.release_pool_memory(FILE_CALL_POOL_KEEP));
}

/// Gives the memory the GPU engines keep for reuse back to the driver
/// (`tensorzip.release_gpu_memory`): the engine of device `device`, or of every device with
/// `None`. Devices whose engine was never made have nothing to give back (none is made here).
#[pyfunction]
#[pyo3(signature = (device=None))]
fn gpu_release_memory(py: Python<'_>, device: Option<usize>) -> PyResult<()> {
    let engs: Vec<Arc<GpuEngine>> = engines()?
        .iter()
        .filter(|(&d, _)| device.is_none_or(|want| want == d))
        .map(|(_, e)| e.clone())
        .collect();
    for eng in engs {
        restoring(|| py.detach(|| eng.release_pool_memory(0))).map_err(gpu_err)?;
    }
    Ok(())
}

/// Trims the pool of device `device`'s engine to [`FILE_CALL_POOL_KEEP`], if an engine was made
/// for it (a `safe_open` reader on a GPU, when it closes: its one-by-one reads kept the buffers
/// between them). Best effort, with the GIL released.
#[pyfunction]
fn gpu_trim(py: Python<'_>, device: usize) -> PyResult<()> {
    let eng = engines()?.get(&device).cloned();
    if let Some(eng) = eng {
        py.detach(|| trim_after_file_call(&eng));
    }
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GpuBlob>()?;
    m.add_function(wrap_pyfunction!(gpu_trim, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_release_memory, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_compress, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_decompress, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_decompress_batch, m)?)?;
    m.add_class::<GpuLayouts>()?;
    m.add_function(wrap_pyfunction!(gpu_read_layouts, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_decode_layouts, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_crc32, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_upload, m)?)?;
    Ok(())
}

/// [`on`] for the files module.
pub(crate) fn engine_on(device: usize, stream: usize) -> PyResult<GpuEngine> {
    on(device, stream)
}
