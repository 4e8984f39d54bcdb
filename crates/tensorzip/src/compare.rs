//! A writer that compares the bytes written to it with an original: what `tensorzip verify
//! --against`, `tensorzip compress --verify` and the Python package's `verify_file` decode an
//! archive into, so that a restore is checked without being kept.

use std::io::Write;

/// Compares everything written with `original` (or, without one, only counts it).
pub struct Compare<'a> {
    original: Option<&'a [u8]>,
    pos: u64,
    mismatch: Option<u64>,
}

/// How the bytes written differ from the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference {
    /// The first byte that differs (or the original's end, where more was written).
    At(u64),
    /// The same bytes as far as they go, but fewer were written than the original has.
    Length { written: u64, original: u64 },
}

impl Difference {
    /// "differs from NAME at byte N" / "restores N bytes but NAME has M".
    pub fn describe(&self, name: &str) -> String {
        match self {
            Difference::At(at) => format!("differs from {name} at byte {at}"),
            Difference::Length { written, original } => {
                format!("restores {written} bytes but {name} has {original}")
            }
        }
    }
}

impl<'a> Compare<'a> {
    pub fn new(original: Option<&'a [u8]>) -> Compare<'a> {
        Compare {
            original,
            pos: 0,
            mismatch: None,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.pos
    }

    /// Once everything is written: how it differs from the original, if it does (`None` without
    /// an original).
    pub fn difference(&self) -> Option<Difference> {
        let o = self.original?;
        match self.mismatch {
            Some(at) => Some(Difference::At(at)),
            None if self.pos != o.len() as u64 => Some(Difference::Length {
                written: self.pos,
                original: o.len() as u64,
            }),
            None => None,
        }
    }
}

impl Write for Compare<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let (Some(o), None) = (self.original, self.mismatch) {
            let start = usize::try_from(self.pos).unwrap_or(usize::MAX);
            let end = start.saturating_add(buf.len());
            match o.get(start..end) {
                Some(want) if want == buf => {}
                Some(want) => {
                    let k = want.iter().zip(buf).position(|(a, b)| a != b).unwrap_or(0);
                    self.mismatch = Some(self.pos + k as u64);
                }
                // Past the original's end: the first byte there (or earlier, where they differ).
                None => {
                    let have = o.get(start.min(o.len())..).unwrap_or_default();
                    let k = have.iter().zip(buf).position(|(a, b)| a != b);
                    self.mismatch = Some(self.pos + k.unwrap_or(have.len()) as u64);
                }
            }
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes every segment of `ar` (on `engine`) and compares the restore with `original`:
/// `Ok(None)` when they are the same bytes, else how they differ; a damaged archive is the
/// decoder's error. `progress` as [`crate::archive::Archive::decode_all_to`]'s.
pub fn restore_difference(
    ar: &crate::archive::Archive<'_>,
    engine: &crate::CpuEngine,
    original: &[u8],
    progress: &(dyn Fn(u64) + Sync),
) -> crate::Result<Option<Difference>> {
    let mut cmp = Compare::new(Some(original));
    ar.decode_all_to(engine, &mut cmp, progress)?;
    Ok(cmp.difference())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(original: &[u8], pieces: &[&[u8]]) -> Option<Difference> {
        let mut c = Compare::new(Some(original));
        for p in pieces {
            c.write_all(p).unwrap();
        }
        c.difference()
    }

    #[test]
    fn differences_are_found_wherever_they_are() {
        let o = b"abcdefgh";
        assert_eq!(run(o, &[b"abc", b"defgh"]), None);
        assert_eq!(run(o, &[b"abc", b"dXfgh"]), Some(Difference::At(4)));
        assert_eq!(run(o, &[b"Xbc", b"dXfgh"]), Some(Difference::At(0)));
        assert_eq!(
            run(o, &[b"abc"]),
            Some(Difference::Length {
                written: 3,
                original: 8
            })
        );
        // Longer than the original: the first byte past its end, or an earlier difference.
        assert_eq!(run(o, &[b"abcdef", b"ghij"]), Some(Difference::At(8)));
        assert_eq!(run(o, &[b"abcdef", b"gXij"]), Some(Difference::At(7)));
        assert_eq!(run(b"", &[b""]), None);
        let mut c = Compare::new(None);
        c.write_all(b"anything").unwrap();
        assert_eq!((c.difference(), c.written()), (None, 8));
        assert_eq!(
            Difference::At(4).describe("m.safetensors"),
            "differs from m.safetensors at byte 4"
        );
    }
}
