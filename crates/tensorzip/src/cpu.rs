//! Run-time CPU feature detection and the constant tables the SIMD paths share.

use std::sync::OnceLock;

/// Defines `fn $name(args) -> R`, which runs `$body` (an `#[inline(always)]` function of the same
/// arguments) compiled for AVX-512F where [`has_avx512`], for AVX2 where [`has_avx2`], and else
/// for the baseline target: the compiler vectorises `$body`'s loops for each.
///
/// Why: code inlined into a closure (a rayon task's) or into a generic iterator's `next` is
/// compiled for the baseline target (SSE2 on x86-64) whatever the features of the functions around
/// it, so a hot loop there belongs in a `#[target_feature]` function (docs/DESIGN.md, "CPU
/// engine"). The AVX-512 variant enables AVX-512F (and AVX2) only: [`has_avx512`] checks no more,
/// and with `avx512bw` enabled a CPU with F but not BW could be handed BW instructions.
macro_rules! dispatch_wide {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:path;
    ) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,popcnt")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,popcnt")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if $crate::cpu::has_avx512() {
                    // SAFETY: AVX-512F support was checked at run time.
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::cpu::has_avx2() {
                    // SAFETY: AVX2 support was checked at run time.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

/// Whether the switch `name` (e.g. `TENSORZIP_NO_AVX512`) is on: set to anything but `0`.
pub(crate) fn switch_on(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v != "0")
}

/// Whether this CPU runs our AVX2 code: AVX2 and POPCNT (checked once; `TENSORZIP_NO_SIMD=1` forces
/// the scalar paths). The SIMD functions enable both: with AVX2 alone the compiler may not use the
/// `popcnt` instruction, and it emulated the population counts of the refill and split masks with
/// byte shuffles (measured: the conditioned split took 16% of bf16 compress time).
pub fn has_avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if switch_on("TENSORZIP_NO_SIMD") {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// For a test of AVX2 code called directly: [`has_avx2`], with the reason printed where the test
/// skips (no AVX2, or `TENSORZIP_NO_SIMD`).
#[cfg(test)]
pub(crate) fn avx2_or_skip() -> bool {
    let has = has_avx2();
    if !has {
        eprintln!("skipped: no AVX2 on this CPU (or TENSORZIP_NO_SIMD)");
    }
    has
}

/// Whether this CPU also runs our AVX-512 code: AVX-512F (checked once; `TENSORZIP_NO_AVX512=1`
/// turns it off, for comparisons; `TENSORZIP_NO_SIMD=1` too).
pub fn has_avx512() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if !has_avx2() || switch_on("TENSORZIP_NO_AVX512") {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether this CPU also has AVX-512BW, AVX-512VBMI (byte permutes) and AVX-512VBMI2 (byte
/// expansion), for the conditioned plane's split and scatter and the encoder's lookups by rank
/// (off with [`has_avx512`]). Every CPU
/// with VBMI2 we know of (Intel since Ice Lake, AMD since Zen 4) has VBMI too.
pub fn has_avx512_vbmi2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if !has_avx512() {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vbmi")
                && std::is_x86_feature_detected!("avx512vbmi2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the encoder should look up tables of 33 to 128 symbols by rank with register permutes
/// ([`crate::rans::table::RankedTable`]) rather than gather them: AVX-512 VBMI on an AMD CPU
/// (checked once). On the Zen 4 VM a 16-lane gather issues only every ~7.5 ns and the wide
/// lookup took MiniLM fp16's encode pass from 32.4-41.4 to 28.2-33.5 ms; on the Intel VM the
/// encoder's step is bound by its 512-bit operations, not by its gathers (a bound measured with
/// the gathers replaced by permutes: at most 5%), so the wide lookup's extra permutes and blends
/// are left out there (docs/DESIGN.md, "Small tables by rank").
pub fn wide_rank_lookups() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx512_vbmi2() && is_amd())
}

/// Whether the CPU's vendor is AMD (CPUID leaf 0; checked once). The choices made by it were
/// measured on one AMD (Zen 4) and one Intel VM; a new CPU family should re-measure them.
pub fn is_amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            [id.ebx, id.edx, id.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .eq(*b"AuthenticAMD")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// How far ahead of its loads the byte-plane split prefetches its source (`transform`'s wide
/// splits, where a compress first reads the tensor and waits on those loads: half their samples
/// on the instruction after them): 3072 bytes on AMD, 1024 elsewhere. Intel VM (2026-12-03,
/// one-thread warm compress, the distance alternated in one process): synthetic fp32 1.54-1.58
/// GB/s without a prefetch, 1.61-1.66 at 512 bytes, 1.63-1.75 at 1024, 1.53-1.65 at 2048;
/// synthetic bf16 1.08-1.10 without, 1.13-1.18 at 512-2048. Zen 4 VM (2026-12-07, one-thread
/// encode pass, `PHASE=encode examples/phasetime`, eight alternating rounds, medians): against
/// 1024 bytes, 2048 took 0.965-0.991 of the time, **3072 0.960-0.970**, 4096 0.964-0.977 over
/// MiniLM bf16 and fp32 and the synthetic bf16 and fp32 sets. A prefetch never faults, so
/// addresses past the source's end are harmless.
pub fn split_prefetch_bytes() -> usize {
    match is_amd() {
        true => 3072,
        false => 1024,
    }
}

/// Whether the AVX-512 decoder should look small tables up by rank with register permutes
/// ([`crate::rans::table::RankedDecodeTable`]) rather than gather them: by default on AMD CPUs
/// with AVX-512 VBMI (checked once; `TENSORZIP_RANKED_DECODE=0` or `=1` overrides the choice,
/// for comparisons, on any CPU with VBMI). On the Zen 4 VM a 16-lane gather issues only every
/// ~7.5 ns (docs/DESIGN.md, "Small tables by rank").
pub fn ranked_decode() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| match std::env::var_os("TENSORZIP_RANKED_DECODE") {
        Some(v) => has_avx512_vbmi2() && v != "0",
        None => wide_rank_lookups(),
    })
}

/// For each 8-bit mask of lanes that refill, the source word index of each lane: lane `i` takes word
/// `popcount(mask & ((1 << i) - 1))` (lanes outside the mask get an index that is ignored).
pub fn refill_permutations() -> &'static [[u32; 8]; 256] {
    static T: OnceLock<Box<[[u32; 8]; 256]>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([[0u32; 8]; 256]);
        for (m, row) in t.iter_mut().enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                *v = (m & ((1 << i) - 1)).count_ones();
            }
        }
        t
    })
}

/// For each 8-bit mask of lanes that emit a word (bit `i` = lane `i`), a byte shuffle that packs the
/// 16-bit words of those lanes, given in descending lane order (lane 7 first), to the front.
pub fn emit_shuffles() -> &'static [[u8; 16]; 256] {
    static T: OnceLock<Box<[[u8; 16]; 256]>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([[0x80u8; 16]; 256]);
        for (m, row) in t.iter_mut().enumerate() {
            let mut k = 0;
            for j in 0..8 {
                // Word j of the input holds lane 7 - j.
                if m & (1 << (7 - j)) != 0 {
                    row[2 * k] = 2 * j as u8;
                    row[2 * k + 1] = 2 * j as u8 + 1;
                    k += 1;
                }
            }
        }
        t
    })
}
