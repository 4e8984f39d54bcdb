//! `tensorzip._tensorzip`: the engines behind the torch layer in `py_src/tensorzip`.
//!
//! Tensors cross this boundary as raw addresses and lengths (host or device), which the Python layer
//! takes from live, contiguous torch tensors that it keeps alive for the call: no copies, and no
//! dependency on numpy. Everything a caller could get wrong that this side can check (dtypes,
//! shapes against byte counts, every byte of a blob) is checked here and raised as `ValueError` /
//! `TypeError`; the Python layer checks devices, contiguity and lifetimes.
//!
//! The GIL is released while an engine works.

mod files;
mod gpu;

use std::sync::OnceLock;

use pyo3::exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tensorzip::blob::{BlobView, Scheme};
use tensorzip::{CompressOptions, CpuEngine, DType};

/// A tensorzip error as the Python exception its kind calls for.
pub(crate) fn to_py(e: tensorzip::Error) -> PyErr {
    use tensorzip::Error as E;
    match e {
        E::Io(m) => PyOSError::new_err(m),
        E::Engine(m) => PyRuntimeError::new_err(m),
        E::OutOfMemory { .. } => PyMemoryError::new_err(format!("tensorzip: {e}")),
        E::InvalidOption(_) | E::InvalidInput(_) => PyValueError::new_err(e.to_string()),
        // Every problem with the bytes of a blob or file.
        e => PyValueError::new_err(format!("tensorzip: {e}")),
    }
}

/// The CPU engine on all cores.
pub(crate) fn cpu() -> &'static CpuEngine {
    static ENGINE: OnceLock<CpuEngine> = OnceLock::new();
    ENGINE.get_or_init(CpuEngine::default)
}

/// The dtype of a torch dtype name (`"torch.bfloat16"` or `"bfloat16"`).
pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    DType::from_torch_name(name).ok_or_else(|| {
        PyTypeError::new_err(format!("tensorzip does not code tensors of dtype {name}"))
    })
}

/// `len` bytes at host address `ptr` (an empty slice for `len == 0`, whatever `ptr`). An address
/// of 0, or a range past the end of the address space, is refused (`ValueError`) instead of read:
/// a tensor on the meta device, or a subclass without storage, has a data pointer of 0 (the torch
/// layer refuses those first; this is the last line).
///
/// # Safety
/// `ptr` must address `len` readable bytes that stay alive and unchanged while the slice is used.
pub(crate) unsafe fn host<'a>(ptr: usize, len: usize) -> PyResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    plausible(ptr, len)?;
    // SAFETY: forwarded from the caller; `ptr` is not null and the range does not wrap.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
}

/// As [`host`], writable.
///
/// # Safety
/// `ptr` must address `len` writable bytes used by nobody else while the slice is used.
pub(crate) unsafe fn host_mut<'a>(ptr: usize, len: usize) -> PyResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    plausible(ptr, len)?;
    // SAFETY: forwarded from the caller; `ptr` is not null and the range does not wrap.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) })
}

/// Refuses output buffers ((address, byte count) each) that overlap, before writable slices of
/// them are made (`ValueError`): the torch layer allocates one tensor each, and this refuses
/// anything else.
pub(crate) fn disjoint(outs: &[(usize, usize)]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize)> = outs.iter().filter(|o| o.1 > 0).copied().collect();
    spans.sort_unstable();
    if spans
        .windows(2)
        .any(|w| w[0].0.checked_add(w[0].1).is_none_or(|end| end > w[1].0))
    {
        return Err(PyValueError::new_err("output buffers overlap"));
    }
    Ok(())
}

/// What [`host`] can check of an address without reading it: not null, and `len` bytes from it
/// within the address space (and within `isize::MAX`, as a slice must be).
fn plausible(ptr: usize, len: usize) -> PyResult<()> {
    if ptr == 0 || ptr.checked_add(len).is_none() || len > isize::MAX as usize {
        return Err(PyValueError::new_err(format!(
            "no host memory at address {ptr:#x} for {len} bytes (a tensor on the meta device, or \
             without storage of its own?)"
        )));
    }
    Ok(())
}

/// The encoder options as the torch layer passes them: one tuple `(chunk_bytes, block_units,
/// passthrough_threshold, min_compress_bytes, max_tables, condition, pair_exponents)`
/// (`_core.Options.args()`).
#[derive(FromPyObject)]
pub(crate) struct OptionArgs(usize, u32, f64, usize, usize, bool, bool);

impl OptionArgs {
    /// The archive writer's options of a file the package writes (`save_file`, `compress_file`):
    /// these encoder options, one checksum per blob.
    pub(crate) fn archive(self) -> PyResult<tensorzip::archive::ArchiveOptions> {
        Ok(tensorzip::archive::ArchiveOptions {
            compress: self.options()?,
            checksum_piece_bytes: 0,
        })
    }

    /// The options, validated by the core (its error names the field).
    pub(crate) fn options(self) -> PyResult<CompressOptions> {
        let OptionArgs(
            chunk_bytes,
            block_units,
            passthrough_threshold,
            min_compress_bytes,
            max_tables,
            condition,
            pair_exponents,
        ) = self;
        let o = CompressOptions {
            chunk_bytes,
            block_units,
            passthrough_threshold,
            min_compress_bytes,
            max_tables,
            // True: the dtypes where it pays (`Condition::Auto`: not fp16).
            condition: match condition {
                true => tensorzip::Condition::Auto,
                false => tensorzip::Condition::Off,
            },
            pair_exponents,
            ..Default::default()
        };
        o.validate().map_err(to_py)?;
        Ok(o)
    }
}

/// Bytes owned by Rust, handed to Python without a copy: the torch layer wraps `ptr()` in a
/// ctypes array that keeps this object alive, and `torch.frombuffer` makes a tensor of it.
///
/// That tensor is writable (torch gives no read-only CPU tensors), so the address handed out is
/// taken once from `Vec::as_mut_ptr` while the vector is still uniquely owned, and Rust never
/// reads or writes the bytes again (only the vector's length, and its drop): a pointer from
/// `as_ptr` must never be written through.
#[pyclass(module = "tensorzip._tensorzip", frozen)]
pub struct RustBytes {
    data: Vec<u8>,
    /// `data.as_mut_ptr()` as taken in `new`; the buffer never moves or grows after that.
    addr: usize,
}

#[pymethods]
impl RustBytes {
    /// Address of the first byte (writable for `__len__` bytes while this object lives).
    fn ptr(&self) -> usize {
        self.addr
    }
    fn __len__(&self) -> usize {
        self.data.len()
    }
}

impl RustBytes {
    pub(crate) fn new(mut data: Vec<u8>) -> RustBytes {
        let addr = data.as_mut_ptr() as usize;
        RustBytes { data, addr }
    }
}

/// Compresses the `nbytes` bytes at host address `ptr` (a tensor of `dtype` and `shape`) into a blob.
#[pyfunction]
fn compress(
    py: Python<'_>,
    ptr: usize,
    nbytes: usize,
    dtype_name: &str,
    shape: Vec<u64>,
    opts: OptionArgs,
) -> PyResult<RustBytes> {
    let dt = dtype(dtype_name)?;
    let opts = opts.options()?;
    // SAFETY: the torch layer passes a live contiguous CPU tensor of `nbytes` bytes and keeps it
    // alive (and unmodified) during the call.
    let data = unsafe { host(ptr, nbytes) }?;
    let blob = py
        .detach(|| cpu().compress(data, dt, &shape, &opts))
        .map_err(to_py)?;
    Ok(RustBytes::new(blob))
}

/// What a blob holds: (scheme, torch dtype name, shape, decoded bytes). Validates the header, tables
/// and directory of the blob at `ptr` (host) of `len` bytes; raises `ValueError` naming the problem.
#[pyfunction]
fn inspect(ptr: usize, len: usize) -> PyResult<(String, String, Vec<u64>, u64)> {
    // SAFETY: the torch layer passes a live contiguous CPU uint8 tensor of `len` bytes.
    let blob = unsafe { host(ptr, len) }?;
    let v = BlobView::parse(blob).map_err(to_py)?;
    Ok(describe(&v.layout.header))
}

/// (scheme, torch dtype name, shape, decoded bytes) of a blob header.
pub(crate) fn describe(h: &tensorzip::BlobHeader) -> (String, String, Vec<u64>, u64) {
    let scheme = match h.scheme {
        Scheme::Stored => "stored",
        Scheme::Planes => "planes",
    };
    (
        scheme.into(),
        h.dtype.torch_name().into(),
        h.shape.clone(),
        h.nbytes(),
    )
}

/// [`inspect`] from the first bytes `prefix` of a blob of `total_len` bytes (header, tables and
/// directory validated; the payloads are the GPU's to check).
#[pyfunction]
fn inspect_prefix(prefix: &[u8], total_len: usize) -> PyResult<(String, String, Vec<u64>, u64)> {
    let l = tensorzip::blob::BlobLayout::parse(prefix, total_len).map_err(to_py)?;
    Ok(describe(&l.header))
}

/// The length of the blob prefix (header, tables and directory) that a GPU decode needs on the
/// host, from its first bytes `prefix` (a `ValueError` names the problem if they are not a blob's):
/// exact once `prefix` holds the header and tables (`BlobLayout::needed_len`); before that, a
/// longer prefix to read next (twice `prefix`, at least 64 KiB, at most the blob). The caller reads
/// that many bytes and asks again until the answer is no more than what it holds. (Before
/// 2026-12-07 a prefix too short to tell got the whole blob's length: a GPU blob of a tensor over
/// ~600 MiB, whose directory passes the first 64 KiB read, was copied to the host whole.)
#[pyfunction]
fn prefix_len(prefix: &[u8], total_len: usize) -> PyResult<usize> {
    tensorzip::blob::BlobLayout::prefix_to_read(prefix, total_len).map_err(to_py)
}

/// Decodes the blob at host address `ptr` (`len` bytes) into the `out_len` bytes at `out_ptr`.
#[pyfunction]
fn decompress_into(
    py: Python<'_>,
    ptr: usize,
    len: usize,
    out_ptr: usize,
    out_len: usize,
) -> PyResult<()> {
    // SAFETY: the torch layer passes a live CPU blob tensor and a fresh contiguous output tensor
    // of `out_len` bytes, both kept alive during the call; they do not overlap.
    let (blob, out) = unsafe { (host(ptr, len)?, host_mut(out_ptr, out_len)?) };
    // The output is a new tensor: let its pages fault in 2 MiB at a time.
    tensorzip::fresh::advise_huge(out);
    py.detach(|| cpu().decompress_into(blob, out))
        .map_err(to_py)?;
    Ok(())
}

/// Decodes every blob of `jobs` ((blob address, blob bytes, output address, output bytes) each, as
/// [`decompress_into`] takes one) on the CPU engine, concurrently: a model's small tensors, a
/// chunk or two each, keep every core busy together. The first failing blob in order raises its
/// error, naming its index; outputs that overlap are refused before anything is written.
#[pyfunction]
fn decompress_batch_into(py: Python<'_>, jobs: Vec<(usize, usize, usize, usize)>) -> PyResult<()> {
    let outs: Vec<(usize, usize)> = jobs.iter().map(|&(_, _, p, l)| (p, l)).collect();
    disjoint(&outs)?;
    let mut blobs = Vec::with_capacity(jobs.len());
    let mut bufs = Vec::with_capacity(jobs.len());
    for &(ptr, len, out_ptr, out_len) in &jobs {
        // SAFETY: the torch layer passes, for each job, a live CPU blob tensor and a fresh
        // contiguous output tensor of `out_len` bytes, all kept alive during the call; the
        // outputs overlap nothing (checked above), and no blob overlaps an output (the outputs
        // are new tensors).
        let (blob, out) = unsafe { (host(ptr, len)?, host_mut(out_ptr, out_len)?) };
        // New tensors: let their pages fault in 2 MiB at a time.
        tensorzip::fresh::advise_huge(out);
        blobs.push(blob);
        bufs.push(out);
    }
    let each = py
        .detach(|| cpu().decompress_each_into(&blobs, &mut bufs))
        .map_err(to_py)?;
    for (k, r) in each.into_iter().enumerate() {
        r.map_err(|e| indexed(py, k, to_py(e)))?;
    }
    Ok(())
}

/// `err`, of the same exception type, its message led by blob `k`'s index (a batch call's
/// failing blob).
pub(crate) fn indexed(py: Python<'_>, k: usize, err: PyErr) -> PyErr {
    let msg = format!("blob {k}: {}", err.value(py));
    PyErr::from_type(err.get_type(py), msg)
}

/// CRC-32 (zlib) of each `piece` bytes of the `len` bytes at host address `ptr` (CPU), written as
/// `u32`s (native order) to the `n_out` of them at `out` (a tensor the torch layer allocates: a
/// Python list of ints took ~50 bytes a piece, 400 MB for 8 MB in pieces of one byte).
#[pyfunction]
fn crc32_pieces(
    py: Python<'_>,
    ptr: usize,
    len: usize,
    piece: usize,
    out: usize,
    n_out: usize,
) -> PyResult<()> {
    // SAFETY: the torch layer passes a live contiguous CPU tensor of `len` bytes, and a distinct
    // new one of `n_out` 4-byte elements for the result.
    let (data, out) = unsafe { (host(ptr, len)?, host_mut(out, n_out.saturating_mul(4))?) };
    py.detach(|| put_u32s(out, &tensorzip::crc32_pieces(data, piece)?))
        .map_err(to_py)
}

/// Copies checksums into `out`, the bytes of a uint32 tensor the torch layer allocated for
/// exactly as many, in native order.
pub(crate) fn put_u32s(out: &mut [u8], values: &[u32]) -> tensorzip::Result<()> {
    if out.len() != values.len() * 4 {
        return Err(tensorzip::Error::InvalidInput(format!(
            "{} checksums for {} places",
            values.len(),
            out.len() / 4
        )));
    }
    for (o, c) in out.chunks_exact_mut(4).zip(values) {
        o.copy_from_slice(&c.to_ne_bytes());
    }
    Ok(())
}

/// The version of the format this build writes (blob, archive).
#[pyfunction]
fn format_versions() -> (u16, u16) {
    (
        tensorzip::blob::BLOB_VERSION,
        tensorzip::archive::ARCHIVE_VERSION,
    )
}

/// The `tensorzip` command line on `argv` (the program's name first), for the package's console
/// script: returns the exit status. It installs the command's signal handlers, so it belongs in a
/// process of its own (`python -m tensorzip`, the `tensorzip` script), not inside a program.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| tensorzip_cli::run(argv))
}

#[pymodule]
fn _tensorzip(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // A mapped file truncated by another process while it is read: an OSError naming it, not a
    // "Bus error" that ends the interpreter (`tensorzip::truncation`).
    tensorzip::truncation::guard();
    m.add_class::<RustBytes>()?;
    m.add_function(wrap_pyfunction!(compress, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(prefix_len, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_into, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_batch_into, m)?)?;
    m.add_function(wrap_pyfunction!(crc32_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(format_versions, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    gpu::register(m)?;
    files::register(m)?;
    Ok(())
}
