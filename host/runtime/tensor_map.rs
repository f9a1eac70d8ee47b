//! Tensor maps for Hopper's tensor memory accelerator (TMA): the driver's
//! `cuTensorMapEncodeTiled`, with every limit the driver documents checked first, so that a bad
//! shape is an [`Error::InvalidArgument`] naming the rule rather than a bare
//! `CUDA_ERROR_INVALID_VALUE` (or, for the limits the driver does not check, a fault on the
//! device).
//!
//! A kernel takes the map by value as its first parameter (`device::tma::TensorMapParam` in the
//! kernel crate): pass [`TensorMap::words`] with [`KernelParams::value`](super::KernelParams::value).

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};

use super::driver::guarded;
use crate::error::{DriverContext, Error, Result};

/// What the map's elements are (the copy moves bytes; the type sets the element size and what
/// out-of-bounds elements read as: zero, in every type here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapElement {
    U8,
    F16,
    Bf16,
    F32,
}

impl MapElement {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            MapElement::U8 => 1,
            MapElement::F16 | MapElement::Bf16 => 2,
            MapElement::F32 => 4,
        }
    }

    fn driver(self) -> CUtensorMapDataType {
        match self {
            MapElement::U8 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            MapElement::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            MapElement::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            MapElement::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// How a box lies in shared memory: rows of the box's innermost extent, with 16-byte chunks
/// permuted within each span of `N` bytes (the layouts `wgmma` and `ldmatrix` read without bank
/// conflicts; `device::wgmma::SharedMatrix` names the same ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapSwizzle {
    None,
    Bytes32,
    Bytes64,
    Bytes128,
}

impl MapSwizzle {
    /// The swizzle span in bytes (the longest innermost box extent it allows), or `None`.
    pub const fn span(self) -> Option<u64> {
        match self {
            MapSwizzle::None => None,
            MapSwizzle::Bytes32 => Some(32),
            MapSwizzle::Bytes64 => Some(64),
            MapSwizzle::Bytes128 => Some(128),
        }
    }

    /// The byte offset in shared memory of byte `offset` of a box stored unswizzled with rows of
    /// `row_bytes` (its innermost extent): the hardware's permutation, XOR of the 16-byte chunk
    /// index with the row within the swizzle's repeat (the CUDA programming guide's TMA swizzle
    /// table). For tests and host-side checks of what the device reads.
    pub const fn apply(self, offset: u64) -> u64 {
        match self.span() {
            None => offset,
            // Bits 4.. (the chunk within the span) XOR bits 7.. (the 128-byte row, mod the
            // span's chunk count): the patterns of 32-, 64- and 128-byte spans.
            Some(span) => {
                let chunks = span / 16;
                let chunk = (offset / 16) % chunks;
                let row = (offset / 128) % chunks;
                offset - chunk * 16 + ((chunk ^ row) * 16)
            }
        }
    }

    fn driver(self) -> CUtensorMapSwizzle {
        match self {
            MapSwizzle::None => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            MapSwizzle::Bytes32 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            MapSwizzle::Bytes64 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            MapSwizzle::Bytes128 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// A tiled tensor in global memory and the box a copy moves, innermost dimension first.
#[derive(Clone, Copy, Debug)]
pub struct TiledTensor<'a> {
    pub element: MapElement,
    /// The tensor's first byte: a device address, 16-byte aligned.
    pub address: u64,
    /// Extent of each dimension in elements (rank = its length, 1 to 5).
    pub dims: &'a [u64],
    /// Bytes between consecutive indices of dimensions 1.. (dimension 0 is contiguous):
    /// `rank - 1` of them, multiples of 16.
    pub strides: &'a [u64],
    /// The box: extent per dimension, 1 to 256 each, innermost extent a multiple of 16 bytes.
    pub box_dims: &'a [u32],
    pub swizzle: MapSwizzle,
}

/// An encoded tensor map (`CUtensorMap`): 128 bytes the driver made, valid as long as the memory
/// it describes is.
#[derive(Clone, Copy)]
pub struct TensorMap(CUtensorMap);

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMap").finish_non_exhaustive()
    }
}

impl TensorMap {
    /// Encodes the map for copies of `tensor`'s box (elements outside the tensor read as zero;
    /// L2 promotion of 128 bytes). `kernel` names the caller in errors.
    pub fn tiled(kernel: &'static str, tensor: &TiledTensor<'_>) -> Result<TensorMap> {
        tensor.check(kernel)?;
        let rank = tensor.dims.len();
        let element_strides = [1u32; 5];
        let mut map = CUtensorMap { opaque: [0; 16] };
        guarded("cuTensorMapEncodeTiled", || {
            // SAFETY: every array holds `rank` entries (`strides` rank - 1), as checked; the
            // driver only writes `map`.
            unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    tensor.element.driver(),
                    rank as u32,
                    tensor.address as *mut std::ffi::c_void,
                    tensor.dims.as_ptr(),
                    tensor.strides.as_ptr(),
                    tensor.box_dims.as_ptr(),
                    element_strides.as_ptr(),
                    CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    tensor.swizzle.driver(),
                    CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            }
            .result()
            .during("cuTensorMapEncodeTiled")
        })?;
        Ok(TensorMap(map))
    }

    /// The map's 128 bytes as a kernel parameter value (the kernel's `TensorMapParam`).
    pub fn words(&self) -> [u64; 16] {
        self.0.opaque
    }
}

impl TiledTensor<'_> {
    /// Whether the driver's documented limits for a tiled map without interleave (CUDA driver
    /// API, `cuTensorMapEncodeTiled`) hold; [`TensorMap::tiled`] checks them first. An error
    /// names the rule and `kernel`.
    pub fn check(&self, kernel: &'static str) -> Result<()> {
        let bad = |message: String| Err(Error::invalid(kernel, format!("tensor map: {message}")));
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) {
            return bad(format!("rank {rank}, expected 1 to 5"));
        }
        if self.strides.len() != rank - 1 || self.box_dims.len() != rank {
            return bad(format!(
                "{} strides and {} box extents for rank {rank} (expected {} and {rank})",
                self.strides.len(),
                self.box_dims.len(),
                rank - 1
            ));
        }
        if self.address == 0 || !self.address.is_multiple_of(16) {
            return bad(format!("address {:#x} is null or not 16-byte aligned", self.address));
        }
        if let Some(i) = self.dims.iter().position(|&d| d == 0 || d > 1 << 32) {
            return bad(format!("dimension {i} has extent {}, expected 1 to 2^32", self.dims[i]));
        }
        if let Some(i) = self.strides.iter().position(|&s| !s.is_multiple_of(16) || s >= 1 << 40) {
            return bad(format!(
                "stride {} of dimension {} is not a multiple of 16 below 2^40",
                self.strides[i],
                i + 1
            ));
        }
        let row_bytes = self.dims[0] * self.element.bytes();
        if let Some(&s) = self.strides.first()
            && s < row_bytes
        {
            return bad(format!("stride {s} of dimension 1 is shorter than a row of dimension 0 ({row_bytes} bytes)"));
        }
        if let Some(i) = self.box_dims.iter().position(|&b| b == 0 || b > 256) {
            return bad(format!("box extent {} in dimension {i}, expected 1 to 256", self.box_dims[i]));
        }
        let inner = self.box_dims[0] as u64 * self.element.bytes();
        if !inner.is_multiple_of(16) {
            return bad(format!("the box's innermost extent is {inner} bytes, not a multiple of 16"));
        }
        if let Some(span) = self.swizzle.span()
            && inner > span
        {
            return bad(format!("the box's innermost extent is {inner} bytes, more than the {span}-byte swizzle span"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor<'a>(dims: &'a [u64], strides: &'a [u64], box_dims: &'a [u32], swizzle: MapSwizzle) -> TiledTensor<'a> {
        TiledTensor { element: MapElement::F16, address: 0x1000, dims, strides, box_dims, swizzle }
    }

    #[test]
    fn the_documented_limits_are_refused_with_the_rule() {
        let ok = tensor(&[128, 97], &[256], &[64, 32], MapSwizzle::Bytes128);
        assert!(ok.check("t").is_ok());
        let cases: [(TiledTensor<'_>, &str); 9] = [
            (tensor(&[], &[], &[], MapSwizzle::None), "rank 0"),
            (tensor(&[128, 97], &[], &[64, 32], MapSwizzle::None), "0 strides"),
            (TiledTensor { address: 0x1008, ..ok }, "not 16-byte aligned"),
            (tensor(&[128, 0], &[256], &[64, 32], MapSwizzle::None), "dimension 1 has extent 0"),
            (tensor(&[128, 97], &[264], &[64, 32], MapSwizzle::None), "stride 264"),
            (tensor(&[128, 97], &[128], &[64, 32], MapSwizzle::None), "shorter than a row"),
            (tensor(&[128, 97], &[256], &[64, 257], MapSwizzle::None), "box extent 257"),
            (tensor(&[128, 97], &[256], &[4, 32], MapSwizzle::None), "8 bytes, not a multiple of 16"),
            (tensor(&[128, 97], &[256], &[128, 32], MapSwizzle::Bytes128), "more than the 128-byte"),
        ];
        for (t, want) in cases {
            let err = t.check("t").unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
    }

    #[test]
    fn swizzle_permutes_chunks_within_each_span_by_the_row() {
        // 128-byte swizzle: chunk c of row r lands at chunk c ^ (r % 8).
        for r in 0..16u64 {
            for c in 0..8u64 {
                assert_eq!(MapSwizzle::Bytes128.apply(r * 128 + c * 16 + 5), r * 128 + (c ^ (r % 8)) * 16 + 5);
            }
        }
        // 64-byte swizzle on 64-byte rows: the row index in 128-byte units decides.
        assert_eq!(MapSwizzle::Bytes64.apply(128 + 16), 128);
        assert_eq!(MapSwizzle::Bytes32.apply(3 * 128 + 16), 3 * 128);
        assert_eq!(MapSwizzle::None.apply(777), 777);
        // A permutation: no two offsets of an 8-row atom collide.
        let mut seen = std::collections::BTreeSet::new();
        for o in (0..1024).step_by(16) {
            assert!(seen.insert(MapSwizzle::Bytes128.apply(o)));
        }
    }
}
