//! Files: `.safetensors` content in the archive format of the command line (`docs/FORMAT.md`, 9).
//!
//! `save_file` serialises the tensors as a safetensors file in memory and writes its archive through
//! a temporary file renamed into place. `ArchiveFile` maps an archive, validates its index, reads the
//! safetensors header from its first segment and decodes any one tensor on request (checksums of the
//! blob before, of the decoded bytes after), on the CPU or, many at once, on the GPU.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use cudarc::driver::DevicePtr;
use pyo3::exceptions::{PyIsADirectoryError, PyKeyError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use tensorzip::archive::{
    parse_header_metadata, plan_safetensors, plan_tensors, safetensors_header, write_archive,
    Archive, ArchiveIndex, ArchiveWriter, BlobEncoder, SegmentBytes, SegmentKind, SourceSegment,
};
use tensorzip::compare::{restore_difference, Compare};
use tensorzip::mapped::{MappedFile, OpenError, Spent};
use tensorzip_cuda::encode::DeviceTensor;

use crate::gpu::{engine_on, gpu_err, restoring, trim_after_file_call};
use crate::{cpu, host, host_mut, to_py, OptionArgs};

/// Writes `entries` — (name, safetensors dtype name, shape, host address, byte count) — and the
/// optional string metadata as a tensorzip archive at `path`: the archive of the `.safetensors`
/// file they make (tensors back to back in the order given), coded straight from their memory.
#[pyfunction]
fn save_file(
    py: Python<'_>,
    path: PathBuf,
    entries: Vec<(String, String, Vec<u64>, usize, usize)>,
    metadata: Option<Vec<(String, String)>>,
    opts: OptionArgs,
) -> PyResult<()> {
    let opts = opts.archive()?;
    // SAFETY: the torch layer passes live contiguous CPU tensors of these byte counts and keeps
    // them alive during the call.
    let data: Vec<&[u8]> = entries
        .iter()
        .map(|&(_, _, _, p, l)| unsafe { host(p, l) })
        .collect::<PyResult<_>>()?;
    py.detach(|| -> PyResult<()> {
        // The archive of the safetensors file these tensors make, coded from the tensors' own
        // memory: no serialised copy of the model.
        let (head, segs) = plan_file(&entries, metadata.as_deref())?;
        let parts = Parts {
            header: &head,
            tensors: &data,
        };
        write_atomically(&path, None, |f| {
            write_archive(cpu(), &parts, &segs, &opts, f, &|_| {})
                .map_err(|e| named(&path.display().to_string(), e))?;
            Ok(())
        })
    })
}

/// The safetensors header of the file that `entries` — (name, safetensors dtype name, shape,
/// address, byte count), back to back in this order — and `metadata` make, and the archive's
/// segments of that file: segment 0 the header, segment `i` tensor `i - 1`.
fn plan_file<A>(
    entries: &[(String, String, Vec<u64>, A, usize)],
    metadata: Option<&[(String, String)]>,
) -> PyResult<(Vec<u8>, Vec<SourceSegment>)> {
    let list: Vec<(&str, &str, &[u64], u64)> = entries
        .iter()
        .map(|(n, d, s, _, l)| (n.as_str(), d.as_str(), s.as_slice(), *l as u64))
        .collect();
    let head = safetensors_header(&list, metadata).map_err(to_py)?;
    let segs = plan_tensors(head.len() as u64, &list);
    Ok((head, segs))
}

/// Writes the file at `path` through a temporary file in the same directory (opened for reading
/// and writing: the archive writer reads its blobs back for their checksums), synced and renamed
/// into place; on failure the temporary file is removed and nothing is left at `path`. The file
/// takes the permissions of `mode_from` (the input of a file-to-file call, as the command line's
/// outputs take theirs), else those of the file it replaces, else the process's defaults.
fn write_atomically(
    path: &std::path::Path,
    mode_from: Option<(&std::path::Path, &MappedFile)>,
    write: impl FnOnce(&mut std::fs::File) -> PyResult<()>,
) -> PyResult<()> {
    if path.file_name().is_none() {
        return Err(PyValueError::new_err(format!(
            "{}: not a file name",
            path.display()
        )));
    }
    let io = |e: std::io::Error| io_error(&path.display().to_string(), e);
    // The rename would replace a directory entry that is not a regular file (`/dev/null` run as
    // root) instead of writing into it: refused, as the command line does.
    let existing = std::fs::metadata(path).ok();
    if let Some(meta) = &existing {
        if meta.is_dir() {
            return Err(PyIsADirectoryError::new_err(format!(
                "{}: is a directory",
                path.display()
            )));
        }
        if !meta.is_file() {
            return Err(PyOSError::new_err(format!(
                "{}: not a regular file; the archive is written to a temporary file and renamed \
                 into place, which would replace it",
                path.display()
            )));
        }
    }
    // A temporary of its own (two threads saving one path do not share one).
    let (tmp, mut f) = tensorzip::mapped::create_beside(path, |t| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(t)
    })
    .map_err(io)?;
    // Removes the temporary on every way out but the rename: an error, and a panic too.
    struct Temporary<'p>(Option<&'p std::path::Path>);
    impl Drop for Temporary<'_> {
        fn drop(&mut self) {
            if let Some(t) = self.0 {
                let _ = std::fs::remove_file(t);
            }
        }
    }
    let mut temporary = Temporary(Some(&tmp));
    // A private checkpoint stays private: a file replaced keeps its permissions, as
    // safetensors' own writer, which writes in place, leaves them. Never set-ID bits: the file
    // is the running user's (a user's setuid file compressed by root came out setuid root).
    // The input's from its descriptor (`MappedFile::metadata`), not a second lookup of its path.
    // Run as root, an input named through a link (the path is not the file read) gives at most
    // 0600, as the command line's outputs (another user's link to a root file readable only
    // through a private directory gave that user root's copy).
    let perms = match mode_from {
        Some((src, m)) => Some(tensorzip::mapped::plain_mode(
            src,
            &m.metadata().map_err(io)?,
        )),
        None => existing.map(|m| tensorzip::mapped::plain_permissions(m.permissions(), false)),
    };
    if let Some(perms) = perms {
        f.set_permissions(perms).map_err(io)?;
    }
    write(&mut f)?;
    f.flush().map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    temporary.0 = None;
    tensorzip::mapped::sync_parent(path);
    Ok(())
}

/// [`save_file`] of tensors in the memory of GPU `device`: `entries` give device addresses. Each
/// group of up to `tensorzip_cuda::archive::BATCH_BYTES` of consecutive tensors is encoded on the
/// GPU in one call (on torch's stream `stream`), the tensors' CRC-32s are taken there, and each
/// blob goes from the device to the file through the staging buffers: the tensors are never
/// copied to the host. The header (and any empty tensor) is coded by the CPU engine. The archive
/// is byte for byte the one [`save_file`] writes for the same tensors on the CPU.
#[pyfunction]
fn save_file_gpu(
    py: Python<'_>,
    path: PathBuf,
    entries: Vec<(String, String, Vec<u64>, u64, usize)>,
    metadata: Option<Vec<(String, String)>>,
    opts: OptionArgs,
    device: usize,
    stream: usize,
) -> PyResult<()> {
    let opts = opts.options()?;
    let eng = engine_on(device, stream)?;
    // The pool is trimmed with the GIL still released (unmapping costs tens of ms a gigabyte).
    restoring(|| {
        py.detach(|| -> PyResult<()> {
            let saved = save_gpu_batches(&eng, &path, &entries, metadata.as_deref(), &opts);
            trim_after_file_call(&eng);
            saved
        })
    })
}

/// [`save_file_gpu`]'s work, with the GIL released.
fn save_gpu_batches(
    eng: &tensorzip_cuda::GpuEngine,
    path: &std::path::Path,
    entries: &[(String, String, Vec<u64>, u64, usize)],
    metadata: Option<&[(String, String)]>,
    opts: &tensorzip::CompressOptions,
) -> PyResult<()> {
    let core = |e: tensorzip_cuda::Error| e.into_core();
    let (head, segs) = plan_file(entries, metadata)?;
    write_atomically(path, None, |f| {
        let mut aw = ArchiveWriter::new(f, 0).map_err(to_py)?;
        let h = &segs[0];
        aw.append(&segs[..1], &[tensorzip::checksum::crc32(&head)], |w| {
            let len = cpu().encode_blob(&head, h.dtype, &h.shape, opts, w, &|_| {})?;
            Ok(vec![len])
        })
        .map_err(to_py)?;
        let lens: Vec<u64> = segs[1..].iter().map(|s| s.len).collect();
        for run in tensorzip_cuda::archive::batches(&lens) {
            let (i, j) = (run.start + 1, run.end + 1);
            // Segment `k` is tensor `k - 1`; empty ones are coded on the CPU.
            let on_gpu: Vec<usize> = (i..j).filter(|&k| segs[k].len > 0).collect();
            let tensors: Vec<DeviceTensor> = on_gpu
                .iter()
                .map(|&k| DeviceTensor {
                    ptr: entries[k - 1].3,
                    nbytes: entries[k - 1].4,
                    dtype: segs[k].dtype,
                    shape: segs[k].shape.clone(),
                })
                .collect();
            let ranges: Vec<(u64, u64)> =
                tensors.iter().map(|t| (t.ptr, t.nbytes as u64)).collect();
            // SAFETY: the torch layer passes live contiguous CUDA tensors of these byte
            // counts on `device`, kept alive and unmodified during the call.
            let (blobs, gpu_crcs) = match tensors.is_empty() {
                true => (Ok(Vec::new()), Ok(Vec::new())),
                false => unsafe {
                    (
                        eng.compress_batch_device(&tensors, opts),
                        eng.crc32_ranges_device(&ranges),
                    )
                },
            };
            let (blobs, gpu_crcs) = (blobs.map_err(gpu_err)?, gpu_crcs.map_err(gpu_err)?);
            if blobs.len() != tensors.len() || gpu_crcs.len() != tensors.len() {
                return Err(gpu_err(tensorzip_cuda::Error::Kernel(format!(
                    "{} blobs and {} checksums for {} tensors",
                    blobs.len(),
                    gpu_crcs.len(),
                    tensors.len()
                ))));
            }
            let (mut blobs, mut gpu_crcs) = (blobs.into_iter(), gpu_crcs.into_iter());
            let crcs: Vec<u32> = (i..j)
                .map(|k| match segs[k].len {
                    0 => tensorzip::checksum::crc32(&[]),
                    _ => gpu_crcs.next().unwrap_or(0),
                })
                .collect();
            aw.append(&segs[i..j], &crcs, |w| {
                let mut lens = Vec::with_capacity(j - i);
                for s in &segs[i..j] {
                    if s.len == 0 {
                        let len = cpu().encode_blob(&[], s.dtype, &s.shape, opts, w, &|_| {})?;
                        lens.push(len);
                        continue;
                    }
                    let blob = blobs
                        .next()
                        .ok_or_else(|| tensorzip::Error::Engine("GPU: a blob is missing".into()))?;
                    let ptr = blob.buf.device_ptr(eng.stream()).0;
                    // SAFETY: the blob's buffer holds at least `blob.len` bytes.
                    unsafe { eng.download_to(ptr, blob.len as u64, w) }.map_err(core)?;
                    lens.push(blob.len as u64);
                }
                Ok(lens)
            })
            .map_err(to_py)?;
        }
        aw.finish(segs.last().map_or(0, |s| s.offset + s.len))
            .map_err(to_py)?;
        Ok(())
    })
}

/// The segments of a file being saved: segment 0 is the safetensors header, segment `i` tensor
/// `i - 1` (as laid out by `plan_tensors`).
struct Parts<'a> {
    header: &'a [u8],
    tensors: &'a [&'a [u8]],
}

impl SegmentBytes for Parts<'_> {
    fn segment(&self, i: usize, _seg: &SourceSegment) -> &[u8] {
        match i {
            0 => self.header,
            i => self.tensors.get(i - 1).copied().unwrap_or(&[]),
        }
    }
}

/// One tensor of an archive: its safetensors dtype name, shape and segment.
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    segment: usize,
}

/// An archive opened for reading (memory-mapped; the index and the safetensors header validated).
#[pyclass(module = "tensorzip._tensorzip", frozen)]
pub struct ArchiveFile {
    /// Blobs' pages are given back once their tensor is decoded (a loaded model would otherwise
    /// hold its archive's size in resident memory beside its tensors until the reader closes).
    map: MappedFile,
    names: Vec<String>,
    entries: HashMap<String, Entry>,
    metadata: Option<Vec<(String, String)>>,
    path: String,
    /// The index as it was at opening, which the entries, the sizes handed to the torch layer
    /// (`info`) and every decode use: the index is parsed once (per call, it made `load_file` of
    /// n tensors O(n^2)), so a file rewritten in place later is read with the index it was
    /// opened with — its changed blobs fail that index's checksums, and no decoder can be handed
    /// byte counts other than those the tensors were sized by.
    index: ArchiveIndex,
}

impl ArchiveFile {
    /// Checks the blob of tensor `name`'s segment, then runs `decode(archive, segment, out)` with
    /// the GIL released on the `out_len` bytes at host address `out_ptr`; errors name the file.
    fn decode_segment_with(
        &self,
        py: Python<'_>,
        name: &str,
        out_ptr: usize,
        out_len: usize,
        decode: impl FnOnce(&Archive<'_>, usize, &mut [u8]) -> tensorzip::Result<()> + Send,
    ) -> PyResult<()> {
        let i = self.entry(name)?.segment;
        let ar = self.archive()?;
        // SAFETY: the torch layer passes a fresh contiguous CPU tensor of `out_len` bytes, alive
        // for the call.
        let out = unsafe { host_mut(out_ptr, out_len) }?;
        let done = py.detach(|| {
            ar.check_segment(i)?;
            decode(&ar, i, out)
        });
        unchanged(
            &self.map,
            &self.path,
            done.map_err(|e| named(&self.path, e)),
        )
    }

    /// The segments of tensors `names`, given `outs` output buffers (one per name).
    fn segments_of(&self, names: &[String], outs: usize) -> PyResult<Vec<usize>> {
        if names.len() != outs {
            return Err(PyValueError::new_err("one output per tensor"));
        }
        names
            .iter()
            .map(|n| self.entry(n).map(|e| e.segment))
            .collect()
    }

    /// The archive over the mapped bytes, with the index read at opening. Nothing is read from
    /// the file here: each caller checks `unchanged` after its work, which covers this too.
    fn archive(&self) -> PyResult<Archive<'_>> {
        self.index.over(&self.map).map_err(|e| named(&self.path, e))
    }
    fn entry(&self, name: &str) -> PyResult<&Entry> {
        self.entries
            .get(name)
            .ok_or_else(|| PyKeyError::new_err(format!("{}: no tensor named {name:?}", self.path)))
    }
}

/// `result`, unless `map`'s file was truncated or changed by another process meanwhile (bytes
/// past a new end read as zeros: `tensorzip::truncation`; `MappedFile::changed`), which wins
/// over any result.
fn unchanged<T>(map: &MappedFile, shown: &str, result: PyResult<T>) -> PyResult<T> {
    match map.changed() {
        true => Err(PyOSError::new_err(format!(
            "{shown}: the file was truncated or changed while it was read (by another process?)"
        ))),
        false => result,
    }
}

/// A problem with an archive as a Python exception naming the file.
fn named(path: &str, e: tensorzip::Error) -> PyErr {
    match e {
        tensorzip::Error::Io(m) => PyOSError::new_err(format!("{path}: {m}")),
        e @ tensorzip::Error::OutOfMemory { .. } => PyMemoryError::new_err(format!("{path}: {e}")),
        e => PyValueError::new_err(format!("{path}: {e}")),
    }
}

/// Maps the regular file at `path` (shown as `shown` in errors) for reading.
fn map_input(path: &std::path::Path, shown: &str) -> PyResult<MappedFile> {
    // SAFETY: the file is mapped read-only; a file changed underneath us yields wrong bytes, which
    // the checksums report, not undefined behaviour of this process's memory.
    unsafe { MappedFile::open(path) }.map_err(|e| match e {
        OpenError::Directory => PyIsADirectoryError::new_err(format!("{shown}: {e}")),
        OpenError::Io(e) => io_error(shown, e),
        e => PyOSError::new_err(format!("{shown}: {e}")),
    })
}

/// An `OSError` of the subclass Python gives `e`'s errno (`FileNotFoundError`,
/// `PermissionError`, ...), with its `errno`, `strerror` and `filename` set, as Python's own file
/// calls raise them.
fn io_error(path: &str, e: std::io::Error) -> PyErr {
    match e.raw_os_error() {
        Some(code) => {
            // The message without Rust's " (os error N)" suffix: Python shows the errno itself.
            let text = e.to_string();
            let msg = text
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&text)
                .to_string();
            PyOSError::new_err((code, msg, path.to_string()))
        }
        None => PyOSError::new_err(format!("{path}: {e}")),
    }
}

/// `dst` must not be `src` itself (the temporary file would be renamed over the input).
fn not_the_input(src: &std::path::Path, dst: &std::path::Path) -> PyResult<()> {
    match tensorzip::mapped::same_file(src, dst) {
        true => Err(PyValueError::new_err(format!(
            "{}: is the input file; give another output",
            dst.display()
        ))),
        false => Ok(()),
    }
}

/// Compresses the `.safetensors` file `src` into the archive `dst` (through a temporary file
/// renamed into place) without loading its tensors: the file is mapped, coded as `tensorzip
/// compress` codes it, and its pages are given back as they are coded. Returns the file's and the
/// archive's sizes.
#[pyfunction]
#[pyo3(signature = (src, dst, opts, verify=false))]
fn compress_file(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    opts: OptionArgs,
    verify: bool,
) -> PyResult<(u64, u64)> {
    let shown = src.display().to_string();
    let opts = opts.archive()?;
    let map = map_input(&src, &shown)?;
    not_the_input(&src, &dst)?;
    py.detach(|| {
        let segs = plan_safetensors(&map).map_err(|e| named(&shown, e));
        let segs = unchanged(&map, &shown, segs)?;
        let spent = Spent::prefix(&map);
        let mut len = 0;
        write_atomically(&dst, Some((&src, &map)), |f| {
            let written = write_archive(cpu(), &map[..], &segs, &opts, f, &|done| {
                spent.reached(done)
            })
            .map_err(|e| match e {
                tensorzip::Error::Io(m) => PyOSError::new_err(format!("{}: {m}", dst.display())),
                e => named(&shown, e),
            });
            // The temporary output goes if the input changed under us.
            len = unchanged(&map, &shown, written)?;
            if verify {
                // As `tensorzip compress --verify`: the archive just written decodes to the
                // input, or it is not kept.
                let out = dst.display().to_string();
                // SAFETY: our own temporary file, complete and no longer written.
                let ar_map = unsafe { MappedFile::map(f) }
                    .map_err(|e| PyOSError::new_err(format!("{out}: {e}")))?;
                let ar = Archive::parse(&ar_map).map_err(|e| named(&out, e))?;
                let found = restore_difference(&ar, cpu(), &map, &|_| {});
                let found = unchanged(&map, &shown, found.map_err(|e| named(&out, e)))?;
                if let Some(d) = found {
                    return Err(PyValueError::new_err(format!(
                        "{out}: the archive just written failed verification: {}; it was not kept",
                        d.describe(&shown)
                    )));
                }
            }
            Ok(())
        })?;
        Ok((map.len() as u64, len))
    })
}

/// Restores the `.safetensors` file of archive `src` into `dst` byte for byte (through a
/// temporary file renamed into place), checking every checksum; the archive's pages are given
/// back as its segments are written. Returns the restored file's size.
#[pyfunction]
fn decompress_file(py: Python<'_>, src: PathBuf, dst: PathBuf) -> PyResult<u64> {
    let shown = src.display().to_string();
    let map = map_input(&src, &shown)?;
    not_the_input(&src, &dst)?;
    py.detach(|| {
        let ar = Archive::parse(&map).map_err(|e| named(&shown, e));
        let ar = unchanged(&map, &shown, ar)?;
        let spent = Spent::blobs(&map, &ar);
        write_atomically(&dst, Some((&src, &map)), |f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let out_err = |m: String| PyOSError::new_err(format!("{}: {m}", dst.display()));
            let done = ar
                .decode_all_to(cpu(), &mut w, &|done| spent.reached(done))
                .map_err(|e| match e {
                    tensorzip::Error::Io(m) => out_err(m),
                    e => named(&shown, e),
                });
            // The temporary output goes if the archive changed under us.
            unchanged(&map, &shown, done)?;
            w.flush().map_err(|e| out_err(e.to_string()))
        })?;
        Ok(ar.original_len)
    })
}

/// Checks every checksum of archive `src` and decodes all of it, keeping nothing; with `against`,
/// also compares the restored bytes with that file (what `tensorzip verify [--against]` does).
/// Returns the restored size; a damaged archive or a difference raises naming the files.
#[pyfunction]
#[pyo3(signature = (src, against=None))]
fn verify_file(py: Python<'_>, src: PathBuf, against: Option<PathBuf>) -> PyResult<u64> {
    let shown = src.display().to_string();
    let map = map_input(&src, &shown)?;
    let original = match &against {
        Some(p) => Some((
            map_input(p, &p.display().to_string())?,
            p.display().to_string(),
        )),
        None => None,
    };
    py.detach(|| {
        let ar = Archive::parse(&map).map_err(|e| named(&shown, e));
        let ar = unchanged(&map, &shown, ar)?;
        let spent = Spent::blobs(&map, &ar);
        let mut cmp = Compare::new(original.as_ref().map(|(o, _)| &o[..]));
        let done = ar
            .decode_all_to(cpu(), &mut cmp, &|done| spent.reached(done))
            .map_err(|e| named(&shown, e));
        unchanged(&map, &shown, done)?;
        if let Some((o, name)) = &original {
            unchanged(o, name, Ok(()))?;
            if let Some(d) = cmp.difference() {
                return Err(PyValueError::new_err(format!(
                    "{shown}: {}",
                    d.describe(name)
                )));
            }
        }
        Ok(ar.original_len)
    })
}

/// Opens the archive at `path`, with the GIL released (the index is read and checked, the
/// safetensors header decoded: up to ~100 MB of work).
#[pyfunction]
fn open_archive(py: Python<'_>, path: PathBuf) -> PyResult<ArchiveFile> {
    py.detach(|| open_archive_at(path))
}

fn open_archive_at(path: PathBuf) -> PyResult<ArchiveFile> {
    let shown = path.display().to_string();
    let named = |e| named(&shown, e);
    let map = map_input(&path, &shown)?;
    let ar = unchanged(&map, &shown, Archive::parse(&map).map_err(named))?;
    // Segment 0 is the safetensors header.
    let head = unchanged(&map, &shown, ar.decode_segment(cpu(), 0).map_err(named))?;
    let (_, tensors, metadata) = parse_header_metadata(&head).map_err(named)?;
    // Tensor segments are in file order, as the tensors sorted by offset.
    let segs: Vec<usize> = (0..ar.segments.len())
        .filter(|&i| ar.segments[i].kind == SegmentKind::Tensor)
        .collect();
    if segs.len() != tensors.len() {
        return Err(PyValueError::new_err(format!(
            "{shown}: {} tensor segments for {} tensors in the header",
            segs.len(),
            tensors.len()
        )));
    }
    let mut entries = HashMap::new();
    let mut names = Vec::new();
    for (t, &i) in tensors.into_iter().zip(&segs) {
        let s = &ar.segments[i];
        if s.orig_offset != t.begin || s.orig_len != t.end - t.begin {
            return Err(PyValueError::new_err(format!(
                "{shown}: tensor {:?} does not match its segment",
                t.name
            )));
        }
        names.push(t.name.clone());
        entries.insert(
            t.name,
            Entry {
                dtype: t.dtype_name,
                shape: t.shape,
                segment: i,
            },
        );
    }
    let index = ar.index();
    drop(ar);
    Ok(ArchiveFile {
        map,
        names,
        entries,
        metadata,
        path: shown,
        index,
    })
}

#[pymethods]
impl ArchiveFile {
    /// Tensor names, in the order of their data in the file.
    fn keys(&self) -> Vec<String> {
        self.names.clone()
    }

    /// The `__metadata__` of the safetensors header, if any.
    fn metadata(&self) -> Option<HashMap<String, String>> {
        self.metadata.as_ref().map(|m| m.iter().cloned().collect())
    }

    /// (safetensors dtype name, shape, byte count) of tensor `name`.
    fn info(&self, name: &str) -> PyResult<(String, Vec<u64>, u64)> {
        let e = self.entry(name)?;
        let len = self.index.segments()[e.segment].orig_len;
        unchanged(
            &self.map,
            &self.path,
            Ok((e.dtype.clone(), e.shape.clone(), len)),
        )
    }

    /// Decodes tensor `name` into the `out_len` bytes at host address `out_ptr` (CPU), checking
    /// the blob's checksums before and the decoded bytes' CRC-32 after.
    fn decode_into(
        &self,
        py: Python<'_>,
        name: &str,
        out_ptr: usize,
        out_len: usize,
    ) -> PyResult<()> {
        self.decode_segment_with(py, name, out_ptr, out_len, |ar, i, out| {
            tensorzip::fresh::advise_huge(out);
            let crc = cpu().decompress_into_crc(ar.blob(i), out);
            // The blob's pages leave the process (a reader that loads every tensor in turn
            // otherwise ends with the whole archive resident beside them).
            self.map.release(ar.blob_range(i));
            if crc? != ar.segments[i].orig_crc {
                return Err(tensorzip::Error::Checksum(format!(
                    "tensor {name:?}: decoded data"
                )));
            }
            Ok(())
        })
    }

    /// Decodes bytes `start..end` of tensor `name` (row-major order; whole elements of its blob)
    /// into the `out_len` bytes at host address `out_ptr`, decoding only the chunks that hold them
    /// (`get_slice`). In bytes, not elements: a tensor the archive keeps as bytes (a dtype or rank
    /// a blob does not take) has blob elements of another size than the header's dtype. The
    /// blob's checksums are checked first; the original bytes' CRC-32 covers the whole tensor, so
    /// a part of it cannot be checked against it.
    fn decode_range_into(
        &self,
        py: Python<'_>,
        name: &str,
        start: u64,
        end: u64,
        out_ptr: usize,
        out_len: usize,
    ) -> PyResult<()> {
        // The part is not advised for huge pages, unlike a whole tensor: on the 2-core VM a loop
        // of 47 MB slices took 26.5-27.4 ms advised against 16.6-18.6 not (2026-12-04; whole
        // tensors, `get_tensor` and `load_file`, 9-16 / 20-23 ms advised against 19 / 30-37).
        self.decode_segment_with(py, name, out_ptr, out_len, |ar, i, out| {
            let isz = tensorzip::blob::BlobHeader::parse(ar.blob(i))?
                .0
                .dtype
                .itemsize() as u64;
            if !start.is_multiple_of(isz) || !end.is_multiple_of(isz) {
                return Err(tensorzip::Error::InvalidInput(format!(
                    "bytes {start}..{end} are not whole {isz}-byte elements"
                )));
            }
            let done = cpu().decompress_range_into(ar.blob(i), start / isz, end / isz, out);
            // What was read of the blob leaves the process, as after a whole tensor.
            self.map.release(ar.blob_range(i));
            done.map(|_| ())
        })
    }

    /// Decodes the tensors `names` into host memory (`outs`: (address, byte count) of each, sized
    /// by `info`) in one call on the CPU engine, all of them concurrently (checksums as
    /// `decode_into`; the first failing tensor in `names`' order is raised). What `load_file`
    /// does on the CPU: tensor by tensor, a model's small tensors left cores idle.
    fn decode_many_into(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        outs: Vec<(usize, usize)>,
    ) -> PyResult<()> {
        // Each blob's pages are given back as soon as it is decoded, so the peak is the tensors
        // and the blobs being decoded, not the tensors and the whole archive.
        let segs = self.segments_of(&names, outs.len())?;
        let ar = self.archive()?;
        // Writable slices of these buffers must not overlap: the torch layer allocates one
        // tensor per name, and this refuses anything else.
        crate::disjoint(&outs)?;
        // SAFETY: the torch layer passes a fresh contiguous CPU tensor of each byte count, alive
        // for the call; no two of them overlap (checked above).
        let mut bufs: Vec<&mut [u8]> = outs
            .iter()
            .map(|&(p, l)| unsafe { host_mut(p, l) })
            .collect::<PyResult<_>>()?;
        for b in bufs.iter_mut() {
            tensorzip::fresh::advise_huge(b);
        }
        let path = &self.path;
        let release = |i: usize| self.map.release(ar.blob_range(i));
        let done = py.detach(|| ar.decode_segments_into_then(cpu(), &segs, &mut bufs, &release));
        unchanged(&self.map, path, done.map_err(|e| named(path, e)))
    }

    /// Decodes the tensors `names` into device memory (`outs`: device addresses, sized by `info`)
    /// on GPU `device`, stream `stream`, in one launch: their blobs are checked on the host and
    /// uploaded together; the decoded bytes' CRC-32s are checked on the GPU.
    /// With `trim`, the engine's pool is trimmed to `gpu::FILE_CALL_POOL_KEEP` afterwards (a
    /// whole file's load); one-by-one reads leave it for the next read (`safe_open` trims when
    /// it closes: `gpu_trim`).
    fn gpu_decode(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        outs: Vec<u64>,
        device: usize,
        stream: usize,
        trim: bool,
    ) -> PyResult<()> {
        let segs = self.segments_of(&names, outs.len())?;
        let ar = self.archive()?;
        let path = &self.path;
        let eng = engine_on(device, stream)?;
        let decoded = restoring(|| {
            py.detach(|| -> PyResult<()> {
                // The blobs parsed on all cores, uploaded straight from the mapped file with their
                // checksums taken on the way, decoded in one launch, the decoded bytes' CRC-32s
                // checked on the GPU (`tensorzip_cuda::archive::Segments`).
                let err = |e| match e {
                    tensorzip_cuda::Error::Format(e) => named(path, e),
                    e => gpu_err(e),
                };
                // At most BATCH_SEGMENTS tensors a launch, as the command line's batches: a
                // launch's device memory grows with its tensors' tables, not only their bytes.
                let n = tensorzip_cuda::archive::BATCH_SEGMENTS;
                let decode = || -> PyResult<()> {
                    for (segs, outs) in segs.chunks(n).zip(outs.chunks(n)) {
                        let batch =
                            tensorzip_cuda::archive::Segments::parse(&ar, segs).map_err(err);
                        let batch = unchanged(&self.map, path, batch)?;
                        // SAFETY: each output is a live CUDA tensor of the tensor's byte count (the
                        // torch layer allocates it from `info`, which the index gives and the parse
                        // above checked against each blob), distinct from the others, on this
                        // engine's device.
                        let done = unsafe { batch.decode_into(&eng, outs) }.map_err(err);
                        // The launch has waited for its uploads: the blobs' pages leave the process
                        // (a `safe_open` reader on a GPU kept every blob it had uploaded resident).
                        for &i in segs {
                            self.map.release(ar.blob_range(i));
                        }
                        unchanged(&self.map, path, done)?;
                    }
                    Ok(())
                };
                let done = decode();
                if trim {
                    trim_after_file_call(&eng);
                }
                done
            })
        });
        decoded
    }
}

/// `dir` resolved, if no user but this process's (or root) can change it or any directory above
/// it (a sticky one, as `/tmp`, allowed): `tensorzip::mapped::only_ours_above`, the rule the
/// command line applies before root builds a model directory. `save_dir` run as root asks it
/// before staging its shards in `dir`, and writes at the resolved path; else PermissionError.
#[pyfunction]
fn only_ours_above(dir: PathBuf) -> PyResult<PathBuf> {
    use tensorzip::mapped::NotOurs;
    tensorzip::mapped::only_ours_above(&dir, true).map_err(|e| match e {
        NotOurs::Io(m) => PyOSError::new_err(m),
        NotOurs::Shared(why) => pyo3::exceptions::PyPermissionError::new_err(format!(
            "{why}: another user can write there, and could redirect the writes of this process \
             (root); save under directories of root's only, or as that user"
        )),
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ArchiveFile>()?;
    m.add_function(wrap_pyfunction!(only_ours_above, m)?)?;
    m.add_function(wrap_pyfunction!(save_file, m)?)?;
    m.add_function(wrap_pyfunction!(save_file_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(open_archive, m)?)?;
    m.add_function(wrap_pyfunction!(compress_file, m)?)?;
    m.add_function(wrap_pyfunction!(decompress_file, m)?)?;
    m.add_function(wrap_pyfunction!(verify_file, m)?)?;
    Ok(())
}
