//! The file commands: compress, decompress, info, verify.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tensorzip::archive::{
    plan_safetensors, write_archive, Archive, ArchiveOptions, BlobEncoder, SegmentKind,
};
use tensorzip::compare::{restore_difference, Compare};
use tensorzip::mapped::{MappedFile, Spent};
use tensorzip::stats::BlobStats;
use tensorzip::{blob::peek_header, CpuEngine};

use crate::output::{map_file, progress_bar, SafeOutput};
use crate::{Common, DecodeArgs, EncoderArgs};

/// Extension of archives.
pub const EXT: &str = "tz";

/// The CPU engine for `--threads`: it runs on rayon's global pool, sized to that count
/// ([`size_pool`]).
pub(crate) fn engine(common: &Common) -> Result<CpuEngine, String> {
    size_pool(common)?;
    CpuEngine::new(0).map_err(|e| e.to_string())
}

/// The GPU engine of `--gpu` (device 0), made on first use and shared by every file of the
/// command: an engine is a CUDA context, its kernels' modules and its pinned buffers (~0.4 s to
/// make on the H200 host with the kernel cache warm), which a model directory of many shards
/// would otherwise pay once per file.
fn gpu_engine() -> Result<&'static tensorzip_cuda::GpuEngine, String> {
    static GPU: std::sync::OnceLock<tensorzip_cuda::GpuEngine> = std::sync::OnceLock::new();
    if let Some(e) = GPU.get() {
        return Ok(e);
    }
    let made = tensorzip_cuda::GpuEngine::new(0).map_err(|e| format!("--gpu: {e}"))?;
    Ok(GPU.get_or_init(|| made))
}

/// Sizes rayon's global pool to `--threads` (0: every core) and returns its size. Everything a
/// command does on the CPU runs there — the engine's coding, the archive writer's checksums of the
/// original bytes and of the blobs read back, the GPU engine's host work — so `--threads 1` works
/// on one thread. (Until 2026-12-04 the CPU engine had a pool of its own and the checksums ran on
/// a global pool of every core.)
fn size_pool(common: &Common) -> Result<usize, String> {
    if common.threads > 0 {
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(common.threads)
            .thread_name(|i| format!("tensorzip-{i}"))
            .build_global();
        // Built already (a second engine in one command) with this size: nothing to do.
        if let Err(e) = built {
            if rayon::current_num_threads() != common.threads {
                return Err(format!("--threads {}: {e}", common.threads));
            }
        }
    }
    Ok(rayon::current_num_threads())
}

/// "1 thread", "2 threads".
pub(crate) fn threads_note(n: usize) -> String {
    match n {
        1 => "1 thread".into(),
        n => format!("{n} threads"),
    }
}

fn gb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

/// Where a command writes its output.
pub enum Output<'a> {
    /// The input's default name (`FILE.tz`, or the archive's name without `.tz`) in `Some`
    /// directory (`--output-dir`), or next to the input.
    Default(Option<&'a Path>),
    /// This path (`-o`).
    Path(&'a Path),
    /// `write`, a file inside a model directory output being built, which becomes `shown` (the
    /// name the command's report gives) once the whole directory is done ([`crate::tree`]).
    Staged { write: &'a Path, shown: &'a Path },
}

impl<'a> Output<'a> {
    /// From `-o` and `--output-dir` (which clap keeps apart).
    pub fn of(output: &'a Option<PathBuf>, dir: &'a Option<PathBuf>) -> Output<'a> {
        match output {
            Some(p) => Output::Path(p),
            None => Output::Default(dir.as_deref()),
        }
    }

    /// The path to write for `input`, whose default output is `default()` (a path next to it),
    /// and the name to report it by.
    fn resolve(
        &self,
        input: &Path,
        default: impl FnOnce() -> Result<PathBuf, String>,
    ) -> Result<(PathBuf, PathBuf), String> {
        let path = match self {
            Output::Path(p) => p.to_path_buf(),
            Output::Staged { write, shown } => {
                return Ok((write.to_path_buf(), shown.to_path_buf()))
            }
            Output::Default(None) => default()?,
            Output::Default(Some(dir)) => match default()?.file_name() {
                Some(name) => dir.join(name),
                None => return Err(format!("{}: not a file name", input.display())),
            },
        };
        Ok((path.clone(), path))
    }
}

/// `FILE.tz` for `FILE`.
pub fn archive_name(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(format!(".{EXT}"));
    PathBuf::from(name)
}

/// The name an archive restores to: its own without `.tz` (`None` if it has no such name).
pub fn restored_name(archive: &Path) -> Option<PathBuf> {
    // `extension` is `None` for a name that is only ".tz".
    match archive.extension() {
        Some(ext) if ext == EXT => Some(archive.with_file_name(archive.file_stem()?)),
        _ => None,
    }
}

/// `--output-dir`, when given, must be a directory that exists, and no two `inputs` may have the
/// same file name (their outputs would be one file, the second written over the first with `-f`).
/// Checked before any input is read.
pub fn check_dir(dir: Option<&Path>, inputs: &[PathBuf]) -> Result<(), String> {
    let Some(dir) = dir else {
        return Ok(());
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "{}: --output-dir is not a directory",
                dir.display()
            ))
        }
        Err(e) => return Err(format!("{}: --output-dir: {e}", dir.display())),
    }
    let mut seen = std::collections::HashMap::new();
    for input in inputs {
        if let Some(before) = seen.insert(input.file_name(), input) {
            return Err(format!(
                "{} and {} have the same name: their outputs in {} would be one file",
                before.display(),
                input.display(),
                dir.display()
            ));
        }
    }
    Ok(())
}

/// How `tensorzip compress` codes each file.
pub struct CompressSettings<'a> {
    /// `--checksum-chunk-bytes`.
    pub piece: u32,
    /// `--gpu`.
    pub gpu: bool,
    /// `--verify`: the archive decoded (on the CPU) and compared with the input before it is
    /// renamed into place.
    pub verify: bool,
    pub enc: &'a EncoderArgs,
    pub common: &'a Common,
}

/// `tensorzip compress` of one file; returns the file's and the archive's sizes.
pub fn compress(
    file: &Path,
    output: Output<'_>,
    force: bool,
    set: &CompressSettings<'_>,
) -> Result<(u64, u64), String> {
    let common = set.common;
    let opts = ArchiveOptions {
        compress: set.enc.options(),
        checksum_piece_bytes: set.piece,
    };
    let threads = size_pool(common)?;
    let cpu;
    let eng: &dyn BlobEncoder = if set.gpu {
        gpu_engine()?
    } else {
        cpu = engine(common)?;
        &cpu
    };
    let src = map_file(file)?;
    let segments = plan_safetensors(&src).map_err(|e| format!("{}: {e}", file.display()))?;
    let (dest, shown) = output.resolve(file, || Ok(archive_name(file)))?;
    let staged = matches!(output, Output::Staged { .. });
    let mut out = SafeOutput::create(&dest, &shown, force, file, &src, !staged)?;
    let pb = progress_bar(src.len() as u64, "compress");
    // The input's pages leave the process once coded (the engines read it in order).
    let spent = Spent::prefix(&src);
    let t = Instant::now();
    let len = write_archive(eng, &src[..], &segments, &opts, out.file(), &|done| {
        pb.set_position(done);
        spent.reached(done);
    })
    .map_err(|e| failure(e, file, &shown))?;
    let secs = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    if set.verify {
        check_written(out.file(), &src, file, &shown, common)?;
    }
    src.unchanged()?;
    out.commit()?;
    let tensors = segments
        .iter()
        .filter(|s| s.kind == SegmentKind::Tensor)
        .count();
    status!(
        "{} -> {}: {} tensors, {} -> {} bytes ({:.2}%), {:.2} GB/s, {}{}",
        file.display(),
        shown.display(),
        tensors,
        src.len(),
        len,
        len as f64 / src.len().max(1) as f64 * 100.0,
        gb_s(src.len() as u64, secs),
        threads_note(threads),
        if set.verify { "; verified" } else { "" }
    );
    Ok((src.len() as u64, len))
}

/// `compress --verify`: decodes the archive just written to `out` (on the CPU engine, whichever
/// engine wrote it) and compares it with the input `src`, before the archive is renamed into
/// place — so a faulty archive never takes its name.
fn check_written(
    out: &std::fs::File,
    src: &MappedFile,
    file: &Path,
    dest: &Path,
    common: &Common,
) -> Result<(), String> {
    // SAFETY: our own temporary file, complete and no longer written; only a process that finds
    // its hidden name could change it, and then the comparison below fails.
    let map = unsafe { MappedFile::map(out) }.map_err(|e| format!("{}: {e}", dest.display()))?;
    let ar = Archive::parse(&map).map_err(|e| {
        format!(
            "{}: the archive just written does not read back ({e}); it was not kept",
            dest.display()
        )
    })?;
    let pb = progress_bar(ar.original_len, "verify");
    let spent = (Spent::blobs(&map, &ar), Spent::prefix(src));
    let progress = |done| {
        pb.set_position(done);
        spent.0.reached(done);
        spent.1.reached(done);
    };
    let decoded = restore_difference(&ar, &engine(common)?, src, &progress);
    pb.finish_and_clear();
    let name = file.display().to_string();
    decoded
        .map_err(|e| e.to_string())
        .and_then(|d| d.map_or(Ok(()), |d| Err(d.describe(&name))))
        .map_err(|e| {
            format!(
                "{}: the archive just written failed verification: {e}; it was not kept",
                dest.display()
            )
        })
}

/// The message of a command's failure: an I/O error is the output's (writing it, or reading back
/// what was written: the inputs are mapped), anything else the input's.
fn failure(e: tensorzip::Error, input: &Path, output: &Path) -> String {
    match e {
        tensorzip::Error::Io(_) => format!("{}: {e}", output.display()),
        e => format!("{}: {e}", input.display()),
    }
}

/// Decodes every segment of `ar` into `w`, on the GPU or the CPU. The outer error is the engine's
/// set-up, the inner one the decoding's.
fn decode_all<W: Write + Send>(
    ar: &Archive<'_>,
    dec: &DecodeArgs,
    common: &Common,
    w: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<tensorzip::Result<()>, String> {
    if dec.gpu {
        size_pool(common)?;
        let gpu = gpu_engine()?;
        Ok(
            tensorzip_cuda::archive::decode_archive_to(gpu, ar, w, progress)
                .map_err(tensorzip_cuda::Error::into_core),
        )
    } else {
        let eng = engine(common)?;
        Ok(ar.decode_all_to(&eng, w, progress))
    }
}

/// `tensorzip decompress` of one archive; returns the restored file's and the archive's sizes (the
/// order of [`Totals::add`]: original, then compressed).
pub fn decompress(
    path: &Path,
    output: Output<'_>,
    force: bool,
    dec: &DecodeArgs,
    common: &Common,
) -> Result<(u64, u64), String> {
    let data = map_file(path)?;
    let ar = Archive::parse(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    let (dest, shown) = output.resolve(path, || {
        restored_name(path).ok_or_else(|| {
            format!(
                "{}: name does not end in .{EXT} after a name of its own; give the output with -o",
                path.display()
            )
        })
    })?;
    let staged = matches!(output, Output::Staged { .. });
    let mut out = SafeOutput::create(&dest, &shown, force, path, &data, !staged)?;
    let pb = progress_bar(ar.original_len, "decompress");
    let spent = Spent::blobs(&data, &ar);
    let t = Instant::now();
    {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, out.file());
        let progress = |done| {
            pb.set_position(done);
            spent.reached(done);
        };
        decode_all(&ar, dec, common, &mut w, &progress)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .map_err(|e| failure(e, path, &shown))?;
        w.flush().map_err(|e| format!("{}: {e}", shown.display()))?;
    }
    let secs = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    data.unchanged()?;
    out.commit()?;
    status!(
        "{} -> {}: {} bytes, {:.2} GB/s, {}",
        path.display(),
        shown.display(),
        ar.original_len,
        gb_s(ar.original_len, secs),
        threads_note(size_pool(common)?)
    );
    Ok((ar.original_len, data.len() as u64))
}

/// `tensorzip info`: a table per archive (each headed by its name when there are several), or with
/// `json` a document per archive (an array of them when there are several). An archive that fails
/// is reported on its own line and the others are still described.
pub fn info(paths: &[PathBuf], json: bool, common: &Common) -> Result<(), String> {
    let eng = engine(common)?;
    let mut described_all = Vec::new();
    let mut totals = Totals::default();
    let mut failed = 0;
    for path in paths {
        let described = describe(path, &eng);
        let described = match (described, paths.len()) {
            (Err(msg), 1) => return Err(msg),
            (Err(msg), _) => {
                status!("tensorzip: error: {msg}");
                failed += 1;
                continue;
            }
            (Ok(d), _) => d,
        };
        if json {
            described_all.push((path, described));
            continue;
        }
        let mut text = String::new();
        if paths.len() > 1 {
            text = format!("==> {} <==\n", path.display());
        }
        text.push_str(&described.table());
        print_out(&text)?;
        totals.add(described.original_bytes, described.archive_bytes);
    }
    if !json && paths.len() > 1 {
        print_out(&format!("{}\n", totals.line("archives", paths.len())))?;
    }
    if json {
        let docs: Vec<InfoJson<'_>> = described_all.iter().map(|(p, d)| d.json(p)).collect();
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let written = match (docs.len(), paths.len()) {
            (1, 1) => serde_json::to_writer_pretty(&mut out, &docs[0]),
            _ => serde_json::to_writer_pretty(&mut out, &docs),
        }
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
        match written {
            // A reader gone (`| head`) is not an error, as for the table.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(format!("stdout: {e}"))
            }
            _ => {}
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} of {} inputs failed", paths.len())),
    }
}

/// The original and compressed bytes of several files, for the line that ends a command given
/// several.
#[derive(Default)]
pub struct Totals {
    files: usize,
    original: u64,
    compressed: u64,
}

impl Totals {
    /// How many files were added.
    pub fn files(&self) -> usize {
        self.files
    }

    pub fn add(&mut self, original: u64, compressed: u64) {
        self.files += 1;
        self.original += original;
        self.compressed += compressed;
    }

    /// "all 3 archives restored: 66 -> 100 bytes" (the sizes in the direction of the work), or
    /// "2 of 3 archives restored: …" when `of` inputs were given and some failed.
    pub fn restored_line(&self, of: usize) -> String {
        format!(
            "{} archives restored: {} -> {} bytes",
            self.count(of),
            self.compressed,
            self.original
        )
    }

    /// "all 3 archives: 100 -> 66 bytes (66.00%)", or "2 of 3 archives: …" when `of` inputs were
    /// given and some failed (the sizes are those of the ones done).
    pub fn line(&self, what: &str, of: usize) -> String {
        format!(
            "{} {what}: {} -> {} bytes ({:.2}%)",
            self.count(of),
            self.original,
            self.compressed,
            self.compressed as f64 / self.original.max(1) as f64 * 100.0
        )
    }

    fn count(&self, of: usize) -> String {
        match of.max(self.files) {
            all if all == self.files => format!("all {all}"),
            of => format!("{} of {of}", self.files),
        }
    }
}

/// One tensor's line of `tensorzip info`.
struct InfoRow {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    bytes: u64,
    compressed: u64,
    planes: Vec<String>,
    coded_as: tensorzip::DType,
}

/// What `tensorzip info` says about an archive.
/// `info --json` of one file. Fields in alphabetical order: the order the output always had.
#[derive(serde::Serialize)]
struct InfoJson<'a> {
    archive_bytes: u64,
    file: String,
    original_bytes: u64,
    ratio: f64,
    tensors: Vec<TensorJson<'a>>,
}

/// One tensor of [`InfoJson`].
#[derive(serde::Serialize)]
struct TensorJson<'a> {
    bytes: u64,
    coded_as: &'static str,
    compressed: u64,
    dtype: &'a str,
    name: &'a str,
    planes: &'a [String],
    ratio: Option<f64>,
    shape: &'a [u64],
}

struct Described {
    rows: Vec<InfoRow>,
    original_bytes: u64,
    archive_bytes: u64,
}

fn describe(path: &Path, eng: &tensorzip::CpuEngine) -> Result<Described, String> {
    let data = map_file(path)?;
    let ar = Archive::parse(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    let tensors = ar
        .tensors(eng)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (t, i) in &tensors {
        let blob = ar.blob(*i);
        let st = BlobStats::of(blob)
            .map_err(|e| format!("{}: tensor {:?}: {e}", path.display(), t.name))?;
        let h = peek_header(blob)
            .map_err(|e| format!("{}: tensor {:?}: {e}", path.display(), t.name))?;
        let planes: Vec<String> = if st.stored {
            vec!["stored".into()]
        } else {
            st.planes.iter().map(|p| p.summary()).collect()
        };
        rows.push(InfoRow {
            name: t.name.clone(),
            dtype: t.dtype_name.clone(),
            shape: t.shape.clone(),
            bytes: ar.segments[*i].orig_len,
            compressed: blob.len() as u64,
            planes,
            coded_as: h.dtype,
        });
    }
    data.unchanged()?;
    Ok(Described {
        rows,
        original_bytes: ar.original_len,
        archive_bytes: data.len() as u64,
    })
}

impl Described {
    /// The file's `info --json` document, borrowing the rows (serialised straight to stdout: a
    /// JSON tree of an archive of 400,000 tensors took ~1 GB).
    fn json<'a>(&'a self, path: &Path) -> InfoJson<'a> {
        InfoJson {
            archive_bytes: self.archive_bytes,
            file: path.display().to_string(),
            original_bytes: self.original_bytes,
            ratio: self.archive_bytes as f64 / self.original_bytes.max(1) as f64,
            tensors: self
                .rows
                .iter()
                .map(|r| TensorJson {
                    bytes: r.bytes,
                    coded_as: r.coded_as.torch_name(),
                    compressed: r.compressed,
                    dtype: &r.dtype,
                    name: &r.name,
                    planes: &r.planes,
                    ratio: (r.bytes > 0).then(|| r.compressed as f64 / r.bytes as f64),
                    shape: &r.shape,
                })
                .collect(),
        }
    }

    fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut text = String::new();
        let w = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            text,
            "{:<w$}  {:<7} {:<18} {:>12} {:>12} {:>7}  planes (byte 0 first)",
            "name", "dtype", "shape", "bytes", "compressed", "ratio"
        );
        for r in &self.rows {
            let _ = writeln!(
                text,
                "{:<w$}  {:<7} {:<18} {:>12} {:>12} {:>7}  {}",
                r.name,
                r.dtype,
                format!("{:?}", r.shape),
                r.bytes,
                r.compressed,
                // An empty tensor has no ratio (its blob is all header).
                match r.bytes {
                    0 => "-".to_string(),
                    b => format!("{:.2}%", r.compressed as f64 / b as f64 * 100.0),
                },
                r.planes.join(" | ")
            );
        }
        let _ = writeln!(
            text,
            "total: {} tensors, {} -> {} bytes ({:.3}%), archive format v{}",
            self.rows.len(),
            self.original_bytes,
            self.archive_bytes,
            self.archive_bytes as f64 / self.original_bytes.max(1) as f64 * 100.0,
            tensorzip::archive::ARCHIVE_VERSION
        );
        text
    }
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
pub fn print_out(text: &str) -> Result<(), String> {
    write_out(text).map(|_| ())
}

/// [`print_out`], telling whether stdout is still open: false once its reader has gone (a broken
/// pipe, which is not an error: `tensorzip info … | head`).
pub fn write_out(text: &str) -> Result<bool, String> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(format!("stdout: {e}")),
    }
}

pub fn verify(
    path: &Path,
    against: Option<&Path>,
    dec: &DecodeArgs,
    common: &Common,
) -> Result<(), String> {
    let data = map_file(path)?;
    let ar = Archive::parse(&data).map_err(|e| format!("{}: {e}", path.display()))?;
    let original = against.map(map_file).transpose()?;
    let mut cmp = Compare::new(original.as_ref().map(|o| &o[..]));
    let pb = progress_bar(ar.original_len, "verify");
    // The archive's and the original's pages leave the process once checked.
    let spent = (
        Spent::blobs(&data, &ar),
        original.as_ref().map(|o| Spent::prefix(o)),
    );
    let progress = |done| {
        pb.set_position(done);
        spent.0.reached(done);
        if let Some(o) = &spent.1 {
            o.reached(done);
        }
    };
    let t = Instant::now();
    if dec.gpu && original.is_none() {
        // Nothing to compare on the host: the checksums are checked on the GPU and nothing
        // decoded comes back.
        size_pool(common)?;
        let gpu = gpu_engine()?;
        tensorzip_cuda::archive::check_archive(gpu, &ar, &progress)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    } else {
        decode_all(&ar, dec, common, &mut cmp, &progress)
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    pb.finish_and_clear();
    data.unchanged()?;
    if let Some(o) = &original {
        o.unchanged()?;
    }
    if let (Some(d), Some(p)) = (cmp.difference(), against) {
        return Err(format!(
            "{}: {}",
            path.display(),
            d.describe(&p.display().to_string())
        ));
    }
    status!(
        "{}: OK ({} segments, {} bytes, every checksum matches{}; {:.2} GB/s, {})",
        path.display(),
        ar.segments.len(),
        ar.original_len,
        if against.is_some() {
            ", identical to the original"
        } else {
            ""
        },
        gb_s(ar.original_len, t.elapsed().as_secs_f64()),
        threads_note(size_pool(common)?)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorzip::archive::serialize_safetensors;

    fn mapped(path: &Path, bytes: &[u8]) -> MappedFile {
        std::fs::write(path, bytes).unwrap();
        let f = std::fs::File::open(path).unwrap();
        // SAFETY: a test file nobody else touches.
        unsafe { MappedFile::map(&f) }.unwrap()
    }

    /// `compress --verify` keeps an archive only if it decodes to its input: an archive of other
    /// bytes (or of other length), or one that does not parse, is refused with what differs.
    #[test]
    fn verification_of_the_written_archive() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let data: Vec<u8> = (0..4000u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let file = serialize_safetensors(&[("w", "F32", &[4000], &data)], None).unwrap();
        let src = mapped(&d.join("m.safetensors"), &file);
        let segs = plan_safetensors(&src).unwrap();
        let mut out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.join("m.tz"))
            .unwrap();
        let eng = CpuEngine::new(1).unwrap();
        let opts = ArchiveOptions {
            compress: Default::default(),
            checksum_piece_bytes: 0,
        };
        write_archive(&eng, &src[..], &segs, &opts, &mut out, &|_| {}).unwrap();
        let common = Common { threads: 0 };
        let (name, dest) = (d.join("m.safetensors"), d.join("m.tz"));
        check_written(&out, &src, &name, &dest, &common).expect("its own input");
        // Another input of the same length: one value changed.
        let mut other = file.clone();
        let n = other.len();
        other[n - 7] ^= 1;
        let o = mapped(&d.join("other"), &other);
        let e = check_written(&out, &o, &name, &dest, &common).unwrap_err();
        assert!(
            e.contains(&format!(
                "differs from {} at byte {}",
                name.display(),
                n - 7
            )),
            "{e}"
        );
        assert!(
            e.contains("failed verification") && e.ends_with("it was not kept"),
            "{e}"
        );
        // A longer input.
        let o = mapped(&d.join("longer"), &[&file[..], b"x"].concat());
        let e = check_written(&out, &o, &name, &dest, &common).unwrap_err();
        assert!(e.contains(&format!("restores {n} bytes")), "{e}");
        // An archive that does not parse.
        std::fs::write(d.join("junk"), b"not an archive").unwrap();
        let junk = std::fs::File::open(d.join("junk")).unwrap();
        let e = check_written(&junk, &src, &name, &dest, &common).unwrap_err();
        assert!(e.contains("does not read back"), "{e}");
    }
}
