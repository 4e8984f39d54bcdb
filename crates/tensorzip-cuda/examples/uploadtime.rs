//! Development probe (device machine): what bounds a staged upload of ~0.7 GB from pageable host
//! memory (a 1 GiB bf16 model's blobs) — the copy engine or the host threads filling the staging
//! buffers. Times (median of `runs`): the staged `upload_gather` without and with the pieces'
//! CRC-32s; one DMA from a page-locked buffer of the same size (the copy engine alone); and the
//! host side alone, all cores copying (and hashing) the same bytes into a page-locked buffer.
//! `cargo run --release -p tensorzip-cuda --example uploadtime -- [MiB] [runs]`
use std::time::Instant;

use cudarc::driver::DevicePtrMut;
use rayon::prelude::*;
use tensorzip_cuda::GpuEngine;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(704);
    let runs: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(7);
    let n = mib << 20;
    let eng = GpuEngine::new(0).expect("a CUDA GPU");
    let s = eng.stream().clone();
    let host: Vec<u8> = (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    // Eight pieces, 16-aligned, like a model's blobs.
    let per = n / 8;
    let pieces: Vec<(&[u8], u64)> = (0..8)
        .map(|k| (&host[k * per..(k + 1) * per], (k * per) as u64))
        .collect();
    let mut dev = s.alloc_zeros::<u8>(n).unwrap();
    let dp = dev.device_ptr_mut(&s).0;
    let gb = |t: f64| n as f64 / t / 1e9;
    let time = |f: &dyn Fn()| -> f64 {
        f();
        median(
            (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .collect(),
        )
    };
    // SAFETY: `dev` holds `n` bytes, the end of the last piece, and lives until the end of main.
    let staged = time(&|| unsafe { eng.upload_gather(&pieces, dp) }.unwrap());
    // SAFETY: as above.
    let staged_crc = time(&|| {
        unsafe { eng.upload_gather_crc(&pieces, dp) }.unwrap();
    });
    // SAFETY: plain bytes, written before read.
    let mut pinned = unsafe { eng.context().alloc_pinned_with_flags::<u8>(n, 0) }.unwrap();
    pinned.as_mut_slice().unwrap().copy_from_slice(&host);
    let dma = time(&|| {
        // SAFETY: `dev` holds `n` bytes; the pinned buffer outlives the copy, which is waited for.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dp, pinned.as_slice().unwrap(), s.cu_stream())
        }
        .unwrap();
        s.synchronize().unwrap();
    });
    let pin_ptr = pinned.as_mut_slice().unwrap().as_mut_ptr() as usize;
    let fill = |crc: bool| {
        // SAFETY: the pinned buffer holds `n` bytes and is not used by anything else meanwhile.
        let dst = unsafe { std::slice::from_raw_parts_mut(pin_ptr as *mut u8, n) };
        dst.par_chunks_mut(1 << 20)
            .zip(host.par_chunks(1 << 20))
            .for_each(|(d, src)| {
                d.copy_from_slice(src);
                if crc {
                    std::hint::black_box(crc32fast::hash(d));
                }
            });
    };
    let host_copy = time(&|| fill(false));
    let host_copy_crc = time(&|| fill(true));
    println!(
        "{mib} MiB, {} threads: staged upload {:.1} GB/s, with CRCs {:.1}; one DMA from page-locked memory {:.1}; host fill alone {:.1}, with CRCs {:.1}",
        rayon::current_num_threads(), gb(staged), gb(staged_crc), gb(dma), gb(host_copy), gb(host_copy_crc)
    );
}
