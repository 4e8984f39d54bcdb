//! Kernels are `.cu` sources compiled at run time with NVRTC, straight to a cubin for the device's
//! architecture (sm_90 on Hopper), once per process, and cached on disk keyed by the source, the
//! architecture and the driver and NVRTC versions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::CudaContext;
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
pub fn cubin(ctx: &CudaContext, name: &str, src: &str, rebuild: bool) -> Result<Vec<u8>> {
    let (maj, min) = ctx.compute_capability()?;
    let arch = format!("sm_{maj}{min}");
    let (driver, nv_major, nv_minor) = versions();
    let key = fnv(&[
        src.as_bytes(),
        arch.as_bytes(),
        &driver.to_le_bytes(),
        &nv_major.to_le_bytes(),
        &nv_minor.to_le_bytes(),
    ]);
    let file = format!("{name}-{arch}-{key:016x}.cubin");
    let built = BUILT.get_or_init(Default::default);
    let remember = |bin: &Vec<u8>| {
        if let Ok(mut m) = built.lock() {
            m.insert(file.clone(), bin.clone());
        }
    };
    if !rebuild {
        if let Some(bin) = built.lock().ok().and_then(|m| m.get(&file).cloned()) {
            return Ok(bin);
        }
    }
    let path = cache_dir().map(|d| d.join(&file));
    if let (Some(p), false) = (&path, rebuild) {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                remember(&bytes);
                return Ok(bytes);
            }
        }
    }
    let bin = compile(name, src, &arch)?;
    remember(&bin);
    if let Some(p) = &path {
        // Best effort: a cache that cannot be written only costs a compile next time.
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &bin).is_ok() {
                    let _ = std::fs::rename(&tmp, p);
                }
            }
        }
    }
    Ok(bin)
}

fn compile(name: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    let csrc = std::ffi::CString::new(src).map_err(|e| Error::Compile(e.to_string()))?;
    let cname =
        std::ffi::CString::new(format!("{name}.cu")).map_err(|e| Error::Compile(e.to_string()))?;
    let prog = nvrtc::create_program(&csrc, Some(&cname))?;
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-lineinfo".to_string(),
    ];
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
