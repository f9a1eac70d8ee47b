//! RMSNorm: `y[r, c] = x[r, c] / sqrt(mean(x[r, :]^2) + eps) * weight[c]`, f32 accumulation.
//!
//! # Launch contract (all variants)
//! - grid `(rows, 1, 1)`: one block per row; block `(B, 1, 1)` with `B` a multiple of 32 and at
//!   most 1024.
//! - dynamic shared memory: [`SHARED_BYTES`] (the block reduction's scratch).
//! - `x` and `y` are `[rows, cols]` with row strides `x_row_stride`/`y_row_stride` (elements,
//!   inner dimension contiguous); `weight` is `[cols]`, contiguous. `y` may equal `x`
//!   (in place) but must not otherwise overlap it; `weight` must not overlap `y`.
//! - `vec` variants additionally need `x`, `y`, `weight` aligned to [`VEC_BYTES`] (16), both
//!   row strides and `cols` multiples of 16 bytes' worth of elements (8 for f16/bf16, 4 for
//!   f32).
//!
//! Entry points: `rmsnorm_{vec,scalar}_{f32,f16,bf16}` ([`layout::ENTRIES`]); the fused
//! residual variant (skip, bias, sum and statistics outputs, broadcast scale) is [`skip`].
//!
//! Two passes over the row: the sum of squares, then the normalized write. The second pass
//! re-reads `x` from L1/L2 (a row of 8192 halves is 16 KiB), so DRAM sees each input byte once.

pub mod layout;
pub mod skip;

use crate::device::memory::{ld_global_nc_v4, ld_global_v4, st_global_v4};
use crate::device::reduce::{BLOCK_REDUCE_SCRATCH_BYTES, block_sum_f32};
use crate::device::{index, math, shared};
use crate::element::{Bf16, Element, F16};

pub use layout::{SHARED_BYTES, VEC_BYTES};
const _: () = assert!(SHARED_BYTES == BLOCK_REDUCE_SCRATCH_BYTES);

#[inline(always)]
unsafe fn rmsnorm_row<T: Element, const VEC: bool>(
    x: *const T,
    weight: *const T,
    y: *mut T,
    cols: u32,
    x_row_stride: u64,
    y_row_stride: u64,
    eps: f32,
) {
    let row = index::block_idx_x() as u64;
    let tid = index::thread_idx_x() as usize;
    let threads = index::block_dim_x() as usize;
    let cols = cols as usize;
    const { assert!(T::PER_VEC * size_of::<T>() == VEC_BYTES) };
    // SAFETY (whole body): the launch contract above guarantees the row, weight and output
    // ranges are valid and aligned for the variant; every thread reaches `block_sum_f32`.
    unsafe {
        let x_row = x.add((row * x_row_stride) as usize);
        let y_row = y.add((row * y_row_stride) as usize);
        let mut sum_sq = 0.0f32;
        let mut lanes = [0.0f32; 8];
        if VEC {
            let vecs = cols / T::PER_VEC;
            let mut v = tid;
            while v < vecs {
                T::unpack_vec(ld_global_v4(x_row.add(v * T::PER_VEC).cast()), &mut lanes);
                for &value in lanes.iter().take(T::PER_VEC) {
                    sum_sq = math::fma(value, value, sum_sq);
                }
                v += threads;
            }
        } else {
            let mut c = tid;
            while c < cols {
                let value = x_row.add(c).read().to_f32();
                sum_sq = math::fma(value, value, sum_sq);
                c += threads;
            }
        }
        let total = block_sum_f32(sum_sq, shared::dynamic_shared_base());
        let inv_rms = math::rsqrt_approx(total / cols as f32 + eps);
        if VEC {
            let vecs = cols / T::PER_VEC;
            let mut w_lanes = [0.0f32; 8];
            let mut v = tid;
            while v < vecs {
                let offset = v * T::PER_VEC;
                T::unpack_vec(ld_global_v4(x_row.add(offset).cast()), &mut lanes);
                T::unpack_vec(ld_global_nc_v4(weight.add(offset).cast()), &mut w_lanes);
                for i in 0..T::PER_VEC {
                    lanes[i] = lanes[i] * inv_rms * w_lanes[i];
                }
                st_global_v4(y_row.add(offset).cast(), T::pack_vec(&lanes));
                v += threads;
            }
        } else {
            let mut c = tid;
            while c < cols {
                let value = x_row.add(c).read().to_f32() * inv_rms * weight.add(c).read().to_f32();
                y_row.add(c).write(T::from_f32(value));
                c += threads;
            }
        }
    }
}

macro_rules! rmsnorm_entry {
    ($name:ident, $ty:ty, $vec:literal) => {
        /// RMSNorm entry point; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            x: *const $ty,
            weight: *const $ty,
            y: *mut $ty,
            cols: u32,
            x_row_stride: u64,
            y_row_stride: u64,
            eps: f32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { rmsnorm_row::<$ty, $vec>(x, weight, y, cols, x_row_stride, y_row_stride, eps) }
        }
    };
}

rmsnorm_entry!(rmsnorm_vec_f32, f32, true);
rmsnorm_entry!(rmsnorm_vec_f16, F16, true);
rmsnorm_entry!(rmsnorm_vec_bf16, Bf16, true);
rmsnorm_entry!(rmsnorm_scalar_f32, f32, false);
rmsnorm_entry!(rmsnorm_scalar_f16, F16, false);
rmsnorm_entry!(rmsnorm_scalar_bf16, Bf16, false);
