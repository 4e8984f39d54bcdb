//! Helpers shared by the development probes (not an example itself: no `main.rs`). Each probe
//! uses some of them, so the others are dead code in its build.
#![allow(dead_code)]

/// CPU time of the process (all threads), in seconds: steadier than wall time on a shared VM.
#[cfg(unix)]
pub fn cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Wall time since the first call, where there is no process CPU clock in `libc`.
#[cfg(not(unix))]
pub fn cpu() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// The dtype named by argument 1 of a probe (`bf16`, `fp32` or `fp16`; bf16 by default).
pub fn dtype_arg(args: &[String]) -> tensorzip::DType {
    match args.get(1).map(String::as_str).unwrap_or("bf16") {
        "fp32" => tensorzip::DType::F32,
        "fp16" => tensorzip::DType::F16,
        "fp64" => tensorzip::DType::F64,
        _ => tensorzip::DType::BF16,
    }
}

/// Argument `i` as a number, or `default`.
pub fn num_arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The thread count from `THREADS` (1 when unset).
pub fn threads_env() -> usize {
    std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Whether to pair bf16 exponents (format version 2, the default): `PAIRS=0` writes version 1.
pub fn pairs_env() -> bool {
    std::env::var("PAIRS").map_or(true, |v| v != "0")
}

/// The tensors of a safetensors file (its bytes): data, dtype and shape of each, in file order.
pub fn file_tensors(bytes: &[u8]) -> Vec<(&[u8], tensorzip::DType, Vec<u64>)> {
    let (_, list) = tensorzip::archive::safetensors_layout(bytes).expect("a safetensors file");
    list.into_iter()
        .map(|t| {
            let dt = tensorzip::DType::from_safetensors_name(&t.dtype_name).expect("dtype");
            (&bytes[t.begin as usize..t.end as usize], dt, t.shape)
        })
        .collect()
}

/// The conditioning named `0` (off) or `all` (fp16 too); anything else is the default.
pub fn condition_named(v: &str) -> tensorzip::Condition {
    match v {
        "0" => tensorzip::Condition::Off,
        "all" => tensorzip::Condition::All,
        _ => tensorzip::Condition::Auto,
    }
}
