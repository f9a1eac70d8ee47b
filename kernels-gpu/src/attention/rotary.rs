//! Rotary position embedding over strided heads, ONNX Runtime's definition (the pairing is
//! [`crate::rotary::rotary_pair`]): `com.microsoft` `RotaryEmbedding`, and the first step of
//! `GroupQueryAttention` on the GPU, which rotates the new queries into a workspace and the new
//! keys straight into the KV cache, and copies the new values there (`rotary_dim` 0).
//!
//! # Launch contract: `attention_rotary_{f32,f16,bf16}`
//! - grid `(seq, batch, args.head_groups())`, block `(ROTARY_THREADS, 1, 1)`, no shared
//!   memory. Block `(s, b, g)` does token `s` of sequence `b`, heads `g * heads_per_block ..`:
//!   - scalar path (`units` 0, `heads_per_block` 1): head `g`, each thread a pair (or a
//!     pass-through element) per step of `ROTARY_THREADS`;
//!   - vector path (`units` = [`super::layout::rotary_vector_units`] of the head with
//!     `T::PER_VEC`, `heads_per_block` = `ROTARY_THREADS / units`): thread `t` does unit
//!     `t % units` of head `t / units` of the group with 16-byte accesses. Needs `src`, `dst`,
//!     every stride and the heads 16-byte aligned, and `cos` / `sin` 16-byte aligned (8 with
//!     `interleaved`). Same results as the scalar path, bit for bit.
//! - `src` head `h` of token `(b, s)` starts at element `b * src_batch_stride + s * src_seq_stride
//!   + h * src_head_stride`, and `dst` likewise with its own strides (row `dst_row` below
//!   instead of `s`); `head_size` contiguous elements each. `dst` must not overlap `src` unless
//!   it is the very same layout (in place: each thread reads its pair or unit, then writes it).
//! - `cos`, `sin`: `[max_position, rotary_dim / 2]`, contiguous.
//! - positions ([`RotaryArgs::positions`]): `POSITIONS_PER_TOKEN` reads `position_ids[b * seq + s]`
//!   (i64); `POSITIONS_FROM_FIRST` reads `position_ids[0] + s`; `POSITIONS_CACHE_APPEND` and
//!   `POSITIONS_CACHE_QUERY` read `seqlens_k[b]` (i32): with `T = seqlens_k[b] + 1` clamped to
//!   `[0, capacity]` and `Q = min(seq, T)`, tokens `s >= Q` are skipped and token `s` sits at
//!   position `T - Q + s`; `APPEND` writes it to `dst` row `T - Q + s` (the cache), `QUERY` to
//!   row `s`. Otherwise `dst` row is `s`.
//! - With `rotary_dim` 0 (a copy) the per-token modes read no position and `position_ids` may
//!   be null.
//! - A position outside `[0, max_position)` writes NaN over the whole head: the host cannot see
//!   device-side positions before the launch, and NaN is visible where a clamp would not be.
//!
//! # Launch contract: `attention_rotary_jobs_{f32,f16,bf16}`
//! - Up to [`ROTARY_JOBS`] such calls in one launch ([`RotaryJobs`]), over the same `seq` tokens
//!   of the same batch: grid `(seq, batch, sum of the jobs' head groups)`, block and memory as
//!   above; block `(s, b, z)` does group `z - (groups of the jobs before)` of the job `z` falls
//!   in, each job on its own path. The jobs' destinations must not overlap each other or another job's source.
//! - `status`, when not null, is `status_words` u32 set to 0 by the launch (the flag word and
//!   arrival counters of the attention kernels that follow it in the stream).
//! - may be launched as a programmatic dependent (Hopper's module): every thread waits for the
//!   grid before it (`griddepcontrol.wait`) before it reads or writes anything, then lets the
//!   next grid (the attention kernel) start.

use crate::device::memory::{ld_global_nc_v2, ld_global_nc_v4, ld_global_v4, st_global_v4};
use crate::device::{index, sync};
use crate::element::{Bf16, Element, F16};
use crate::rotary::rotary_pair;

pub use super::layout::{
    POSITIONS_CACHE_APPEND, POSITIONS_CACHE_QUERY, POSITIONS_FROM_FIRST, POSITIONS_PER_TOKEN, ROTARY_JOBS,
    ROTARY_THREADS, RotaryArgs, RotaryJobs,
};

/// Block `(s, b, group)`'s part of one rotary call: the token's position and destination
/// row, then the heads of `group` on the vector or the scalar path.
#[inline(always)]
unsafe fn rotary<T: Element>(
    src: *const T,
    dst: *mut T,
    cos: *const T,
    sin: *const T,
    position_ids: *const i64,
    seqlens_k: *const i32,
    p: RotaryArgs,
    group: u32,
) {
    let s = index::block_idx_x() as u64;
    let b = index::block_idx_y() as u64;
    // SAFETY (whole body): the launch contract sizes every buffer for the strides and shapes
    // in `p`; positions are checked before `cos` / `sin` are read.
    unsafe {
        let (position, dst_row) = match p.positions {
            // A plain copy (no rotation) needs no position.
            POSITIONS_PER_TOKEN | POSITIONS_FROM_FIRST if p.rotary_dim == 0 => (0, s),
            POSITIONS_PER_TOKEN => (position_ids.add((b * p.seq as u64 + s) as usize).read(), s),
            POSITIONS_FROM_FIRST => (position_ids.read().wrapping_add(s as i64), s),
            mode => {
                let total = (seqlens_k.add(b as usize).read() as i64 + 1).clamp(0, p.capacity as i64) as u64;
                let new = total.min(p.seq as u64);
                if s >= new {
                    return;
                }
                let position = total - new + s;
                (position as i64, if mode == POSITIONS_CACHE_APPEND { position } else { s })
            }
        };
        let valid = position >= 0 && position < p.max_position as i64;
        let token = Token {
            src: src.add((b * p.src_batch_stride as u64 + s * p.src_seq_stride as u64) as usize),
            dst: dst.add((b * p.dst_batch_stride as u64 + dst_row * p.dst_seq_stride as u64) as usize),
            valid,
            cos_row: if valid { position as usize * (p.rotary_dim / 2) as usize } else { 0 },
        };
        if p.units == 0 {
            token.rotate_scalar(cos, sin, &p, group);
        } else {
            token.rotate_vector(cos, sin, &p, group);
        }
    }
}

/// One token of one call: where its heads are read and written, and its position's row of the
/// cos / sin caches.
#[derive(Clone, Copy)]
struct Token<T> {
    src: *const T,
    dst: *mut T,
    /// The position lies in the caches; otherwise every element written is NaN.
    valid: bool,
    cos_row: usize,
}

impl<T: Element> Token<T> {
    /// The scalar path: head `h` of this block, one pair (or one pass-through element) per
    /// thread and step.
    ///
    /// # Safety
    /// The launch contract, with `p.units == 0`.
    #[inline(always)]
    unsafe fn rotate_scalar(&self, cos: *const T, sin: *const T, p: &RotaryArgs, h: u32) {
        let half = p.rotary_dim / 2;
        // Work items per head: the rotated pairs, then the pass-through tail.
        let per_head = half + p.head_size.saturating_sub(p.rotary_dim);
        let mut w = index::thread_idx_x();
        // SAFETY: in-range by the launch contract; `cos` / `sin` read only when valid.
        unsafe {
            let x = self.src.add((h * p.src_head_stride) as usize);
            let y = self.dst.add((h * p.dst_head_stride) as usize);
            while w < per_head {
                if w < half {
                    let (i, j) = rotary_pair(w as usize, p.rotary_dim as usize, p.interleaved != 0);
                    let (a, bv) = (x.add(i).read().to_f32(), x.add(j).read().to_f32());
                    let (out_i, out_j) = if self.valid {
                        let at = self.cos_row + w as usize;
                        rotate(a, bv, cos.add(at).read().to_f32(), sin.add(at).read().to_f32())
                    } else {
                        (f32::NAN, f32::NAN)
                    };
                    y.add(i).write(T::from_f32(out_i));
                    y.add(j).write(T::from_f32(out_j));
                } else {
                    let i = (p.rotary_dim + w - half) as usize;
                    let v = x.add(i).read();
                    y.add(i).write(if self.valid { v } else { T::from_f32(f32::NAN) });
                }
                w += ROTARY_THREADS;
            }
        }
    }

    /// The vector path: `p.heads_per_block` heads of this block's group, one 16-byte unit
    /// ([`super::layout::rotary_vector_units`]) per thread: the same arithmetic as the scalar
    /// path, element for element, with 16-byte loads and stores where it makes 2- or 4-byte ones.
    ///
    /// # Safety
    /// The launch contract, with `p.units` the units of `p`'s heads and every head, row and
    /// unit 16-byte aligned (the `cos` / `sin` rows 16-byte aligned, 8 with `interleaved`).
    #[inline(always)]
    unsafe fn rotate_vector(&self, cos: *const T, sin: *const T, p: &RotaryArgs, group: u32) {
        let w = T::PER_VEC;
        let tid = index::thread_idx_x();
        let (slot, unit) = (tid / p.units, (tid % p.units) as usize);
        let h = group * p.heads_per_block + slot;
        if slot >= p.heads_per_block || h >= p.heads {
            return;
        }
        let interleaved = p.interleaved != 0;
        let (rotary, half) = (p.rotary_dim as usize, p.rotary_dim as usize / 2);
        let rotated_units = if interleaved { rotary / w } else { half / w };
        let nan = [f32::NAN; 8];
        // SAFETY: in-range and aligned by the launch contract; `cos` / `sin` read only when valid.
        unsafe {
            let x = self.src.add((h * p.src_head_stride) as usize);
            let y = self.dst.add((h * p.dst_head_stride) as usize);
            let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
            if unit >= rotated_units {
                let at = rotary + (unit - rotated_units) * w;
                let v = ld_global_v4(x.add(at).cast());
                st_global_v4(y.add(at).cast(), if self.valid { v } else { T::pack_vec(&nan) });
            } else if interleaved {
                // `w / 2` adjacent pairs and their `w / 2` angles (8 bytes).
                let at = unit * w;
                T::unpack_vec(ld_global_v4(x.add(at).cast()), &mut lo);
                if self.valid {
                    let [c0, c1] = ld_global_nc_v2(cos.add(self.cos_row + at / 2).cast());
                    let [s0, s1] = ld_global_nc_v2(sin.add(self.cos_row + at / 2).cast());
                    let (mut c, mut sn) = ([0f32; 8], [0f32; 8]);
                    T::unpack_vec([c0, c1, 0, 0], &mut c);
                    T::unpack_vec([s0, s1, 0, 0], &mut sn);
                    for k in 0..w / 2 {
                        (hi[2 * k], hi[2 * k + 1]) = rotate(lo[2 * k], lo[2 * k + 1], c[k], sn[k]);
                    }
                } else {
                    hi = nan;
                }
                st_global_v4(y.add(at).cast(), T::pack_vec(&hi));
            } else {
                // `w` pairs: elements `at + k` and `at + half + k`, angles `at + k`.
                let at = unit * w;
                T::unpack_vec(ld_global_v4(x.add(at).cast()), &mut lo);
                T::unpack_vec(ld_global_v4(x.add(at + half).cast()), &mut hi);
                if self.valid {
                    let (mut c, mut sn) = ([0f32; 8], [0f32; 8]);
                    T::unpack_vec(ld_global_nc_v4(cos.add(self.cos_row + at).cast()), &mut c);
                    T::unpack_vec(ld_global_nc_v4(sin.add(self.cos_row + at).cast()), &mut sn);
                    for k in 0..w {
                        (lo[k], hi[k]) = rotate(lo[k], hi[k], c[k], sn[k]);
                    }
                } else {
                    (lo, hi) = (nan, nan);
                }
                st_global_v4(y.add(at).cast(), T::pack_vec(&lo));
                st_global_v4(y.add(at + half).cast(), T::pack_vec(&hi));
            }
        }
    }
}

/// One token's rotation, a unit at a time, for kernels that rotate what they load (the paged
/// decode kernel's one-launch GroupQueryAttention step): the same arithmetic as
/// [`Token::rotate_vector`], element for element, so either path gives the same bits.
#[derive(Clone, Copy)]
pub(crate) struct Turn<T> {
    /// The position's rows of the `cos` / `sin` caches (unread when not `valid`).
    cos: *const T,
    sin: *const T,
    rotary_dim: usize,
    interleaved: bool,
    /// The position lies in the caches; otherwise every unit is NaN.
    valid: bool,
}

impl<T: Element> Turn<T> {
    /// The turn of `position` with `[max_position, rotary_dim / 2]` caches (no rotation and
    /// always valid when `rotary_dim` is 0).
    pub(crate) fn new(
        cos: *const T,
        sin: *const T,
        rotary_dim: u32,
        interleaved: bool,
        max_position: u32,
        position: u32,
    ) -> Self {
        let valid = rotary_dim == 0 || position < max_position;
        let row = if valid { position as usize * (rotary_dim / 2) as usize } else { 0 };
        Turn {
            cos: cos.wrapping_add(row),
            sin: sin.wrapping_add(row),
            rotary_dim: rotary_dim as usize,
            interleaved,
            valid,
        }
    }

    /// The `T::PER_VEC` elements at `at` (a multiple of it) of the head at `x`, rotated, or
    /// passed through from `rotary_dim` on.
    ///
    /// # Safety
    /// `x` is a head of at least `at + T::PER_VEC` (and `rotary_dim`) elements, 16-byte aligned at
    /// every unit, read-only while the kernel runs; the rotated part splits into whole units
    /// (`rotary_vector_units`' condition) and the caches' rows hold the position when `valid`,
    /// 16-byte aligned (8 with `interleaved`).
    #[inline(always)]
    pub(crate) unsafe fn unit(&self, x: *const T, at: usize) -> [u32; 4] {
        let w = T::PER_VEC;
        if !self.valid {
            return T::pack_vec(&[f32::NAN; 8]);
        }
        // SAFETY: in range and aligned by the contract; the caches read only when valid.
        unsafe {
            let raw = ld_global_nc_v4(x.add(at).cast());
            let (rotary, half) = (self.rotary_dim, self.rotary_dim / 2);
            if at >= rotary {
                return raw;
            }
            let (mut own, mut partner, mut c, mut sn, mut out) =
                ([0f32; 8], [0f32; 8], [0f32; 8], [0f32; 8], [0f32; 8]);
            T::unpack_vec(raw, &mut own);
            if self.interleaved {
                let [c0, c1] = ld_global_nc_v2(self.cos.add(at / 2).cast());
                let [s0, s1] = ld_global_nc_v2(self.sin.add(at / 2).cast());
                T::unpack_vec([c0, c1, 0, 0], &mut c);
                T::unpack_vec([s0, s1, 0, 0], &mut sn);
                for k in 0..w / 2 {
                    (out[2 * k], out[2 * k + 1]) = rotate(own[2 * k], own[2 * k + 1], c[k], sn[k]);
                }
            } else {
                // The first half's element `k` pairs with the second half's `k`, both at angle `k`.
                let first = at < half;
                let (other, angle) = if first { (at + half, at) } else { (at - half, at - half) };
                T::unpack_vec(ld_global_nc_v4(x.add(other).cast()), &mut partner);
                T::unpack_vec(ld_global_nc_v4(self.cos.add(angle).cast()), &mut c);
                T::unpack_vec(ld_global_nc_v4(self.sin.add(angle).cast()), &mut sn);
                for k in 0..w {
                    out[k] = if first {
                        rotate(own[k], partner[k], c[k], sn[k]).0
                    } else {
                        rotate(partner[k], own[k], c[k], sn[k]).1
                    };
                }
            }
            T::pack_vec(&out)
        }
    }
}

/// One pair `(a, b)` turned by the angle whose cosine and sine are `c` and `s`.
#[inline(always)]
fn rotate(a: f32, b: f32, c: f32, s: f32) -> (f32, f32) {
    (a * c - b * s, b * c + a * s)
}

macro_rules! rotary_entries {
    ($($name:ident: $ty:ty);+ $(;)?) => {$(
        /// Rotary embedding over strided heads; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            src: *const $ty, dst: *mut $ty, cos: *const $ty, sin: *const $ty,
            position_ids: *const i64, seqlens_k: *const i32, args: RotaryArgs,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { rotary::<$ty>(src, dst, cos, sin, position_ids, seqlens_k, args, index::block_idx_z()) }
        }
    )+};
}

rotary_entries!(
    attention_rotary_f32: f32;
    attention_rotary_f16: F16;
    attention_rotary_bf16: Bf16;
);

/// The job grid index `z` falls in (the jobs' head groups in order): its source, destination,
/// arguments and group. Chosen field by field with constant indices: an index into the
/// parameter struct would copy it to local memory first.
#[inline(always)]
fn job_of(jobs: &RotaryJobs, z: u32) -> (u64, u64, RotaryArgs, u32) {
    const { assert!(ROTARY_JOBS == 3) };
    let (h0, h1) = (jobs.args[0].head_groups(), jobs.args[1].head_groups());
    if jobs.count <= 1 || z < h0 {
        (jobs.src[0], jobs.dst[0], jobs.args[0], z)
    } else if jobs.count == 2 || z < h0 + h1 {
        (jobs.src[1], jobs.dst[1], jobs.args[1], z - h0)
    } else {
        (jobs.src[2], jobs.dst[2], jobs.args[2], z - h0 - h1)
    }
}

macro_rules! rotary_jobs_entries {
    ($($name:ident: $ty:ty);+ $(;)?) => {$(
        /// Several rotary calls over the same tokens in one launch; see the module docs for the
        /// launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            jobs: RotaryJobs, cos: *const $ty, sin: *const $ty, position_ids: *const i64,
            seqlens_k: *const i32, status: *mut u32, status_words: u32,
        ) {
            sync::wait_for_prerequisite_grids();
            sync::allow_dependent_launch();
            // SAFETY: forwarded launch contract: `status` null or `status_words` words, and each
            // job's buffers sized for its arguments.
            unsafe {
                if !status.is_null() {
                    // Spread over the whole grid: every block clears its own words.
                    let block = (index::block_idx_z() * index::grid_dim_y() + index::block_idx_y()) * index::grid_dim_x()
                        + index::block_idx_x();
                    let blocks = index::grid_dim_x() * index::grid_dim_y() * index::grid_dim_z();
                    let mut w = block as usize * ROTARY_THREADS as usize + index::thread_idx_x() as usize;
                    while w < status_words as usize {
                        status.add(w).write(0);
                        w += blocks as usize * ROTARY_THREADS as usize;
                    }
                }
                let (src, dst, args, h) = job_of(&jobs, index::block_idx_z());
                rotary::<$ty>(src as *const $ty, dst as *mut $ty, cos, sin, position_ids, seqlens_k, args, h)
            }
        }
    )+};
}

rotary_jobs_entries!(
    attention_rotary_jobs_f32: f32;
    attention_rotary_jobs_f16: F16;
    attention_rotary_jobs_bf16: Bf16;
);
