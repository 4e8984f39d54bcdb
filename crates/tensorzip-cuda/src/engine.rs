//! The GPU engine: a CUDA context, a stream and the compiled kernels; batch decoding of blobs.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use rayon::prelude::*;
use tensorzip::blob::{BlobLayout, PrefixStep};
use tensorzip::Tensor;

use crate::error::{Error, Result};
use crate::plan::{ChunkDesc, Job, Plan, TensorDesc, KERNELS, RING_STASH_BYTES};

/// How many first bytes of a device-resident blob of `len` bytes [`GpuEngine::read_layouts`] reads
/// back at first: 4 KiB, plus one byte for every 4096 of the blob — the directory of a default
/// blob (128 KiB chunks) is ~1/7000 of it for bf16 (1 GiB: a 99,909-byte prefix in a 705 MB
/// blob) and ~1/5400 for fp32, so most blobs take one round (a second read and a launch cost more
/// than the extra bytes); one whose prefix is longer (small chunks, or planes that code to almost
/// nothing) takes another round for itself.
pub fn first_prefix_read(len: usize) -> usize {
    len.min((1 << 12) + len / 4096)
}

/// Rounds of reads [`GpuEngine::read_layouts`] allows a blob: the first, the doubling guesses
/// while its header and tables are not in (from 64 KiB, at most ~48 for any length a `usize`
/// holds), and the exact one.
const MAX_PREFIX_ROUNDS: usize = 64;

/// Source of the decoder kernel.
pub const DECODE_SRC: &str = concat!(
    include_str!("../kernels/smem.cuh"),
    include_str!("../kernels/decode.cu")
);

/// The decoder's compile units: one per [`KERNELS`] entry (labelled by the name after
/// `tz_decode_`), its kernels one and two warps per chunk.
pub(crate) fn decode_units() -> crate::compile::Units {
    let variants = KERNELS
        .iter()
        .map(|(n, _, _)| {
            let label = n.trim_start_matches("tz_decode_").to_string();
            (label, [n.to_string(), format!("{n}_pair")])
        })
        .collect();
    crate::compile::Units::new(
        "tz_decode",
        "TZ_UNIT",
        variants,
        crate::compile::source("tz_decode", DECODE_SRC),
    )
}

/// Lets `f` launch with as much dynamic shared memory as the device leaves it (the per-block
/// limit `smem_limit` less `f`'s static shared memory, 0 where that is all of it), checks that
/// `need` bytes fit, and returns that room (a caller sizing its launch by the room passes 0). The
/// attribute is one setting per function for the whole process: set to each launch's own size,
/// two threads launching one kernel with different sizes (decodes of different tensors, or the
/// encoder's counting step with and without its joint counts in shared memory) could lower it
/// under the other's launch, which then failed (a review's finding, 2026-12-05). Everyone sets the
/// same maximum, so it never changes once set; a launch's occupancy still follows the dynamic
/// shared memory it asks for.
pub(crate) fn allow_dynamic_smem(
    f: &cudarc::driver::CudaFunction,
    smem_limit: u32,
    need: u64,
) -> Result<u64> {
    let most = (smem_limit as u64).saturating_sub(f.shared_size_bytes()?.max(0) as u64);
    if need > most {
        return Err(Error::Unsupported(format!(
            "a launch of {need} bytes of dynamic shared memory, where the device leaves {most}"
        )));
    }
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        most as i32,
    )?;
    Ok(most)
}

/// What a decode block leaves of the device's per-block shared memory ([`Shared::smem_limit`]) for
/// the kernels' static shared memory (`cache`, `merge_sel`, `sync_words`, `pair_tab` in
/// `kernels/decode.cu`: ~680 bytes) and the driver: its dynamic shared memory is at most the
/// limit less this — 220 KiB on Hopper (227 KiB), the figure every decoder measurement in
/// docs/BENCHMARKS.md ran with.
const DECODE_SMEM_RESERVE: u32 = 7 * 1024;
/// The decoder's dynamic shared memory on an H100 / H200, for the tests of the launch shapes.
#[cfg(test)]
const HOPPER_DECODE_SMEM: u32 = 227 * 1024 - DECODE_SMEM_RESERVE;
/// Tables a block's cache in shared memory holds at least (compact form: 4096 + 1024 bytes each):
/// launches whose tensors have no more keep the shared-memory shapes measured with it.
const CACHE_TABLES: u32 = 10;
/// Tables a block's cache holds at most (`MAX_CACHED` in `kernels/decode.cu`). A launch whose
/// tensors have more than [`CACHE_TABLES`] caches as many as its largest one has, up to this: a
/// table left out is read from global memory by the general step loop in every block that uses
/// it. all-MiniLM-L6-v2 fp32's word embedding has 13 (2 + 2 + 8 block tables of planes 0, 1 and
/// 3, and the conditional table of plane 2); with 10 its conditional table and two exponent
/// tables were left out, in 358 of the model's 770 chunks.
const MAX_CACHE_TABLES: u32 = 16;
/// Shared memory of a table cache of `tables` tables, plus the slack the kernel uses to align it to
/// 4096 bytes (`ALIGN_SLACK` in `kernels/decode.cu`).
const fn cache_bytes(tables: u32) -> u32 {
    tables * (4096 + 1024) + 4096
}
/// Most warps of a decode block: the kernels' launch bounds (`__launch_bounds__(512)` in
/// `kernels/decode.cu`).
const DECODE_WARPS: u32 = 16;

/// A plan in device memory, ready to launch (again and again).
pub struct DevicePlan {
    groups: Vec<DeviceGroup>,
    /// The plan's small arrays — chunk and tensor descriptors, table information, the tables'
    /// frequencies, the small copies and the error word — in one device buffer, uploaded with
    /// one copy (they were six or more synchronous copies: a third of a small model's decode call).
    _buf: CudaSlice<u8>,
    /// Device addresses inside `_buf`.
    tensors: u64,
    info: u64,
    pairs: u64,
    err: u64,
    copies: u64,
    /// Stored blobs copied by `tz_copy` (at most [`KERNEL_COPY_MAX`] bytes each).
    n_copies: u32,
    tables: CudaSlice<u32>,
    /// Stored blobs larger than [`KERNEL_COPY_MAX`]: one copy-engine copy each.
    large_copies: Vec<crate::plan::Copy>,
    /// The error word holds its initial value (uploaded with the plan, not launched since):
    /// the first launch need not reset it.
    err_reset: bool,
    /// The stream the plan was uploaded on, which frees its buffers when it is dropped. A launch
    /// on another stream (an engine from [`GpuEngine::on_stream`]) first waits for this one, and
    /// this one then waits for the launch: the descriptors are read after their upload, freed
    /// after the launch, and [`GpuEngine::check`] reads the error word after it.
    stream: Arc<CudaStream>,
}

/// Stored blobs up to this size are copied by the `tz_copy` kernel, all in one launch; larger ones
/// by the copy engine (one call each, which pays for itself at this size).
const KERNEL_COPY_MAX: u64 = 1 << 20;

/// Plain `repr(C)` values without padding, which may be uploaded as bytes.
///
/// # Safety
/// Implementors must have no padding bytes and no invalid bit patterns.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: integers.
unsafe impl Plain for u8 {}
// SAFETY: integers.
unsafe impl Plain for u16 {}
// SAFETY: integers.
unsafe impl Plain for u32 {}
// SAFETY: integers.
unsafe impl Plain for u64 {}
// SAFETY: `repr(C)`: two u64, six u32, two [u8; 8] (56 bytes, no padding).
unsafe impl Plain for ChunkDesc {}
// SAFETY: `repr(C)`: u32 fields and arrays only.
unsafe impl Plain for TensorDesc {}
// SAFETY: `repr(C)`: three u64.
unsafe impl Plain for crate::plan::Copy {}

/// The host image of small arrays to upload (a plan's descriptors, copy lists), each at a 16-byte
/// aligned offset, written straight into the engine's page-locked small-transfer buffer
/// ([`GpuEngine::upload_staged`]): a 1 GiB tensor's plan is ~460 KB, which went through a fresh
/// vector and a second copy before.
pub(crate) struct Staging<'a> {
    buf: &'a mut [u8],
    len: usize,
    /// Set when a write did not fit `buf` (nothing is written past it; the upload then fails).
    overflow: bool,
}

impl Staging<'_> {
    /// Pads to the next 16-byte boundary and returns it: where values appended from now on start.
    fn align(&mut self) -> usize {
        let at = self.len.div_ceil(16) * 16;
        match self.buf.get_mut(self.len..at) {
            Some(pad) => {
                pad.fill(0);
                self.len = at;
            }
            None => self.overflow = true,
        }
        at
    }

    /// Appends one value (after [`Staging::align`], as part of an array).
    fn push_one<T: Plain>(&mut self, v: &T) {
        self.push_bytes(std::slice::from_ref(v));
    }

    /// Appends the bytes of `v` where the staged bytes end.
    fn push_bytes<T: Plain>(&mut self, v: &[T]) {
        // SAFETY: `T: Plain` has no padding, so all `size_of_val(v)` bytes are initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
        };
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflow = true,
        }
    }

    /// Appends `v` and returns its offset.
    pub(crate) fn push<T: Plain>(&mut self, v: &[T]) -> usize {
        let at = self.align();
        self.push_bytes(v);
        at
    }
}

/// Bytes a [`Staging`] needs for `n` values of `T` pushed as one array (its alignment included).
pub(crate) fn staged_len<T>(n: usize) -> usize {
    n * std::mem::size_of::<T>() + 15
}

/// Writes into device memory collected from the host and run together: byte strings from the host
/// (`put`) and device-to-device copies (`copy`). `flush` uploads the strings and the copy list in one
/// copy and runs one `tz_copy` launch (copies over [`KERNEL_COPY_MAX`] go to the copy engine). The
/// encoder writes each blob's head and each stored blob this way: they were a synchronous copy call
/// or two per blob (MiniLM: 104 blobs).
#[derive(Default)]
pub(crate) struct DeviceWrites {
    bytes: Vec<u8>,
    /// (offset in `bytes`, length, destination address).
    puts: Vec<(usize, usize, u64)>,
    /// Device copies: (source, destination, length).
    copies: Vec<(u64, u64, u64)>,
}

impl DeviceWrites {
    /// Queues writing `v` at device address `dst`.
    pub(crate) fn put(&mut self, v: &[u8], dst: u64) {
        self.puts.push((self.bytes.len(), v.len(), dst));
        self.bytes.extend_from_slice(v);
    }

    /// Queues copying `len` bytes from device address `src` to `dst`.
    pub(crate) fn copy(&mut self, src: u64, dst: u64, len: u64) {
        if len > 0 {
            self.copies.push((src, dst, len));
        }
    }

    /// Queues everything on the engine's stream. The returned buffer holds what the launch reads:
    /// keep it alive until the stream has run it.
    ///
    /// # Safety
    /// Every destination must be writable and every source readable device memory of the engine's
    /// context, alive until the stream has run the writes; destinations must not overlap.
    pub(crate) unsafe fn flush(self, eng: &GpuEngine) -> Result<Option<CudaSlice<u8>>> {
        let s = eng.stream();
        let mut descs = Vec::with_capacity(self.puts.len() + self.copies.len());
        let mut large = Vec::new();
        for &(src, dst, len) in &self.copies {
            if len <= KERNEL_COPY_MAX {
                descs.push(crate::plan::Copy {
                    from: src,
                    to: dst,
                    len,
                });
            } else {
                large.push((src, dst, len));
            }
        }
        let staged = if self.puts.is_empty() && descs.is_empty() {
            None
        } else {
            let n = self.puts.len() + descs.len();
            // The strings, then the descriptors, whose sources point into the same buffer.
            let cap = staged_len::<u8>(self.bytes.len()) + staged_len::<crate::plan::Copy>(n);
            let (buf, descs_at) = eng.upload_staged(cap, |st, base| {
                let bytes_at = st.push(&self.bytes);
                let mut all: Vec<crate::plan::Copy> = self
                    .puts
                    .iter()
                    .map(|&(off, len, dst)| crate::plan::Copy {
                        from: base + (bytes_at + off) as u64,
                        to: dst,
                        len: len as u64,
                    })
                    .collect();
                all.extend_from_slice(&descs);
                Ok(st.push(&all))
            })?;
            let base = buf.device_ptr(s).0;
            // SAFETY: `n` descriptors with absolute addresses: sources in `buf` or the caller's
            // readable memory, destinations the caller's writable memory.
            unsafe { eng.launch_copies(base + descs_at as u64, n as u32, 0, 0) }?;
            Some(buf)
        };
        for &(src, dst, len) in &large {
            // SAFETY: the caller's promise.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst, src, len as usize, s.cu_stream())?;
            }
        }
        Ok(staged)
    }
}

struct DeviceGroup {
    kernel: usize,
    /// Two warps per chunk, a decoding and a merging one (`DecodeLayout`).
    split: bool,
    /// Device address of the group's chunk descriptors (inside the plan's buffer).
    chunks: u64,
    scratch: Option<CudaSlice<u8>>,
    n: u32,
    warps: u32,
    smem: u32,
    per_warp: u32,
    n_slots: u32,
    slot_units: u32,
    /// Tables each block caches (the kernel's `cache_tables`).
    cache_tables: u32,
}

/// The value of `TENSORZIP_GPU_TRACE` (`None`: no tracing), read here only.
pub(crate) fn trace_mode() -> Option<String> {
    std::env::var("TENSORZIP_GPU_TRACE").ok()
}

/// With `TENSORZIP_GPU_TRACE=1`, a function that prints the time since its creation at each step it
/// is called with, after waiting for the stream (the host's time before the wait too). With
/// `TENSORZIP_GPU_TRACE=events` it does not wait: it records an event on the stream at each step
/// and, when dropped (the caller's work done), prints for each step the host's time and the
/// stream's (the step's event, from an event recorded at creation) — where an untraced call
/// waits. With `TENSORZIP_GPU_TRACE=host` it only notes the host's time at each step and prints
/// them when dropped: no event and no wait, so the call runs as untraced and the notes say when the
/// host queued each step (the GPU idles until its first launch). Otherwise it does nothing.
pub(crate) fn step_tracer(s: &CudaStream, label: String) -> impl Fn(&str) + '_ {
    let mode = trace_mode();
    let events = mode.as_deref() == Some("events");
    let host_only = mode.as_deref() == Some("host");
    let tracing = mode.is_some() && !events && !host_only;
    let t0 = std::time::Instant::now();
    let log = EventLog {
        s,
        label: label.clone(),
        t0,
        start: if events { record_timed(s) } else { None },
        host_only,
        steps: std::cell::RefCell::new(Vec::new()),
    };
    move |what: &str| {
        if tracing {
            let host = t0.elapsed().as_secs_f64() * 1e3;
            let _ = s.synchronize();
            eprintln!(
                "{label}: {what} at {:.3} ms (host at {host:.3} ms)",
                t0.elapsed().as_secs_f64() * 1e3
            );
        } else if log.start.is_some() || log.host_only {
            let host = t0.elapsed().as_secs_f64() * 1e3;
            let ev = if log.host_only { None } else { record_timed(s) };
            log.steps.borrow_mut().push((what.to_string(), ev, host));
        }
    }
}

/// An event with timing recorded on `s` now (`None` if the driver refuses: the trace then omits it).
fn record_timed(s: &CudaStream) -> Option<cudarc::driver::CudaEvent> {
    s.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .ok()
}

/// The steps of an event trace (`TENSORZIP_GPU_TRACE=events`), printed when dropped.
struct EventLog<'a> {
    s: &'a CudaStream,
    label: String,
    t0: std::time::Instant,
    start: Option<cudarc::driver::CudaEvent>,
    /// `TENSORZIP_GPU_TRACE=host`: host times only.
    host_only: bool,
    steps: std::cell::RefCell<Vec<(String, Option<cudarc::driver::CudaEvent>, f64)>>,
}

impl Drop for EventLog<'_> {
    fn drop(&mut self) {
        if self.host_only {
            let steps = self.steps.borrow();
            let line: Vec<String> = steps
                .iter()
                .map(|(what, _, host)| format!("{what} {host:.3}"))
                .collect();
            eprintln!("{} (host ms): {}", self.label, line.join(", "));
            return;
        }
        let Some(start) = &self.start else {
            return;
        };
        let _ = self.s.synchronize();
        for (what, ev, host) in self.steps.borrow().iter() {
            let gpu = ev
                .as_ref()
                .and_then(|e| start.elapsed_ms(e).ok())
                .map_or("?".to_string(), |ms| format!("{ms:.3}"));
            eprintln!("{}: {what}: host {host:.3} ms, stream {gpu} ms", self.label);
        }
        eprintln!(
            "{}: dropped at host {:.3} ms",
            self.label,
            self.t0.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// The chunks laid out in blocks of `warps` that each hold chunks of one tensor only (empty
/// chunks fill the gaps; the kernel skips them), handed to `emit` in order; returns how many.
fn pad_blocks(chunks: &[ChunkDesc], warps: usize, mut emit: impl FnMut(&ChunkDesc)) -> usize {
    let mut n = 0usize;
    let mut last: Option<ChunkDesc> = None;
    for c in chunks {
        let fill = n % warps;
        if let Some(prev) = last.filter(|p| fill != 0 && p.tensor != c.tensor) {
            let pad = ChunkDesc {
                len: 0,
                payload_len: 0,
                rans_len: 0,
                sel_len: 0,
                ..prev
            };
            for _ in fill..warps {
                emit(&pad);
                n += 1;
            }
        }
        emit(c);
        n += 1;
        last = Some(*c);
    }
    n
}

/// How many chunks [`pad_blocks`] hands out for tensors of `runs` chunks ([`tensor_runs`]): every
/// tensor but the last is rounded up to whole blocks of `warps`.
fn padded_len(runs: &[usize], warps: usize) -> usize {
    let w = warps.max(1);
    match runs.split_last() {
        Some((last, rest)) => rest.iter().map(|r| r.div_ceil(w) * w).sum::<usize>() + last,
        None => 0,
    }
}

/// The number of chunks of each tensor, in order (`chunks` hold each tensor's chunks together).
fn tensor_runs(chunks: &[ChunkDesc]) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=chunks.len() {
        if i == chunks.len() || chunks[i].tensor != chunks[start].tensor {
            runs.push(i - start);
            start = i;
        }
    }
    runs
}

/// The block width (chunks per thread block) of a two-warp launch that spreads tensors of `runs`
/// chunks ([`tensor_runs`]) over the SMs: the narrowest width, up to `most`, whose blocks (each
/// of one tensor's chunks: see [`pad_blocks`]) number at most `sms`, so that each SM runs one
/// block and as few decoding warps as the launch allows. `None` when even `most` needs more
/// blocks than SMs.
///
/// Why: a two-warp launch lasts as long as its slowest chunk's dependent chain, and the chains of
/// the decoding warps that share an SM's schedulers slow each other. The width that was used
/// before — the average chunks per tensor, up to 8 — put all-MiniLM-L6-v2's ~360 bf16 chunks in
/// ~71 blocks of 8 on 71 of the H200's 132 SMs (two decoding warps per scheduler), the other 61
/// idle; width 3 gives ~120 blocks of at most 3 chunks.
fn spread_width(runs: &[usize], most: u32, sms: u32) -> Option<u32> {
    (1..=most.max(1)).find(|&w| {
        let blocks: usize = runs.iter().map(|r| r.div_ceil(w as usize)).sum();
        blocks <= sms as usize
    })
}

/// [`DecodeLayout::Auto`]'s choice for a launch of tensors of `runs` chunks ([`tensor_runs`]) with
/// `per_warp` bytes of buffers per chunk and warp: two warps per chunk when the launch has at most
/// [`SPLIT_MAX_CHUNKS_PER_SM`] chunks per SM and (with `spread`) fits one wave of one two-warp
/// block per SM ([`spread_width`]). A second wave doubles a two-warp launch's time, while one
/// warp per chunk holds twice the chunks per SM: all-MiniLM-L6-v2 fp32's 770 chunks (two-warp
/// blocks of at most 4 chunks) decoded at 92.8 GB/s in two waves of two-warp blocks and 109.5 in
/// one wave of one-warp blocks (kernel, H200, 2026-12-01); bf16 launches of 1024 and 1536 chunks
/// (one tensor) went 236 → 327 and 343 → 262 GB/s from one to two warps (2026-11-30), as this
/// rule says. The caller checks that two buffers per chunk fit at all.
fn auto_two_warps(runs: &[usize], per_warp: u32, room: u32, sms: u32, spread: bool) -> bool {
    let chunks: usize = runs.iter().sum();
    chunks as u64 <= SPLIT_MAX_CHUNKS_PER_SM as u64 * sms as u64
        && (!spread
            || spread_width(runs, most_in_shared(per_warp, 2, DECODE_WARPS, room), sms).is_some())
}

/// The chunks a block can take when each has `nbuf` buffers of `per_warp` bytes in shared memory
/// besides its ring and stash, in `room` bytes (the block's shared memory less its table cache),
/// with at most `max_warps` warps per block ([`DECODE_WARPS`], or the development switch of
/// [`Shared::decode_max_warps`]).
fn most_in_shared(per_warp: u32, nbuf: u32, max_warps: u32, room: u32) -> u32 {
    (room / (nbuf * per_warp + RING_STASH_BYTES)).clamp(1, max_warps / nbuf)
}

/// [`pad_blocks`] into a vector.
#[cfg(test)]
fn pad_to_blocks(chunks: &[ChunkDesc], warps: usize) -> Vec<ChunkDesc> {
    let mut out = Vec::new();
    pad_blocks(chunks, warps, |c| out.push(*c));
    out
}

/// Keeps freed memory in the device's default memory pool (where the engine's stream-ordered
/// allocations come from) instead of returning it to the driver at every synchronisation: the
/// encoder allocates its scratch and blobs per call, and unmapping and mapping gigabytes again cost
/// ~20 ms per call on the H200. Best effort: without it the engine is only slower.
/// [`GpuEngine::release_pool_memory`] gives it back.
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    let mut threshold: u64 = u64::MAX;
    if let Ok(pool) = current_pool(ctx) {
        // SAFETY: a plain driver call on the device's current pool; `threshold` outlives it.
        unsafe {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

/// The device's current memory pool, where the engine's stream-ordered allocations
/// (`cuMemAllocAsync`) come from: its default pool unless another library in the process set
/// another (`cudaDeviceSetMemPool`). Where the device has no pools (cudarc then allocates with
/// `cuMemAlloc`), the driver's error.
fn current_pool(ctx: &CudaContext) -> Result<cudarc::driver::sys::CUmemoryPool> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // An error an earlier asynchronous free recorded is not this call's: cleared, so that
    // `bind_to_thread` (which reports it first) binds.
    let _ = ctx.check_err();
    ctx.bind_to_thread()?;
    // SAFETY: a plain driver call on this context's device; `pool` outlives it.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }.result()?;
    Ok(pool)
}

/// How the decoder's warps share a chunk (docs/GPU.md, "Decode kernel").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeLayout {
    /// Two warps per chunk for launches of few chunks, where a chunk's latency is the decode
    /// time, as long as they fit one wave of two-warp blocks; one warp per chunk otherwise
    /// (`auto_two_warps`).
    #[default]
    Auto,
    /// One warp per chunk decodes and merges each block in turn.
    OneWarp,
    /// Per chunk, one warp decodes block b while a second merges block b - 1 (two buffers per
    /// chunk; not for blocks whose buffers live in global memory, which take `OneWarp`).
    TwoWarps,
}

/// With [`DecodeLayout::Auto`], a launch takes two warps per chunk when it has at most this many
/// chunks per SM: all of them then run at once, and the batch takes as long as its slowest chunk.
pub const SPLIT_MAX_CHUNKS_PER_SM: u32 = 8;

/// The GPU engine of one device.
pub struct GpuEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// How the decoder's warps share a chunk.
    layout: DecodeLayout,
    /// Most scratch bytes one wave of the encoder uses ([`crate::encode::SCRATCH_BYTES`]).
    wave_bytes: u64,
    /// Waves the encoder cuts a large launch into, so that compactions overlap encoding
    /// ([`crate::encode::PIPE_WAVES`]).
    pipe_waves: u64,
    /// Kernels and buffers, shared by the engines of one device on other streams.
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    /// The decoder's source, compiled a variant of [`KERNELS`] at a time on first use; each
    /// variant's kernels are one warp per chunk and two (`NAME_pair`, [`DecodeLayout::TwoWarps`]).
    decode: crate::compile::Units,
    /// `tz_build_tables`: frequencies to decoder tables.
    build_tables: CudaFunction,
    /// `tz_copy`: the small stored blobs of a batch, in one launch.
    copy: CudaFunction,
    /// The device's multiprocessors.
    sms: u32,
    /// Shared memory a thread block may have (static and dynamic): the device's opt-in limit
    /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`: 227 KiB on Hopper and data-centre
    /// Blackwell, 163 KiB on an A100, 99 KiB on Ada and consumer Ampere and Blackwell, 64 or 96 KiB
    /// on Turing and Volta), or less with `TENSORZIP_DEV_SMEM_LIMIT=BYTES` — which runs the
    /// launch shapes of a smaller GPU on this one (the test suite under 99 and 163 KiB on an
    /// H200: docs/GPU.md, "Shared memory of other GPUs"). The kernels' launch shapes are sized
    /// from it: the decoder's table cache and warps per block, the encoder's warps per block, and
    /// whether the counting step keeps its joint counts in shared memory.
    pub(crate) smem_limit: u32,
    /// Whether two-warp launches spread their chunks over the SMs ([`spread_width`]); off with
    /// `TENSORZIP_DEV_BLOCK_SPREAD=0` (the average chunks per tensor, for comparisons).
    spread_blocks: bool,
    /// Most warps of a one-warp-per-chunk decode block: [`DECODE_WARPS`], or N with
    /// `TENSORZIP_DEV_DECODE_MAX_WARPS=N`, for a kernel source given with
    /// `TENSORZIP_DEV_TZ_DECODE_SRC` whose launch bounds allow `32 N` threads (two-warp blocks keep
    /// [`DECODE_WARPS`]: their hand-over words are sized for 8 pairs). Measured with it (H200,
    /// 2026-12-01, 1 GiB synthetic, 2048-unit blocks so that 20 warps fit, the same 96-register
    /// build at both widths): 20 warps per SM against 16, fp32 438-440 against 424-425 GB/s, bf16
    /// 436-437 against 456-457. More resident warps do not pay, and capping the registers at 96 to
    /// allow them cost 6% (bf16) and 32% (fp32) at the default blocks.
    decode_max_warps: u32,
    /// The encoder kernels, compiled (or read from the cache) on first use.
    encode: std::sync::OnceLock<crate::encode::EncodeKernels>,
    /// Page-locked host memory for the encoder's downloads, kept between calls (pinning is slow).
    pinned: std::sync::Mutex<Option<cudarc::driver::PinnedHostSlice<u32>>>,
    /// Page-locked staging buffers of the pageable host copies (`transfer.rs`).
    pub(crate) staging: std::sync::Mutex<Vec<cudarc::driver::PinnedHostSlice<u8>>>,
    /// Page-locked memory for a call's small transfers: a plan's arrays on their way up, blob
    /// prefixes on their way down ([`GpuEngine::upload`], [`GpuEngine::read_ranges`]). A copy
    /// from pageable memory waits for the stream and goes through the driver's own staging first;
    /// from this buffer it is one asynchronous DMA.
    small: std::sync::Mutex<Option<SmallPinned>>,
}

/// The small-transfer buffer and the event recorded after the last upload from it.
pub(crate) struct SmallPinned {
    buf: cudarc::driver::PinnedHostSlice<u8>,
    done: Option<cudarc::driver::CudaEvent>,
}

/// The engine's page-locked download buffer, held for one use.
pub(crate) struct PinnedGuard<'a>(
    std::sync::MutexGuard<'a, Option<cudarc::driver::PinnedHostSlice<u32>>>,
);

impl std::ops::Deref for PinnedGuard<'_> {
    type Target = cudarc::driver::PinnedHostSlice<u32>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("allocated by pinned_u32")
    }
}

impl std::ops::DerefMut for PinnedGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("allocated by pinned_u32")
    }
}

impl GpuEngine {
    /// An engine on device `ordinal` (the primary context; its default stream).
    pub fn new(ordinal: usize) -> Result<GpuEngine> {
        crate::available().map_err(Error::Unavailable)?;
        let ctx = CudaContext::new(ordinal)?;
        // The common kernels now (quick to compile; the decode kernels on first use, per variant).
        let decode = decode_units();
        let module = decode.common(&ctx)?;
        let build_tables = module.load_function("tz_build_tables")?;
        let copy = module.load_function("tz_copy")?;
        let stream = ctx.default_stream();
        keep_pool_memory(&ctx);
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as u32;
        let optin = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let smem_limit = std::env::var("TENSORZIP_DEV_SMEM_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map_or(optin.max(0) as u32, |v| v.min(optin.max(0) as u32));
        // Development overrides of the decoder's layout and block widths, for same-binary
        // comparisons.
        let spread_blocks = std::env::var_os("TENSORZIP_DEV_BLOCK_SPREAD").is_none_or(|v| v != "0");
        let decode_max_warps = std::env::var("TENSORZIP_DEV_DECODE_MAX_WARPS")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(DECODE_WARPS, |n| n.clamp(1, 32));
        let layout = match std::env::var("TENSORZIP_DEV_DECODE_LAYOUT").as_deref() {
            Ok("one") => DecodeLayout::OneWarp,
            Ok("two") => DecodeLayout::TwoWarps,
            _ => DecodeLayout::Auto,
        };
        Ok(GpuEngine {
            ctx,
            stream,
            layout,
            wave_bytes: crate::encode::SCRATCH_BYTES,
            pipe_waves: crate::encode::pipe_waves_from_env(),
            shared: Arc::new(Shared {
                decode,
                build_tables,
                copy,
                sms,
                smem_limit,
                spread_blocks,
                decode_max_warps,
                encode: std::sync::OnceLock::new(),
                pinned: std::sync::Mutex::new(None),
                staging: std::sync::Mutex::new(Vec::new()),
                small: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The same engine (context, kernels, buffers) working on `stream` instead: e.g. a stream of
    /// the caller's (`CudaContext::wrap_borrowed_stream`). Calls on different streams may run
    /// concurrently, except that the encoder's download buffer is used by one call at a time.
    pub fn on_stream(&self, stream: Arc<CudaStream>) -> GpuEngine {
        GpuEngine {
            ctx: self.ctx.clone(),
            stream,
            layout: self.layout,
            wave_bytes: self.wave_bytes,
            pipe_waves: self.pipe_waves,
            shared: self.shared.clone(),
        }
    }

    /// The same engine with the decoder's warps laid out as `layout` (for plans uploaded from now
    /// on). Every layout decodes the same bytes; they differ in speed.
    pub fn with_decode_layout(mut self, layout: DecodeLayout) -> GpuEngine {
        self.layout = layout;
        self
    }

    /// The same engine with the encoder's waves limited to `bytes` of scratch each (at least one
    /// chunk's slot per wave): the same blobs, in more launches. For tests of the path that tensors
    /// of more than ~3 GiB in one call take with the default ([`crate::encode::SCRATCH_BYTES`]).
    pub fn with_wave_bytes(mut self, bytes: u64) -> GpuEngine {
        self.wave_bytes = bytes;
        self
    }

    /// Most scratch bytes one wave of the encoder uses.
    pub(crate) fn wave_bytes(&self) -> u64 {
        self.wave_bytes
    }

    /// The same engine with the encoder's large launches cut into about `waves` waves (at least 1,
    /// at most 64; [`crate::encode::PIPE_WAVES`] by default): the same blobs, the compaction of one
    /// wave under the encoding of the next. For comparisons of the pipeline's depth (1: none).
    pub fn with_pipe_waves(mut self, waves: u64) -> GpuEngine {
        self.pipe_waves = waves.clamp(1, 64);
        self
    }

    /// Waves the encoder cuts a large launch into.
    pub(crate) fn pipe_waves(&self) -> u64 {
        self.pipe_waves
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// One of the engine's shared host buffers, locked. A thread that panicked while it held the
    /// buffer may have left copies into or out of it queued on its stream: then every stream of
    /// the context is waited for before the buffer is used again. Nothing in a buffer is relied
    /// on from one call to the next, so it is then as good as new (before, the first such panic
    /// disabled the engine for the rest of the process).
    pub(crate) fn lock_buffer<'a, T>(
        &self,
        m: &'a std::sync::Mutex<T>,
    ) -> Result<std::sync::MutexGuard<'a, T>> {
        match m.lock() {
            Ok(g) => Ok(g),
            Err(poisoned) => {
                self.ctx.synchronize()?;
                m.clear_poison();
                Ok(poisoned.into_inner())
            }
        }
    }

    /// The page-locked download buffer, with room for at least `n` u32 (cached, cacheable memory:
    /// the host reads it).
    pub(crate) fn pinned_u32(&self, n: usize) -> Result<PinnedGuard<'_>> {
        let mut g = self.lock_buffer(&self.shared.pinned)?;
        if g.as_ref().is_none_or(|p| p.len() < n) {
            // The old buffer is released first.
            drop(g.take());
            // SAFETY: plain integers; every element read is written by a download first.
            *g = Some(unsafe { self.ctx.alloc_pinned_with_flags::<u32>(n.max(1 << 20), 0) }?);
        }
        Ok(PinnedGuard(g))
    }

    /// The small-transfer buffer with room for at least `n` bytes (allocated on first use and grown
    /// by doubling; pinning is slow), after its last upload has been read by the device.
    fn small_pinned(&self, n: usize) -> Result<std::sync::MutexGuard<'_, Option<SmallPinned>>> {
        let mut g = self.lock_buffer(&self.shared.small)?;
        if let Some(done) = g.as_mut().and_then(|p| p.done.take()) {
            done.synchronize()?;
        }
        if g.as_ref().is_none_or(|p| p.buf.len() < n) {
            drop(g.take());
            *g = Some(SmallPinned {
                // SAFETY: plain bytes; every byte read is written first (by the host for an
                // upload, by a download before the host reads it).
                buf: unsafe {
                    self.ctx
                        .alloc_pinned_with_flags::<u8>(n.next_power_of_two().max(256 << 10), 0)
                }?,
                done: None,
            });
        }
        Ok(g)
    }

    /// Stages at most `cap` bytes with `fill` in the small-transfer buffer and queues their copy to
    /// a new device buffer of `cap` bytes, which is returned with what `fill` returned. `fill` gets
    /// the buffer's device address (descriptors may point into the buffer itself). Fails, copying
    /// nothing, if `fill` fails or staged more than `cap` bytes.
    pub(crate) fn upload_staged<R>(
        &self,
        cap: usize,
        fill: impl FnOnce(&mut Staging<'_>, u64) -> Result<R>,
    ) -> Result<(CudaSlice<u8>, R)> {
        let s = &self.stream;
        let cap = cap.max(1);
        // SAFETY: plain bytes; the staged ones are written by the copy below before any launch
        // reads them, and nothing reads the rest.
        let buf = unsafe { s.alloc::<u8>(cap) }?;
        let base = buf.device_ptr(s).0;
        let mut g = self.small_pinned(cap)?;
        let p = g.as_mut().expect("allocated by small_pinned");
        let host = &mut p.buf.as_mut_slice()?[..cap];
        let mut st = Staging {
            buf: host,
            len: 0,
            overflow: false,
        };
        let r = fill(&mut st, base)?;
        let (len, overflow) = (st.len, st.overflow);
        if overflow {
            return Err(Error::Driver(format!(
                "staged upload exceeds its bound of {cap} bytes"
            )));
        }
        if len > 0 {
            // SAFETY: the staged bytes are page-locked and not written again before `done`
            // (recorded just after the copy) has completed (cudarc's own event of the slice is not
            // recorded when the context has one stream, so ours orders the reuse); `buf` holds
            // `cap >= len` bytes and is returned to the caller, who keeps it until the stream has
            // run what reads it.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    base,
                    &p.buf.as_slice()?[..len],
                    s.cu_stream(),
                )
            }?;
            match s.record_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            )) {
                Ok(e) => p.done = Some(e),
                Err(e) => {
                    // Without the event the next user could not tell the copy still reads the
                    // buffer: wait for it here.
                    let _ = s.synchronize();
                    return Err(e.into());
                }
            }
        }
        Ok((buf, r))
    }

    /// Copies `n` bytes at device address `src` to a new vector, after the stream's earlier work,
    /// through the small-transfer buffer; waits for the stream.
    ///
    /// # Safety
    /// `src` must be `n` readable bytes of device memory of this engine's context, alive until
    /// this returns.
    unsafe fn download_small(&self, src: u64, n: usize) -> Result<Vec<u8>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let s = &self.stream;
        let mut g = self.small_pinned(n)?;
        let p = g.as_mut().expect("allocated by small_pinned");
        let host = &mut p.buf.as_mut_slice()?[..n];
        // SAFETY: `host` is page-locked, `n` bytes; the host reads it only after the stream has
        // completed the copy; `src` is the caller's promise.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut *host, src, s.cu_stream()) }?;
        s.synchronize()?;
        Ok(host.to_vec())
    }

    /// The encoder kernels (loaded on the first call).
    pub(crate) fn encode_kernels(&self) -> Result<&crate::encode::EncodeKernels> {
        if let Some(k) = self.shared.encode.get() {
            return Ok(k);
        }
        let k = crate::encode::EncodeKernels::load(self)?;
        Ok(self.shared.encode.get_or_init(|| k))
    }

    /// Waits for the engine's stream, then gives the memory its freed buffers left in the
    /// device's current pool back to the driver, down to `keep` bytes. The engine keeps freed
    /// memory in that pool (see `keep_pool_memory`: a call allocates its scratch and blobs anew,
    /// and mapping gigabytes again costs ~20 ms), so after a large call the process holds up to
    /// that call's working set — memory other allocators (torch's caching allocator) cannot use
    /// and do not count. Callers that are done with the GPU engine for a while call this.
    ///
    /// With `keep == 0` (give back everything) the whole context is waited for, not only the
    /// engine's stream: frees queued on other streams (a tensor-level call on a torch side stream)
    /// count as outstanding until the host has seen them complete. Where the device has no memory
    /// pools (cudarc allocates with `cuMemAlloc` and frees at once) there is nothing to give back.
    pub fn release_pool_memory(&self, keep: u64) -> Result<()> {
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        // An error an earlier asynchronous free recorded is not this call's (cudarc's
        // `synchronize` would report it first, and the trim would not happen).
        let _ = self.ctx.check_err();
        match keep {
            0 => self.ctx.synchronize()?,
            _ => self.stream.synchronize()?,
        }
        let pool = current_pool(&self.ctx)?;
        // SAFETY: `pool` is the device's current pool; trimming releases only memory no
        // allocation uses (the frees waited for above have completed).
        unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, keep as usize) }.result()?;
        Ok(())
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The engine's step tracer for a caller's own sequence of steps (the Python loader's): with
    /// `TENSORZIP_GPU_TRACE` set, each call prints the time since creation (see `step_tracer`);
    /// otherwise it does nothing.
    pub fn tracer(&self, label: String) -> impl Fn(&str) + '_ {
        step_tracer(&self.stream, label)
    }

    /// The stream the engine's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Uploads a plan's descriptors and tables (and allocates its scratch): one copy of the plan's
    /// arrays and one launch that expands the tables.
    pub fn upload(&self, plan: &Plan) -> Result<DevicePlan> {
        let s = &self.stream;
        // `tz_build_tables` reads each serialised table where its offset says: a plan is a value
        // anyone can build (its fields are public), so this safe call checks that every table
        // lies inside `table_bytes` (`lo`, `hi`, then a code for each of `lo..=hi`).
        let tb = &plan.table_bytes;
        for &o in &plan.table_offsets {
            let o = o as usize;
            let inside = match tb.get(o..o.saturating_add(2)) {
                Some(&[lo, hi]) => hi < lo || o + 2 + ((hi - lo) as usize) < tb.len(),
                _ => false,
            };
            if !inside {
                return Err(Error::Unsupported(format!(
                    "plan: a table at offset {o} runs past the {} table bytes",
                    tb.len()
                )));
            }
        }
        let trace = step_tracer(s, "gpu plan upload".into());
        // Each group's launch shape first; the descriptors are then staged in one pass straight
        // into page-locked memory (a 1 GiB tensor has 8192 of them) and their device addresses
        // set once the buffer exists.
        let mut groups = Vec::with_capacity(plan.groups.len());
        let mut cap = 0usize;
        // A block's dynamic shared memory: its table cache, then per chunk a ring and stash and
        // (unless in global scratch) the chunk's buffers.
        let smem_max = self.shared.smem_limit.saturating_sub(DECODE_SMEM_RESERVE);
        let Some(spare) = smem_max.checked_sub(cache_bytes(0) + RING_STASH_BYTES) else {
            return Err(Error::Unsupported(format!(
                "{} bytes of shared memory per block",
                self.shared.smem_limit
            )));
        };
        for g in &plan.groups {
            // As many tables as the launch's tensors have (at least CACHE_TABLES, at most
            // MAX_CACHE_TABLES), as long as one chunk's ring and stash fit beside them: a GPU with
            // less shared memory than Hopper caches fewer, and its blocks read the others from
            // global memory.
            let cache_tables = g
                .cache_tables
                .clamp(CACHE_TABLES, MAX_CACHE_TABLES)
                .min(spare / (4096 + 1024));
            let cache = cache_bytes(cache_tables);
            let room = smem_max - cache;
            let global = g.global_scratch || g.per_warp + RING_STASH_BYTES > room;
            let runs = tensor_runs(&g.chunks);
            // Two warps per chunk need two buffers per chunk in shared memory and at most 8
            // chunks per block (512 threads).
            let split = !global
                && 2 * g.per_warp + RING_STASH_BYTES <= room
                && match self.layout {
                    DecodeLayout::OneWarp => false,
                    DecodeLayout::TwoWarps => true,
                    DecodeLayout::Auto => auto_two_warps(
                        &runs,
                        g.per_warp,
                        room,
                        self.shared.sms,
                        self.shared.spread_blocks,
                    ),
                };
            let nbuf = if split { 2 } else { 1 };
            let most = if global {
                (room / RING_STASH_BYTES).clamp(1, 8)
            } else {
                let max_warps = if split {
                    DECODE_WARPS
                } else {
                    self.shared.decode_max_warps
                };
                most_in_shared(g.per_warp, nbuf, max_warps, room)
            };
            // A block caches the tables of one tensor, so it takes the chunks of one tensor only.
            // Blocks as wide as a tensor's chunks on average: many small tensors make many narrow
            // blocks (several per SM) rather than wide blocks padded with empty chunks.
            let avg = (g.chunks.len().div_ceil(runs.len().max(1)) as u32).clamp(1, most);
            let warps = match split && self.shared.spread_blocks {
                true => spread_width(&runs, most, self.shared.sms).unwrap_or(avg),
                false => avg,
            };
            let n = padded_len(&runs, warps as usize) as u32;
            cap += staged_len::<ChunkDesc>(n as usize);
            let (smem, scratch) = if global {
                (
                    warps * RING_STASH_BYTES + cache,
                    Some(s.alloc_zeros::<u8>(n as usize * g.per_warp as usize)?),
                )
            } else {
                (warps * (nbuf * g.per_warp + RING_STASH_BYTES) + cache, None)
            };
            groups.push(DeviceGroup {
                kernel: g.kernel,
                split,
                chunks: 0,
                scratch,
                n,
                warps,
                smem,
                per_warp: g.per_warp,
                n_slots: g.n_slots,
                slot_units: g.slot_units,
                cache_tables,
            });
        }
        let no_tensor = [TensorDesc::default()];
        let tensors: &[TensorDesc] = if plan.tensors.is_empty() {
            &no_tensor
        } else {
            &plan.tensors
        };
        let info: &[u32] = if plan.table_info.is_empty() {
            &[0]
        } else {
            &plan.table_info
        };
        // The kernel reads a paired plane's `pair_d` pairs from `pair_base` into a 256-entry
        // table: they must lie inside `pairs` (a plan is a value anyone can build), and only
        // bf16's exponent plane (plane 1 of 2-byte units with the 8-bit exponent transform) can
        // be paired, with 2 ..= 128 pairs (FORMAT.md section 12).
        for t in tensors.iter().filter(|t| t.pair_d != 0) {
            let end = t.pair_base as u64 + t.pair_d as u64;
            let bf16 = t.pair_plane == 1 && t.unit_size == 2 && t.exp_bits == 8;
            if !bf16 || !(2..=128).contains(&t.pair_d) || end > plan.pairs.len() as u64 {
                return Err(Error::Unsupported(format!(
                    "plan: {} pairs of plane {} ({}-byte units, {} exponent bits) from {} of {}",
                    t.pair_d,
                    t.pair_plane,
                    t.unit_size,
                    t.exp_bits,
                    t.pair_base,
                    plan.pairs.len()
                )));
            }
        }
        let pairs: &[u32] = if plan.pairs.is_empty() {
            &[0]
        } else {
            &plan.pairs
        };
        let (small, large): (Vec<_>, Vec<_>) = plan
            .copies
            .iter()
            .filter(|c| c.len > 0)
            .partition(|c| c.len <= KERNEL_COPY_MAX);
        cap += staged_len::<TensorDesc>(tensors.len())
            + staged_len::<u32>(info.len())
            + staged_len::<u32>(pairs.len())
            + staged_len::<u8>(plan.table_bytes.len())
            + staged_len::<u32>(plan.table_offsets.len())
            + staged_len::<u32>(2)
            + staged_len::<crate::plan::Copy>(small.len());
        // The buffer lives in the returned plan, which the caller keeps until its launches have
        // run (the copy is ordered before them on the stream).
        let (
            buf,
            (
                chunks_at,
                [tensors_at, info_at, pairs_at, table_bytes_at, table_offsets_at, err_at, copies_at],
            ),
        ) = self.upload_staged(cap, |st, _| {
            let mut chunks_at = Vec::with_capacity(plan.groups.len());
            for (g, dg) in plan.groups.iter().zip(&groups) {
                chunks_at.push(st.align());
                let n = pad_blocks(&g.chunks, dg.warps as usize, |c| st.push_one(c));
                // The launch reads `dg.n` descriptors: exactly as many must have been staged.
                if n != dg.n as usize {
                    return Err(Error::Driver(format!(
                        "{n} chunk descriptors staged, {} counted",
                        dg.n
                    )));
                }
            }
            let offsets = [
                st.push(tensors),
                st.push(info),
                st.push(pairs),
                st.push(&plan.table_bytes),
                st.push(&plan.table_offsets),
                st.push(&[u32::MAX, u32::MAX]),
                st.push(&small),
            ];
            trace(&format!("{} bytes staged", st.len));
            Ok((chunks_at, offsets))
        })?;
        trace("copied");
        let base = buf.device_ptr(s).0;
        let at = |off: usize| base + off as u64;
        for (g, &off) in groups.iter_mut().zip(&chunks_at) {
            g.chunks = at(off);
        }
        let tables = self.build_tables(
            at(table_bytes_at),
            at(table_offsets_at),
            plan.table_offsets.len(),
        )?;
        trace("tables built");
        Ok(DevicePlan {
            groups,
            tensors: at(tensors_at),
            info: at(info_at),
            pairs: at(pairs_at),
            err: at(err_at),
            copies: at(copies_at),
            n_copies: small.len() as u32,
            tables,
            large_copies: large,
            err_reset: true,
            _buf: buf,
            stream: s.clone(),
        })
    }

    /// Launches `tz_copy` over the `n` copy descriptors at device address `descs` (sources
    /// relative to `data`, destinations to `out`; one thread block per copy): the stored blobs of a
    /// decode, the gathered ranges of `read_ranges`, the encoder's blob heads and stored blobs.
    ///
    /// # Safety
    /// `descs` must hold `n` descriptors whose source ranges (offset by `data`) are readable and
    /// whose destination ranges (offset by `out`) are writable device memory, disjoint, all alive
    /// until the stream has run the launch.
    pub(crate) unsafe fn launch_copies(
        &self,
        descs: u64,
        n: u32,
        data: u64,
        out: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.shared.copy);
        b.arg(&descs).arg(&n).arg(&data).arg(&out);
        // SAFETY: the arguments match `tz_copy`; the ranges are the caller's promise.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Launches the decoding of an uploaded plan: blob bytes at device address `data`, output at
    /// `out`. Asynchronous on the engine's stream; [`GpuEngine::check`] waits and reports errors.
    /// The plan may have been uploaded on another stream of the context (an engine from
    /// [`GpuEngine::on_stream`]): the two streams are ordered both ways around the launch.
    ///
    /// # Safety
    /// `data` and `out` must be valid device addresses covering every offset of the plan (it was
    /// built from layouts of the blobs at `data`, with outputs inside `out`), and must stay alive
    /// until the stream has run the launch.
    pub unsafe fn launch(&self, dp: &mut DevicePlan, data: u64, out: u64) -> Result<()> {
        let s = &self.stream;
        // What can fail without the device's doing (compiling or loading a kernel, a shared-memory
        // size the GPU refuses) comes before anything is queued, so that such an error leaves no
        // work reading `data` or writing `out` behind it.
        let kernels: Vec<usize> = dp.groups.iter().map(|g| g.kernel).collect();
        let fns = self.shared.decode.kernels(&self.ctx, &kernels)?;
        let mut chosen = Vec::with_capacity(fns.len());
        for (g, (one, pair)) in dp.groups.iter().zip(fns) {
            let f = if g.split { pair } else { one };
            allow_dynamic_smem(f, self.shared.smem_limit, g.smem as u64)?;
            chosen.push(f);
        }
        // A plan uploaded on another stream: this launch's work waits for the upload (the
        // descriptors' copy, the tables' expansion), and the plan's stream for the launch (below).
        let elsewhere = dp.stream.cu_stream() != s.cu_stream();
        if elsewhere {
            s.join(&dp.stream)?;
        }
        // SAFETY: `data` and `out` are the caller's promise.
        let queued = unsafe { self.queue_launch(dp, &chosen, data, out) };
        // Also after a failed launch: what it queued may still run. Should the ordering itself
        // fail, this stream is waited for instead, so that nothing queued outlives the plan.
        if elsewhere {
            if let Err(e) = dp.stream.join(s) {
                let _ = s.synchronize();
                return Err(e.into());
            }
        }
        queued
    }

    /// [`GpuEngine::launch`]'s work on the engine's stream, the kernels `chosen` for the plan's
    /// groups.
    ///
    /// # Safety
    /// As [`GpuEngine::launch`]; the plan's upload is ordered before this stream's work.
    unsafe fn queue_launch(
        &self,
        dp: &mut DevicePlan,
        chosen: &[&CudaFunction],
        data: u64,
        out: u64,
    ) -> Result<()> {
        let s = &self.stream;
        // The error word (`fail` in decode.cu: the lowest failing chunk and its code) all ones:
        // no chunk failed. A plan's first launch finds it so (it was uploaded with it).
        if !std::mem::take(&mut dp.err_reset) {
            // SAFETY: `dp.err` is the plan's 8-byte error word, inside its buffer.
            unsafe { cudarc::driver::result::memset_d8_async(dp.err, 0xFF, 8, s.cu_stream())? };
        }
        // SAFETY: `dp.copies` holds `n_copies` descriptors whose ranges, offset by `data` and
        // `out`, lie inside the caller's buffers (the caller's promise).
        unsafe { self.launch_copies(dp.copies, dp.n_copies, data, out) }?;
        for c in &dp.large_copies {
            // SAFETY: the caller guarantees both ranges are valid device memory.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    out + c.to,
                    data + c.from,
                    c.len as usize,
                    s.cu_stream(),
                )?;
            }
        }
        for (g, &f) in dp.groups.iter().zip(chosen) {
            let cfg = LaunchConfig {
                grid_dim: (g.n.div_ceil(g.warps), 1, 1),
                block_dim: (32 * g.warps * (1 + g.split as u32), 1, 1),
                shared_mem_bytes: g.smem,
            };
            let scratch_ptr = match &g.scratch {
                Some(b) => b.device_ptr(s).0,
                None => 0u64,
            };
            let mut b = s.launch_builder(f);
            b.arg(&data)
                .arg(&g.chunks)
                .arg(&g.n)
                .arg(&dp.tensors)
                .arg(&dp.tables)
                .arg(&dp.info)
                .arg(&dp.pairs)
                .arg(&out)
                .arg(&dp.err);
            b.arg(&scratch_ptr)
                .arg(&g.per_warp)
                .arg(&g.warps)
                .arg(&g.n_slots)
                .arg(&g.slot_units)
                .arg(&g.cache_tables);
            // SAFETY: the arguments match the kernel's signature; every pointer is valid for the
            // sizes the plan describes (guaranteed by the caller for `data` and `out`).
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// Expands `n` serialised tables (at device address `bytes`, table `i` from byte `offsets[i]`,
    /// `Plan::table_bytes`) on the device into decoder tables of 4096 entries each (`sym | freq << 8
    /// | bias << 20`, as `FreqTable::decode_table`).
    fn build_tables(&self, bytes: u64, offsets: u64, n: usize) -> Result<CudaSlice<u32>> {
        let s = &self.stream;
        // SAFETY: plain integers; `tz_build_tables` writes every entry of every table.
        let mut tables = unsafe { s.alloc::<u32>((n * 4096).max(1)) }?;
        if n == 0 {
            return Ok(tables);
        }
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = s.launch_builder(&self.shared.build_tables);
        b.arg(&bytes).arg(&offsets).arg(&mut tables);
        // SAFETY: `bytes` holds `n` serialised tables at `offsets`, each validated when its blob
        // was parsed (codes of `lo..=hi` only, one anchor, frequencies summing to 4096);
        // `tables` holds `n * 4096` entries; one block per table.
        unsafe { b.launch(cfg) }?;
        Ok(tables)
    }

    /// Reads byte ranges `(device address, length)` back to the host, concatenated in order: one
    /// gathering launch (`tz_copy`) into a device buffer and one copy, instead of a copy call per
    /// range (the blob prefixes of a device-resident model: 104 calls for MiniLM). Waits for the
    /// engine's stream.
    ///
    /// # Safety
    /// Every range must be readable device memory of this engine's context, alive until this
    /// returns.
    pub unsafe fn read_ranges(&self, ranges: &[(u64, u64)]) -> Result<Vec<u8>> {
        let s = &self.stream;
        let mut descs = Vec::with_capacity(ranges.len());
        let mut total = 0u64;
        for &(from, len) in ranges {
            descs.push(crate::plan::Copy {
                from,
                to: total,
                len,
            });
            total += len;
        }
        if total == 0 {
            return Ok(Vec::new());
        }
        let (dev_descs, at) = self
            .upload_staged(staged_len::<crate::plan::Copy>(descs.len()), |st, _| {
                Ok(st.push(&descs))
            })?;
        // SAFETY: plain bytes; the kernel writes every one (the ranges tile `0..total`).
        let mut gathered = unsafe { s.alloc::<u8>(total as usize) }?;
        // `dev_descs` lives until this returns (after the download below, which waits for the
        // stream).
        let descs_ptr = dev_descs.device_ptr(s).0 + at as u64;
        let out = gathered.device_ptr_mut(s).0;
        // SAFETY: `descs.len()` descriptors; sources are the caller's readable ranges,
        // destinations tile `gathered`.
        unsafe { self.launch_copies(descs_ptr, descs.len() as u32, 0, out) }?;
        // SAFETY: `gathered` holds `total` bytes, written by the launch before this copy.
        unsafe { self.download_small(out, total as usize) }
    }

    /// Reads back and parses the prefixes (header, tables, directory) of blobs in device memory,
    /// `(device address, length)` each: one [`GpuEngine::read_ranges`] a round — first
    /// [`first_prefix_read`] bytes of each blob, then, for the few whose prefix is longer, what
    /// [`BlobLayout::prefix_to_read`] asks — and the parses in parallel. Returns each blob's
    /// layout or its own error (not a valid blob), in order; the outer error is the device's. The
    /// layouts are what [`GpuEngine::decode_device`] takes for the same addresses. (A whole
    /// model's blobs resident on the GPU: all-MiniLM-L6-v2 bf16's 104 blobs take one round.)
    ///
    /// # Safety
    /// Every `(address, length)` must be readable device memory of this engine's context, alive
    /// until this returns.
    pub unsafe fn read_layouts(
        &self,
        blobs: &[(u64, usize)],
    ) -> Result<Vec<tensorzip::Result<BlobLayout>>> {
        let n = blobs.len();
        let mut want: Vec<Option<usize>> = blobs
            .iter()
            .map(|&(_, len)| Some(first_prefix_read(len)))
            .collect();
        let mut out: Vec<Option<tensorzip::Result<BlobLayout>>> = (0..n).map(|_| None).collect();
        for _ in 0..MAX_PREFIX_ROUNDS {
            // The blobs that want more, and their ranges (each a prefix of its blob).
            let (round, ranges): (Vec<usize>, Vec<(u64, u64)>) = want
                .iter()
                .enumerate()
                .filter_map(|(k, w)| w.map(|w| (k, (blobs[k].0, w as u64))))
                .unzip();
            if round.is_empty() {
                break;
            }
            // SAFETY: every range is a prefix (at most the length) of a blob the caller vouches
            // for.
            let bytes = unsafe { self.read_ranges(&ranges) }?;
            // Each round reads every blob it takes from its first byte, so a blob's prefix is its
            // range of this round's bytes (the ranges tile them in order), parsed in place.
            let mut at = 0;
            let prefixes: Vec<(usize, &[u8])> = round
                .iter()
                .zip(&ranges)
                .map(|(&k, &(_, len))| {
                    let p = &bytes[at..at + len as usize];
                    at += len as usize;
                    (k, p)
                })
                .collect();
            // Each blob of the round parsed in parallel: the parse is the whole host cost.
            let steps: Vec<PrefixStep> = prefixes
                .par_iter()
                .map(|&(k, p)| BlobLayout::parse_prefix(p, blobs[k].1))
                .collect();
            for (&k, step) in round.iter().zip(steps) {
                match step {
                    PrefixStep::Parsed(r) => {
                        want[k] = None;
                        out[k] = Some(r.map(|l| *l));
                    }
                    PrefixStep::Want(need) => want[k] = Some(need),
                }
            }
        }
        // No input keeps `prefix_to_read` from settling within the rounds (it doubles from 64
        // KiB to the blob's length, then answers exactly); a blob that did anyway is an error of
        // its own, not a loop.
        Ok(out
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(tensorzip::Error::Engine(
                        "the blob's prefix length did not settle".into(),
                    ))
                })
            })
            .collect())
    }

    /// Waits for the last launch of `dp` (on whichever stream: the plan's own stream waits for
    /// each launch) and reports its error flags.
    pub fn check(&self, dp: &DevicePlan) -> Result<()> {
        let mut e = [0u32; 2];
        // SAFETY: `dp.err` is the plan's 8-byte error word (alive with `dp`); `e` outlives the copy,
        // which the synchronisation below completes.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut e, dp.err, dp.stream.cu_stream())
        }?;
        dp.stream.synchronize()?;
        if e != [u32::MAX; 2] {
            let what = match e[0] {
                1 => "block selector names no table",
                2 => "rANS stream ends early",
                3 => "rANS state below 2^16",
                4 => "raw area of the wrong size",
                5 => "rANS stream does not end exactly",
                6 => "rANS stream present where nothing is coded, or missing",
                7 => "a paired plane's rank past its escape",
                _ => "unknown error",
            };
            return Err(tensorzip::Error::Corrupt(format!(
                "chunk {} (of the batch): {what} (detected on the GPU)",
                e[1]
            ))
            .into());
        }
        Ok(())
    }

    /// Decodes blobs that are already in device memory into device memory the caller owns: each job
    /// is (the blob's validated layout, the device address of the blob, the device address of its
    /// output), all in one launch per kernel. Waits for the engine's stream and reports errors.
    ///
    /// # Safety
    /// Each blob address must hold the blob its layout was parsed from (`layout.total_len` bytes),
    /// each output address `layout.header.nbytes()` writable bytes, all in this engine's context
    /// and alive until this returns; outputs must not overlap.
    pub unsafe fn decode_device(&self, jobs: &[(&BlobLayout, u64, u64)]) -> Result<()> {
        let js: Vec<Job<'_>> = jobs
            .iter()
            .map(|&(layout, data, out)| Job {
                layout,
                data_offset: data,
                out_offset: out,
            })
            .collect();
        let trace = step_tracer(&self.stream, "gpu decode_device".into());
        let plan = Plan::new(&js)?;
        trace("planned");
        let mut dp = self.upload(&plan)?;
        trace("uploaded");
        // SAFETY: the plan's addresses are absolute (bases 0), valid by the caller's promise.
        if let Err(e) = unsafe { self.launch(&mut dp, 0, 0) } {
            // A launch that failed part of the way may have queued copies or kernels on the
            // caller's buffers, which the caller may free once this returns: wait for them.
            let _ = self.stream.synchronize();
            return Err(e);
        }
        trace("launched");
        self.check(&dp)?;
        trace("checked");
        Ok(())
    }

    /// Decodes blobs held on the host: uploads them, decodes them on the GPU in one launch, and
    /// downloads the tensors.
    pub fn decompress_host(&self, blobs: &[&[u8]]) -> Result<Vec<Tensor>> {
        let batch = self.decode_host_batch(blobs)?;
        Ok(batch
            .tensors
            .iter()
            .map(|&(dtype, ref shape, o, n)| Tensor {
                dtype,
                shape: shape.clone(),
                data: batch.data[o as usize..(o + n) as usize].to_vec(),
            })
            .collect())
    }

    /// Decodes blobs held on the host in one launch into one host buffer (no per-tensor copies).
    pub fn decode_host_batch(&self, blobs: &[&[u8]]) -> Result<HostBatch> {
        // Parsed in parallel; the first failure in order is reported.
        let parsed: Vec<tensorzip::Result<BlobLayout>> = blobs
            .par_iter()
            .map(|b| BlobLayout::parse(b, b.len()))
            .collect();
        let layouts = parsed.into_iter().collect::<tensorzip::Result<Vec<_>>>()?;
        self.decode_host_parsed(blobs, &layouts)
    }

    /// [`GpuEngine::decode_host_batch`] of blobs whose layouts the caller has parsed already
    /// (`layouts[k]` parsed from all of `blobs[k]`).
    pub(crate) fn decode_host_parsed(
        &self,
        blobs: &[&[u8]],
        layouts: &[BlobLayout],
    ) -> Result<HostBatch> {
        // Blobs 16-byte aligned in one device buffer. When `transfer::staged`, copied there from the
        // caller's memory through the staging buffers and the tensors back the same way (no
        // gathered host copy; a direct copy from pageable memory runs at ~8-10 GB/s on the H200's
        // host, the staged one at the PCIe limit).
        let mut pieces = Vec::with_capacity(blobs.len());
        let mut jobs = Vec::with_capacity(blobs.len());
        let mut in_len = 0u64;
        let mut out_len = 0u64;
        let mut tensors = Vec::with_capacity(blobs.len());
        for (b, l) in blobs.iter().zip(layouts) {
            in_len = in_len.next_multiple_of(16);
            jobs.push(Job {
                layout: l,
                data_offset: in_len,
                out_offset: out_len,
            });
            pieces.push((*b, in_len));
            in_len += b.len() as u64;
            let n = l.header.nbytes();
            tensors.push((l.header.dtype, l.header.shape.clone(), out_len, n));
            // Keep every tensor aligned to 16 bytes.
            out_len += n.div_ceil(16) * 16;
        }
        let plan = Plan::new(&jobs)?;
        let mut dplan = self.upload(&plan)?;
        let s = &self.stream;
        let staged = crate::transfer::staged(in_len.max(out_len));
        let mut dev_data = if staged {
            // SAFETY: plain bytes, all written by the upload below before the decoder reads them.
            unsafe { s.alloc::<u8>(in_len.max(1) as usize) }?
        } else {
            // A small batch: the blobs gathered on the host and copied plainly (no staging buffers
            // to allocate in a short-lived process, e.g. the command line on a small file).
            let mut host = vec![0u8; in_len.max(1) as usize];
            for &(b, at) in &pieces {
                host[at as usize..at as usize + b.len()].copy_from_slice(b);
            }
            s.clone_htod(&host)?
        };
        let mut dev_out = s.alloc_zeros::<u8>(out_len.max(1) as usize)?;
        // The tensors: downloaded through the staging buffers inside the pointer guards' scope
        // (`Some`), or copied plainly from `dev_out` after it (`None`, a small batch).
        let staged_data = {
            let (dp, _g1) = dev_data.device_ptr_mut(s);
            let (op, _g2) = dev_out.device_ptr_mut(s);
            if staged {
                // SAFETY: `dev_data` holds `in_len` bytes, the end of the last piece.
                unsafe { self.upload_gather(&pieces, dp)? };
            }
            // SAFETY: the plan's offsets lie inside `dev_data` (layouts were parsed from these
            // bytes) and its outputs inside `dev_out` (sized above); both outlive the launch, which
            // `check` waits for.
            unsafe { self.launch(&mut dplan, dp, op)? };
            self.check(&dplan)?;
            if staged {
                // The blobs' claimed sizes: a refused allocation is an error, not an abort.
                let mut data = tensorzip::fresh::try_zeroed(out_len)?;
                // SAFETY: `dev_out` holds `out_len` bytes, the length of `data`.
                unsafe { self.download_from(op, &mut data)? };
                Some(data)
            } else {
                None
            }
        };
        let data = match staged_data {
            Some(data) => data,
            None => {
                let mut data = s.clone_dtoh(&dev_out)?;
                data.truncate(out_len as usize);
                data
            }
        };
        Ok(HostBatch { data, tensors })
    }
}

/// Tensors decoded by [`GpuEngine::decode_host_batch`]: one buffer, and per blob its dtype, shape,
/// offset and length in it.
pub struct HostBatch {
    pub data: Vec<u8>,
    pub tensors: Vec<(tensorzip::DType, Vec<u64>, u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(tensor: u32, index: u32) -> ChunkDesc {
        ChunkDesc {
            tensor,
            index,
            len: 100,
            ..Default::default()
        }
    }

    /// Chunks of tensors with 3, 1 and 5 chunks, indexed in order.
    fn three_tensors() -> Vec<ChunkDesc> {
        [0, 0, 0, 1, 2, 2, 2, 2, 2]
            .iter()
            .enumerate()
            .map(|(i, &t)| chunk(t, i as u32))
            .collect()
    }

    #[test]
    fn blocks_hold_chunks_of_one_tensor() {
        let chunks = three_tensors();
        let out = pad_to_blocks(&chunks, 4);
        // Every real chunk is there once, in order.
        let real: Vec<u32> = out.iter().filter(|c| c.len > 0).map(|c| c.index).collect();
        assert_eq!(real, (0..9).collect::<Vec<_>>());
        // Each block of 4 has one tensor.
        for b in out.chunks(4) {
            assert!(b.iter().all(|c| c.tensor == b[0].tensor), "{b:?}");
        }
        // Padding is empty: nothing to read or write.
        assert!(out
            .iter()
            .filter(|c| c.len == 0)
            .all(|c| c.payload_len == 0 && c.rans_len == 0 && c.sel_len == 0));
        assert_eq!(out.len(), 4 + 4 + 5);
        assert_eq!(pad_to_blocks(&chunks, 1).len(), 9);
    }

    #[test]
    fn padded_len_counts_what_pad_blocks_hands_out() {
        let mut chunks = three_tensors();
        // Runs of 1..=6 chunks over more tensors, so that blocks of every width end anywhere.
        for (t, run) in (3u32..9).zip(1u32..) {
            chunks.extend((0..run).map(|i| chunk(t, i)));
        }
        let runs = tensor_runs(&chunks);
        for warps in 1..=16 {
            assert_eq!(
                padded_len(&runs, warps),
                pad_to_blocks(&chunks, warps).len(),
                "{warps} warps"
            );
            assert_eq!(padded_len(&runs[..1], warps), runs[0]);
        }
        assert_eq!(padded_len(&[], 4), 0);
    }

    #[test]
    fn auto_takes_two_warps_only_for_one_wave() {
        // bf16 slots (one plane of 4096 units) and fp32 slots (three planes).
        let (bf16, fp32) = (8224, 16416);
        let room10 = HOPPER_DECODE_SMEM - cache_bytes(CACHE_TABLES);
        let most2 = |pw: u32| room10 / (2 * pw + RING_STASH_BYTES);
        assert_eq!((most2(bf16), most2(fp32)), (9, 4));
        // all-MiniLM-L6-v2: 104 tensors, one of them most of the chunks.
        let mut minilm = vec![2usize; 100];
        minilm.push(173);
        assert!(auto_two_warps(&minilm, bf16, room10, 132, true));
        // Its fp32 cast: ~770 chunks do not fit 132 blocks of 4.
        let mut minilm32 = vec![4usize; 100];
        minilm32.push(370);
        assert!(!auto_two_warps(&minilm32, fp32, room10, 132, true));
        // One bf16 tensor of 1024 chunks fits 128 blocks of 8; 1536 chunks do not.
        assert!(auto_two_warps(&[1024], bf16, room10, 132, true));
        assert!(!auto_two_warps(&[1536], bf16, room10, 132, true));
        // Without spreading (a development knob) only the chunk count decides.
        assert!(auto_two_warps(&minilm32, fp32, room10, 132, false));
        assert!(!auto_two_warps(&[1057], bf16, room10, 132, false));
        assert!(auto_two_warps(&[], bf16, room10, 132, true));
    }

    #[test]
    fn spread_width_is_the_narrowest_that_fits_the_sms() {
        let chunks = three_tensors();
        let runs = tensor_runs(&chunks);
        assert_eq!(runs, [3, 1, 5]);
        // Blocks by width: 1 -> 9, 2 -> 2 + 1 + 3 = 6, 3 -> 1 + 1 + 2 = 4, 5 -> 3.
        assert_eq!(spread_width(&runs, 8, 9), Some(1));
        assert_eq!(spread_width(&runs, 8, 8), Some(2));
        assert_eq!(spread_width(&runs, 8, 4), Some(3));
        assert_eq!(spread_width(&runs, 8, 3), Some(5));
        assert_eq!(spread_width(&runs, 4, 3), None);
        // The blocks `pad_blocks` makes at that width are as many as counted.
        assert_eq!(pad_to_blocks(&chunks, 3).len().div_ceil(3), 4);
        assert!(tensor_runs(&[]).is_empty());
        assert_eq!(spread_width(&[], 8, 1), Some(1));
    }

    /// A thread that panics while it holds the engine's shared host buffers leaves them usable:
    /// the engine still downloads, uploads and decodes afterwards (the locks were poisoned, which
    /// used to disable the engine for the rest of the process).
    #[test]
    #[ignore = "needs a CUDA GPU: run with --include-ignored on the device machine"]
    fn engine_works_after_a_thread_panicked_holding_its_buffers() {
        let eng = GpuEngine::new(0).expect("CUDA device");
        std::thread::scope(|sc| {
            let panicked = sc
                .spawn(|| {
                    let _a = eng.pinned_u32(16).unwrap();
                    let _b = eng.small_pinned(16).unwrap();
                    let _c = eng.lock_buffer(&eng.shared.staging).unwrap();
                    panic!("a panic while the buffers are held");
                })
                .join();
            assert!(panicked.is_err());
        });
        assert!(eng.shared.pinned.is_poisoned() && eng.shared.small.is_poisoned());
        // A small tensor (plain copies through the small-transfer buffer) and a 64 MiB one
        // (through the staging buffers).
        for n in [1u64 << 18, 1 << 25] {
            let bf16 = tensorzip::DType::BF16;
            let data = tensorzip::sample::weights(1, n as usize, bf16, 5);
            let opts = tensorzip::CompressOptions::default();
            let want = tensorzip::compress(&data, bf16, &[n], &opts).unwrap();
            let blob = eng.compress_host(&data, bf16, &[n], &opts).unwrap();
            assert!(blob == want, "{n} units: GPU blob differs from the CPU's");
            assert!(eng.decompress_host(&[&want]).unwrap()[0].data == data);
        }
        let s = &eng.shared;
        assert!(!s.pinned.is_poisoned() && !s.small.is_poisoned() && !s.staging.is_poisoned());
    }
}
