//! `tensorzip`: compress, decompress, inspect and verify `.safetensors` files.
//!
//! The command line as a library: [`run`] is the whole command, called by this crate's binary
//! (`src/main.rs`) and by the Python package's console script (`python -m tensorzip`, or the
//! `tensorzip` script a `pip install` puts on the path), so that a wheel gives the same command.

/// A status or error line on stderr. A closed stderr (`tensorzip ... 2>&1 | true`) is not the
/// command's failure: `eprintln!` panicked there (exit 101) after the work was done.
macro_rules! status {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod bench;
mod commands;
mod copies;
mod demo;
mod output;
#[cfg(unix)]
mod sigbus;
mod tree;
/// No `SIGBUS` elsewhere: nothing to prepare.
#[cfg(not(unix))]
mod sigbus {
    pub fn install() {}
    pub fn writing(_temp: Option<&std::path::Path>) {}
    pub fn created(_path: &std::path::Path) {}
    pub fn tree_done() {}
    pub struct Reading;
    impl Reading {
        pub fn new(_path: &std::path::Path) -> Reading {
            Reading
        }
    }
}

use std::ffi::OsString;
use std::path::Path;

use clap::{Args, Parser, Subcommand};
use tree::Wanted;

#[derive(Parser)]
#[command(
    name = "tensorzip",
    version,
    about = "Lossless compression of neural-network tensors (.safetensors files)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options shared by the commands that do work.
#[derive(Args, Clone)]
pub struct Common {
    /// Worker threads (0 = all cores; at most 1024).
    #[arg(long, short = 't', default_value_t = 0,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(0..=tensorzip::engine::MAX_THREADS as u64))]
    threads: usize,
}

/// Where `compress` and `decompress` write.
#[derive(Args)]
struct OutputArgs {
    /// Output path (only with a single input; for a directory, the new directory).
    #[arg(short, long)]
    output: Option<std::path::PathBuf>,
    /// Write each output into this directory (under its default name) instead of next to
    /// its input.
    #[arg(short = 'O', long, conflicts_with = "output")]
    output_dir: Option<std::path::PathBuf>,
    /// Overwrite the output if it exists.
    #[arg(short, long)]
    force: bool,
}

/// Where decoding runs.
#[derive(Args, Clone)]
pub struct DecodeArgs {
    /// Decode on the first CUDA GPU (many tensors per launch); checksums are checked as on the CPU.
    #[arg(long)]
    gpu: bool,
}

/// Encoder options (meanings as in cuZipNN's `compress_tensor`).
#[derive(Args, Clone)]
pub struct EncoderArgs {
    /// Bytes of original data per independently coded chunk (a multiple of 8, at most 16 MiB).
    #[arg(long, default_value_t = tensorzip::CompressOptions::default().chunk_bytes)]
    chunk_bytes: usize,
    /// Units per table-selection block (a power of two, 32..=65536).
    #[arg(long, default_value_t = tensorzip::CompressOptions::default().block_units)]
    block_units: u32,
    /// A block stays coded only below this fraction of its raw size, in (0, 1].
    #[arg(long, default_value_t = tensorzip::CompressOptions::default().passthrough_threshold)]
    passthrough_threshold: f64,
    /// Tensors smaller than this many bytes are stored uncompressed.
    #[arg(long, default_value_t = tensorzip::CompressOptions::default().min_compress_bytes)]
    min_compress_bytes: usize,
    /// Most frequency tables per byte plane (1..=64).
    #[arg(long, default_value_t = tensorzip::CompressOptions::default().max_tables)]
    max_tables: usize,
    /// Do not code the byte below the exponent conditioned on the exponent (faster to decode,
    /// 0.1-0.3 points larger on float weights).
    #[arg(long, conflicts_with = "condition_fp16")]
    no_condition: bool,
    /// Consider the conditioned byte for fp16 too (by default bf16, fp32 and fp64 only: fp16's
    /// byte below the top byte is low mantissa bits, where it measured no gain).
    #[arg(long)]
    condition_fp16: bool,
    /// Write format version 1 only: bf16 exponents one unit a symbol, as tensorzip before
    /// 2026-12-05 reads them (by default bf16 exponents are coded two units a symbol, format
    /// version 2: 1.1-1.2x faster to decode on one CPU thread, as fast to compress, ~0.1 points
    /// larger; small tensors stay version 1).
    #[arg(long)]
    no_pair_exponents: bool,
}

impl EncoderArgs {
    pub fn options(&self) -> tensorzip::CompressOptions {
        tensorzip::CompressOptions {
            chunk_bytes: self.chunk_bytes,
            block_units: self.block_units,
            passthrough_threshold: self.passthrough_threshold,
            min_compress_bytes: self.min_compress_bytes,
            max_tables: self.max_tables,
            condition: match (self.no_condition, self.condition_fp16) {
                (true, _) => tensorzip::Condition::Off,
                (false, true) => tensorzip::Condition::All,
                (false, false) => tensorzip::Condition::Auto,
            },
            pair_exponents: !self.no_pair_exponents,
            ..Default::default()
        }
    }

    /// The options' validation (`CompressOptions::validate`) in the flags' names: a usage error,
    /// reported once before any file is touched.
    fn check(&self) -> Result<(), String> {
        self.options().validate().map_err(|e| {
            let mut msg = e.to_string();
            for field in [
                "chunk_bytes",
                "block_units",
                "passthrough_threshold",
                "min_compress_bytes",
                "max_tables",
            ] {
                msg = msg.replace(field, &format!("--{}", field.replace('_', "-")));
            }
            msg
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Compress .safetensors files into tensorzip archives (default output: FILE.tz).
    ///
    /// Several files (the shards of a checkpoint, say) are compressed one after the other; a
    /// file that fails is reported and the others are still done, and the exit status is then
    /// non-zero. A directory stands for the .safetensors files under it; `DIR -o OUT` instead
    /// makes OUT a copy of the whole model directory with its .safetensors files compressed and
    /// every other file (config, tokenizer, index) copied — built aside and renamed into place
    /// when complete; OUT must not exist, and DIR must hold no .tz archive already. Names that
    /// begin with "." are skipped (and named as skipped). Outputs take their input's permissions.
    Compress {
        /// Files, or model directories.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        #[command(flatten)]
        out: OutputArgs,
        /// Store a CRC-32 of every N bytes of each blob (cuZipNN's checksum_chunk_bytes); 0 = one per blob.
        #[arg(long, default_value_t = 0)]
        checksum_chunk_bytes: u32,
        /// Encode on the first CUDA GPU (the same bytes as the CPU engine writes).
        #[arg(long)]
        gpu: bool,
        /// Decode each archive just written (on the CPU) and compare it with its input before
        /// it takes its name: a faulty archive is never kept.
        #[arg(long)]
        verify: bool,
        #[command(flatten)]
        enc: EncoderArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Restore the original .safetensors files, byte for byte (default output: ARCHIVE without .tz).
    ///
    /// Several archives are restored one after the other, as `compress` does. A directory stands
    /// for the .tz archives under it; `DIR -o OUT` makes OUT a copy of the directory with its
    /// archives restored and every other file copied (the original model directory back).
    Decompress {
        /// Archives, or directories of them.
        #[arg(required = true)]
        archives: Vec<std::path::PathBuf>,
        #[command(flatten)]
        out: OutputArgs,
        #[command(flatten)]
        dec: DecodeArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Per tensor: dtype, shape, size, compressed size, ratio and how each byte plane is coded.
    ///
    /// A directory stands for the .tz archives under it.
    Info {
        /// Archives, or directories of them.
        #[arg(required = true)]
        archives: Vec<std::path::PathBuf>,
        /// Print JSON instead of a table (an array of the archives' documents when there are
        /// several).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Check every checksum and decode everything (nothing is written).
    ///
    /// A directory stands for the .tz archives under it, and the files `compress ORIG -o DIR`
    /// copied into it are checked against their checksums (DIR/.tensorzip-copies.json);
    /// `DIR --against ORIG` checks such a directory against ORIG: each archive against its
    /// original, every other file against its namesake, and no file missing on either side.
    Verify {
        /// Archives, or directories of them.
        #[arg(required = true)]
        archives: Vec<std::path::PathBuf>,
        /// Also compare the decoded bytes with this original file (only with a single archive;
        /// a directory with a directory).
        #[arg(long)]
        against: Option<std::path::PathBuf>,
        #[command(flatten)]
        dec: DecodeArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Build the built-in sample model, compress, verify and decompress it; print ratio and speed.
    Demo {
        #[command(flatten)]
        common: Common,
    },
    /// Measure ratio and speed on .safetensors files (tensor by tensor, median of runs); prints JSON lines.
    Bench {
        /// The .safetensors files to measure (a directory: the .safetensors files under it).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Cast f32 tensors to this dtype first.
        #[arg(long, default_value = "none", value_parser = ["none", "bf16", "f16"])]
        cast: String,
        /// Timed runs per measurement (the median is reported), 1 to 10000 (every run's time is
        /// kept for the median: 2^32 ran until killed, its memory growing).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        runs: u64,
        /// Also measure thread scaling in pairs: each run times the warm compress and decompress on
        /// one thread and on `--threads` back to back (and a compute loop, the machine's own
        /// scaling), and reports the median of the per-run ratios
        #[arg(long)]
        scaling: bool,
        #[command(flatten)]
        enc: EncoderArgs,
        #[command(flatten)]
        common: Common,
    },
}

/// `option` (a path that goes with one input: `-o`, `--against`) is refused with several inputs;
/// `hint` says what to do instead.
fn one_output(
    inputs: &[std::path::PathBuf],
    option: &Option<std::path::PathBuf>,
    name: &str,
    hint: &str,
) -> Result<(), String> {
    match (option, inputs.len()) {
        (Some(p), n) if n > 1 => Err(format!(
            "{name} {} names one file, but {n} inputs were given ({hint})",
            p.display()
        )),
        _ => Ok(()),
    }
}

/// What to do instead of `-o` with several inputs.
const EACH_OUTPUT: &str =
    "leave -o out: each input gets its own output, next to it or in --output-dir";

/// Runs `one` on each input in turn. With several inputs a failure is reported on its own line
/// and the others are still done (as gzip does); the result is then an error that counts them.
fn each(
    inputs: &[std::path::PathBuf],
    mut one: impl FnMut(&std::path::Path) -> Result<(), String>,
) -> Result<(), String> {
    if let [single] = inputs {
        return one(single);
    }
    let mut failed = 0;
    for input in inputs {
        if let Err(msg) = one(input) {
            status!("tensorzip: error: {msg}");
            failed += 1;
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} of {} inputs failed", inputs.len())),
    }
}

/// `compress` / `decompress` of their inputs with `convert(input, output, force)` (which returns
/// the original's and the archive's sizes): a single directory with `-o` is mirrored
/// ([`tree::mirror`]; never with force), anything else expanded ([`tree::expand`]) and done file
/// by file ([`each`]), followed by their total when there are several ("2 of 3" where some
/// failed).
fn convert_inputs(
    inputs: &[std::path::PathBuf],
    out: &OutputArgs,
    wanted: Wanted,
    convert: impl Fn(&Path, commands::Output<'_>, bool) -> Result<(u64, u64), String>,
) -> Result<(), String> {
    if let ([dir], Some(dest)) = (inputs, &out.output) {
        if tree::is_dir(dir) {
            return tree::mirror(dir, dest, wanted, |f, o| convert(f, o, false));
        }
    }
    one_output(inputs, &out.output, "-o", EACH_OUTPUT)?;
    let files = tree::expand(inputs, wanted)?;
    commands::check_dir(out.output_dir.as_deref(), &files)?;
    let mut totals = commands::Totals::default();
    let done = each(&files, |f| {
        let o = commands::Output::of(&out.output, &out.output_dir);
        let (original, archive) = convert(f, o, out.force)?;
        totals.add(original, archive);
        Ok(())
    });
    if files.len() > 1 && totals.files() > 0 {
        status!(
            "{}",
            match wanted {
                Wanted::Models => totals.line("files compressed", files.len()),
                Wanted::Archives => totals.restored_line(files.len()),
            }
        );
    }
    done
}

/// Runs the command line on `args` (the program's name first) and returns its exit status: 0
/// done, 1 failed (the error printed on stderr), 2 a usage error (clap's message). It installs
/// the process's Ctrl-C / SIGTERM / SIGHUP and SIGBUS handlers (temporary outputs are removed and
/// the process exits): meant for a process that runs one command.
pub fn run(args: impl IntoIterator<Item = OsString>) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0, usage errors to stderr with 2.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    output::on_interrupt();
    sigbus::install();
    let result = match cli.command {
        Command::Compress {
            files,
            out,
            checksum_chunk_bytes,
            gpu,
            verify,
            enc,
            common,
        } => {
            if let Err(msg) = enc.check() {
                status!("tensorzip: error: {msg}");
                return 2;
            }
            let set = commands::CompressSettings {
                piece: checksum_chunk_bytes,
                gpu,
                verify,
                enc: &enc,
                common: &common,
            };
            convert_inputs(&files, &out, Wanted::Models, |f, o, force| {
                commands::compress(f, o, force, &set)
            })
        }
        Command::Decompress {
            archives,
            out,
            dec,
            common,
        } => convert_inputs(&archives, &out, Wanted::Archives, |a, o, force| {
            commands::decompress(a, o, force, &dec, &common)
        }),
        Command::Info {
            archives,
            json,
            common,
        } => tree::expand(&archives, Wanted::Archives)
            .and_then(|archives| commands::info(&archives, json, &common)),
        Command::Verify {
            archives,
            against,
            dec,
            common,
        } => match (&archives[..], &against) {
            ([dir], Some(orig)) if tree::is_dir(dir) => tree::verify_mirror(dir, orig, |a, o| {
                commands::verify(a, Some(o), &dec, &common)
            }),
            _ => one_output(
                &archives,
                &against,
                "--against",
                "verify each archive against its original in a command of its own",
            )
            .and_then(|()| tree::expand(&archives, Wanted::Archives))
            .and_then(|files| {
                let r = each(&files, |a| {
                    commands::verify(a, against.as_deref(), &dec, &common)
                });
                // A compressed model directory's copied files, against its manifest (checked
                // whatever the archives gave: each problem is reported).
                let c: Vec<Result<(), String>> = archives
                    .iter()
                    .filter(|d| tree::is_dir(d))
                    .map(|d| tree::verify_copies(d))
                    .collect();
                r.and(c.into_iter().find(Result::is_err).unwrap_or(Ok(())))
            }),
        },
        Command::Demo { common } => demo::run(&common),
        Command::Bench {
            files,
            cast,
            runs,
            scaling,
            enc,
            common,
        } => {
            if let Err(msg) = enc.check() {
                status!("tensorzip: error: {msg}");
                return 2;
            }
            bench::run(&files, &cast, runs as usize, scaling, &enc, &common)
        }
    };
    match result {
        Ok(()) => 0,
        Err(msg) => {
            status!("tensorzip: error: {msg}");
            1
        }
    }
}
