//! Fused residual RMSNorm (`SkipSimplifiedLayerNormalization`, and `SimplifiedLayerNormalization`
//! with its `inv_std_var` and broadcast scale):
//!
//! ```text
//! s[r, c]    = round_T(x[r, c] + skip[r % skip_rows, c] + bias[c])   (skip, bias optional)
//! inv[r]     = 1 / sqrt(mean(s[r, :]^2) + eps)                        (f32)
//! y[r, c]    = s[r, c] * inv[r] * gamma[c % scale_len]
//! sum[r, c]  = s[r, c]          mean[r] = 0          inv_std_var[r] = inv[r]   (each optional)
//! ```
//!
//! The sum is rounded to the element type before it is normalized, so `y` is the RMSNorm of
//! exactly the `sum` tensor the next layer reads (as an unfused `Add` then norm would compute).
//!
//! # Launch contract (both variants)
//! - grid `(rows, 1, 1)`: one block per row; block `(B, 1, 1)` with `B` a multiple of 32 and at
//!   most 1024.
//! - dynamic shared memory: [`SHARED_BYTES`] (the block reduction's scratch).
//! - `x`, `y` are `[rows, cols]`, `skip` is `[skip_rows, cols]`, `sum` is `[rows, cols]`, each
//!   with its row stride in [`SkipArgs`] (elements, inner dimension contiguous); `gamma` is
//!   `[scale_len]` with `scale_len` dividing `cols`, `bias` is `[cols]`; `mean` and
//!   `inv_std_var` are `[rows]` f32. `x`, `gamma`, `y` are required; the other pointers may be
//!   null (absent).
//! - aliasing: `y` may be exactly `x`, or exactly `skip` when `skip_rows >= rows`, with equal row
//!   strides; so may `sum`; `y` and `sum` must not overlap each other, and nothing else may
//!   overlap an output. (Each element of `x`/`skip` is read before the same thread writes the
//!   element of `y`/`sum` at its place, and the second pass never reads `x` or `skip` where
//!   `sum` may have replaced them: it reads the registers, or `sum` itself.)
//! - `vec` variants additionally need every non-null pointer among `x`, `skip`, `gamma`, `bias`,
//!   `y`, `sum` aligned to [`VEC_BYTES`] (16), and `cols`, `scale_len` and those tensors' row
//!   strides multiples of 16 bytes' worth of elements (8 for f16/bf16, 4 for f32).
//!
//! Entry points: `rmsnorm_skip_{vec,scalar}_{f32,f16,bf16}` ([`layout::ENTRIES`]).
//!
//! Each thread keeps its first [`SKIP_CACHED_UNITS`] units of the row in registers between
//! the two passes, so rows up to `SKIP_CACHED_UNITS * B` units (8192 halves at 256 threads)
//! touch memory once; longer rows read their other units again from L1/L2.
//!
//! The kernels may be launched as programmatic dependents of the grid before them (Hopper's
//! module): every thread waits for it (`griddepcontrol.wait`) before it reads `x` or `skip` or
//! writes anything, after loading its cached units of `gamma` and `bias` when
//! [`SKIP_FLAG_GAMMA_READY`] says they are constants; then it lets the next grid start
//! (`griddepcontrol.launch_dependents`), whose own prologue (the W4 decode kernels' first
//! weights) then overlaps this grid. In a decode step a norm is a few microseconds of latency
//! chains: the scale's load no longer follows the reduction, and the next projection no longer
//! waits for the norm to exit before it starts streaming its weights.

use super::layout::{self, SKIP_CACHED_UNITS, SKIP_FLAG_GAMMA_READY, SkipArgs};
use crate::device::memory::{ld_global_nc_v4, ld_global_v4, st_global_v4};
use crate::device::reduce::block_sum_f32;
use crate::device::{index, math, shared, sync};
use crate::element::{Bf16, Element, F16};
use crate::unroll;

pub use layout::{SHARED_BYTES, VEC_BYTES};
const _: () = assert!(SKIP_CACHED_UNITS == 4, "the unroll! lists below name 4 slots");

/// One block's view of its row.
#[derive(Clone, Copy)]
struct Row<T> {
    x: *const T,
    /// Null when absent.
    skip: *const T,
    gamma: *const T,
    /// Null when absent.
    bias: *const T,
    y: *mut T,
    /// Null when absent.
    sum: *mut T,
    cols: usize,
    scale_len: usize,
}

impl<T: Element> Row<T> {
    /// Elements per unit: a 16-byte vector, or one element.
    const fn width(vec: bool) -> usize {
        if vec { T::PER_VEC } else { 1 }
    }

    /// Loads unit `u` of `gamma` and of `bias` (0 when absent): what [`Row::load_sum_with`] and
    /// [`Row::store_y_with`] take.
    ///
    /// # Safety
    /// As [`Row::load_sum`].
    #[inline(always)]
    unsafe fn load_constants<const VEC: bool>(&self, u: usize) -> Constants {
        let off = u * Self::width(VEC);
        let g_off = self.scale_offset(off);
        // SAFETY: the launch contract: in-range, aligned for the variant.
        unsafe {
            if VEC {
                let gamma = ld_global_nc_v4(self.gamma.add(g_off).cast());
                let bias = if self.bias.is_null() { [0; 4] } else { ld_global_nc_v4(self.bias.add(off).cast()) };
                Constants { gamma, bias }
            } else {
                let gamma = self.gamma.add(g_off).read().to_f32();
                let bias = if self.bias.is_null() { 0.0 } else { self.bias.add(off).read().to_f32() };
                Constants { gamma: [gamma.to_bits(), 0, 0, 0], bias: [bias.to_bits(), 0, 0, 0] }
            }
        }
    }

    /// Element offset of the scale for the unit starting at element `off`. A scale broadcast
    /// over leading normalized axes repeats every `scale_len` elements; units never straddle a
    /// repeat (the vec variant needs scale_len % W == 0). The launcher refuses scale_len 0; the
    /// checked remainder keeps a panic path out of the kernel.
    #[inline(always)]
    fn scale_offset(&self, off: usize) -> usize {
        if self.scale_len == self.cols { off } else { off.checked_rem(self.scale_len).unwrap_or(0) }
    }

    /// [`Row::load_sum_with`] loading the unit's constants itself.
    ///
    /// # Safety
    /// As [`Row::load_sum`].
    #[inline(always)]
    unsafe fn load_sum<const VEC: bool>(&self, u: usize, out: &mut [f32; 8]) {
        // SAFETY: forwarded.
        unsafe { self.load_sum_with::<VEC>(u, &self.load_constants::<VEC>(u), out) }
    }

    /// Loads unit `u` (elements `u * W ..`) of `x + skip + bias`, rounded to `T`, into the first
    /// lanes of `out`, with the unit's `bias` in `c`.
    ///
    /// # Safety
    /// `u` is a unit of the row; the launch contract holds.
    #[inline(always)]
    unsafe fn load_sum_with<const VEC: bool>(&self, u: usize, c: &Constants, out: &mut [f32; 8]) {
        let w = Self::width(VEC);
        let off = u * w;
        // SAFETY: the launch contract: in-range, aligned for the variant.
        unsafe {
            if VEC {
                T::unpack_vec(ld_global_v4(self.x.add(off).cast()), out);
                let mut other = [0.0f32; 8];
                if !self.skip.is_null() {
                    T::unpack_vec(ld_global_v4(self.skip.add(off).cast()), &mut other);
                    for i in 0..w {
                        out[i] += other[i];
                    }
                }
                if !self.bias.is_null() {
                    T::unpack_vec(c.bias, &mut other);
                    for i in 0..w {
                        out[i] += other[i];
                    }
                }
                // Round to T: the sum the next layer reads is the one normalized.
                let packed = T::pack_vec(out);
                T::unpack_vec(packed, out);
            } else {
                let mut v = self.x.add(off).read().to_f32();
                if !self.skip.is_null() {
                    v += self.skip.add(off).read().to_f32();
                }
                if !self.bias.is_null() {
                    v += f32::from_bits(c.bias[0]);
                }
                out[0] = T::from_f32(v).to_f32();
            }
        }
    }

    /// Stores the first lanes of `s` as unit `u` of `sum` (which must be non-null).
    ///
    /// # Safety
    /// As [`Row::load_sum`].
    #[inline(always)]
    unsafe fn store_sum<const VEC: bool>(&self, u: usize, s: &[f32; 8]) {
        let off = u * Self::width(VEC);
        // SAFETY: the launch contract.
        unsafe {
            if VEC {
                st_global_v4(self.sum.add(off).cast(), T::pack_vec(s));
            } else {
                self.sum.add(off).write(T::from_f32(s[0]));
            }
        }
    }

    /// Unit `u` of the (rounded) sum again in the second pass: from `sum` where it was written
    /// (it may have replaced `x` or `skip`), else recomputed from the inputs.
    ///
    /// # Safety
    /// As [`Row::load_sum`]; for `sum`, this thread wrote unit `u` in the first pass.
    #[inline(always)]
    unsafe fn reload<const VEC: bool>(&self, u: usize, out: &mut [f32; 8]) {
        let off = u * Self::width(VEC);
        // SAFETY: the launch contract; a thread reads its own earlier writes.
        unsafe {
            if self.sum.is_null() {
                self.load_sum::<VEC>(u, out);
            } else if VEC {
                T::unpack_vec(ld_global_v4(self.sum.add(off).cast_const().cast()), out);
            } else {
                out[0] = self.sum.add(off).read().to_f32();
            }
        }
    }

    /// Writes unit `u` of `y = s * inv * gamma`, with the unit's `gamma` in `c`.
    ///
    /// # Safety
    /// As [`Row::load_sum`].
    #[inline(always)]
    unsafe fn store_y_with<const VEC: bool>(&self, u: usize, c: &Constants, s: &[f32; 8], inv: f32) {
        let w = Self::width(VEC);
        let off = u * w;
        // SAFETY: the launch contract.
        unsafe {
            if VEC {
                let mut g = [0.0f32; 8];
                T::unpack_vec(c.gamma, &mut g);
                let mut out = [0.0f32; 8];
                for i in 0..w {
                    out[i] = s[i] * inv * g[i];
                }
                st_global_v4(self.y.add(off).cast(), T::pack_vec(&out));
            } else {
                let g = f32::from_bits(c.gamma[0]);
                self.y.add(off).write(T::from_f32(s[0] * inv * g));
            }
        }
    }
}

/// A unit's `gamma` and `bias`: as stored (a 16-byte vector) in the vec variants, as f32 bits in
/// lane 0 in the scalar ones; bias 0 when absent.
#[derive(Clone, Copy)]
struct Constants {
    gamma: [u32; 4],
    bias: [u32; 4],
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn skip_row<T: Element, const VEC: bool>(
    x: *const T,
    skip: *const T,
    gamma: *const T,
    bias: *const T,
    y: *mut T,
    sum: *mut T,
    mean: *mut f32,
    inv_std_var: *mut f32,
    a: SkipArgs,
) {
    let row = index::block_idx_x() as u64;
    let tid = index::thread_idx_x() as usize;
    let threads = index::block_dim_x() as usize;
    let cols = a.cols as usize;
    let w = Row::<T>::width(VEC);
    let units = cols / w;
    const { assert!(T::PER_VEC * size_of::<T>() == VEC_BYTES) };
    // SAFETY (whole body): the launch contract above guarantees every range is valid and aligned
    // for the variant; every thread reaches `block_sum_f32`.
    unsafe {
        let skip_row = (row % a.skip_rows.max(1) as u64) * a.skip_row_stride;
        let r = Row {
            x: x.add((row * a.x_row_stride) as usize),
            skip: if skip.is_null() { skip } else { skip.add(skip_row as usize) },
            gamma,
            bias,
            y: y.add((row * a.y_row_stride) as usize),
            sum: if sum.is_null() { sum } else { sum.add((row * a.sum_row_stride) as usize) },
            cols,
            scale_len: a.scale_len as usize,
        };
        // Constants of the cached units: before the wait when they are known to be in place.
        let early = a.flags & SKIP_FLAG_GAMMA_READY != 0;
        let mut constants = [Constants { gamma: [0; 4], bias: [0; 4] }; SKIP_CACHED_UNITS];
        let mut load_constants = || {
            unroll!(K in [0, 1, 2, 3] {
                let u = tid + K * threads;
                if u < units {
                    constants[K] = r.load_constants::<VEC>(u);
                }
            });
        };
        if early {
            load_constants();
        }
        sync::wait_for_prerequisite_grids();
        sync::allow_dependent_launch();
        if !early {
            load_constants();
        }
        let mut cache = [[0.0f32; 8]; SKIP_CACHED_UNITS];
        let mut sum_sq = 0.0f32;
        unroll!(K in [0, 1, 2, 3] {
            let u = tid + K * threads;
            if u < units {
                r.load_sum_with::<VEC>(u, &constants[K], &mut cache[K]);
                for i in 0..w {
                    sum_sq = math::fma(cache[K][i], cache[K][i], sum_sq);
                }
                if !r.sum.is_null() {
                    r.store_sum::<VEC>(u, &cache[K]);
                }
            }
        });
        let mut u = tid + SKIP_CACHED_UNITS * threads;
        while u < units {
            let mut s = [0.0f32; 8];
            r.load_sum::<VEC>(u, &mut s);
            for i in 0..w {
                sum_sq = math::fma(s[i], s[i], sum_sq);
            }
            if !r.sum.is_null() {
                r.store_sum::<VEC>(u, &s);
            }
            u += threads;
        }
        let total = block_sum_f32(sum_sq, shared::dynamic_shared_base());
        let inv = math::rsqrt_approx(total / cols as f32 + a.eps);
        if tid == 0 {
            if !mean.is_null() {
                // The simplified norm subtracts no mean; ORT reports it as 0.
                mean.add(row as usize).write(0.0);
            }
            if !inv_std_var.is_null() {
                inv_std_var.add(row as usize).write(inv);
            }
        }
        unroll!(K in [0, 1, 2, 3] {
            let u = tid + K * threads;
            if u < units {
                r.store_y_with::<VEC>(u, &constants[K], &cache[K], inv);
            }
        });
        let mut u = tid + SKIP_CACHED_UNITS * threads;
        while u < units {
            let mut s = [0.0f32; 8];
            r.reload::<VEC>(u, &mut s);
            r.store_y_with::<VEC>(u, &r.load_constants::<VEC>(u), &s, inv);
            u += threads;
        }
    }
}

macro_rules! skip_entry {
    ($name:ident, $ty:ty, $vec:literal) => {
        /// Fused residual RMSNorm entry point; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            x: *const $ty,
            skip: *const $ty,
            gamma: *const $ty,
            bias: *const $ty,
            y: *mut $ty,
            sum: *mut $ty,
            mean: *mut f32,
            inv_std_var: *mut f32,
            args: SkipArgs,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { skip_row::<$ty, $vec>(x, skip, gamma, bias, y, sum, mean, inv_std_var, args) }
        }
    };
}

skip_entry!(rmsnorm_skip_vec_f32, f32, true);
skip_entry!(rmsnorm_skip_vec_f16, F16, true);
skip_entry!(rmsnorm_skip_vec_bf16, Bf16, true);
skip_entry!(rmsnorm_skip_scalar_f32, f32, false);
skip_entry!(rmsnorm_skip_scalar_f16, F16, false);
skip_entry!(rmsnorm_skip_scalar_bf16, Bf16, false);
