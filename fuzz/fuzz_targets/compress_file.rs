//! Arbitrary bytes as the input of `tensorzip compress`: planning the file (`plan_safetensors`,
//! which parses its safetensors header) returns `Ok` or `Err`, never panics; a file it accepts is
//! written as an archive (`write_archive`, small chunks and blocks, a checksum piece size the
//! first byte chooses) that parses, lists its tensors and decodes back to exactly the file — the
//! header, its metadata and any bytes between or after the tensors included.
#![no_main]

use std::io::{Read, Seek, SeekFrom};

use libfuzzer_sys::fuzz_target;
use tensorzip::archive::{plan_safetensors, write_archive, Archive, ArchiveOptions};
use tensorzip::CompressOptions;

#[path = "one_engine.rs"]
mod one_engine;
use one_engine::engine;

/// The scratch file the archive is written to (one per process, truncated for each input).
fn scratch() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("tensorzip-fuzz-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("scratch file");
    // Unlinked at once: the open handle is all that is used.
    let _ = std::fs::remove_file(&path);
    f
}

fuzz_target!(|data: &[u8]| {
    let [p, file @ ..] = data else { return };
    let Ok(segments) = plan_safetensors(file) else {
        return;
    };
    let opts = ArchiveOptions {
        compress: CompressOptions {
            chunk_bytes: 8 * (1 + (*p as usize % 64)),
            block_units: 32,
            min_compress_bytes: 0,
            ..CompressOptions::default()
        },
        checksum_piece_bytes: [0, 4096, 64, 1][(*p as usize >> 6) % 4],
    };
    let mut out = scratch();
    let len = write_archive(engine(), file, &segments, &opts, &mut out, &|_| {})
        .expect("a planned file is written");
    let mut ar = Vec::new();
    out.seek(SeekFrom::Start(0)).unwrap();
    out.read_to_end(&mut ar).unwrap();
    assert_eq!(ar.len() as u64, len);
    let parsed = Archive::parse(&ar).expect("our archive parses");
    parsed
        .tensors(engine())
        .expect("our archive lists its tensors");
    let mut back = Vec::new();
    parsed
        .decode_all_to(engine(), &mut back, &|_| {})
        .expect("our archive decodes");
    assert!(back == file, "restored file differs ({} bytes)", file.len());
});
