//! The GPU encoder: a tensor in device memory becomes a blob in device memory, byte for byte the
//! blob the CPU engine writes (`docs/GPU.md`, "Encoder").
//!
//! Steps, all on the engine's stream:
//! 1. `tz_hist_*` counts the sampled blocks' planes (and the joint counts of the conditioned plane).
//! 2. The host downloads those counts (a few MiB at most: `sample_blocks` x planes x 1 KiB) and runs
//!    the core's `model_from_counts`, the same code the CPU engine runs, so the tables are identical.
//!    Table choice is a sequential search over at most `sample_blocks` histograms; it stays on the host.
//! 3. `tz_encode_*` codes every chunk (one warp each) into a scratch slot and reports its sizes.
//! 4. The host turns the sizes into offsets and the directory; `tz_compact` moves the payloads to
//!    their places in the blob, and the header, tables and directory are uploaded in front.
//!
//! Host synchronisations: one after step 1, one per wave of chunks after step 3 (a wave is as many
//! chunks as [`SCRATCH_BYTES`] of scratch holds; 1 GiB of bf16 is one wave). None per chunk.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use tensorzip::blob::{BlobHeader, ChunkEntry, PlaneMode, Scheme, SEL_CONST};
use tensorzip::encoder::{check_len, stored_header};
use tensorzip::model::{const_selector, model_from_counts, Model, Sampling};
use tensorzip::rans::log2::code_len_table;
use tensorzip::rans::table::FreqTable;
use tensorzip::{CompressOptions, DType};

use crate::engine::GpuEngine;
use crate::error::{Error, Result};

/// Source of the encoder kernels.
pub const ENCODE_SRC: &str = include_str!("../kernels/encode.cu");

/// Most scratch memory one wave of chunks may use.
pub const SCRATCH_BYTES: u64 = 1 << 30;

/// Warps (chunks) per thread block of `tz_encode_*` (`ENC_WARPS` in encode.cu).
const ENC_WARPS: u32 = 4;

/// Parameters of an encode (layout shared with `struct EncParams` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct EncParams {
    units: u64,
    blocks_per_chunk: u64,
    chunk_units: u32,
    block_units: u32,
    threshold: u32,
    cond_plane: u32,
    cond_src: u32,
    cond_value: u32,
    cond_table: u32,
    joint_plane: u32,
    joint_src: u32,
    cap_words: u32,
    slot_bytes: u64,
    off_sels: u64,
    off_coff: u64,
    off_states: u64,
    off_area: u64,
    off_csyms: u64,
    off_words: u64,
    table_base: [u32; 8],
    n_tables: [u32; 8],
}

/// What the encoder reports per chunk (layout shared with `struct ChunkOut` in encode.cu).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct ChunkOut {
    payload_len: u32,
    rans_len: u32,
    sel_len: u32,
    kept: u32,
    n_words: u32,
    nb: u32,
    pad: [u32; 2],
    modes: [u8; 8],
    values: [u8; 8],
}

// SAFETY: plain `repr(C)` structs of integers, laid out as their CUDA counterparts.
unsafe impl DeviceRepr for EncParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for ChunkOut {}
// SAFETY: all-zero bytes are a valid value of every field.
unsafe impl ValidAsZeroBits for ChunkOut {}

/// The encoder's kernels, loaded on first use.
pub(crate) struct EncodeKernels {
    _module: Arc<CudaModule>,
    hist: Vec<CudaFunction>,
    encode: Vec<CudaFunction>,
    compact: CudaFunction,
    pub(crate) crc: CudaFunction,
}

/// (unit size, exponent bits) of each kernel instantiation, and its name suffix.
const VARIANTS: [(usize, u32, &str); 7] = [
    (1, 0, "1"),
    (2, 0, "2"),
    (2, 8, "2e8"),
    (4, 0, "4"),
    (4, 8, "4e8"),
    (8, 0, "8"),
    (8, 11, "8e11"),
];

impl EncodeKernels {
    pub(crate) fn load(eng: &GpuEngine) -> Result<EncodeKernels> {
        let ctx = eng.context();
        let load = |rebuild| -> Result<_> {
            let bin = crate::compile::cubin(ctx, "tz_encode", ENCODE_SRC, rebuild)?;
            Ok(ctx.load_module(Ptx::from_binary(bin))?)
        };
        let module = match load(false) {
            Ok(m) => m,
            Err(_) => load(true)?,
        };
        let get = |n: String| module.load_function(&n);
        Ok(EncodeKernels {
            hist: VARIANTS
                .iter()
                .map(|v| get(format!("tz_hist_{}", v.2)))
                .collect::<std::result::Result<_, _>>()?,
            encode: VARIANTS
                .iter()
                .map(|v| get(format!("tz_encode_{}", v.2)))
                .collect::<std::result::Result<_, _>>()?,
            compact: get("tz_compact".into())?,
            crc: get("tz_crc32".into())?,
            _module: module,
        })
    }
}

/// A blob in device memory: its first `len` bytes of `buf`.
pub struct DeviceBlob {
    pub buf: CudaSlice<u8>,
    pub len: usize,
}

/// The encoder's view of the model: every table as (frequency | cumulative << 16) and code lengths
/// per symbol, and per plane where its tables start.
struct DeviceTables {
    fcs: Vec<u32>,
    cls: Vec<u32>,
    info: Vec<u32>,
    const_sel: Vec<u8>,
}

impl DeviceTables {
    fn push(&mut self, t: &FreqTable) {
        let cl = code_len_table();
        let cum = t.cumulative();
        for (&f, &c) in t.freq.iter().zip(&cum) {
            let f = f as u32;
            self.fcs.push(f | c << 16);
            // Code lengths are below 12 << 16; absent symbols are marked u32::MAX.
            self.cls.push(if f == 0 {
                u32::MAX
            } else {
                cl[f as usize] as u32
            });
        }
        self.info.push(if t.is_single() {
            1 << 31 | t.single_symbol() as u32
        } else {
            0
        });
    }
}

fn variant(dtype: DType) -> Result<usize> {
    let us = dtype.unit_size();
    let e = match dtype.transform() {
        tensorzip::dtype::Transform::Identity => 0,
        tensorzip::dtype::Transform::SignBelowExponent { exp_bits } => exp_bits,
    };
    VARIANTS
        .iter()
        .position(|&(u, x, _)| u == us && x == e)
        .ok_or_else(|| Error::Unsupported(format!("no encoder kernel for {dtype}")))
}

impl GpuEngine {
    /// Compresses a tensor held on the host: uploads it, encodes it on the GPU and downloads the
    /// blob. The bytes equal [`tensorzip::CpuEngine::compress`]'s.
    pub fn compress_host(
        &self,
        data: &[u8],
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<Vec<u8>> {
        let s = self.stream();
        let dev = s.clone_htod(if data.is_empty() { &[0u8][..] } else { data })?;
        let blob = {
            let (p, _g) = dev.device_ptr(s);
            // SAFETY: `dev` holds `data.len()` bytes (at least one) and outlives the call, which
            // waits for its work before returning.
            unsafe { self.compress_device(p, data.len(), dtype, shape, opts)? }
        };
        Ok(s.clone_dtoh(&blob.buf.slice(0..blob.len))?)
    }

    /// Compresses the tensor of `nbytes` bytes at device address `data` into a blob in device
    /// memory. The work runs on the engine's stream; the call returns when the blob is complete.
    ///
    /// # Safety
    /// `data` must be a valid device address of `nbytes` readable bytes in this engine's context,
    /// not written by anyone until this returns.
    pub unsafe fn compress_device(
        &self,
        data: u64,
        nbytes: usize,
        dtype: DType,
        shape: &[u64],
        opts: &CompressOptions,
    ) -> Result<DeviceBlob> {
        opts.validate()?;
        check_len(nbytes as u64, dtype, shape)?;
        let s = self.stream().clone();
        let us = dtype.unit_size();
        if nbytes == 0 || nbytes < opts.min_compress_bytes {
            // SAFETY: forwarded from the caller.
            return unsafe { self.stored_blob(data, nbytes, dtype, shape) };
        }
        // The kernels load whole units: an unaligned tensor is copied to an aligned buffer first.
        let aligned;
        let data = if data % us as u64 != 0 {
            let mut tmp = s.alloc_zeros::<u8>(nbytes)?;
            {
                let (tp, _g) = tmp.device_ptr_mut(&s);
                // SAFETY: both ranges hold `nbytes` bytes (the source by the caller's promise).
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(tp, data, nbytes, s.cu_stream())?;
                }
            }
            aligned = tmp;
            aligned.device_ptr(&s).0
        } else {
            data
        };
        let k = self.encode_kernels()?;
        let v = variant(dtype)?;
        // TENSORZIP_GPU_TRACE=1 prints the time of each step (synchronising after each).
        let tracing = std::env::var_os("TENSORZIP_GPU_TRACE").is_some();
        let t0 = std::time::Instant::now();
        let trace = |what: &str| {
            if tracing {
                let _ = s.synchronize();
                eprintln!(
                    "gpu encode {nbytes} B: {what} at {:.3} ms",
                    t0.elapsed().as_secs_f64() * 1e3
                );
            }
        };
        let header = BlobHeader {
            scheme: Scheme::Planes,
            dtype,
            shape: shape.to_vec(),
            chunk_units: (opts.chunk_bytes / us) as u32,
            block_units: opts.block_units,
        };
        let sampling = Sampling::new(&header, opts);
        let mut p = EncParams {
            units: sampling.units,
            blocks_per_chunk: sampling.blocks_per_chunk,
            chunk_units: header.chunk_units,
            block_units: header.block_units,
            threshold: opts.threshold_q16() as u32,
            cond_plane: 255,
            cond_src: 255,
            joint_plane: 255,
            joint_src: 255,
            ..Default::default()
        };
        if let (true, Some((cp, cq))) = (opts.condition, dtype.conditioned_plane()) {
            p.joint_plane = cp as u32;
            p.joint_src = cq as u32;
        }

        // 1. Counts of the sampled blocks.
        let n_picks = sampling.picks.len();
        let picks = s.clone_htod(&sampling.picks)?;
        let mut hists = s.alloc_zeros::<u32>(n_picks * us * 256)?;
        let mut joint = s.alloc_zeros::<u32>(65536)?;
        let params = s.clone_htod(&[p])?;
        {
            let mut b = s.launch_builder(&k.hist[v]);
            b.arg(&data)
                .arg(&params)
                .arg(&picks)
                .arg(&mut hists)
                .arg(&mut joint);
            let cfg = LaunchConfig {
                grid_dim: (n_picks as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `tz_hist_*`; the picks are blocks of the tensor, so every
            // unit read lies inside `data`'s `nbytes` bytes; `hists` holds n_picks x U x 256 counts.
            unsafe { b.launch(cfg) }?;
        }
        let counts = s.clone_dtoh(&hists)?;
        trace("sample counts");
        let counts: Vec<[u32; 256]> = counts
            .chunks_exact(256)
            .map(|c| c.try_into().expect("256 counts"))
            .collect();
        // 2. The model, by the CPU engine's own code.
        let mut joint_err = None;
        let model = model_from_counts(&header, opts, &sampling, &counts, |_, _| {
            match s.clone_dtoh(&joint) {
                Ok(j) => j,
                Err(e) => {
                    joint_err = Some(e);
                    vec![0; 65536]
                }
            }
        });
        if let Some(e) = joint_err {
            return Err(e.into());
        }
        drop((hists, joint, picks));
        trace("model");
        let tables = self.device_tables(&model, dtype, &mut p);
        let mut prefix = Vec::new();
        header.write(&mut prefix);
        model.write_tables(&mut prefix);

        // Scratch slots, sized for the longest chunk.
        let cmax = (header.chunk_units as u64).min(sampling.units);
        let nbmax = cmax.div_ceil(header.block_units as u64);
        let r16 = |x: u64| x.div_ceil(16) * 16;
        let u = us as u64;
        p.off_sels = 0;
        p.off_coff = r16(u * nbmax);
        p.off_states = p.off_coff + r16(4 * (nbmax + 1));
        p.off_area = p.off_states + 128;
        p.off_csyms = p.off_area + r16(cmax * u + 64);
        p.off_words = p.off_csyms + r16(cmax + 64);
        p.cap_words = (cmax * u / 2 + 1) as u32;
        p.slot_bytes = p.off_words + r16(2 * p.cap_words as u64);
        let n = header.n_chunks();
        let wave = (SCRATCH_BYTES / p.slot_bytes).clamp(1, n);

        let params = s.clone_htod(&[p])?;
        let fcs = s.clone_htod(&tables.fcs)?;
        let cls = s.clone_htod(&tables.cls)?;
        let info = s.clone_htod(&tables.info)?;
        let const_sel = s.clone_htod(&tables.const_sel)?;
        let mut scratch = s.alloc_zeros::<u8>((wave * p.slot_bytes) as usize)?;
        let mut outs = s.alloc_zeros::<ChunkOut>(wave as usize)?;
        let mut offsets = s.alloc_zeros::<u64>(wave as usize)?;
        let entry_len = header.dir_entry_len();
        let head_len = prefix.len() + n as usize * entry_len;
        let cap = head_len + nbytes;
        // SAFETY: plain bytes; everything below the returned length is written before it is read.
        let mut blob = unsafe { s.alloc::<u8>(cap) }?;
        let mut dir = Vec::with_capacity(n as usize * entry_len);
        let mut total = head_len as u64;

        // 3-4. Waves of chunks: encode, sizes to the host, compaction.
        let mut c0 = 0u64;
        while c0 < n {
            let cnt = wave.min(n - c0) as u32;
            {
                let mut b = s.launch_builder(&k.encode[v]);
                b.arg(&data)
                    .arg(&params)
                    .arg(&fcs)
                    .arg(&cls)
                    .arg(&info)
                    .arg(&const_sel)
                    .arg(&mut scratch)
                    .arg(&mut outs)
                    .arg(&c0)
                    .arg(&cnt);
                let cfg = LaunchConfig {
                    grid_dim: (cnt.div_ceil(ENC_WARPS), 1, 1),
                    block_dim: (32 * ENC_WARPS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: arguments match `tz_encode_*`; chunks c0..c0+cnt lie inside the tensor,
                // and each writes only its own slot of `scratch` (cnt slots) and its `outs` entry.
                unsafe { b.launch(cfg) }?;
            }
            let got = s.clone_dtoh(&outs.slice(0..cnt as usize))?;
            let mut offs = Vec::with_capacity(cnt as usize);
            for (i, o) in got.iter().enumerate() {
                let c = c0 + i as u64;
                let len = header.chunk_len(c) as u64 * u;
                let sum = o.sel_len as u64 + o.rans_len as u64 + o.kept as u64;
                if o.payload_len as u64 != sum
                    || o.payload_len as u64 > len
                    || (o.rans_len != 0 && o.rans_len != 128 + 2 * o.n_words)
                    || o.n_words > p.cap_words
                {
                    return Err(Error::Driver(format!(
                        "encoder kernel reported inconsistent sizes for chunk {c}: {o:?}"
                    )));
                }
                offs.push(total);
                total += o.payload_len as u64;
                let mut modes = [PlaneMode::Raw; 8];
                for (q, m) in modes.iter_mut().enumerate().take(us) {
                    *m = match o.modes[q] {
                        0 => PlaneMode::Raw,
                        1 => PlaneMode::Const(o.values[q]),
                        2 => PlaneMode::Blocks,
                        _ => PlaneMode::Cond,
                    };
                }
                ChunkEntry {
                    payload_len: o.payload_len,
                    rans_len: o.rans_len,
                    modes,
                }
                .write(us, &mut dir);
            }
            if total > cap as u64 {
                return Err(Error::Driver(
                    "encoded chunks exceed the blob buffer".into(),
                ));
            }
            s.memcpy_htod(&offs, &mut offsets.slice_mut(0..cnt as usize))?;
            {
                let mut b = s.launch_builder(&k.compact);
                b.arg(&scratch)
                    .arg(&params)
                    .arg(&outs)
                    .arg(&offsets)
                    .arg(&mut blob)
                    .arg(&cnt);
                let cfg = LaunchConfig {
                    grid_dim: (cnt, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: arguments match `tz_compact`; each chunk's payload goes to
                // offsets[i]..offsets[i] + payload_len, inside `blob` (checked above).
                unsafe { b.launch(cfg) }?;
            }
            c0 += cnt as u64;
        }
        trace("chunks");
        let stored_len = stored_header(dtype, shape).encoded_len() + nbytes;
        if total >= stored_len as u64 {
            // SAFETY: forwarded from the caller.
            return unsafe { self.stored_blob(data, nbytes, dtype, shape) };
        }
        prefix.extend_from_slice(&dir);
        s.memcpy_htod(&prefix, &mut blob.slice_mut(0..prefix.len()))?;
        s.synchronize()?;
        trace("done");
        Ok(DeviceBlob {
            buf: blob,
            len: total as usize,
        })
    }

    /// A stored blob of the `nbytes` bytes at `data`.
    ///
    /// # Safety
    /// As [`GpuEngine::compress_device`].
    unsafe fn stored_blob(
        &self,
        data: u64,
        nbytes: usize,
        dtype: DType,
        shape: &[u64],
    ) -> Result<DeviceBlob> {
        let s = self.stream();
        let mut head = Vec::new();
        stored_header(dtype, shape).write(&mut head);
        let len = head.len() + nbytes;
        let mut buf = s.alloc_zeros::<u8>(len)?;
        s.memcpy_htod(&head, &mut buf.slice_mut(0..head.len()))?;
        if nbytes > 0 {
            let (bp, _g) = buf.device_ptr_mut(s);
            // SAFETY: the destination holds `len` bytes; the source `nbytes` (caller's promise).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    bp + head.len() as u64,
                    data,
                    nbytes,
                    s.cu_stream(),
                )?;
            }
        }
        s.synchronize()?;
        Ok(DeviceBlob { buf, len })
    }

    /// The model's tables in the encoder kernel's form; fills the table fields of `p`.
    fn device_tables(&self, model: &Model, dtype: DType, p: &mut EncParams) -> DeviceTables {
        let mut t = DeviceTables {
            fcs: Vec::new(),
            cls: Vec::new(),
            info: Vec::new(),
            const_sel: vec![SEL_CONST; 8 * 256],
        };
        for (q, pm) in model.planes.iter().enumerate() {
            p.table_base[q] = t.info.len() as u32;
            p.n_tables[q] = pm.tables.len() as u32;
            for tab in &pm.tables {
                t.push(tab);
            }
            for v in 0..256 {
                t.const_sel[q * 256 + v] = const_selector(v as u8, &pm.tables);
            }
            if let Some((value, tab)) = &pm.cond {
                let (_, src) = dtype.conditioned_plane().expect("a conditioned plane");
                p.cond_plane = q as u32;
                p.cond_src = src as u32;
                p.cond_value = *value as u32;
                p.cond_table = t.info.len() as u32;
                t.push(tab);
            }
        }
        if t.info.is_empty() {
            // Kernels take non-empty arrays.
            t.fcs.resize(256, 0);
            t.cls.resize(256, u32::MAX);
            t.info.push(0);
        }
        t
    }
}
