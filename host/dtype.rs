//! Element types shared by launchers, references and (later) DLPack.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

/// A tensor element type dlkern kernels accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I8,
    U8,
    I32,
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// The name used in kernel symbols and messages (`f16`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A floating-point element type with host-side conversions, for typed launchers and tests.
pub trait Element: Copy + Default + DeviceRepr + ValidAsZeroBits + bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}

/// Any element type a host slice of a tensor may have (floats and the integer types).
pub trait Scalar: Copy + bytemuck::Pod + 'static {
    const DTYPE: DType;
}

macro_rules! scalar {
    ($($t:ty => $d:ident),+) => {$(
        impl Scalar for $t {
            const DTYPE: DType = DType::$d;
        }
    )+};
}

scalar!(f32 => F32, half::f16 => F16, half::bf16 => BF16, u8 => U8, i8 => I8, i32 => I32, i64 => I64);
