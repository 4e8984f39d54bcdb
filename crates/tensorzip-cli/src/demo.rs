//! `tensorzip demo`: the main job on the built-in sample model — write it as a .safetensors file,
//! compress it, verify the archive, restore the file and compare it byte for byte; print ratio and
//! speed.

use std::time::Instant;

use tensorzip::archive::{
    plan_safetensors, serialize_safetensors, write_archive, Archive, ArchiveOptions,
};
use tensorzip::sample;

use crate::bench::median;
use crate::Common;

/// How many times the demo compresses and decompresses the sample model.
const RUNS: usize = 5;

pub fn run(common: &Common) -> Result<(), String> {
    // The process's pool sized by --threads, as the file commands do: the archive writer's
    // checksums run on it too, so `-t N` keeps the whole demo to N threads.
    let eng = crate::commands::engine(common)?;
    let model = sample::sample_model(2026);
    let views: Vec<(&str, &str, &[u64], &[u8])> = model
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.dtype.safetensors_name(),
                t.shape.as_slice(),
                t.data.as_slice(),
            )
        })
        .collect();
    let file = serialize_safetensors(&views, Some(&[("format".into(), "pt".into())]))
        .map_err(|e| e.to_string())?;
    // A directory of its own (never one already there), removed on Ctrl-C too (the interrupt
    // handler removes what is pending).
    let dir = std::env::temp_dir().join(format!("tensorzip-demo-{}", std::process::id()));
    crate::output::pending_create(|| std::fs::create_dir(&dir).map(|()| (dir.clone(), ())))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = (|| {
        let src_path = dir.join("sample.safetensors");
        std::fs::write(&src_path, &file).map_err(|e| format!("{}: {e}", src_path.display()))?;
        let segments = plan_safetensors(&file).map_err(|e| e.to_string())?;
        let ar_path = dir.join("sample.safetensors.tz");
        let mut out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&ar_path)
            .map_err(|e| format!("{}: {e}", ar_path.display()))?;
        // The first run of each step pays for fresh memory and cold caches (on small VMs a new
        // page costs more than coding it); the repeated runs are what a process that keeps
        // working sees. Both are printed.
        let mut t_c = Vec::with_capacity(RUNS);
        let mut len = 0;
        for _ in 0..RUNS {
            let t = Instant::now();
            len = write_archive(
                &eng,
                &file[..],
                &segments,
                &ArchiveOptions::default(),
                &mut out,
                &|_| {},
            )
            .map_err(|e| e.to_string())?;
            t_c.push(t.elapsed().as_secs_f64());
        }
        drop(out);
        let archive = std::fs::read(&ar_path).map_err(|e| format!("{}: {e}", ar_path.display()))?;
        let ar = Archive::parse(&archive).map_err(|e| e.to_string())?;
        // Decode everything into one buffer, as `tensorzip decompress` writes it, checking every
        // checksum; the buffer is reused by the repeated runs.
        let mut restored = Vec::with_capacity(file.len());
        let mut t_d = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            restored.clear();
            let t = Instant::now();
            ar.decode_all_to(&eng, &mut restored, &|_| {})
                .map_err(|e| e.to_string())?;
            t_d.push(t.elapsed().as_secs_f64());
            if restored != file {
                return Err("demo: the restored file differs from the original".to_string());
            }
        }
        let gbps = |t: f64| file.len() as f64 / t / 1e9;
        crate::commands::print_out(&format!(
            "sample model: {} tensors, {:.1} MiB (.safetensors) -> {:.1} MiB, ratio {:.2}%\n\
             compress {:.2} GB/s, verify+decompress {:.2} GB/s on {} (median of runs 2-{RUNS}; \
             first run {:.2} / {:.2}); restored file is identical\n",
            model.len(),
            file.len() as f64 / (1 << 20) as f64,
            len as f64 / (1 << 20) as f64,
            len as f64 / file.len() as f64 * 100.0,
            gbps(median(t_c[1..].to_vec())),
            gbps(median(t_d[1..].to_vec())),
            crate::commands::threads_note(eng.threads()),
            gbps(t_c[0]),
            gbps(t_d[0]),
        ))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    crate::output::pending_remove(&dir);
    result
}
