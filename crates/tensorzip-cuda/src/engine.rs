//! The GPU engine: a CUDA context, a stream and the compiled kernels; batch decoding of blobs.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use tensorzip::blob::BlobLayout;
use tensorzip::Tensor;

use crate::error::{Error, Result};
use crate::plan::{Job, Plan};

/// Source of the decoder kernel.
pub const DECODE_SRC: &str = include_str!("../kernels/decode.cu");

/// Shared memory one block of the decoder may use (the H200 allows 227 KiB).
const MAX_SMEM: u32 = 200 * 1024;

/// The GPU engine of one device.
pub struct GpuEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    decode: CudaFunction,
}

impl GpuEngine {
    /// An engine on device `ordinal` (the primary context; its default stream).
    pub fn new(ordinal: usize) -> Result<GpuEngine> {
        crate::available().map_err(Error::Unavailable)?;
        let ctx = CudaContext::new(ordinal)?;
        let module = ctx.load_module(Ptx::from_binary(crate::compile::cubin(
            &ctx,
            "tz_decode",
            DECODE_SRC,
        )?))?;
        let decode = module.load_function("tz_decode")?;
        let stream = ctx.default_stream();
        Ok(GpuEngine {
            ctx,
            stream,
            decode,
        })
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream the engine's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Launches the decoding of `plan`: blob bytes at device address `data`, output at `out`.
    /// Asynchronous on the engine's stream; returns the error flags to check after synchronising.
    ///
    /// # Safety
    /// `data` and `out` must be valid device addresses covering every offset in `plan` (the plan
    /// was built from layouts whose offsets lie inside the blobs at `data`, and whose outputs lie in
    /// `out`), and must stay alive until the stream has run the launch.
    pub unsafe fn launch_decode(&self, plan: &Plan, data: u64, out: u64) -> Result<CudaSlice<u32>> {
        let s = &self.stream;
        let mut err = s.clone_htod(&[0u32, u32::MAX])?;
        for c in &plan.copies {
            if c.len > 0 {
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
        }
        if plan.chunks.is_empty() {
            return Ok(err);
        }
        let chunks = s.clone_htod(&plan.chunks)?;
        let tensors = s.clone_htod(&plan.tensors)?;
        let tables = s.clone_htod(if plan.tables.is_empty() {
            &[0u32][..]
        } else {
            &plan.tables
        })?;
        let info = s.clone_htod(if plan.table_info.is_empty() {
            &[0u32][..]
        } else {
            &plan.table_info
        })?;
        let n = plan.chunks.len() as u32;
        let (warps, smem, scratch) = if plan.global_scratch {
            (
                4u32,
                0u32,
                Some(s.alloc_zeros::<u8>(n as usize * plan.per_warp as usize)?),
            )
        } else {
            let warps = (MAX_SMEM / plan.per_warp).clamp(1, 8);
            (warps, warps * plan.per_warp, None)
        };
        self.decode.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(warps), 1, 1),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: smem,
        };
        let (scratch_ptr, _g) = match &scratch {
            Some(b) => {
                let (p, g) = b.device_ptr(s);
                (p, Some(g))
            }
            None => (0u64, None),
        };
        let per_warp = plan.per_warp;
        let mut b = s.launch_builder(&self.decode);
        b.arg(&data)
            .arg(&chunks)
            .arg(&n)
            .arg(&tensors)
            .arg(&tables)
            .arg(&info)
            .arg(&out)
            .arg(&mut err);
        b.arg(&scratch_ptr).arg(&per_warp).arg(&warps);
        // SAFETY: the arguments match the kernel's signature; every pointer is valid for the sizes
        // the plan describes (guaranteed by the caller for `data` and `out`).
        unsafe { b.launch(cfg) }?;
        drop(_g);
        // Keep the descriptors alive until the launch has run.
        s.synchronize()?;
        drop((chunks, tensors, tables, info, scratch));
        Ok(err)
    }

    /// Reads the error flags of a launch (synchronises the stream).
    pub fn check(&self, err: &CudaSlice<u32>) -> Result<()> {
        let e = self.stream.clone_dtoh(err)?;
        if e[0] != 0 {
            let what = match e[0] {
                1 => "block selector names no table",
                2 => "rANS stream ends early",
                3 => "rANS state below 2^16",
                4 => "raw area of the wrong size",
                5 => "rANS stream does not end exactly",
                6 => "rANS stream present where nothing is coded, or missing",
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

    /// Decodes blobs held on the host: uploads them, decodes them on the GPU in one launch, and
    /// downloads the tensors.
    pub fn decompress_host(&self, blobs: &[&[u8]]) -> Result<Vec<Tensor>> {
        let layouts: Vec<BlobLayout> = blobs
            .iter()
            .map(|b| BlobLayout::parse(b, b.len()))
            .collect::<std::result::Result<_, _>>()?;
        let mut data = Vec::with_capacity(blobs.iter().map(|b| b.len()).sum());
        let mut jobs = Vec::with_capacity(blobs.len());
        let mut out_len = 0u64;
        let mut outs = Vec::with_capacity(blobs.len());
        for (b, l) in blobs.iter().zip(&layouts) {
            jobs.push(Job {
                layout: l,
                data_offset: data.len() as u64,
                out_offset: out_len,
            });
            data.extend_from_slice(b);
            let n = l.header.nbytes();
            outs.push((out_len, n));
            // Keep every tensor aligned to 16 bytes.
            out_len += n.div_ceil(16) * 16;
        }
        let plan = Plan::new(&jobs)?;
        let s = &self.stream;
        let dev_data = s.clone_htod(if data.is_empty() { &[0u8][..] } else { &data })?;
        let mut dev_out = s.alloc_zeros::<u8>(out_len.max(1) as usize)?;
        {
            let (dp, _g1) = dev_data.device_ptr(s);
            let (op, _g2) = dev_out.device_ptr_mut(s);
            // SAFETY: the plan's offsets lie inside `dev_data` (layouts were parsed from these
            // bytes) and its outputs inside `dev_out` (sized above); both outlive the launch,
            // which `launch_decode` waits for.
            let err = unsafe { self.launch_decode(&plan, dp, op)? };
            self.check(&err)?;
        }
        let host = s.clone_dtoh(&dev_out)?;
        Ok(layouts
            .iter()
            .zip(outs)
            .map(|(l, (o, n))| Tensor {
                dtype: l.header.dtype,
                shape: l.header.shape.clone(),
                data: host[o as usize..(o + n) as usize].to_vec(),
            })
            .collect())
    }
}
