//! Kernels are `.cu` sources compiled at run time with NVRTC, straight to a cubin for the device's
//! architecture (sm_90 on Hopper), once per process, and cached on disk keyed by the source, the
//! architecture and the driver and NVRTC versions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{Error, Result};

/// FNV-1a, 64 bits: a stable hash for cache keys.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Where compiled kernels are kept: `$TENSORZIP_CACHE_DIR`, else `$XDG_CACHE_HOME/tensorzip`, else
/// `~/.cache/tensorzip`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TENSORZIP_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("tensorzip"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("tensorzip"))
}

/// The kernel cache directory `dir`, created if missing (readable by its user only), if it can be
/// trusted with kernels this process will run: on Unix, it and every directory above it owned by
/// this process's user or by root, and none writable by other users — except, above it, a
/// directory with the sticky bit (`/tmp`), where others cannot rename or remove what is ours.
/// Otherwise no cache is used (every unit compiled; a warning printed once): anyone who can write
/// the directory could put a sealed cubin there (a review's finding, 2026-12-05). The path
/// returned is the checked one, resolved: a link on the way given (`TENSORZIP_CACHE_DIR=/tmp/x`
/// made a link by another user) could be repointed after the check, and the cache then read
/// through it (a review's finding of the same day: `dir` as given was used after the check).
fn usable_cache(dir: PathBuf) -> Option<PathBuf> {
    if create_private_dir(&dir).is_err() {
        return None;
    }
    match tensorzip::mapped::only_ours_above(&dir, false) {
        Ok(real) => Some(real),
        Err(why) => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                eprintln!(
                    "tensorzip: kernel cache {} not used: {why}; kernels are compiled afresh \
                     (set TENSORZIP_CACHE_DIR to a directory of your own)",
                    dir.display()
                );
            });
            None
        }
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// A cached file's bytes, if no user but this one (or root) can change the file
/// ([`tensorzip::mapped::only_ours`]; `path` is in the directory [`usable_cache`] resolved and
/// checked, which no other user can write).
fn read_private(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    tensorzip::mapped::only_ours(&f.metadata().ok()?, false).ok()?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

fn versions() -> (i32, i32, i32) {
    let mut driver = 0;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain FFI calls writing into local integers; both libraries were checked present.
    unsafe {
        let _ = cudarc::driver::sys::cuDriverGetVersion(&mut driver);
        let _ = nvrtc_sys::nvrtcVersion(&mut major, &mut minor);
    }
    (driver, major, minor)
}

/// Cubins built or read in this process, by cache file name (source, architecture and versions).
static BUILT: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();

/// Shared-memory accessors both kernel sources use (prepended to each).
const SMEM_SRC: &str = include_str!("../kernels/smem.cuh");

/// The kernel source `src` built into the crate, or, for development only, the file named by the
/// environment variable `TENSORZIP_DEV_<NAME>_SRC` (e.g. `TENSORZIP_DEV_TZ_DECODE_SRC`): that lets
/// one device run time several variants of a kernel with the same binaries (`scripts/gpu_ab.sh`).
/// The override is read at engine creation and goes through the same cache, keyed by its text; like
/// the built-in sources, it gets `kernels/smem.cuh` (the shared-memory accessors) in front.
pub fn source(name: &str, src: &'static str) -> std::borrow::Cow<'static, str> {
    let var = format!("TENSORZIP_DEV_{}_SRC", name.to_ascii_uppercase());
    match std::env::var_os(&var) {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(text) => std::borrow::Cow::Owned(format!("{SMEM_SRC}{text}")),
            Err(e) => {
                eprintln!(
                    "tensorzip: {var}={}: {e}; using the built-in kernels",
                    path.to_string_lossy()
                );
                std::borrow::Cow::Borrowed(src)
            }
        },
        None => std::borrow::Cow::Borrowed(src),
    }
}

/// The cubin of `src` for `ctx`'s device: from this process's memory, from the disk cache, or
/// compiled now (and cached in both). `rebuild` skips both caches (a cached cubin that the driver
/// refused) and replaces their entries.
/// `defines` are `NAME=VALUE` macro definitions given to NVRTC (and part of the cache key).
pub fn cubin(
    ctx: &CudaContext,
    name: &str,
    src: &str,
    defines: &[String],
    rebuild: bool,
) -> Result<Vec<u8>> {
    let (maj, min) = ctx.compute_capability()?;
    let arch = format!("sm_{maj}{min}");
    let (driver, nv_major, nv_minor) = versions();
    let defs = defines.join("\n");
    let key = fnv(&[
        src.as_bytes(),
        arch.as_bytes(),
        &driver.to_le_bytes(),
        &nv_major.to_le_bytes(),
        &nv_minor.to_le_bytes(),
        defs.as_bytes(),
        NVRTC_OPTIONS.join(" ").as_bytes(),
    ]);
    let file = format!("{name}-{arch}-{key:016x}.cubin");
    let built = BUILT.get_or_init(Default::default);
    let remember = |bin: &Vec<u8>| {
        // Whole cubins are inserted and cloned out: a panic elsewhere cannot leave one half-made.
        built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(file.clone(), bin.clone());
    };
    if !rebuild {
        let known = built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&file)
            .cloned();
        if let Some(bin) = known {
            return Ok(bin);
        }
    }
    let path = cache_dir().and_then(usable_cache).map(|d| d.join(&file));
    if let (Some(p), false) = (&path, rebuild) {
        if let Some(bytes) = read_private(p) {
            if let Some(bin) = unseal(&file, &bytes) {
                let bin = bin.to_vec();
                remember(&bin);
                return Ok(bin);
            }
        }
    }
    let bin = compile(name, src, &arch, defines)?;
    remember(&bin);
    if let Some(p) = &path {
        // Best effort: a cache that cannot be written only costs a compile next time. A
        // temporary of its own (two engines of one process, on two GPUs of one architecture,
        // may compile the same unit at once), renamed into place once whole.
        // The file writable by its user only, whatever the umask (a group-writable entry is not
        // read back: `read_private`).
        let made = tensorzip::mapped::create_beside(p, |t| {
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            o.open(t)
        });
        if let Ok((tmp, mut f)) = made {
            use std::io::Write;
            match f.write_all(&seal(&file, &bin)) {
                Ok(()) => {
                    let _ = std::fs::rename(&tmp, p);
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }
    Ok(bin)
}

/// NVRTC's options besides the architecture and the unit's definitions (part of the cache key).
const NVRTC_OPTIONS: [&str; 2] = ["--std=c++17", "-lineinfo"];

/// The end of a cached kernel file: after the cubin, this mark, the CRC-32 of the file's name (its
/// cache key) and the cubin, and the cubin's length. A file cut short, damaged or written for
/// another key is compiled again instead of loaded: a cubin the driver accepts could still be
/// wrong bytes, and a kernel's output has no checksum of its own (a review's finding,
/// 2026-12-05; files from before the mark are compiled again once).
const SEAL: &[u8; 8] = b"tzcubin1";

/// `bin` as the cache keeps it under `name` ([`SEAL`]).
fn seal(name: &str, bin: &[u8]) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    h.update(name.as_bytes());
    h.update(bin);
    let mut out = Vec::with_capacity(bin.len() + 20);
    out.extend_from_slice(bin);
    out.extend_from_slice(SEAL);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(&(bin.len() as u64).to_le_bytes());
    out
}

/// The cubin of a cache file kept under `name`, if its seal holds.
fn unseal<'b>(name: &str, bytes: &'b [u8]) -> Option<&'b [u8]> {
    let n = bytes.len().checked_sub(20)?;
    let (bin, tail) = bytes.split_at(n);
    let len = u64::from_le_bytes(tail[12..20].try_into().ok()?);
    let crc = u32::from_le_bytes(tail[8..12].try_into().ok()?);
    let mut h = crc32fast::Hasher::new();
    h.update(name.as_bytes());
    h.update(bin);
    (!bin.is_empty() && &tail[..8] == SEAL && len == n as u64 && h.finalize() == crc).then_some(bin)
}

fn compile(name: &str, src: &str, arch: &str, defines: &[String]) -> Result<Vec<u8>> {
    let csrc = std::ffi::CString::new(src).map_err(|e| Error::Compile(e.to_string()))?;
    let cname =
        std::ffi::CString::new(format!("{name}.cu")).map_err(|e| Error::Compile(e.to_string()))?;
    let prog = nvrtc::create_program(&csrc, Some(&cname))?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
    opts.extend(defines.iter().map(|d| format!("-D{d}")));
    // SAFETY: `prog` was just created and is destroyed below, once.
    let res = unsafe { nvrtc::compile_program(prog, &opts) };
    let out = match res {
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(Error::Compile(format!("{e}: {log}")))
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; the buffer has the size NVRTC reports.
            unsafe {
                nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
                if size == 0 {
                    Err(Error::Compile(format!(
                        "NVRTC produced an empty cubin for {arch}"
                    )))
                } else {
                    let mut buf = vec![0u8; size];
                    nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _).result()?;
                    Ok(buf)
                }
            }
        }
    };
    // SAFETY: `prog` is not used after this.
    unsafe {
        let _ = nvrtc::destroy_program(prog);
    }
    out
}

/// A kernel source compiled in *units*, each on first use: unit 0 holds the source's common
/// kernels, unit `v + 1` the kernels of variant `v` (a unit size and transform), selected by the
/// macro `<macro>=-1` or `<macro>=v`. A call compiles only the variants its tensors need, and
/// several at once on parallel threads (one NVRTC program each). One program of every kernel made
/// the first `compress --gpu` of the fp32 sample on a new H200 host take 79.8 s (2.4 s in units,
/// then 7.2 s for the fp32 decoder at the first decode; docs/BENCHMARKS.md, 2026-12-01); the whole
/// decoder takes ~100 s on the 2-core development VM, one variant ~7-13 s.
pub(crate) struct Units {
    name: &'static str,
    macro_name: &'static str,
    /// Per variant: its label (in cache file names) and the names of its two kernels.
    variants: Vec<(String, [String; 2])>,
    src: std::borrow::Cow<'static, str>,
    modules: Vec<OnceLock<Arc<CudaModule>>>,
    /// Each variant's two kernels, once loaded.
    kernels: Vec<OnceLock<(CudaFunction, CudaFunction)>>,
    /// Held while compiling, so that two calls do not compile the same unit twice.
    compiling: Mutex<()>,
}

impl Units {
    /// `variants` gives each variant's label and the names of its two kernels; `src` as
    /// [`source`] returns it.
    pub(crate) fn new(
        name: &'static str,
        macro_name: &'static str,
        variants: Vec<(String, [String; 2])>,
        src: std::borrow::Cow<'static, str>,
    ) -> Units {
        Units {
            name,
            macro_name,
            modules: (0..=variants.len()).map(|_| OnceLock::new()).collect(),
            kernels: variants.iter().map(|_| OnceLock::new()).collect(),
            variants,
            src,
            compiling: Mutex::new(()),
        }
    }

    /// The module of the common kernels.
    pub(crate) fn common(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
        self.load(ctx, &[0]).map(|mut m| m.remove(0))
    }

    /// The two kernels of each of `variants`, compiling the variants not built yet together.
    pub(crate) fn kernels(
        &self,
        ctx: &Arc<CudaContext>,
        variants: &[usize],
    ) -> Result<Vec<&(CudaFunction, CudaFunction)>> {
        let loaded = |v: usize| self.kernels.get(v).and_then(|k| k.get());
        let missing: Vec<usize> = variants
            .iter()
            .copied()
            .filter(|&v| v < self.kernels.len() && loaded(v).is_none())
            .collect();
        if !missing.is_empty() {
            let units: Vec<usize> = missing.iter().map(|&v| v + 1).collect();
            for (&v, m) in missing.iter().zip(self.load(ctx, &units)?) {
                let [a, b] = &self.variants[v].1;
                let _ = self.kernels[v].set((m.load_function(a)?, m.load_function(b)?));
            }
        }
        variants
            .iter()
            .map(|&v| {
                loaded(v)
                    .ok_or_else(|| Error::Driver(format!("no kernel variant {v} of {}", self.name)))
            })
            .collect()
    }

    /// Unit `u`'s name (its cache files start with it): `NAME-common`, `NAME-LABEL`.
    fn unit_name(&self, u: usize) -> String {
        match u {
            0 => format!("{}-common", self.name),
            _ => format!("{}-{}", self.name, self.variants[u - 1].0),
        }
    }

    fn load(&self, ctx: &Arc<CudaContext>, units: &[usize]) -> Result<Vec<Arc<CudaModule>>> {
        if let Some(ms) = units
            .iter()
            .map(|&u| self.modules.get(u).and_then(|m| m.get().cloned()))
            .collect::<Option<Vec<_>>>()
        {
            return Ok(ms);
        }
        // Serialises compiles only (it guards no data): a panic while it was held leaves nothing
        // to distrust.
        let _held = self
            .compiling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut missing: Vec<usize> = units
            .iter()
            .copied()
            .filter(|&u| self.modules.get(u).is_some_and(|m| m.get().is_none()))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        let unit_name = |u: usize| self.unit_name(u);
        let defines = |u: usize| vec![format!("{}={}", self.macro_name, u as i64 - 1)];
        // The cubins in parallel (from the caches, or compiled), then loaded here; a cached cubin
        // the driver refuses (damaged on disk) is compiled again.
        let bins: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
            let handles: Vec<_> = missing
                .iter()
                .map(|&u| {
                    sc.spawn(move || cubin(ctx, &unit_name(u), &self.src, &defines(u), false))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Compile("kernel compile thread panicked".into()))
                    })
                })
                .collect()
        });
        for (&u, bin) in missing.iter().zip(bins) {
            let module = match ctx.load_module(Ptx::from_binary(bin?)) {
                Ok(m) => m,
                Err(_) => {
                    let bin = cubin(ctx, &unit_name(u), &self.src, &defines(u), true)?;
                    ctx.load_module(Ptx::from_binary(bin))?
                }
            };
            let _ = self.modules[u].set(module);
        }
        units
            .iter()
            .map(|&u| {
                self.modules
                    .get(u)
                    .and_then(|m| m.get().cloned())
                    .ok_or_else(|| Error::Compile(format!("no kernel unit {u} of {}", self.name)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// The kernel names each unit of `src` defines, by unit (`#if TZ_ALL || TZ_UNIT == k` before
    /// the line that instantiates them), read from the source text.
    fn units_of(src: &str, entry: &str) -> Vec<(i64, String)> {
        let lines: Vec<&str> = src.lines().collect();
        let mut out = Vec::new();
        for w in lines.windows(2) {
            if let Some(k) = w[0].strip_prefix("#if TZ_ALL || TZ_UNIT == ") {
                let k: i64 = k.trim().parse().unwrap();
                if let Some(rest) = w[1].strip_prefix(entry) {
                    out.push((k, rest.split([',', ')']).next().unwrap().to_string()));
                } else if let Some(i) = w[1].find(" tz_") {
                    let name = &w[1][i + 1..];
                    out.push((k, name[..name.find('(').unwrap()].to_string()));
                }
            }
        }
        out
    }

    /// A cache file is loaded only whole, undamaged and under its own name.
    #[test]
    fn cached_kernels_are_loaded_only_with_their_seal() {
        let bin: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let file = super::seal("tz_decode-2e8-sm_90-0123.cubin", &bin);
        assert_eq!(
            super::unseal("tz_decode-2e8-sm_90-0123.cubin", &file),
            Some(&bin[..])
        );
        assert_eq!(super::unseal("tz_decode-4e8-sm_90-0123.cubin", &file), None);
        for cut in [0, 1, 19, 20, file.len() - 1] {
            assert_eq!(
                super::unseal("tz_decode-2e8-sm_90-0123.cubin", &file[..cut]),
                None
            );
        }
        for at in [0, 500, bin.len(), bin.len() + 9, file.len() - 1] {
            let mut bad = file.clone();
            bad[at] ^= 4;
            assert_eq!(
                super::unseal("tz_decode-2e8-sm_90-0123.cubin", &bad),
                None,
                "{at}"
            );
        }
        // A file of the cache's old form (the bare cubin) is not taken.
        assert_eq!(super::unseal("tz_decode-2e8-sm_90-0123.cubin", &bin), None);
        assert_eq!(super::unseal("x", &super::seal("x", &[])), None);
    }

    #[test]
    fn decoder_units_are_the_kernels_of_their_index() {
        let units = units_of(crate::engine::DECODE_SRC, "ENTRY(");
        let want: Vec<(i64, String)> = crate::plan::KERNELS
            .iter()
            .enumerate()
            .map(|(k, (name, _, _))| (k as i64, name.to_string()))
            .chain([(-1, "tz_build_tables".into()), (-1, "tz_copy".into())])
            .collect();
        assert_eq!(units, want);
    }

    #[test]
    fn units_keep_their_cache_names() {
        let d = crate::engine::decode_units();
        let names: Vec<String> = (0..=7).map(|u| d.unit_name(u)).collect();
        assert_eq!(names[0], "tz_decode-common");
        assert_eq!(names[3], "tz_decode-2e8");
        assert_eq!(names[7], "tz_decode-8e11");
        assert_eq!(d.variants[4].1, ["tz_decode_4e8", "tz_decode_4e8_pair"]);
        let e = crate::encode::encode_units();
        assert_eq!(e.unit_name(5), "tz_encode-4e8");
        assert_eq!(e.variants[2].1, ["tz_hist_2e8", "tz_encode_2e8"]);
    }

    #[test]
    fn encoder_units_are_the_kernels_of_their_index() {
        let units = units_of(crate::encode::ENCODE_SRC, "ENTRIES(");
        let mut want: Vec<(i64, String)> = crate::encode::VARIANTS
            .iter()
            .enumerate()
            .map(|(k, v)| (k as i64, v.2.to_string()))
            .collect();
        want.extend(
            ["tz_place", "tz_compact", "tz_crc32", "tz_crc32_list"].map(|n| (-1, n.to_string())),
        );
        assert_eq!(units, want);
    }

    /// The kernel cache is used only where no other user can change it: a directory it creates is
    /// its user's alone; one writable by others, or under a directory writable by others without
    /// the sticky bit, is not used; a cached file writable by others is not read.
    #[cfg(unix)]
    #[test]
    fn kernel_cache_used_only_where_no_one_else_can_write() {
        use super::{read_private, usable_cache};
        use std::os::unix::fs::PermissionsExt;
        use tensorzip::mapped::only_ours_above;
        let chmod = |p: &std::path::Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode();
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("made").join("cache");
        assert_eq!(usable_cache(d.clone()), Some(d.canonicalize().unwrap()));
        assert_eq!(mode(&d) & 0o777, 0o700);
        for (m, ok) in [
            (0o777, false),
            (0o775, false),
            (0o757, false),
            (0o755, true),
        ] {
            chmod(&d, m);
            assert_eq!(usable_cache(d.clone()).is_some(), ok, "{m:o}");
        }
        chmod(&d, 0o777);
        assert!(only_ours_above(&d, false)
            .unwrap_err()
            .to_string()
            .contains("writable by other users"));
        // A directory above: writable by others is refused unless sticky (as /tmp).
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        let inner = open.join("cache");
        assert_eq!(usable_cache(inner.clone()), None);
        chmod(&open, 0o1777);
        let real = inner.canonicalize().unwrap();
        assert_eq!(usable_cache(inner.clone()), Some(real.clone()));
        // Named through a link: the cache is the resolved directory (the link could be
        // repointed after the check).
        let via = t.path().join("via");
        std::os::unix::fs::symlink(&open, &via).unwrap();
        assert_eq!(usable_cache(via.join("cache")), Some(real));
        // A cached file: read only if others cannot write it.
        let f = inner.join("x.cubin");
        std::fs::write(&f, b"bytes").unwrap();
        chmod(&f, 0o644);
        assert_eq!(read_private(&f).as_deref(), Some(&b"bytes"[..]));
        for m in [0o666, 0o664, 0o646] {
            chmod(&f, m);
            assert_eq!(read_private(&f), None, "{m:o}");
        }
    }
}
