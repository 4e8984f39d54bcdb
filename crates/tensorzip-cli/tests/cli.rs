//! The command line, end to end: restores are byte-exact, outputs are never overwritten by accident,
//! and every bad input gives a one-line error naming the file, a non-zero exit code, and no leftovers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tensorzip::archive::serialize_safetensors;
use tensorzip::sample::{self, Rng};
use tensorzip::DType;

fn tz(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensorzip"))
        .current_dir(dir)
        .args(args)
        .env_remove("TENSORZIP_NO_SIMD")
        .output()
        .expect("run the tensorzip binary")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\nstderr: {}\nstdout: {}",
        o.status,
        stderr(o),
        String::from_utf8_lossy(&o.stdout)
    );
}

/// A failure: exit code 1 (not a crash), one line on stderr that contains every one of `needles`.
fn fails(o: &Output, what: &str, needles: &[&str]) -> String {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{what}: expected exit code 1, got {:?}\nstderr: {err}",
        o.status
    );
    let line = err.trim_end();
    assert_eq!(
        line.lines().count(),
        1,
        "{what}: stderr is not one line:\n{err}"
    );
    assert!(line.starts_with("tensorzip: error: "), "{what}: {line}");
    for n in needles {
        assert!(
            line.contains(n),
            "{what}: stderr does not mention {n:?}: {line}"
        );
    }
    line.to_string()
}

/// No temporary output file (`.NAME.tmp-*`) is left in `dir`.
fn no_temp_files(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !(name.starts_with('.') && name.contains(".tmp-")),
            "temporary file left behind: {name}"
        );
    }
}

fn model_bytes() -> Vec<u8> {
    let w = sample::weights(32, 300, DType::BF16, 1);
    let mut rng = Rng::new(2);
    let norm: Vec<u8> = (0..300)
        .flat_map(|_| ((1.0 + 0.05 * rng.normal()) as f32).to_le_bytes())
        .collect();
    let ids: Vec<u8> = (0..100i64).flat_map(|i| i.to_le_bytes()).collect();
    let f16 = sample::weights(10, 70, DType::F16, 3);
    let tensors: Vec<(&str, &str, &[u64], &[u8])> = vec![
        ("layers.0.weight", "BF16", &[32u64, 300][..], &w[..]),
        ("layers.0.norm", "F32", &[300u64][..], &norm[..]),
        ("position_ids", "I64", &[1u64, 100][..], &ids[..]),
        ("head", "F16", &[10u64, 70][..], &f16[..]),
        ("empty", "F32", &[0u64, 4][..], &[][..]),
    ];
    let meta = vec![
        ("format".to_string(), "pt".to_string()),
        ("note".to_string(), "tensorzip cli test".to_string()),
    ];
    serialize_safetensors(&tensors, Some(&meta)).unwrap()
}

/// A temporary directory holding `model.safetensors` and its archive `model.safetensors.tz`.
fn setup() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let model = model_bytes();
    std::fs::write(dir.path().join("model.safetensors"), &model).unwrap();
    // Small chunks, so the archive has several chunks per tensor.
    ok(
        &tz(
            dir.path(),
            &[
                "compress",
                "model.safetensors",
                "--chunk-bytes",
                "1024",
                "--block-units",
                "64",
                "-t",
                "2",
            ],
        ),
        "compress",
    );
    let archive = dir.path().join("model.safetensors.tz");
    assert!(archive.exists());
    (dir, archive, model)
}

#[test]
fn compress_decompress_round_trip_is_byte_exact() {
    let (dir, archive, model) = setup();
    let d = dir.path();
    let ar = std::fs::read(&archive).unwrap();
    assert!(
        ar.len() < model.len(),
        "archive {} bytes for {} original",
        ar.len(),
        model.len()
    );
    // --verify decodes the archive before keeping it: the same archive, said to be verified.
    let o = tz(
        d,
        &[
            "compress",
            "model.safetensors",
            "-o",
            "verified.tz",
            "--verify",
            "--chunk-bytes",
            "1024",
            "--block-units",
            "64",
        ],
    );
    ok(&o, "compress --verify");
    assert!(
        stderr(&o).trim_end().ends_with("; verified"),
        "{}",
        stderr(&o)
    );
    assert!(std::fs::read(d.join("verified.tz")).unwrap() == ar);
    ok(
        &tz(
            d,
            &[
                "decompress",
                "model.safetensors.tz",
                "-o",
                "restored.safetensors",
            ],
        ),
        "decompress -o",
    );
    assert!(
        std::fs::read(d.join("restored.safetensors")).unwrap() == model,
        "restored file differs"
    );
    // Into a subdirectory, on one thread.
    std::fs::create_dir(d.join("sub")).unwrap();
    ok(
        &tz(
            d,
            &[
                "decompress",
                "model.safetensors.tz",
                "-o",
                "sub/x.safetensors",
                "-t",
                "1",
            ],
        ),
        "decompress -o sub/",
    );
    assert!(std::fs::read(d.join("sub/x.safetensors")).unwrap() == model);
    // Default options and one checksum per 256 bytes give the same restore.
    ok(
        &tz(
            d,
            &[
                "compress",
                "model.safetensors",
                "-o",
                "b.tz",
                "--checksum-chunk-bytes",
                "256",
            ],
        ),
        "compress default options",
    );
    ok(
        &tz(d, &["decompress", "b.tz", "-o", "b.safetensors"]),
        "decompress b.tz",
    );
    assert!(std::fs::read(d.join("b.safetensors")).unwrap() == model);
    // Archives do not depend on the thread count; every command reports the threads it ran on,
    // its whole process's pool (checksums included).
    let t1 = tz(
        d,
        &[
            "compress",
            "model.safetensors",
            "-o",
            "t1.tz",
            "--chunk-bytes",
            "1024",
            "--block-units",
            "64",
            "-t",
            "1",
        ],
    );
    ok(&t1, "compress -t 1");
    assert!(
        stderr(&t1).trim_end().ends_with(", 1 thread"),
        "{}",
        stderr(&t1)
    );
    assert!(
        std::fs::read(d.join("t1.tz")).unwrap() == ar,
        "archives differ between 1 and 2 threads"
    );
    let v3 = tz(d, &["verify", "t1.tz", "-t", "3"]);
    ok(&v3, "verify -t 3");
    assert!(
        stderr(&v3).trim_end().ends_with(", 3 threads)"),
        "{}",
        stderr(&v3)
    );
    let x1 = tz(
        d,
        &["decompress", "t1.tz", "-o", "t1.safetensors", "-t", "1"],
    );
    ok(&x1, "decompress -t 1");
    assert!(
        stderr(&x1).trim_end().ends_with(", 1 thread"),
        "{}",
        stderr(&x1)
    );
    no_temp_files(d);
}

#[test]
fn decompress_to_the_default_name_refuses_to_overwrite() {
    let (dir, _, model) = setup();
    let d = dir.path();
    // The default output (the name without .tz) is the original, which exists.
    let o = tz(d, &["decompress", "model.safetensors.tz"]);
    fails(
        &o,
        "decompress onto an existing file",
        &["model.safetensors", "already exists"],
    );
    // The output takes its input's permissions (a private archive restores private), also
    // over a file -f replaces.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(d.join("model.safetensors.tz"), private).unwrap();
    }
    ok(
        &tz(d, &["decompress", "model.safetensors.tz", "-f"]),
        "decompress -f",
    );
    assert!(std::fs::read(d.join("model.safetensors")).unwrap() == model);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join("model.safetensors"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "-f widened a private file's permissions"
        );
    }
    // With the original gone, the default name is used.
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    ok(
        &tz(d, &["decompress", "model.safetensors.tz"]),
        "decompress to default name",
    );
    assert!(std::fs::read(d.join("model.safetensors")).unwrap() == model);
    no_temp_files(d);
}

#[test]
fn verify_and_verify_against() {
    let (dir, _, model) = setup();
    let d = dir.path();
    let o = tz(d, &["verify", "model.safetensors.tz"]);
    ok(&o, "verify");
    assert!(stderr(&o).contains("OK"), "{}", stderr(&o));
    ok(
        &tz(
            d,
            &[
                "verify",
                "model.safetensors.tz",
                "--against",
                "model.safetensors",
            ],
        ),
        "verify --against",
    );
    // Against a different file of the same size, and a shorter one.
    let mut other = model.clone();
    let at = other.len() - 10;
    other[at] ^= 1;
    std::fs::write(d.join("other.safetensors"), &other).unwrap();
    let o = tz(
        d,
        &[
            "verify",
            "model.safetensors.tz",
            "--against",
            "other.safetensors",
        ],
    );
    fails(
        &o,
        "verify against a different file",
        &["model.safetensors.tz", "other.safetensors", "differs"],
    );
    std::fs::write(d.join("short.safetensors"), &model[..model.len() - 1]).unwrap();
    let o = tz(
        d,
        &[
            "verify",
            "model.safetensors.tz",
            "--against",
            "short.safetensors",
        ],
    );
    fails(&o, "verify against a shorter file", &["short.safetensors"]);
    let o = tz(
        d,
        &[
            "verify",
            "model.safetensors.tz",
            "--against",
            "missing.safetensors",
        ],
    );
    fails(
        &o,
        "verify against a missing file",
        &["missing.safetensors"],
    );
}

/// Several inputs in one command (a sharded checkpoint): each gets its own output; a bad one
/// among them is reported on its own line while the others are still done, and the exit status
/// is then non-zero; `-o` and `--against` (one file) are refused with several inputs.
#[test]
fn several_inputs_in_one_command() {
    let (dir, _, model) = setup();
    let d = dir.path();
    let mut other = model_bytes();
    // The same layout with other values (the last tensor's bytes end the file).
    let n = other.len();
    for b in &mut other[n - 64..] {
        *b ^= 0x5a;
    }
    std::fs::write(d.join("shard-1.safetensors"), &model).unwrap();
    std::fs::write(d.join("shard-2.safetensors"), &other).unwrap();
    std::fs::write(d.join("shard-bad.safetensors"), b"not a safetensors file").unwrap();
    let o = tz(
        d,
        &[
            "compress",
            "shard-1.safetensors",
            "shard-bad.safetensors",
            "shard-2.safetensors",
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("tensorzip: error: "))
        .collect();
    assert_eq!(errors.len(), 2, "{err}");
    assert!(errors[0].contains("shard-bad.safetensors"), "{err}");
    assert!(errors[1].contains("1 of 3 inputs failed"), "{err}");
    // The sizes of the two done, together, before the failure count.
    let total = err
        .lines()
        .find(|l| l.starts_with("2 of 3 files compressed: "))
        .unwrap_or_else(|| panic!("no total line: {err}"));
    let twice = 2 * model.len();
    assert!(total.contains(&format!(": {twice} -> ")), "{total}");
    assert!(!d.join("shard-bad.safetensors.tz").exists());
    // The good ones were compressed, the one after the bad one too.
    for f in ["shard-1", "shard-2"] {
        std::fs::rename(
            d.join(format!("{f}.safetensors")),
            d.join(format!("{f}.orig")),
        )
        .unwrap();
    }
    let o = tz(
        d,
        &[
            "decompress",
            "shard-1.safetensors.tz",
            "shard-2.safetensors.tz",
        ],
    );
    ok(&o, "decompress two archives");
    let restored = format!(" -> {} bytes", model.len() + other.len());
    assert!(
        stderr(&o)
            .lines()
            .any(|l| l.starts_with("all 2 archives restored: ") && l.ends_with(&restored)),
        "{}",
        stderr(&o)
    );
    for (f, want) in [("shard-1", &model), ("shard-2", &other)] {
        let got = std::fs::read(d.join(format!("{f}.safetensors"))).unwrap();
        assert!(got == *want, "{f} restored");
    }
    let o = tz(
        d,
        &["verify", "shard-1.safetensors.tz", "shard-2.safetensors.tz"],
    );
    ok(&o, "verify two archives");
    assert_eq!(stderr(&o).matches(": OK (").count(), 2, "{}", stderr(&o));
    // info: a table per archive under its name; with --json an array.
    let o = tz(
        d,
        &["info", "shard-1.safetensors.tz", "shard-2.safetensors.tz"],
    );
    ok(&o, "info two archives");
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("==> shard-1.safetensors.tz <=="), "{text}");
    assert!(text.contains("==> shard-2.safetensors.tz <=="), "{text}");
    assert_eq!(text.matches("total: ").count(), 2, "{text}");
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.starts_with(&format!("all 2 archives: {twice} -> "))),
        "{text}"
    );
    let o = tz(
        d,
        &[
            "info",
            "--json",
            "shard-1.safetensors.tz",
            "shard-2.safetensors.tz",
        ],
    );
    ok(&o, "info --json two archives");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let docs = v.as_array().expect("an array of documents");
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[1]["file"], "shard-2.safetensors.tz");
    // One output for several inputs is refused before anything is done.
    let o = tz(
        d,
        &["compress", "shard-1.orig", "shard-2.orig", "-o", "both.tz"],
    );
    fails(&o, "-o with two inputs", &["-o both.tz", "2 inputs"]);
    assert!(!d.join("both.tz").exists());
    let o = tz(
        d,
        &[
            "verify",
            "shard-1.safetensors.tz",
            "shard-2.safetensors.tz",
            "--against",
            "shard-1.orig",
        ],
    );
    fails(
        &o,
        "--against with two archives",
        &["--against", "2 inputs"],
    );
    // No input at all is a usage error.
    let o = tz(d, &["compress"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    no_temp_files(d);
}

/// `--output-dir` puts each output, under its default name, in a directory that must exist;
/// it cannot go with `-o`.
#[test]
fn output_dir_takes_the_outputs() {
    let (dir, _, model) = setup();
    let d = dir.path();
    std::fs::write(d.join("b.safetensors"), &model).unwrap();
    std::fs::create_dir(d.join("out")).unwrap();
    std::fs::create_dir(d.join("back")).unwrap();
    ok(
        &tz(
            d,
            &[
                "compress",
                "model.safetensors",
                "b.safetensors",
                "-O",
                "out",
                "-f",
            ],
        ),
        "compress -O",
    );
    assert!(d.join("out/model.safetensors.tz").exists());
    assert!(d.join("out/b.safetensors.tz").exists());
    assert!(
        !d.join("b.safetensors.tz").exists(),
        "written next to its input"
    );
    ok(
        &tz(
            d,
            &[
                "decompress",
                "out/model.safetensors.tz",
                "out/b.safetensors.tz",
                "--output-dir",
                "back",
            ],
        ),
        "decompress --output-dir",
    );
    for f in ["model", "b"] {
        let got = std::fs::read(d.join(format!("back/{f}.safetensors"))).unwrap();
        assert!(got == model, "{f} restored");
    }
    // Without -f an existing output in the directory is kept.
    let o = tz(d, &["compress", "b.safetensors", "-O", "out"]);
    fails(
        &o,
        "an existing output in -O",
        &["b.safetensors.tz", "already exists"],
    );
    let o = tz(d, &["compress", "b.safetensors", "-O", "missing"]);
    fails(&o, "a missing -O", &["missing", "--output-dir"]);
    let o = tz(
        d,
        &["decompress", "out/b.safetensors.tz", "-O", "b.safetensors"],
    );
    fails(&o, "-O a file", &["b.safetensors", "not a directory"]);
    // Two inputs of the same name would have one output.
    std::fs::create_dir(d.join("other")).unwrap();
    std::fs::write(d.join("other/b.safetensors"), &model).unwrap();
    let o = tz(
        d,
        &[
            "compress",
            "b.safetensors",
            "other/b.safetensors",
            "-O",
            "out",
            "-f",
        ],
    );
    fails(
        &o,
        "two inputs of one name",
        &["other/b.safetensors", "same name"],
    );
    let o = tz(d, &["compress", "b.safetensors", "-O", "out", "-o", "x.tz"]);
    assert_eq!(o.status.code(), Some(2), "-O with -o: {}", stderr(&o));
    no_temp_files(&d.join("out"));
    no_temp_files(&d.join("back"));
}

/// A model directory as a Hugging Face snapshot has it: shards (one in a sub-folder), the
/// config, a hidden folder that is skipped and a link to a file that is followed.
fn model_dir(d: &Path, model: &[u8]) -> PathBuf {
    let m = d.join("model");
    std::fs::create_dir_all(m.join("text_encoder")).unwrap();
    std::fs::create_dir_all(m.join(".cache")).unwrap();
    std::fs::write(m.join("model-1.safetensors"), model).unwrap();
    let mut other = model.to_vec();
    let n = other.len();
    for b in &mut other[n - 64..] {
        *b ^= 0x33;
    }
    std::fs::write(m.join("text_encoder/model.safetensors"), &other).unwrap();
    std::fs::write(m.join("config.json"), b"{\"layers\": 1}").unwrap();
    std::fs::write(m.join("text_encoder/empty.txt"), b"").unwrap();
    std::fs::write(m.join(".cache/lock"), b"x").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("../config.json", m.join("text_encoder/config.json")).unwrap();
    #[cfg(not(unix))]
    std::fs::write(m.join("text_encoder/config.json"), b"{\"layers\": 1}").unwrap();
    m
}

/// The files under `root` (relative, sorted, hidden ones included) and their bytes.
fn tree_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `compress DIR -o OUT` builds OUT as a copy of the model directory with its `.safetensors`
/// files compressed and every other file copied; `decompress OUT -o BACK` gives the directory
/// back file for file; `verify OUT --against DIR` checks one against the other and names what
/// differs or is missing. A directory output is never replaced.
#[test]
fn model_directories_are_mirrored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_bytes();
    let m = model_dir(d, &model);
    let o = tz(d, &["compress", "model", "-o", "model-tz", "-t", "2"]);
    ok(&o, "compress a directory");
    let err = stderr(&o);
    assert!(
        err.contains("model -> model-tz: all 2 files compressed")
            && err.contains("3 other files copied"),
        "{err}"
    );
    // The report names the final paths, not the temporary directory's.
    assert!(
        err.contains("-> model-tz/text_encoder/model.safetensors.tz: "),
        "{err}"
    );
    let names: Vec<String> = tree_files(&d.join("model-tz"))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            ".tensorzip-copies.json",
            "config.json",
            "model-1.safetensors.tz",
            "text_encoder/config.json",
            "text_encoder/empty.txt",
            "text_encoder/model.safetensors.tz"
        ]
    );
    ok(
        &tz(d, &["verify", "model-tz", "--against", "model"]),
        "verify a directory against its original",
    );
    ok(
        &tz(d, &["decompress", "model-tz", "-o", "back"]),
        "decompress a directory",
    );
    let hidden_skipped: Vec<(String, Vec<u8>)> = tree_files(&m)
        .into_iter()
        .filter(|(n, _)| !n.starts_with('.'))
        .collect();
    assert!(
        tree_files(&d.join("back")) == hidden_skipped,
        "restored directory differs"
    );
    // An existing output directory is kept, with or without -f, and nothing is left behind.
    for args in [
        &["compress", "model", "-o", "back"][..],
        &["compress", "model", "-o", "back", "-f"][..],
        &["decompress", "model-tz", "-o", "back", "-f"][..],
    ] {
        let o = tz(d, args);
        fails(
            &o,
            "an existing output directory",
            &["back", "already exists"],
        );
    }
    assert!(
        tree_files(&d.join("back")) == hidden_skipped,
        "an existing directory was changed"
    );
    // verify --against names a changed file, a missing one and an extra one, and counts them.
    std::fs::write(m.join("config.json"), b"{\"layers\": 2}").unwrap();
    std::fs::write(m.join("text_encoder/extra.json"), b"{}").unwrap();
    std::fs::remove_file(d.join("back/text_encoder/model.safetensors")).unwrap();
    let o = tz(d, &["verify", "model-tz", "--against", "back"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("model-tz/text_encoder/model.safetensors.tz: ")
            && err.contains("back/text_encoder/model.safetensors does not exist"),
        "{err}"
    );
    assert!(err.contains("1 of 5 files"), "{err}");
    let o = tz(d, &["verify", "model-tz", "--against", "model"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model-tz/config.json: differs from model/config.json at byte 11"),
        "{err}"
    );
    assert!(
        err.contains("model/text_encoder/extra.json: has no counterpart in model-tz"),
        "{err}"
    );
    // The link in text_encoder/ follows the changed config: it differs too.
    assert!(
        err.contains("model-tz/text_encoder/config.json: differs"),
        "{err}"
    );
    assert!(err.contains("3 of 6 files"), "{err}");
    let o = tz(d, &["verify", "model-tz", "--against", "model/config.json"]);
    fails(&o, "--against a file", &["not a directory"]);
    no_temp_files(d);
}

/// Without `-o`, a directory stands for its `.safetensors` files (for `compress`) or its
/// archives (for the others), each done as if named on the command line.
/// The files a mirror copies as they are carry checksums too (`.tensorzip-copies.json`):
/// `verify` and `decompress` check each copy against them, so a changed, missing or added file
/// is found (the archives were the only files checked before).
#[test]
fn copied_files_of_a_mirror_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_bytes();
    model_dir(d, &model);
    let o = tz(d, &["compress", "model", "-o", "c"]);
    ok(&o, "compress a directory");
    assert!(
        stderr(&o).contains("their checksums in c/.tensorzip-copies.json"),
        "{}",
        stderr(&o)
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("c/.tensorzip-copies.json")).unwrap())
            .unwrap();
    let files = manifest["files"].as_object().unwrap();
    let listed: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        listed,
        [
            "config.json",
            "text_encoder/config.json",
            "text_encoder/empty.txt"
        ]
    );
    assert_eq!(
        files["config.json"]["crc32"].as_u64().unwrap(),
        tensorzip::crc32(b"{\"layers\": 1}") as u64
    );
    let o = tz(d, &["verify", "c"]);
    ok(&o, "verify a mirror");
    assert!(
        stderr(&o).contains("c: OK (3 copied files match"),
        "{}",
        stderr(&o)
    );
    let o = tz(d, &["decompress", "c", "-o", "back"]);
    ok(&o, "decompress a mirror");
    assert!(
        stderr(&o).contains("each matching its checksum"),
        "{}",
        stderr(&o)
    );
    assert!(
        !d.join("back/.tensorzip-copies.json").exists(),
        "the manifest is not restored"
    );
    // A copy changed after the mirror was made: verify and decompress fail naming it, and
    // decompress leaves nothing.
    std::fs::write(d.join("c/text_encoder/empty.txt"), b"x").unwrap();
    let o = tz(d, &["verify", "c"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("empty.txt: not the file the mirror copied"),
        "{}",
        stderr(&o)
    );
    // (The lines of the archives restored before the failure come first: not one line.)
    let failed = |o: &Output, needles: &[&str]| {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        let last = err.trim_end().lines().last().unwrap_or("");
        assert!(last.starts_with("tensorzip: error: "), "{err}");
        for n in needles {
            assert!(last.contains(n), "{n:?} not in {last}");
        }
    };
    failed(
        &tz(d, &["decompress", "c", "-o", "back2"]),
        &[
            "empty.txt",
            "not the file the mirror copied",
            "back2 was not written",
        ],
    );
    assert!(!d.join("back2").exists());
    // A listed file missing.
    std::fs::remove_file(d.join("c/text_encoder/empty.txt")).unwrap();
    failed(
        &tz(d, &["decompress", "c", "-o", "back2"]),
        &["empty.txt", "listed in", "missing"],
    );
    std::fs::write(d.join("c/text_encoder/empty.txt"), b"").unwrap();
    // A file added to the mirror: copied, and named as unchecked.
    std::fs::write(d.join("c/extra.txt"), b"new").unwrap();
    let o = tz(d, &["decompress", "c", "-o", "back2"]);
    ok(&o, "decompress a mirror with a file added");
    assert!(
        stderr(&o).contains("extra.txt: copied without a checksum"),
        "{}",
        stderr(&o)
    );
    let o = tz(d, &["verify", "c"]);
    ok(&o, "verify a mirror with a file added");
    assert!(
        stderr(&o).contains("extra.txt: not listed"),
        "{}",
        stderr(&o)
    );
    // A manifest that is not one is an error, not a mirror without checks.
    std::fs::write(d.join("c/.tensorzip-copies.json"), b"{\"files\": 1}").unwrap();
    fails(
        &tz(d, &["decompress", "c", "-o", "back3"]),
        "decompress with a broken manifest",
        &[".tensorzip-copies.json", "not a manifest"],
    );
}

#[test]
fn a_directory_stands_for_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_bytes();
    let m = model_dir(d, &model);
    let o = tz(d, &["compress", "model"]);
    ok(&o, "compress the files of a directory");
    assert!(
        stderr(&o).contains("all 2 files compressed"),
        "{}",
        stderr(&o)
    );
    assert!(m.join("model-1.safetensors.tz").exists());
    assert!(m.join("text_encoder/model.safetensors.tz").exists());
    let o = tz(d, &["verify", "model"]);
    ok(&o, "verify the archives of a directory");
    assert_eq!(stderr(&o).matches(": OK (").count(), 2, "{}", stderr(&o));
    let o = tz(d, &["info", "model"]);
    ok(&o, "info of a directory");
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains("==> model/text_encoder/model.safetensors.tz <=="),
        "{text}"
    );
    std::fs::create_dir(d.join("flat")).unwrap();
    ok(
        &tz(d, &["decompress", "model", "-O", "flat"]),
        "decompress the archives of a directory into another",
    );
    assert!(std::fs::read(d.join("flat/model-1.safetensors")).unwrap() == model);
    // Outputs next to inputs that exist are kept without -f (each reported).
    let o = tz(d, &["compress", "model"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 of 2 inputs failed"),
        "{}",
        stderr(&o)
    );
    // A directory without any of the command's files does nothing.
    std::fs::create_dir(d.join("none")).unwrap();
    std::fs::write(d.join("none/config.json"), b"{}").unwrap();
    for (args, what) in [
        (&["compress", "none"][..], ".safetensors"),
        (&["compress", "none", "-o", "none-tz"][..], ".safetensors"),
        (&["verify", "none"][..], ".tz"),
        (&["info", "none"][..], ".tz"),
    ] {
        let o = tz(d, args);
        fails(&o, "a directory of no input", &["none", what]);
    }
    assert!(!d.join("none-tz").exists());
    // A directory to compress that holds archives (here, those written above) is refused.
    let o = tz(d, &["compress", "model", "-o", "out"]);
    fails(
        &o,
        "archives in a directory to compress",
        &[
            "model-1.safetensors.tz",
            "a tensorzip archive in the directory to compress",
        ],
    );
    assert!(!d.join("out").exists());
    // Two files restored as one output are refused before anything is written.
    std::fs::create_dir(d.join("z")).unwrap();
    std::fs::copy(
        m.join("model-1.safetensors.tz"),
        d.join("z/a.safetensors.tz"),
    )
    .unwrap();
    std::fs::write(d.join("z/a.safetensors"), b"a stray copy").unwrap();
    let o = tz(d, &["decompress", "z", "-o", "z-back"]);
    fails(
        &o,
        "two inputs of one output name",
        &["a.safetensors", "both"],
    );
    assert!(!d.join("z-back").exists());
    no_temp_files(d);
}

/// A file that fails in a mirrored directory ends the command with nothing written.
#[test]
fn a_failed_directory_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = model_dir(d, &model_bytes());
    std::fs::write(m.join("text_encoder/model.safetensors"), b"not safetensors").unwrap();
    let o = tz(d, &["compress", "model", "-o", "out"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("tensorzip: error: model/text_encoder/model.safetensors: ")
            && last.ends_with("(out was not written)"),
        "{err}"
    );
    assert!(!d.join("out").exists());
    no_temp_files(d);
    assert!(
        !err.contains(".tmp-"),
        "a message names the temporary: {err}"
    );
}

/// An archive already in a directory to compress is refused (the mirror's decompress would
/// restore it, so the directory would not come back as it was); nothing is written.
#[test]
fn a_directory_to_compress_holding_an_archive_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = model_dir(d, &model_bytes());
    std::fs::write(m.join("text_encoder/old.tz"), b"whatever").unwrap();
    let o = tz(d, &["compress", "model", "-o", "out"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model/text_encoder/old.tz: a tensorzip archive in the directory to compress"),
        "{err}"
    );
    assert!(!d.join("out").exists());
    no_temp_files(d);
}

/// A mirrored directory's other files keep their permissions (a script stays executable).
#[cfg(unix)]
#[test]
fn mirrored_and_compressed_files_keep_their_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = model_dir(d, &model_bytes());
    std::fs::write(m.join("run.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(m.join("run.sh"), std::fs::Permissions::from_mode(0o751)).unwrap();
    ok(
        &tz(d, &["compress", "model", "-o", "out"]),
        "compress a directory",
    );
    let mode = std::fs::metadata(d.join("out/run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o751);
    assert_eq!(std::fs::read(d.join("out/run.sh")).unwrap(), b"#!/bin/sh\n");
    // A private model stays private through compress and decompress: its directories and its
    // shards' archives take the source's permissions (they came out 0755 / 0644 before).
    let mode_of = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let set =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    set(&m, 0o700);
    set(&m.join("text_encoder"), 0o750);
    set(&m.join("model-1.safetensors"), 0o600);
    let o = tz(d, &["compress", "model", "-o", "private"]);
    ok(&o, "compress a private directory");
    // The hidden entry is named once the copy is under way.
    assert!(
        stderr(&o).contains("model/.cache: hidden"),
        "{}",
        stderr(&o)
    );
    assert_eq!(mode_of(&d.join("private")), 0o700);
    assert_eq!(mode_of(&d.join("private/text_encoder")), 0o750);
    assert_eq!(mode_of(&d.join("private/model-1.safetensors.tz")), 0o600);
    let o = tz(d, &["verify", "private", "--against", "model"]);
    ok(&o, "verify a private directory");
    assert!(
        stderr(&o).contains("1 hidden entries of model not compared"),
        "{}",
        stderr(&o)
    );
    ok(
        &tz(d, &["decompress", "private", "-o", "back"]),
        "decompress a private directory",
    );
    assert_eq!(mode_of(&d.join("back")), 0o700);
    assert_eq!(mode_of(&d.join("back/model-1.safetensors")), 0o600);
    // One file: the archive takes its input's permissions.
    ok(
        &tz(
            d,
            &["compress", "model/model-1.safetensors", "-o", "one.tz"],
        ),
        "compress a private file",
    );
    assert_eq!(mode_of(&d.join("one.tz")), 0o600);
}

/// Single-file outputs take their input's owner and group where the user may give them, as
/// gzip's do: run as root, another user's file compressed, restored and written over with --force
/// stays that user's (it became root's before). A model directory mirrored by root stays root's,
/// every entry: handing entries over while the mirror was built let their new owner plant links
/// that root's later writes followed (found by a review; `output::take_owner`). Run as any other
/// user, every output is the user's own and nothing is refused.
#[cfg(unix)]
#[test]
fn outputs_take_their_inputs_owner() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = model_dir(d, &model_bytes());
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let root = me == 0;
    let mine = {
        let md = std::fs::metadata(d).unwrap();
        (md.uid(), md.gid())
    };
    let theirs = if root {
        let mut stack = vec![m.clone()];
        while let Some(p) = stack.pop() {
            std::os::unix::fs::lchown(&p, Some(4321), Some(4322)).unwrap();
            if p.is_dir() && !p.is_symlink() {
                stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            }
        }
        (4321, 4322)
    } else {
        mine
    };
    ok(
        &tz(d, &["compress", "model", "-o", "out"]),
        "compress a directory",
    );
    let one = ["compress", "model/model-1.safetensors", "-o", "one.tz"];
    ok(&tz(d, &one), "compress a file");
    std::fs::write(d.join("two.tz"), b"old").unwrap();
    let two = [
        "compress",
        "model/model-1.safetensors",
        "-o",
        "two.tz",
        "-f",
    ];
    ok(&tz(d, &two), "compress over a file");
    let back = ["decompress", "one.tz", "-o", "one.safetensors"];
    ok(&tz(d, &back), "decompress a file");
    ok(
        &tz(d, &["decompress", "out", "-o", "back"]),
        "decompress a directory",
    );
    let owner = |p: &str| {
        let md = std::fs::symlink_metadata(d.join(p)).unwrap();
        (md.uid(), md.gid())
    };
    for p in ["one.tz", "two.tz", "one.safetensors"] {
        assert_eq!(owner(p), theirs, "{p}");
    }
    let mut stack = vec![d.join("out"), d.join("back")];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((md.uid(), md.gid()), mine, "{}", p.display());
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
}

/// Outputs never carry set-ID bits, and a mirror's directories are never writable by group or
/// others (they are the running user's while they are built): a user's setuid file copied or
/// restored by root came out setuid root, and a source directory made 0777 by its owner let that
/// user plant links in root's staging tree (a review's findings, 2026-12-05). Run as root, a model
/// directory is not built in a directory another user can write.
#[cfg(unix)]
#[test]
fn outputs_are_never_set_id_nor_shared_while_built() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = model_dir(d, &model_bytes());
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    std::fs::write(m.join("tool"), b"#!/bin/sh\n").unwrap();
    set(&m.join("tool"), 0o4755);
    set(&m.join("model-1.safetensors"), 0o6755);
    set(&m, 0o777);
    set(&m.join("text_encoder"), 0o2777);
    ok(
        &tz(d, &["compress", "model", "-o", "out"]),
        "compress a directory",
    );
    assert_eq!(mode(&d.join("out/tool")), 0o755);
    assert_eq!(mode(&d.join("out/model-1.safetensors.tz")), 0o755);
    assert_eq!(mode(&d.join("out")), 0o755);
    assert_eq!(mode(&d.join("out/text_encoder")), 0o755);
    let one = ["compress", "model/model-1.safetensors", "-o", "one.tz"];
    ok(&tz(d, &one), "compress a file");
    assert_eq!(mode(&d.join("one.tz")), 0o755);
    ok(
        &tz(d, &["decompress", "one.tz", "-o", "one.safetensors"]),
        "decompress a file",
    );
    assert_eq!(mode(&d.join("one.safetensors")), 0o755);
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = d.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4321), Some(4322)).unwrap();
        let o = tz(d, &["compress", "model", "-o", "theirs/out"]);
        assert!(!o.status.success(), "built in another user's directory");
        assert!(
            stderr(&o).contains("another user can write"),
            "{}",
            stderr(&o)
        );
        assert!(std::fs::read_dir(&theirs).unwrap().next().is_none());
        // A parent that does not exist: its own error, not the other user's.
        let o = tz(d, &["compress", "model", "-o", "missing/out"]);
        assert!(!o.status.success(), "built under a missing directory");
        assert!(
            stderr(&o).contains("No such file") && !stderr(&o).contains("another user"),
            "{}",
            stderr(&o)
        );
        // A file reached through a link (another user's, say, to a 0644 file in a 0700 directory
        // of root's): its output is at most 0600, single file or in a mirror.
        let private = d.join("private");
        std::fs::create_dir(&private).unwrap();
        set(&private, 0o700);
        std::fs::copy(m.join("model-1.safetensors"), private.join("s.safetensors")).unwrap();
        std::fs::write(private.join("notes.txt"), b"secret").unwrap();
        set(&private.join("s.safetensors"), 0o644);
        set(&private.join("notes.txt"), 0o644);
        let linked = d.join("linked");
        std::fs::create_dir(&linked).unwrap();
        std::os::unix::fs::symlink(private.join("s.safetensors"), linked.join("s.safetensors"))
            .unwrap();
        std::os::unix::fs::symlink(private.join("notes.txt"), linked.join("notes.txt")).unwrap();
        ok(
            &tz(d, &["compress", "linked/s.safetensors", "-o", "s.tz"]),
            "compress through a link",
        );
        assert_eq!(mode(&d.join("s.tz")), 0o600);
        ok(
            &tz(d, &["compress", "linked", "-o", "linked.out"]),
            "mirror with links",
        );
        assert_eq!(mode(&d.join("linked.out/notes.txt")), 0o600);
        assert_eq!(mode(&d.join("linked.out/s.safetensors.tz")), 0o600);
        // A directory of root's inside another user's: that user can rename it away.
        std::fs::create_dir(theirs.join("sub")).unwrap();
        let o = tz(d, &["compress", "model", "-o", "theirs/sub/out"]);
        assert!(!o.status.success(), "built below another user's directory");
        assert!(std::fs::read_dir(theirs.join("sub"))
            .unwrap()
            .next()
            .is_none());
        // A parent reached through a link in another user's directory, pointing at a directory
        // of root's: resolved once and built at the resolved path (the link, checked and then
        // followed again, could be repointed in between), so the copy is in root's directory.
        std::fs::create_dir(d.join("rootdir")).unwrap();
        std::os::unix::fs::symlink(d.join("rootdir"), theirs.join("link")).unwrap();
        let o = tz(d, &["compress", "model", "-o", "theirs/link/out"]);
        ok(&o, "compress through a link to root's directory");
        assert!(std::fs::symlink_metadata(d.join("rootdir/out"))
            .unwrap()
            .is_dir());
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        set(&open, 0o777);
        let o = tz(d, &["compress", "model", "-o", "open/out"]);
        assert!(!o.status.success(), "built in a directory others can write");
        assert!(
            stderr(&o).contains("writable by other users"),
            "{}",
            stderr(&o)
        );
        set(&open, 0o1777);
        ok(
            &tz(d, &["compress", "model", "-o", "open/out"]),
            "compress into a sticky directory",
        );
        assert_eq!(std::fs::metadata(d.join("open/out")).unwrap().uid(), 0);
    }
}

#[test]
fn info_and_info_json() {
    let (dir, _, model) = setup();
    let d = dir.path();
    let o = tz(d, &["info", "model.safetensors.tz"]);
    ok(&o, "info");
    let text = String::from_utf8(o.stdout).unwrap();
    for name in [
        "layers.0.weight",
        "layers.0.norm",
        "position_ids",
        "head",
        "empty",
        "total: 5 tensors",
    ] {
        assert!(text.contains(name), "info lacks {name}:\n{text}");
    }
    let o = tz(d, &["info", "--json", "model.safetensors.tz"]);
    ok(&o, "info --json");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json prints JSON");
    assert_eq!(v["original_bytes"].as_u64(), Some(model.len() as u64));
    let archive_len = std::fs::metadata(d.join("model.safetensors.tz"))
        .unwrap()
        .len();
    assert_eq!(v["archive_bytes"].as_u64(), Some(archive_len));
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 5);
    let w = tensors
        .iter()
        .find(|t| t["name"] == "layers.0.weight")
        .expect("layers.0.weight listed");
    assert_eq!(w["dtype"], "BF16");
    assert_eq!(w["shape"], serde_json::json!([32, 300]));
    assert_eq!(w["bytes"].as_u64(), Some(32 * 300 * 2));
    assert!(w["compressed"].as_u64().unwrap() < 32 * 300 * 2);
    assert_eq!(w["coded_as"], "bfloat16");
    let e = tensors.iter().find(|t| t["name"] == "empty").unwrap();
    assert_eq!(e["bytes"].as_u64(), Some(0));
}

#[test]
fn compress_refuses_to_overwrite_without_force() {
    let (dir, archive, model) = setup();
    let d = dir.path();
    let before = std::fs::read(&archive).unwrap();
    let o = tz(d, &["compress", "model.safetensors"]);
    fails(
        &o,
        "compress onto an existing archive",
        &["model.safetensors.tz", "already exists"],
    );
    assert!(
        std::fs::read(&archive).unwrap() == before,
        "existing output was changed"
    );
    // Any existing file counts, also with -o.
    std::fs::write(d.join("keep.tz"), b"precious").unwrap();
    let o = tz(d, &["compress", "model.safetensors", "-o", "keep.tz"]);
    fails(&o, "compress -o onto an existing file", &["keep.tz"]);
    assert_eq!(std::fs::read(d.join("keep.tz")).unwrap(), b"precious");
    no_temp_files(d);
    // -f replaces it.
    let o = tz(d, &["compress", "model.safetensors", "-o", "keep.tz", "-f"]);
    ok(&o, "compress -f");
    ok(
        &tz(d, &["decompress", "keep.tz", "-o", "k.safetensors"]),
        "decompress the forced archive",
    );
    assert!(std::fs::read(d.join("k.safetensors")).unwrap() == model);
    ok(
        &tz(d, &["compress", "model.safetensors", "--force"]),
        "compress --force",
    );
    no_temp_files(d);
}

/// Even with --force, the output may not be the input (it would be replaced by its own archive or
/// restoration), a directory, or anything but a regular file (the rename would replace a device or
/// a pipe — `/dev/null` when run as root — instead of writing into it). Nothing is written.
#[test]
fn outputs_that_are_the_input_or_not_regular_files_are_refused() {
    let (dir, archive, model) = setup();
    let d = dir.path();
    let ar = std::fs::read(&archive).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("model.safetensors", d.join("link.safetensors")).unwrap();
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec![
                "compress",
                "model.safetensors",
                "-o",
                "model.safetensors",
                "-f",
            ],
            &["model.safetensors", "is the input file"],
        ),
        (
            vec![
                "decompress",
                "model.safetensors.tz",
                "-o",
                "model.safetensors.tz",
                "-f",
            ],
            &["model.safetensors.tz", "is the input file"],
        ),
        (
            vec!["compress", "model.safetensors", "-o", ".", "-f"],
            &["is a directory"],
        ),
        // Without -f too: a hint to use --force would only lead to the line above.
        (
            vec!["compress", "model.safetensors", "-o", "."],
            &["is a directory", "--output-dir"],
        ),
        // `-` is not standard output (the archive was written to a file named `-`), nor input.
        (
            vec!["compress", "model.safetensors", "-o", "-"],
            &["standard output is not supported", "./-"],
        ),
        (
            vec!["decompress", "model.safetensors.tz", "-o", "-"],
            &["standard output is not supported"],
        ),
        (vec!["info", "-"], &["standard input is not supported"]),
    ];
    #[cfg(unix)]
    cases.push((
        vec![
            "compress",
            "model.safetensors",
            "-o",
            "link.safetensors",
            "-f",
        ],
        &["link.safetensors", "is the input file"],
    ));
    #[cfg(unix)]
    let fifo = std::process::Command::new("mkfifo")
        .arg(d.join("pipe"))
        .status()
        .is_ok_and(|s| s.success());
    #[cfg(unix)]
    if fifo {
        cases.push((
            vec!["decompress", "model.safetensors.tz", "-o", "pipe", "-f"],
            &["pipe", "not a regular file"],
        ));
    }
    for (args, needles) in &cases {
        let o = tz(d, args);
        fails(&o, &args.join(" "), needles);
    }
    assert!(std::fs::read(d.join("model.safetensors")).unwrap() == model);
    assert!(std::fs::read(&archive).unwrap() == ar);
    assert!(!d.join("-").exists());
    #[cfg(unix)]
    if fifo {
        use std::os::unix::fs::FileTypeExt;
        let t = std::fs::symlink_metadata(d.join("pipe"))
            .unwrap()
            .file_type();
        assert!(t.is_fifo(), "the pipe was replaced");
    }
    no_temp_files(d);
}

/// Ctrl-C (SIGINT) or SIGTERM in the middle of a compress or decompress removes the temporary
/// file of the partial output (a signal skips destructors: it was left behind) and exits with 130.
/// The signal is sent once the temporary file exists (the command is then mid-way); a run that
/// finishes first is repeated.
#[cfg(unix)]
#[test]
fn an_interrupted_run_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = sample::weights(2048, 4096, DType::F32, 9);
    let file = serialize_safetensors(&[("w", "F32", &[2048, 4096], &data)], None).unwrap();
    std::fs::write(d.join("big.safetensors"), &file).unwrap();
    ok(
        &tz(d, &["compress", "big.safetensors", "-o", "big.tz"]),
        "compress",
    );
    let temp_exists = || {
        std::fs::read_dir(d)
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().contains(".tmp-"))
    };
    let compress = [
        "compress",
        "big.safetensors",
        "-o",
        "out.tz",
        "-f",
        "--threads",
        "1",
    ];
    let decompress = [
        "decompress",
        "big.tz",
        "-o",
        "out.safetensors",
        "-f",
        "--threads",
        "1",
    ];
    for (args, signal) in [(compress, "INT"), (decompress, "INT"), (compress, "TERM")] {
        let mut interrupted = false;
        for _ in 0..20 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_tensorzip"))
                .args(args)
                .current_dir(d)
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let t = std::time::Instant::now();
            while !temp_exists()
                && child.try_wait().unwrap().is_none()
                && t.elapsed().as_secs() < 10
            {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let _ = Command::new("kill")
                .args([format!("-{signal}"), child.id().to_string()])
                .status();
            let status = child.wait().unwrap();
            assert!(
                !temp_exists(),
                "{args:?}: a temporary file was left (exit {status:?})"
            );
            match status.code() {
                Some(130) => {
                    interrupted = true;
                    break;
                }
                Some(0) => continue,
                other => panic!("{args:?} after SIG{signal}: exit {other:?}"),
            }
        }
        assert!(interrupted, "{args:?}: never caught mid-way in 20 runs");
    }
}

/// A thread count past the engines' limit is refused before anything starts (`--threads 100000`
/// panicked in thread creation).
/// An input truncated by another process while it is mapped and read (a checkpoint saved again
/// in place) raises SIGBUS: the command removes its partial output, names the input and exits
/// with status 1 (it was killed by the signal, leaving a temporary file). The truncation must
/// land while the file is being read, so a run that finishes first is repeated (up to 20).
#[cfg(unix)]
#[test]
fn an_input_truncated_while_read_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = sample::weights(4096, 4096, DType::F32, 9);
    let file = serialize_safetensors(&[("w", "F32", &[4096, 4096], &data)], None).unwrap();
    std::fs::write(d.join("big.safetensors"), &file).unwrap();
    ok(
        &tz(d, &["compress", "big.safetensors", "-o", "big.tz"]),
        "compress",
    );
    let archive = std::fs::read(d.join("big.tz")).unwrap();
    let temp_exists = || {
        std::fs::read_dir(d)
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().contains(".tmp-"))
    };
    let cases: [(&str, &[u8], [&str; 7]); 2] = [
        (
            "in.safetensors",
            &file,
            [
                "compress",
                "in.safetensors",
                "-o",
                "out.tz",
                "-f",
                "-t",
                "1",
            ],
        ),
        (
            "in.tz",
            &archive,
            [
                "decompress",
                "in.tz",
                "-o",
                "out.safetensors",
                "-f",
                "-t",
                "1",
            ],
        ),
    ];
    for (input, bytes, args) in cases {
        let mut caught = false;
        for _ in 0..20 {
            std::fs::write(d.join(input), bytes).unwrap();
            // A run that finished wrote its output: gone before the next.
            let _ = std::fs::remove_file(d.join(args[3]));
            let child = Command::new(env!("CARGO_BIN_EXE_tensorzip"))
                .args(args)
                .current_dir(d)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let t = std::time::Instant::now();
            while !temp_exists() && t.elapsed().as_secs() < 10 {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join(input))
                .unwrap()
                .set_len(4096)
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(!temp_exists(), "{args:?}: a temporary file was left");
            match out.status.code() {
                Some(0) => continue,
                Some(1) => {
                    let err = String::from_utf8_lossy(&out.stderr);
                    // An I/O or format error is possible too if the truncation lands between
                    // reads; the SIGBUS case is the one this test waits for.
                    if err.contains("truncated while it was read") {
                        assert!(err.contains(input), "{args:?}: {err}");
                        caught = true;
                        break;
                    }
                }
                other => panic!("{args:?}: exit {other:?}"),
            }
        }
        assert!(
            caught,
            "{args:?}: the truncation never landed mid-read in 20 runs"
        );
        assert!(
            !d.join(args[3]).exists(),
            "{args:?}: an output was left behind"
        );
    }
}

/// A mirrored directory interrupted (SIGINT) or whose input is truncated under it (SIGBUS) while
/// its second shard is written: the temporary directory, with the first shard's finished archive
/// and the copies in it, is removed, and the output does not appear.
#[cfg(unix)]
#[test]
fn an_interrupted_directory_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = d.join("model");
    std::fs::create_dir_all(m.join("sub")).unwrap();
    std::fs::write(m.join("a.safetensors"), model_bytes()).unwrap();
    std::fs::write(m.join("sub/c.json"), b"{}").unwrap();
    let data = sample::weights(4096, 4096, DType::F32, 9);
    let big = serialize_safetensors(&[("w", "F32", &[4096, 4096], &data)], None).unwrap();
    let staged = || {
        std::fs::read_dir(d).unwrap().find_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.starts_with(".out.tmp-").then(|| d.join(name))
        })
    };
    // The second shard's temporary archive exists: the first is done, the second being read.
    let mid_way = || {
        staged().is_some_and(|t| {
            std::fs::read_dir(t).is_ok_and(|mut r| {
                r.any(|e| {
                    e.is_ok_and(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(".b.safetensors")
                    })
                })
            })
        })
    };
    for how in ["INT", "truncate"] {
        let mut caught = false;
        for _ in 0..20 {
            std::fs::write(m.join("b.safetensors"), &big).unwrap();
            let _ = std::fs::remove_dir_all(d.join("out"));
            let child = Command::new(env!("CARGO_BIN_EXE_tensorzip"))
                .args(["compress", "model", "-o", "out", "-t", "1"])
                .current_dir(d)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let t = std::time::Instant::now();
            while !mid_way() && t.elapsed().as_secs() < 10 {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            match how {
                "INT" => {
                    let _ = Command::new("kill")
                        .args(["-INT", &child.id().to_string()])
                        .status();
                }
                _ => std::fs::OpenOptions::new()
                    .write(true)
                    .open(m.join("b.safetensors"))
                    .unwrap()
                    .set_len(4096)
                    .unwrap(),
            }
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                staged().is_none(),
                "{how}: the temporary directory was left: {err}"
            );
            match (how, out.status.code()) {
                (_, Some(0)) => continue,
                ("INT", Some(130)) => {
                    caught = true;
                    break;
                }
                (_, Some(1)) if err.contains("truncated while it was read") => {
                    assert!(err.contains("b.safetensors"), "{err}");
                    caught = true;
                    break;
                }
                // The truncation between two reads: a format or I/O error, also clean.
                (_, Some(1)) => {}
                (_, other) => panic!("{how}: exit {other:?}: {err}"),
            }
        }
        assert!(caught, "{how}: never caught mid-way in 20 runs");
        assert!(!d.join("out").exists(), "{how}: an output was left");
    }
}

/// Bad encoder options and bench arguments are usage errors: exit code 2, one line naming the
/// flag, before any file is touched (they were exit 1, once per input file, with the library's
/// field names).
#[test]
fn bad_options_are_usage_errors_before_any_work() {
    let (dir, _, _) = setup();
    let d = dir.path();
    std::fs::copy(d.join("model.safetensors"), d.join("second.safetensors")).unwrap();
    for (args, needle) in [
        (
            &[
                "compress",
                "model.safetensors",
                "second.safetensors",
                "--chunk-bytes",
                "7",
            ][..],
            "--chunk-bytes",
        ),
        (
            &["compress", "model.safetensors", "--block-units", "100"],
            "--block-units",
        ),
        (
            &["compress", "model.safetensors", "--max-tables", "0"],
            "--max-tables",
        ),
        (
            &["bench", "model.safetensors", "--passthrough-threshold", "2"],
            "--passthrough-threshold",
        ),
        (&["bench", "model.safetensors", "--cast", "xx"], "--cast"),
        (&["bench", "model.safetensors", "--runs", "0"], "--runs"),
        (&["bench", "model.safetensors", "--runs", "10001"], "--runs"),
        (&["bench"], "FILES"),
    ] {
        let o = tz(d, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        if args[0] == "compress" {
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        }
    }
    assert!(!d.join("second.safetensors.tz").exists());
    // An output --force cannot overwrite is named as such without -f too.
    let o = tz(
        d,
        &["compress", "model.safetensors", "-o", "model.safetensors"],
    );
    fails(&o, "compress onto the input", &["is the input file"]);
    let o = tz(d, &["compress", "model.safetensors", "-o", "newdir/"]);
    fails(
        &o,
        "compress to a missing directory",
        &["newdir/", "names a directory"],
    );
    no_temp_files(d);
}

/// A closed stderr (`2>&1 | true`) does not turn a finished command into a crash: status lines
/// that cannot be written are dropped.
#[cfg(unix)]
#[test]
fn a_closed_stderr_is_not_a_crash() {
    let (dir, _, _) = setup();
    let d = dir.path();
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    let o = Command::new(env!("CARGO_BIN_EXE_tensorzip"))
        .current_dir(d)
        .args(["compress", "model.safetensors", "-o", "piped.tz"])
        .stderr(w)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{:?}", o.status);
    assert!(d.join("piped.tz").exists());
}

#[test]
fn absurd_thread_counts_are_refused() {
    let (dir, _, _) = setup();
    let d = dir.path();
    for args in [
        &[
            "compress",
            "model.safetensors",
            "-o",
            "x.tz",
            "--threads",
            "100000",
        ][..],
        &["verify", "model.safetensors.tz", "-t", "1025"],
    ] {
        // A usage error, as clap reports every bad argument: exit code 2.
        let o = tz(d, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--threads") && err.contains("0..=1024"),
            "{err}"
        );
    }
    assert!(!d.join("x.tz").exists());
}

#[test]
fn decompress_needs_a_tz_name_or_an_output() {
    let (dir, archive, model) = setup();
    let d = dir.path();
    std::fs::copy(&archive, d.join("archive.bin")).unwrap();
    std::fs::copy(&archive, d.join(".tz")).unwrap();
    for name in ["archive.bin", ".tz"] {
        let o = tz(d, &["decompress", name]);
        let line = fails(&o, "decompress a name without .tz", &[name, "-o"]);
        assert!(line.contains(".tz"), "{line}");
    }
    ok(
        &tz(d, &["decompress", "archive.bin", "-o", "x.safetensors"]),
        "decompress archive.bin -o",
    );
    assert!(std::fs::read(d.join("x.safetensors")).unwrap() == model);
    no_temp_files(d);
}

/// A FIFO given as the input is refused at once: opening one blocks until a writer appears, so
/// the input is opened non-blocking and its type checked on the handle.
#[cfg(unix)]
#[test]
fn a_fifo_input_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let made = Command::new("mkfifo")
        .arg(d.join("pipe"))
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("SKIP: no mkfifo");
        return;
    }
    for cmd in ["compress", "decompress", "verify", "info"] {
        let mut args = vec![cmd, "pipe"];
        if cmd == "decompress" {
            args.extend(["-o", "out.safetensors"]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensorzip"))
            .args(&args)
            .current_dir(d)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed().as_secs() > 30 {
                let _ = child.kill();
                panic!("{cmd} pipe: still waiting after 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let o = child.wait_with_output().unwrap();
        fails(&o, &args.join(" "), &["pipe", "not a regular file"]);
    }
}

#[test]
fn not_a_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut rng = Rng::new(5);
    let junk: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(d.join("junk.safetensors"), &junk).unwrap();
    std::fs::write(d.join("empty.safetensors"), b"").unwrap();
    // A header length that points past the end.
    let mut lying = 1_000_000u64.to_le_bytes().to_vec();
    lying.extend_from_slice(b"{}      ");
    std::fs::write(d.join("lying.safetensors"), &lying).unwrap();
    // A tensor that runs past the end of the file.
    let mut model = model_bytes();
    model.truncate(model.len() - 100);
    std::fs::write(d.join("cut.safetensors"), &model).unwrap();
    for name in [
        "junk.safetensors",
        "empty.safetensors",
        "lying.safetensors",
        "cut.safetensors",
    ] {
        let o = tz(d, &["compress", name]);
        fails(&o, &format!("compress {name}"), &[name]);
        assert!(
            !d.join(format!("{name}.tz")).exists(),
            "{name}: an output was left"
        );
    }
    // Tensors whose data ranges leave a gap or overlap (the safetensors reader refuses both): the
    // message says what the rule is.
    let header = |h: &str| {
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(h.as_bytes());
        f.extend_from_slice(&[7u8; 64]);
        f
    };
    for (name, h) in [
        (
            "gap.safetensors",
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[12],"data_offsets":[16,64]},"c":{"dtype":"F32","shape":[1],"data_offsets":[60,64]}}"#,
        ),
        (
            "gap2.safetensors",
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[48,64]}}"#,
        ),
    ] {
        std::fs::write(d.join(name), header(h)).unwrap();
        let o = tz(d, &["compress", name]);
        fails(
            &o,
            &format!("compress {name}"),
            &[name, "no gap and no overlap"],
        );
    }
    let o = tz(d, &["compress", "missing.safetensors"]);
    fails(&o, "compress a missing file", &["missing.safetensors"]);
    // A directory of no input and a device are named as what they are (mapping them gave "No
    // such device").
    std::fs::create_dir_all(d.join("adir")).unwrap();
    for (args, what) in [
        (&["compress", "adir"][..], "no .safetensors file"),
        (&["decompress", "adir"], "no .tz file"),
        (&["info", "adir"], "no .tz file"),
    ] {
        fails(
            &tz(d, args),
            &format!("{} a directory", args[0]),
            &["adir", what],
        );
    }
    #[cfg(unix)]
    fails(
        &tz(d, &["verify", "/dev/null"]),
        "verify a device",
        &["/dev/null", "not a regular file"],
    );
    // Not an archive.
    for args in [
        &["decompress", "junk.safetensors", "-o", "out"][..],
        &["verify", "junk.safetensors"],
        &["info", "junk.safetensors"],
    ] {
        let o = tz(d, args);
        let line = fails(&o, &format!("{} junk", args[0]), &["junk.safetensors"]);
        assert!(line.contains("magic"), "{line}");
    }
    // An archive given to compress, and a safetensors file given where an archive is expected:
    // the error says what each is.
    std::fs::write(d.join("m.safetensors"), model_bytes()).unwrap();
    ok(&tz(d, &["compress", "m.safetensors"]), "compress");
    fails(
        &tz(d, &["compress", "m.safetensors.tz", "-o", "again.tz"]),
        "compress of an archive",
        &["m.safetensors.tz", "tensorzip archive already"],
    );
    for args in [
        &["decompress", "m.safetensors", "-o", "out"][..],
        &["verify", "m.safetensors"],
        &["info", "m.safetensors"],
    ] {
        let o = tz(d, args);
        fails(
            &o,
            &format!("{} of a safetensors file", args[0]),
            &[
                "m.safetensors",
                "not a tensorzip archive",
                "it is a safetensors file",
            ],
        );
    }
    assert!(!d.join("out").exists());
    no_temp_files(d);
}

/// Runs decompress, verify and info on `name`; each must fail, naming the file, with every needle.
fn all_readers_fail(d: &Path, name: &str, needles: &[&str]) {
    let mut n = vec![name];
    n.extend_from_slice(needles);
    fails(
        &tz(d, &["decompress", name, "-o", "restored.safetensors"]),
        &format!("decompress {name}"),
        &n,
    );
    assert!(
        !d.join("restored.safetensors").exists(),
        "decompress {name} left an output"
    );
    fails(&tz(d, &["verify", name]), &format!("verify {name}"), &n);
    fails(&tz(d, &["info", name]), &format!("info {name}"), &n);
    fails(
        &tz(d, &["info", "--json", name]),
        &format!("info --json {name}"),
        &n,
    );
    no_temp_files(d);
}

#[test]
fn truncated_archives_fail() {
    let (dir, archive, _) = setup();
    let d = dir.path();
    let ar = std::fs::read(&archive).unwrap();
    for (i, cut) in [
        0usize,
        3,
        10,
        31,
        32,
        ar.len() / 2,
        ar.len() - 5,
        ar.len() - 1,
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("cut{i}.tz");
        std::fs::write(d.join(&name), &ar[..cut]).unwrap();
        all_readers_fail(d, &name, &[]);
    }
}

#[test]
fn corrupted_archives_fail_with_a_checksum_error() {
    let (dir, archive, _) = setup();
    let d = dir.path();
    let ar = std::fs::read(&archive).unwrap();
    // One byte flipped in the middle of the largest blob (after the 32-byte header).
    let index_offset = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
    for at in [40, index_offset / 2, index_offset - 3] {
        let mut bad = ar.clone();
        bad[at] ^= 0x10;
        let name = format!("flip{at}.tz");
        std::fs::write(d.join(&name), &bad).unwrap();
        let line = fails(
            &tz(d, &["verify", &name]),
            "verify a corrupted archive",
            &[&name],
        );
        assert!(line.contains("checksum"), "{line}");
        let line = fails(
            &tz(d, &["decompress", &name, "-o", "r.safetensors"]),
            "decompress a corrupted archive",
            &[&name],
        );
        assert!(line.contains("checksum"), "{line}");
        assert!(
            !d.join("r.safetensors").exists(),
            "a partial output was left"
        );
        no_temp_files(d);
    }
    // A flipped byte in the index.
    let mut bad = ar.clone();
    bad[index_offset + 6] ^= 1;
    std::fs::write(d.join("index.tz"), &bad).unwrap();
    all_readers_fail(d, "index.tz", &[]);
}

#[test]
fn unknown_archive_version_fails() {
    let (dir, archive, _) = setup();
    let d = dir.path();
    let mut ar = std::fs::read(&archive).unwrap();
    ar[4..6].copy_from_slice(&2u16.to_le_bytes());
    std::fs::write(d.join("v2.tz"), &ar).unwrap();
    all_readers_fail(d, "v2.tz", &["version 2"]);
    ar[4..6].copy_from_slice(&0xFFFFu16.to_le_bytes());
    std::fs::write(d.join("vmax.tz"), &ar).unwrap();
    all_readers_fail(d, "vmax.tz", &["version 65535"]);
}

#[test]
fn failed_runs_leave_no_partial_output() {
    let (dir, archive, _) = setup();
    let d = dir.path();
    let mut ar = std::fs::read(&archive).unwrap();
    // Corrupt the last blob: decompress writes the earlier segments, then fails.
    let index_offset = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
    ar[index_offset - 1] ^= 0xFF;
    std::fs::write(d.join("late.tz"), &ar).unwrap();
    fails(
        &tz(d, &["decompress", "late.tz", "-o", "out.safetensors"]),
        "decompress late failure",
        &["late.tz"],
    );
    assert!(!d.join("out.safetensors").exists());
    // Same with -f onto an existing file: the old file stays as it was.
    std::fs::write(d.join("out.safetensors"), b"old").unwrap();
    fails(
        &tz(d, &["decompress", "late.tz", "-o", "out.safetensors", "-f"]),
        "decompress -f late failure",
        &["late.tz"],
    );
    assert_eq!(std::fs::read(d.join("out.safetensors")).unwrap(), b"old");
    no_temp_files(d);
}

/// An archive whose index (with a correct CRC) claims a huge size for the safetensors header segment
/// must be refused with an error, not by aborting on a huge allocation.
#[test]
fn hostile_index_sizes_fail_cleanly() {
    let (dir, archive, _) = setup();
    let d = dir.path();
    let mut ar = std::fs::read(&archive).unwrap();
    let io = u64::from_le_bytes(ar[24..32].try_into().unwrap()) as usize;
    let n = u32::from_le_bytes(ar[io..io + 4].try_into().unwrap()) as usize;
    // Entry layout: kind, orig_offset, orig_len, blob_offset, blob_len (u64s), orig_crc, n_crcs, crcs.
    let mut at = io + 4;
    let extra = 1u64 << 46;
    for i in 0..n {
        let ncrc = u32::from_le_bytes(ar[at + 37..at + 41].try_into().unwrap()) as usize;
        if i == 0 {
            let len = u64::from_le_bytes(ar[at + 9..at + 17].try_into().unwrap()) + extra;
            ar[at + 9..at + 17].copy_from_slice(&len.to_le_bytes());
        } else {
            let off = u64::from_le_bytes(ar[at + 1..at + 9].try_into().unwrap()) + extra;
            ar[at + 1..at + 9].copy_from_slice(&off.to_le_bytes());
        }
        at += 41 + 4 * ncrc;
    }
    let total = u64::from_le_bytes(ar[16..24].try_into().unwrap()) + extra;
    ar[16..24].copy_from_slice(&total.to_le_bytes());
    let crc = tensorzip::crc32(&ar[io..at]);
    ar[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(d.join("hostile.tz"), &ar).unwrap();
    all_readers_fail(d, "hostile.tz", &[]);
}

/// `tensorzip demo` (the README's first command ends with it) compresses, verifies and restores the
/// built-in sample model, and says so with its ratio and speed.
#[test]
fn demo_restores_the_sample_model() {
    let dir = tempfile::tempdir().unwrap();
    let o = tz(dir.path(), &["demo", "-t", "1"]);
    ok(&o, "demo");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sample model: 34 tensors"), "{out}");
    assert!(out.contains(" on 1 thread ("), "{out}");
    assert!(out.contains("ratio 6"), "{out}");
    assert!(out.contains("restored file is identical"), "{out}");
    assert!(out.contains("first run"), "{out}");
}

#[test]
fn bench_reports_sizes_and_paired_scaling() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), model_bytes()).unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let o = tz(dir.path(), args);
        ok(&o, "bench");
        serde_json::from_slice(&o.stdout).expect("one JSON object")
    };
    let base = ["bench", "model.safetensors", "--runs", "2", "--scaling"];
    let d = json(&[&base[..], &["-t", "2"]].concat());
    let orig = d["original_bytes"].as_u64().unwrap();
    // The five tensors' data: bf16 32x300, f32 300, i64 100, f16 10x70, empty.
    assert_eq!(orig, 2 * 32 * 300 + 4 * 300 + 8 * 100 + 2 * 700);
    assert!(d["compressed_bytes"].as_u64().unwrap() < orig);
    let s = &d["scaling"];
    assert_eq!(s["threads"], 2);
    assert_eq!(s["runs"], 2);
    for k in [
        "compress_warm_ratios",
        "decompress_warm_ratios",
        "machine_ratios",
    ] {
        let v = s[k].as_array().unwrap_or_else(|| panic!("{k}: {s}"));
        assert_eq!(v.len(), 2, "{k}");
        assert!(
            v.iter().all(|r| r.as_f64().is_some_and(|r| r > 0.0)),
            "{k}: {s}"
        );
    }
    // The kernel's TLB shootdowns of each round: counts where /proc/interrupts has them.
    let linux = std::fs::read_to_string("/proc/interrupts").is_ok_and(|t| t.contains("TLB:"));
    for k in ["compress_tlb_shootdowns", "decompress_tlb_shootdowns"] {
        let v = s[k].as_array().unwrap_or_else(|| panic!("{k}: {s}"));
        assert_eq!(v.len(), 2, "{k}");
        assert!(
            v.iter()
                .all(|t| t.is_u64() == linux && (linux || t.is_null())),
            "{k}: {s}"
        );
    }
    // One thread: nothing to pair.
    assert!(json(&[&base[..], &["-t", "1"]].concat())["scaling"].is_null());
}

/// `bench` measures what `compress` codes: a tensor of a dtype tensorzip does not model counts (as
/// bytes; it was left out), a file without tensor bytes has no speeds (null, not 0 GB/s), a
/// directory stands for its files, and a bad file among several is reported while the others are
/// still measured.
#[test]
fn bench_measures_every_tensor_and_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("m")).unwrap();
    let scales: Vec<u8> = (0..4096u32).map(|i| 120 + (i % 7) as u8).collect();
    let w = sample::weights(1, 64, DType::F32, 4);
    let odd = serialize_safetensors(
        &[
            ("scales", "F8_E8M0", &[4096u64][..], &scales[..]),
            ("w", "F32", &[64u64][..], &w[..]),
        ],
        None,
    )
    .unwrap();
    std::fs::write(d.join("m/odd.safetensors"), odd).unwrap();
    let empty = serialize_safetensors(&[("e", "F32", &[0u64, 3][..], &[][..])], None).unwrap();
    std::fs::write(d.join("m/empty.safetensors"), empty).unwrap();
    std::fs::write(d.join("junk.safetensors"), b"not a model at all").unwrap();
    let docs = |o: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
            .collect()
    };
    let o = tz(d, &["bench", "m", "--runs", "1"]);
    ok(&o, "bench m");
    let got = docs(&o);
    assert_eq!(got.len(), 2, "{got:?}");
    let named = |n: &str| {
        got.iter()
            .find(|j| j["file"].as_str().unwrap().ends_with(n))
            .unwrap_or_else(|| panic!("{n}: {got:?}"))
            .clone()
    };
    let j = named("odd.safetensors");
    assert_eq!(
        (j["tensors"].as_u64(), j["original_bytes"].as_u64()),
        (Some(2), Some(4096 + 256))
    );
    assert!(
        j["decompress_warm_gbps"].as_f64().is_some_and(|g| g > 0.0),
        "{j}"
    );
    let j = named("empty.safetensors");
    assert_eq!(j["original_bytes"].as_u64(), Some(0));
    for k in [
        "ratio",
        "compress_gbps",
        "compress_warm_gbps",
        "decompress_warm_gbps",
        "decompress_e2e_gbps",
        "bound_per_tensor",
    ] {
        assert!(j[k].is_null(), "{k}: {j}");
    }
    let o = tz(
        d,
        &[
            "bench",
            "junk.safetensors",
            "m/odd.safetensors",
            "--runs",
            "1",
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("junk.safetensors: not a safetensors file"),
        "{err}"
    );
    assert!(err.contains("1 of 2 inputs failed"), "{err}");
    assert_eq!(docs(&o).len(), 1);
}
