//! Device self-test kernels: each runs one device-module primitive on data from the host, so
//! the host test suite can check the wrappers' fragment layouts and accuracy on a real GPU
//! against CPU references before larger kernels build on them.
//!
//! # Launch contract
//! - `probe_mma_m16n8k16_{f16,bf16}`: grid `(tiles, 1, 1)`, block `(32, 1, 1)`, no dynamic
//!   shared memory. `a`: `[tiles][16][16]` row-major; `b`: `[tiles][8][16]` (n-major, k
//!   contiguous); `c`: `[tiles][16][8]` f32 row-major. All 16-byte aligned.
//! - `probe_mma_m16n8k16_f16_ktrans`: as above but `b` is `[tiles][16][8]` (k-major, n
//!   contiguous), loaded with `ldmatrix.trans`.
//! - `probe_mma_m16n8k32_s8`: as above with `a`: `[tiles][16][32]` i8, `b`: `[tiles][8][32]`
//!   i8, `c`: `[tiles][16][8]` i32.
//! - `probe_fast_math_f32`: grid `(ceil(n / 256), 1, 1)`, block `(256, 1, 1)`; `x` and the
//!   three outputs are `[n]` f32: `2^x`, `1/x`, `1/sqrt(x)`.
//! - `probe_stream_read(src, vectors, per_block, out, flags)`: the memory ceiling of a kernel
//!   that only reads (the W4 decode kernels' bound), and a check that it read every byte. Grid
//!   `(blocks, 1, 1)` with `blocks * per_block >= vectors` and `blocks * per_block` below
//!   2^32, `per_block` a multiple of [`STREAM_READ_THREADS`]` * `[`STREAM_READ_UNROLL`]
//!   (`stream_read_per_block`), block `(STREAM_READ_THREADS, 1, 1)`, no shared memory. `src`:
//!   `vectors` 16-byte vectors, 16-byte aligned, not written while the grid runs; `out`:
//!   `blocks * STREAM_READ_THREADS / 32` words, warp `w` of block `b` writing word `b * 8 + w`:
//!   the XOR of the 32-bit words of the vectors its lanes read (so the XOR of all of `out` is
//!   that of `src`). `flags`: [`STREAM_READ_BEFORE_WAIT`], [`STREAM_READ_EARLY_DEPENDENTS`];
//!   it may be launched as a programmatic dependent of the grid before it, and writes `out`
//!   only after waiting for that grid.
//! - `probe_tma_load(map, out, c0, c1, c2, rank, box_bytes)` (sm_90a module only): one tensor
//!   copy. `map`: a tiled tensor map of rank 2 or 3 (`rank`), first parameter, by value;
//!   `(c0, c1, c2)`: the box's first coordinates (innermost first; `c2` unused at rank 2);
//!   `box_bytes`: the box's size, a multiple of 16. Grid `(1, 1, 1)`, block `(128, 1, 1)`,
//!   dynamic shared memory `box_bytes + 1024 + 8` (the box starts at the first 1024-byte
//!   boundary, the barrier after it). `out`: `box_bytes + 16` bytes, 16-byte aligned: the box as
//!   shared memory holds it, then `[landed, tries, 0, 0]` as u32.

pub mod layout;

use crate::device::async_copy::{commit_group, cp_async_16, wait_group};
use crate::device::ldmatrix::{ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4};
use crate::device::memory::ld_global_nc_v4;
use crate::device::mma::{mma_m16n8k16_bf16_f32, mma_m16n8k16_f16_f32, mma_m16n8k32_s8_s32};
use crate::device::warp::shfl_xor_u32;
use crate::device::{SharedAddr, index, math, sync};
use crate::{shared_array, unroll};
pub use layout::*;

/// A tile: 16 rows of 32 bytes. B: 8 rows of 32 bytes (or 16 rows of 16 bytes, k-major).
const A_TILE_BYTES: usize = 512;
const B_TILE_BYTES: usize = 256;

/// Copies this tile's A and B into shared memory with `cp.async` (one 16-byte chunk per lane for
/// A, lanes 0..16 for B) and waits for the copies of the whole warp.
#[inline(always)]
unsafe fn stage_tiles(a: *const u8, b: *const u8, a_tile: SharedAddr, b_tile: SharedAddr) {
    let tile = index::block_idx_x() as usize;
    let lane = index::lane_id();
    // SAFETY: the launch contract sizes and aligns the tiles; the warp is converged.
    unsafe {
        cp_async_16(a_tile.offset(lane * 16), a.add(tile * A_TILE_BYTES + lane as usize * 16));
        if lane < 16 {
            cp_async_16(b_tile.offset(lane * 16), b.add(tile * B_TILE_BYTES + lane as usize * 16));
        }
        commit_group();
        wait_group::<0>();
        sync::sync_warp();
    }
}

/// Row address lane `lane` passes to `ldmatrix.x4` for a 16-row tile with 32-byte rows:
/// matrices 0/1 are rows 0..8/8..16 of the low 16 bytes, matrices 2/3 the high 16 bytes.
#[inline(always)]
fn a_fragment_row(tile: SharedAddr, lane: u32) -> SharedAddr {
    tile.offset((lane % 16) * 32 + (lane / 16) * 16)
}

/// Row address for `ldmatrix.x2` on an 8-row, 32-byte-row (n-major) B tile.
#[inline(always)]
fn b_fragment_row(tile: SharedAddr, lane: u32) -> SharedAddr {
    tile.offset((lane % 8) * 32 + ((lane / 8) % 2) * 16)
}

#[inline(always)]
unsafe fn store_c<T: Copy>(c: *mut T, d: [T; 4]) {
    let tile = index::block_idx_x() as usize;
    let lane = index::lane_id() as usize;
    let (group, tig) = (lane / 4, lane % 4);
    // SAFETY: the launch contract sizes `c` as [tiles][16][8].
    unsafe {
        let base = c.add(tile * 128);
        base.add(group * 8 + tig * 2).write(d[0]);
        base.add(group * 8 + tig * 2 + 1).write(d[1]);
        base.add((group + 8) * 8 + tig * 2).write(d[2]);
        base.add((group + 8) * 8 + tig * 2 + 1).write(d[3]);
    }
}

#[inline(always)]
unsafe fn probe_mma_16bit<const BF16: bool, const K_MAJOR_B: bool>(a: *const u8, b: *const u8, c: *mut f32) {
    let a_tile = shared_array!(DLKERN_PROBE_A_TILE, 512, 128);
    let b_tile = shared_array!(DLKERN_PROBE_B_TILE, 256, 128);
    let lane = index::lane_id();
    // SAFETY: one converged warp per block, tiles staged before the loads.
    unsafe {
        stage_tiles(a, b, a_tile, b_tile);
        let a_frag = ldmatrix_x4(a_fragment_row(a_tile, lane));
        let b_frag = if K_MAJOR_B {
            // k-major B: 16 rows (k) of 8 halves; lanes 0..16 address rows 0..16.
            ldmatrix_x2_trans(b_tile.offset((lane % 16) * 16))
        } else {
            ldmatrix_x2(b_fragment_row(b_tile, lane))
        };
        let d = if BF16 {
            mma_m16n8k16_bf16_f32([0.0; 4], a_frag, b_frag)
        } else {
            mma_m16n8k16_f16_f32([0.0; 4], a_frag, b_frag)
        };
        store_c(c, d);
    }
}

/// f16 A x n-major B, f32 accumulate. See the module docs for the launch contract.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_mma_m16n8k16_f16(a: *const u8, b: *const u8, c: *mut f32) {
    // SAFETY: forwarded launch contract.
    unsafe { probe_mma_16bit::<false, false>(a, b, c) }
}

/// bf16 A x n-major B, f32 accumulate. See the module docs for the launch contract.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_mma_m16n8k16_bf16(a: *const u8, b: *const u8, c: *mut f32) {
    // SAFETY: forwarded launch contract.
    unsafe { probe_mma_16bit::<true, false>(a, b, c) }
}

/// f16 A x k-major B (through `ldmatrix.trans`). See the module docs for the launch contract.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_mma_m16n8k16_f16_ktrans(a: *const u8, b: *const u8, c: *mut f32) {
    // SAFETY: forwarded launch contract.
    unsafe { probe_mma_16bit::<false, true>(a, b, c) }
}

/// int8 A x n-major int8 B, int32 accumulate. See the module docs for the launch contract.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_mma_m16n8k32_s8(a: *const u8, b: *const u8, c: *mut i32) {
    let a_tile = shared_array!(DLKERN_PROBE_S8_A_TILE, 512, 128);
    let b_tile = shared_array!(DLKERN_PROBE_S8_B_TILE, 256, 128);
    let lane = index::lane_id();
    // SAFETY: one converged warp per block, tiles staged before the loads.
    unsafe {
        stage_tiles(a, b, a_tile, b_tile);
        let a_frag = ldmatrix_x4(a_fragment_row(a_tile, lane));
        let b_frag = ldmatrix_x2(b_fragment_row(b_tile, lane));
        store_c(c, mma_m16n8k32_s8_s32([0; 4], a_frag, b_frag));
    }
}

/// Elementwise `ex2.approx`, `rcp.approx`, `rsqrt.approx`. See the module docs.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_fast_math_f32(
    x: *const f32,
    exp2: *mut f32,
    recip: *mut f32,
    rsqrt: *mut f32,
    n: u32,
) {
    let i = index::block_idx_x() * index::block_dim_x() + index::thread_idx_x();
    if i < n {
        let i = i as usize;
        // SAFETY: i < n and the contract sizes every array as [n].
        unsafe {
            let v = x.add(i).read();
            exp2.add(i).write(math::ex2_approx(v));
            recip.add(i).write(math::rcp_approx(v));
            rsqrt.add(i).write(math::rsqrt_approx(v));
        }
    }
}

/// Reads its block's share of `src`, [`STREAM_READ_UNROLL`] independent 16-byte loads per
/// thread and step, and XORs it into one word per warp. See the module docs.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_stream_read(
    src: *const [u32; 4],
    vectors: u32,
    per_block: u32,
    out: *mut u32,
    flags: u32,
) {
    const THREADS: u32 = STREAM_READ_THREADS;
    const UNROLL: u32 = STREAM_READ_UNROLL;
    const { assert!(THREADS.is_multiple_of(32) && UNROLL == 8) };
    if flags & STREAM_READ_EARLY_DEPENDENTS != 0 {
        sync::allow_dependent_launch();
    }
    if flags & STREAM_READ_BEFORE_WAIT == 0 {
        sync::wait_for_prerequisite_grids();
    }
    let first = index::block_idx_x() * per_block;
    let end = first.saturating_add(per_block).min(vectors);
    let mut v = first + index::thread_idx_x();
    let mut acc = [0u32; 4];
    // SAFETY: every vector read is below `vectors` (the loops' bounds), which the contract
    // sizes; `out` holds a word per warp of every block.
    unsafe {
        while v + (UNROLL - 1) * THREADS < end {
            let mut x = [[0u32; 4]; UNROLL as usize];
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                x[U] = ld_global_nc_v4(src.add((v + U as u32 * THREADS) as usize));
            });
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(C in [0, 1, 2, 3] {
                    acc[C] ^= x[U][C];
                });
            });
            v += UNROLL * THREADS;
        }
        while v < end {
            let x = ld_global_nc_v4(src.add(v as usize));
            unroll!(C in [0, 1, 2, 3] {
                acc[C] ^= x[C];
            });
            v += THREADS;
        }
        // The grid before may still read `out` (a chain of these reuses it).
        sync::wait_for_prerequisite_grids();
        let mut word = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
        // Every lane gets here: the loops above have no exit but their ends.
        unroll!(S in [16, 8, 4, 2, 1] {
            word ^= shfl_xor_u32(word, S as u32);
        });
        let warp = index::thread_idx_x() / 32;
        if index::lane_id() == 0 {
            out.add((index::block_idx_x() * (THREADS / 32) + warp) as usize).write(word);
        }
    }
}

#[cfg(dlkern_arch_specific)]
crate::tensor_map_param!(probe_tma_load, 0);

/// Copies one box of a tensor with TMA into shared memory and writes the shared memory's bytes,
/// as they lie there (swizzled as the map says), to `out`, then one word: 1 if the copy landed
/// within the wait's bound, else 0 (the bytes are then not meaningful). See the module docs.
///
/// # Safety
/// The launch contract in the module docs.
#[cfg(dlkern_arch_specific)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn probe_tma_load(
    _map: crate::device::tma::TensorMapParam,
    out: *mut [u32; 4],
    c0: i32,
    c1: i32,
    c2: i32,
    rank: u32,
    box_bytes: u32,
) {
    use crate::device::memory::st_global_v4;
    use crate::device::shared::{dynamic_shared_base, ld_shared_v4};
    use crate::device::wgmma::{SharedMatrix, fence_proxy_async_shared};
    use crate::device::{mbarrier, tma};
    // About 0.1 s of polling at the test's rate: far past a copy's microseconds, short of a hang.
    const TRIES: u32 = 1 << 20;

    let map = crate::kernel_param_address!("probe_tma_load_param_0");
    let tid = index::thread_idx_x();
    let tile = SharedMatrix::atom_aligned(dynamic_shared_base());
    let bar = tile.offset(box_bytes);
    // SAFETY: the contract sizes the shared memory (box, alignment slack, barrier) and `out`;
    // only thread 0 touches the barrier before the block barrier that publishes its init.
    unsafe {
        if tid == 0 {
            tma::prefetch(map);
            mbarrier::init(bar, 1);
            // The copy completes its bytes on the barrier through the async proxy.
            fence_proxy_async_shared();
        }
        sync::sync_threads();
        if tid == 0 {
            mbarrier::arrive_expect_tx(bar, box_bytes);
            if rank == 3 {
                tma::load_3d(tile, map, c0, c1, c2, bar);
            } else {
                tma::load_2d(tile, map, c0, c1, bar);
            }
        }
        let mut tries = 0;
        let mut landed = false;
        while tries < TRIES && !landed {
            landed = mbarrier::test_parity(bar, 0);
            tries += 1;
        }
        let vectors = box_bytes / 16;
        if landed {
            let mut i = tid;
            while i < vectors {
                st_global_v4(out.add(i as usize), ld_shared_v4(tile.offset(16 * i)));
                i += index::block_dim_x();
            }
        }
        if tid == 0 {
            st_global_v4(out.add(vectors as usize), [landed as u32, tries, 0, 0]);
        }
    }
}
