//! Element types and how each is split into byte planes.
//!
//! Every dtype is coded as a sequence of *units* (the element itself, or for `complex64` its two `f32`
//! halves). A unit of `unit_size` bytes goes through a bit transform and is then split into `unit_size`
//! byte planes (plane `p` holds byte `p` of every transformed unit, little-endian).
//!
//! The transform per dtype is fixed by format version 1 (see `docs/FORMAT.md`, "Transforms"):
//! * `bf16`, `f32`, `complex64`, `f64`: ZipNN's exponent reordering — the sign bit moves from the top to
//!   just below the exponent, so the whole exponent lands in the top byte (the top 8 of 11 bits for
//!   `f64`). For bf16 and f32 this is bit for bit ZipNN's `reorder_float_bits_dtype16/32`.
//! * `f16`: identity. Its 5-bit exponent already sits inside the top byte; moving the sign within that
//!   byte only relabels the byte's symbols, which leaves every order-0 entropy unchanged (measured in
//!   `docs/BENCHMARKS.md`).
//! * 8-bit floats, integers and bool: identity (a single-byte unit has no planes to separate; integer
//!   bytes are coded as they are).

use crate::error::{Error, Result};

/// Element type of a tensor. The discriminant is the code stored in the blob header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    Bool = 0,
    U8 = 1,
    I8 = 2,
    U16 = 3,
    I16 = 4,
    U32 = 5,
    I32 = 6,
    U64 = 7,
    I64 = 8,
    F16 = 9,
    BF16 = 10,
    F32 = 11,
    F64 = 12,
    F8E4M3FN = 13,
    F8E5M2 = 14,
    F8E4M3FNUZ = 15,
    F8E5M2FNUZ = 16,
    Complex64 = 17,
}

/// The bit transform applied to each unit before it is split into planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Bytes are used as they are.
    Identity,
    /// ZipNN's reordering: the sign bit moves from the most significant bit to just below an exponent
    /// of `exp_bits` bits, which moves up by one bit to the top of the unit.
    SignBelowExponent { exp_bits: u32 },
}

impl DType {
    /// All dtypes, in code order.
    pub const ALL: [DType; 18] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::F8E4M3FNUZ,
        DType::F8E5M2FNUZ,
        DType::Complex64,
    ];

    /// The dtype stored under header code `code`.
    pub fn from_code(code: u8) -> Result<DType> {
        DType::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::Corrupt(format!("unknown dtype code {code}")))
    }

    /// Header code of this dtype.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool
            | DType::U8
            | DType::I8
            | DType::F8E4M3FN
            | DType::F8E5M2
            | DType::F8E4M3FNUZ
            | DType::F8E5M2FNUZ => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::Complex64 => 8,
        }
    }

    /// Bytes per coded unit (= number of byte planes).
    pub fn unit_size(self) -> usize {
        match self {
            DType::Complex64 => 4,
            other => other.itemsize(),
        }
    }

    /// Units per element (2 for complex64, else 1).
    pub fn units_per_element(self) -> usize {
        self.itemsize() / self.unit_size()
    }

    /// The transform format version 1 applies to this dtype.
    pub fn transform(self) -> Transform {
        match self {
            DType::BF16 | DType::F32 | DType::Complex64 => {
                Transform::SignBelowExponent { exp_bits: 8 }
            }
            DType::F64 => Transform::SignBelowExponent { exp_bits: 11 },
            _ => Transform::Identity,
        }
    }

    /// The plane that may be coded conditioned on another, and that condition plane: the byte just
    /// below the exponent byte, conditioned on the exponent byte (for float dtypes whose exponent
    /// fills the top byte after the transform), else `None`.
    pub fn conditioned_plane(self) -> Option<(usize, usize)> {
        match self {
            DType::BF16 | DType::F16 => Some((0, 1)),
            DType::F32 | DType::Complex64 => Some((2, 3)),
            DType::F64 => Some((6, 7)),
            _ => None,
        }
    }

    /// The plane format version 2 may code two units a symbol (docs/FORMAT.md, "Version 2"):
    /// bf16's exponent byte (plane 1), else `None`. Not fp32: its exponent plane is a quarter of
    /// the unit, and pairing it made a one-thread decode no faster on all-MiniLM-L6-v2 (3.69-3.86
    /// against 3.58-3.86 GB/s) and slower on synthetic weights (4.41-4.43 against 4.00-4.19;
    /// 2026-12-05, Intel VM, `tensorzip bench --threads 1 --runs 5 [--pair-exponents]`), nor fp16
    /// (75-123 distinct top bytes a tensor: too many for 128 pairs).
    pub fn paired_plane(self) -> Option<usize> {
        match self {
            DType::BF16 => Some(1),
            _ => None,
        }
    }

    /// Name as used by safetensors (`"BF16"`, `"F32"`, ...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::U16 => "U16",
            DType::I16 => "I16",
            DType::U32 => "U32",
            DType::I32 => "I32",
            DType::U64 => "U64",
            DType::I64 => "I64",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::F8E4M3FN => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E4M3FNUZ => "F8_E4M3FNUZ",
            DType::F8E5M2FNUZ => "F8_E5M2FNUZ",
            DType::Complex64 => "C64",
        }
    }

    /// The dtype of a safetensors dtype name, if tensorzip codes it.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.safetensors_name() == name)
    }

    /// Lower-case name as used by PyTorch (`"bfloat16"`, `"float8_e4m3fn"`, ...).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U16 => "uint16",
            DType::I16 => "int16",
            DType::U32 => "uint32",
            DType::I32 => "int32",
            DType::U64 => "uint64",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::Complex64 => "complex64",
        }
    }

    /// The dtype of a PyTorch dtype name (with or without the `torch.` prefix).
    pub fn from_torch_name(name: &str) -> Option<DType> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        DType::ALL.iter().copied().find(|d| d.torch_name() == name)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.torch_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_are_consistent() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(d.code() as usize, i);
            assert_eq!(DType::from_code(d.code()).unwrap(), *d);
            assert_eq!(d.unit_size() * d.units_per_element(), d.itemsize());
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(*d));
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(*d));
        }
        assert!(DType::from_code(18).is_err());
        assert!(DType::from_code(255).is_err());
        assert_eq!(DType::from_torch_name("torch.bfloat16"), Some(DType::BF16));
    }
}
