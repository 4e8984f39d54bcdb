//! The checksums of the files a model directory's mirror copies as they are.
//!
//! `compress DIR -o OUT` codes the `.safetensors` files (each archive carries its own checksums)
//! and copies every other file — config, tokenizer, index, and weights in other formats. Those
//! copies would travel unprotected, so the mirror also gets `OUT/.tensorzip-copies.json`: each
//! copied file's path (relative, `/`-separated), length and CRC-32 (`zlib.crc32`), taken from the
//! bytes as they were copied. `decompress OUT -o BACK` checks every copy against it as it copies
//! (a file changed or missing fails the command, which leaves nothing) and `verify OUT` checks
//! them too. The name begins with `.`, so directory walks skip it: it is never copied back, and a
//! mirror without one (made before it existed) is restored as before, its copies unchecked.
//!
//! ```json
//! {"format": "tensorzip-copies", "version": 1,
//!  "files": {"config.json": {"bytes": 571, "crc32": 2831049373}, ...}}
//! ```

use std::collections::BTreeMap;
use std::path::Path;

/// The manifest's file name, in the mirror's top directory.
pub const NAME: &str = ".tensorzip-copies.json";

/// Manifests larger than this are refused unread (a million files take ~60 MB).
const MAX_BYTES: u64 = 256 << 20;

/// One copied file's record.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    version: u32,
    files: BTreeMap<String, Record>,
}

/// The copied files of a mirror, by relative path.
#[derive(Default)]
pub struct Copies {
    files: BTreeMap<String, Record>,
}

/// `rel` as the manifest names it: its components joined by `/`; `None` for a path that is not
/// valid UTF-8 (such a file is copied but cannot be listed).
pub fn key(rel: &Path) -> Option<String> {
    let parts: Option<Vec<&str>> = rel.iter().map(|c| c.to_str()).collect();
    parts.map(|p| p.join("/"))
}

impl Copies {
    /// Records a copy; false where its path cannot be listed.
    pub fn add(&mut self, rel: &Path, rec: Record) -> bool {
        match key(rel) {
            Some(k) => {
                self.files.insert(k, rec);
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// The record of `rel`, if listed.
    pub fn get(&self, rel: &Path) -> Option<Record> {
        key(rel).and_then(|k| self.files.get(&k).copied())
    }

    /// The listed paths and their records.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Record)> {
        self.files.iter().map(|(k, r)| (k.as_str(), *r))
    }

    /// The manifest's bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let m = Manifest {
            format: "tensorzip-copies".into(),
            version: 1,
            files: self.files.clone(),
        };
        let mut out = serde_json::to_vec_pretty(&m).expect("strings and numbers serialise");
        out.push(b'\n');
        out
    }

    /// Reads `dir`'s manifest: `None` where there is none; an error naming it where it cannot
    /// be read or is not one (another format, another version, a path that is absolute or
    /// climbs out of `dir`).
    pub fn read(dir: &Path) -> Result<Option<Copies>, String> {
        let path = dir.join(NAME);
        let shown = |m: String| format!("{}: {m}", path.display());
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(shown(e.to_string())),
        };
        if !meta.is_file() {
            return Err(shown("not a regular file".into()));
        }
        if meta.len() > MAX_BYTES {
            return Err(shown(format!("{} bytes; at most {MAX_BYTES}", meta.len())));
        }
        let bytes = std::fs::read(&path).map_err(|e| shown(e.to_string()))?;
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| shown(format!("not a manifest of copies: {e}")))?;
        if m.format != "tensorzip-copies" || m.version != 1 {
            return Err(shown(format!(
                "format {:?} version {}; this tensorzip reads tensorzip-copies version 1",
                m.format, m.version
            )));
        }
        for name in m.files.keys() {
            let bad = name.is_empty()
                || name.starts_with('/')
                || name
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..");
            if bad {
                return Err(shown(format!(
                    "lists {name:?}, not a path inside the directory"
                )));
            }
        }
        Ok(Some(Copies { files: m.files }))
    }
}

/// The length and CRC-32 of the file at `path`, read once.
pub fn record_of(path: &Path) -> Result<Record, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    crate::tree::copy_reporting(&mut f, &mut std::io::sink(), path, path)
}

/// Compares a copy (`got`) with its record, naming the file where they differ.
pub fn check(shown: &Path, want: Record, got: Record) -> Result<(), String> {
    if want == got {
        return Ok(());
    }
    Err(format!(
        "{}: not the file the mirror copied ({} bytes, CRC-32 {:08x}; {NAME} records {} bytes, \
         CRC-32 {:08x})",
        shown.display(),
        got.bytes,
        got.crc32,
        want.bytes,
        want.crc32
    ))
}
