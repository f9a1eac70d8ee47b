//! Attention (prefill) forward on the GPU (device code: `kernels-gpu/src/attention/`), with
//! flash-attention's layouts: padded `[B, S, H, D]` or packed `[total, H, D]` batches with
//! cumulative sequence lengths, GQA/MQA, bottom-right causal, left window, soft cap, and the
//! optional row log-sum-exp. Memory: O(S) (the scores never leave registers).

use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::common::checks::{check_pointer, check_same_device, check_slice};
use crate::runtime::tensor_map::{MapElement, MapSwizzle, TensorMap, TiledTensor};
use crate::runtime::{Device, KernelParams, LaunchDims};

const KERNEL: &str = "attention";
use super::layout;
use layout::{Dims, WARPS, block_m, shared_bytes};
const THREADS: u32 = 32 * WARPS as u32;
/// Head sizes with a kernel.
pub const HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

/// How the batch is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// `[B, Sq, H, D]` queries and `[B, Sk, Hkv, D]` keys/values.
    Padded { seqlen_q: usize, seqlen_k: usize },
    /// `[total_q, H, D]` / `[total_k, Hkv, D]` with cumulative lengths (i32 `[B + 1]`, on the
    /// device); `max_seqlen_q` bounds every sequence's query count (sizes the grid).
    Packed { total_q: usize, total_k: usize, max_seqlen_q: usize },
}

/// Shapes and options of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub dtype: DType,
    pub batch: usize,
    pub layout: Batch,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Keys at most this far left of the diagonal, if set.
    pub window_left: Option<usize>,
    pub scale: f32,
    /// `cap * tanh(s / cap)`, 0 for none.
    pub softcap: f32,
    /// Whether the log-sum-exp is written.
    pub lse: bool,
}

/// What a validated call launches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionPlan {
    pub kernel: &'static str,
    pub dims: LaunchDims,
    args: Dims,
}

impl AttentionPlan {
    /// The same call on the Hopper kernel (`attention_fwd{,_cache}_wgmma_*`, sm_90a only), where
    /// it has an instantiation for the dtype and head size: a producer warpgroup and two
    /// consumer warpgroups of `wgmma`, 128 query rows per block.
    pub fn hopper(&self) -> Option<AttentionPlan> {
        let (hopper, d) = match self.entry()? {
            layout::Entry::Fwd(t, d) => (layout::Entry::Hopper(t, d), d),
            layout::Entry::FwdCache(t, d) => (layout::Entry::HopperCache(t, d), d),
            _ => return None,
        };
        let kernel = layout::entry(hopper)?;
        let rows = (self.dims.grid.0 as usize * block_m(d)).div_ceil(layout::HOPPER_BLOCK_M);
        let dims = LaunchDims {
            grid: (rows.max(1) as u32, self.dims.grid.1, self.dims.grid.2),
            block: (layout::HOPPER_THREADS as u32, 1, 1),
            shared_bytes: layout::hopper_shared_bytes(d) as u32,
        };
        Some(AttentionPlan { kernel, dims, args: self.args })
    }

    /// The entry point this plan launches.
    fn entry(&self) -> Option<layout::Entry> {
        layout::ENTRIES.iter().find(|&&(_, name)| name == self.kernel).map(|&(e, _)| e)
    }

    /// Whether this plan runs the Hopper kernel.
    pub fn is_hopper(&self) -> bool {
        self.dims.block.0 == layout::HOPPER_THREADS as u32
    }

    /// The kernel `device` runs for this call: the Hopper kernel where the device runs the
    /// sm_90a module and it has the instantiation, this plan otherwise. The environment
    /// variable `DLKERN_ATTENTION_KERNEL=mma_sync` (read once) keeps the mma.sync kernel
    /// everywhere: for comparisons, and a way around a fault in the newer kernel.
    pub fn on(self, device: &Device) -> AttentionPlan {
        static MMA_SYNC_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let mma_sync_only =
            *MMA_SYNC_ONLY.get_or_init(|| std::env::var("DLKERN_ATTENTION_KERNEL").is_ok_and(|v| v == "mma_sync"));
        if device.has_wgmma() && !mma_sync_only { self.hopper().unwrap_or(self) } else { self }
    }
}

fn kernel_name(dtype: DType, d: usize) -> Option<&'static str> {
    layout::Dtype::from_name(dtype.name()).and_then(|t| layout::entry(layout::Entry::Fwd(t, d)))
}

impl AttentionParams {
    /// Query rows and key rows in all (`total_q`, `total_k`).
    pub fn totals(&self) -> (usize, usize) {
        match self.layout {
            Batch::Padded { seqlen_q, seqlen_k } => (self.batch * seqlen_q, self.batch * seqlen_k),
            Batch::Packed { total_q, total_k, .. } => (total_q, total_k),
        }
    }

    /// Elements of the log-sum-exp output: `[B, H, Sq]` or `[H, total_q]`.
    pub fn lse_len(&self) -> usize {
        self.heads * self.totals().0
    }

    pub fn plan(&self) -> Result<AttentionPlan> {
        let p = self;
        let bad = |m: String| Error::invalid(KERNEL, m);
        let kernel = match p.dtype {
            DType::F16 | DType::BF16 => kernel_name(p.dtype, p.head_dim)
                .ok_or_else(|| bad(format!("head dim {} not supported ({HEAD_DIMS:?})", p.head_dim)))?,
            other => return Err(bad(format!("dtype {other} not supported on the GPU (f16, bf16)"))),
        };
        if p.batch == 0 || p.batch > 65535 || p.heads == 0 || p.heads > 65535 || p.kv_heads == 0 {
            return Err(bad(format!("batch {} and heads {} must be 1..=65535, kv heads >= 1", p.batch, p.heads)));
        }
        if !p.heads.is_multiple_of(p.kv_heads) {
            return Err(bad(format!("{} heads are not a multiple of {} KV heads", p.heads, p.kv_heads)));
        }
        let (total_q, total_k) = p.totals();
        let max_q = match p.layout {
            Batch::Padded { seqlen_q, .. } => seqlen_q,
            Batch::Packed { max_seqlen_q, .. } => max_seqlen_q,
        };
        let q_row = p.heads * p.head_dim;
        let k_row = p.kv_heads * p.head_dim;
        if total_q.max(total_k).saturating_mul(q_row.max(k_row)) > i32::MAX as usize
            || p.window_left.is_some_and(|w| w > i32::MAX as usize)
        {
            return Err(bad("tensors too large for the kernel's 32-bit strides".into()));
        }
        if !(p.scale.is_finite() && p.softcap.is_finite() && p.softcap >= 0.0) {
            return Err(bad(format!("scale {} / softcap {} must be finite (softcap >= 0)", p.scale, p.softcap)));
        }
        let (seqlen_q, seqlen_k) = match p.layout {
            Batch::Padded { seqlen_q, seqlen_k } => (seqlen_q, seqlen_k),
            Batch::Packed { .. } => (0, 0),
        };
        let (lse_head_stride, lse_batch_stride) = match p.layout {
            Batch::Padded { seqlen_q, .. } => (seqlen_q, p.heads * seqlen_q),
            Batch::Packed { total_q, .. } => (total_q, 0),
        };
        let args = Dims {
            heads: p.heads as u32,
            kv_heads: p.kv_heads as u32,
            seqlen_q: seqlen_q as u32,
            seqlen_k: seqlen_k as u32,
            q_row_stride: q_row as u32,
            k_row_stride: k_row as u32,
            causal: p.causal as u32,
            window_left: p.window_left.map_or(-1, |w| w as i32),
            scale: p.scale,
            softcap: p.softcap,
            lse_head_stride: lse_head_stride as u32,
            lse_batch_stride: lse_batch_stride as u32,
            total_q: total_q as u32,
            total_k: total_k as u32,
            out_row_stride: q_row as u32,
            kv_head_stride: p.head_dim as u32,
            kv_batch_stride: 0,
            cache_capacity: 0,
        };
        let dims = LaunchDims {
            grid: (max_q.div_ceil(block_m(p.head_dim)).max(1) as u32, p.heads as u32, p.batch as u32),
            block: (THREADS, 1, 1),
            shared_bytes: shared_bytes(p.head_dim) as u32,
        };
        Ok(AttentionPlan { kernel, dims, args })
    }
}

/// Device addresses of one call (`lse`, `cu_seqlens_*` 0 when absent).
#[derive(Clone, Copy, Debug)]
pub struct AttentionPointers {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
}

/// Attention forward on raw device pointers, on `stream`.
///
/// # Safety
/// Device addresses in `device`'s context valid for the extents the parameters describe until
/// the kernel has run on `stream`. Packed batches' cumulative lengths need not be valid for
/// memory safety (the kernel clamps them to the totals), but only valid ones (from 0,
/// non-decreasing, no sequence longer than `max_seqlen_q`) give a meaningful result.
pub unsafe fn attention_raw(
    device: &Device,
    stream: CUstream,
    params: &AttentionParams,
    ptrs: &AttentionPointers,
) -> Result<AttentionPlan> {
    let plan = params.plan()?.on(device);
    // SAFETY: forwarded contract; the plan is this call's.
    unsafe { attention_raw_planned(device, stream, params, &plan, ptrs)? };
    Ok(plan)
}

/// [`attention_raw`] with the caller's plan: `params.plan()` (the mma.sync kernel, any GPU) or
/// its [`AttentionPlan::hopper`] variant (sm_90a), which the tests and benches compare.
///
/// # Safety
/// As [`attention_raw`]; `plan` must be one of `params`'s plans.
pub unsafe fn attention_raw_planned(
    device: &Device,
    stream: CUstream,
    params: &AttentionParams,
    plan: &AttentionPlan,
    ptrs: &AttentionPointers,
) -> Result<()> {
    for (name, ptr) in [("q", ptrs.q), ("k", ptrs.k), ("v", ptrs.v), ("out", ptrs.out)] {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    if params.lse {
        check_pointer(KERNEL, "lse", ptrs.lse, 4)?;
    }
    let packed = matches!(params.layout, Batch::Packed { .. });
    if packed {
        check_pointer(KERNEL, "cu_seqlens_q", ptrs.cu_seqlens_q, 4)?;
        check_pointer(KERNEL, "cu_seqlens_k", ptrs.cu_seqlens_k, 4)?;
    }
    let pointers = [
        ptrs.q,
        ptrs.k,
        ptrs.v,
        ptrs.out,
        if params.lse { ptrs.lse } else { 0 },
        if packed { ptrs.cu_seqlens_q } else { 0 },
        if packed { ptrs.cu_seqlens_k } else { 0 },
    ];
    // SAFETY: forwarded contract.
    unsafe { launch_planned(device, stream, plan, pointers) }
}

/// Launches `plan` with its pointers (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k; 0 where
/// absent), and before them, for the Hopper kernel, the tensor maps of Q, K and V its copies
/// go through.
///
/// # Safety
/// The pointers hold the extents the plan's arguments describe.
unsafe fn launch_planned(device: &Device, stream: CUstream, plan: &AttentionPlan, pointers: [u64; 7]) -> Result<()> {
    if plan.is_hopper() {
        let [q, k, v] = hopper_maps(plan, [pointers[0], pointers[1], pointers[2]])?;
        let args =
            KernelParams::new().value(q.words()).value(k.words()).value(v.words()).pointers(&pointers).value(plan.args);
        // SAFETY: three maps, seven pointers and the Dims struct, as the Hopper entries declare.
        unsafe { device.launch(plan.kernel, plan.dims, stream, args) }
    } else {
        let args = KernelParams::new().pointers(&pointers).value(plan.args);
        // SAFETY: seven pointers and the Dims struct, as the kernel declares.
        unsafe { device.launch(plan.kernel, plan.dims, stream, args) }
    }
}

/// The Hopper kernel's tensor maps of Q, K and V (addresses `[q, k, v]`), encoded from
/// [`hopper_map_shapes`].
fn hopper_maps(plan: &AttentionPlan, [q, k, v]: [u64; 3]) -> Result<[TensorMap; 3]> {
    let (element, [q_shape, kv_shape]) = hopper_map_shapes(plan)?;
    let map = |address, shape: &MapShape| TensorMap::tiled(KERNEL, &shape.tensor(element, address));
    Ok([map(q, &q_shape)?, map(k, &kv_shape)?, map(v, &kv_shape)?])
}

/// A tensor map of the Hopper kernel before it has an address: extents, byte strides and box,
/// innermost first, of rank 3 or 4 (`rank` entries used).
#[derive(Clone, Copy, Debug, PartialEq)]
struct MapShape {
    rank: usize,
    dims: [u64; 4],
    strides: [u64; 3],
    box_dims: [u32; 4],
}

impl MapShape {
    fn tensor(&self, element: MapElement, address: u64) -> TiledTensor<'_> {
        let r = self.rank;
        TiledTensor {
            element,
            address,
            dims: &self.dims[..r],
            strides: &self.strides[..r - 1],
            box_dims: &self.box_dims[..r],
            swizzle: MapSwizzle::Bytes128,
        }
    }
}

/// The element type and the shapes of the Hopper kernel's maps for `plan`: Q's, then K's and V's
/// (one shape). Boxes of 64 columns of one head, 128 query rows or a key tile's rows, in the
/// 128-byte swizzle its `wgmma`s read. Token-major tensors are `[rows, heads, D]` with the
/// plan's row strides; a KV cache is `[batch, kv_heads, capacity, D]`.
fn hopper_map_shapes(plan: &AttentionPlan) -> Result<(MapElement, [MapShape; 2])> {
    let (t, d, cache) = match plan.entry() {
        Some(layout::Entry::Hopper(t, d)) => (t, d, false),
        Some(layout::Entry::HopperCache(t, d)) => (t, d, true),
        _ => return Err(Error::invalid(KERNEL, format!("{} takes no tensor maps", plan.kernel))),
    };
    let element = if t == layout::Dtype::Bf16 { MapElement::Bf16 } else { MapElement::F16 };
    let a = &plan.args;
    let (d, bytes) = (d as u64, element.bytes());
    let rows = |n: u32| (n as u64).max(1);
    let q = MapShape {
        rank: 3,
        dims: [d, a.heads as u64, rows(a.total_q), 1],
        strides: [d * bytes, a.q_row_stride as u64 * bytes, 0],
        box_dims: [64, 1, layout::HOPPER_BLOCK_M as u32, 1],
    };
    let block_n = layout::hopper_block_n(d as usize) as u32;
    let kv = if cache {
        MapShape {
            rank: 4,
            dims: [d, rows(a.cache_capacity), a.kv_heads as u64, plan.dims.grid.2 as u64],
            strides: [a.k_row_stride as u64 * bytes, a.kv_head_stride as u64 * bytes, a.kv_batch_stride as u64 * bytes],
            box_dims: [64, block_n, 1, 1],
        }
    } else {
        MapShape {
            rank: 3,
            dims: [d, a.kv_heads as u64, rows(a.total_k), 1],
            strides: [a.kv_head_stride as u64 * bytes, a.k_row_stride as u64 * bytes, 0],
            box_dims: [64, 1, block_n, 1],
        }
    };
    Ok((element, [q, kv]))
}

/// Attention forward over cudarc slices for a padded batch (safe: lengths are checked against
/// the params).
#[allow(clippy::too_many_arguments)]
pub fn attention_padded<T: Element>(
    device: &Device,
    stream: &Arc<CudaStream>,
    params: &AttentionParams,
    q: &CudaSlice<T>,
    k: &CudaSlice<T>,
    v: &CudaSlice<T>,
    out: &mut CudaSlice<T>,
    lse: Option<&mut CudaSlice<f32>>,
) -> Result<AttentionPlan> {
    if !matches!(params.layout, Batch::Padded { .. }) {
        return Err(Error::invalid(
            KERNEL,
            "attention_padded needs Batch::Padded (use attention_raw for packed batches)",
        ));
    }
    if T::DTYPE != params.dtype || params.lse != lse.is_some() {
        return Err(Error::invalid(KERNEL, "slices must match params.dtype and params.lse"));
    }
    params.plan()?;
    check_same_device(KERNEL, device, stream)?;
    let (tq, tk) = params.totals();
    check_slice(KERNEL, "q", device, q, tq * params.heads * params.head_dim)?;
    check_slice(KERNEL, "k", device, k, tk * params.kv_heads * params.head_dim)?;
    check_slice(KERNEL, "v", device, v, tk * params.kv_heads * params.head_dim)?;
    check_slice(KERNEL, "out", device, out, tq * params.heads * params.head_dim)?;
    let (q_ptr, _q) = q.device_ptr(stream);
    let (k_ptr, _k) = k.device_ptr(stream);
    let (v_ptr, _v) = v.device_ptr(stream);
    let (out_ptr, _out) = out.device_ptr_mut(stream);
    let lse_ptr = match lse {
        Some(l) => {
            check_slice(KERNEL, "lse", device, l, params.lse_len())?;
            Some(l.device_ptr_mut(stream))
        }
        None => None,
    };
    let ptrs = AttentionPointers {
        q: q_ptr,
        k: k_ptr,
        v: v_ptr,
        out: out_ptr,
        lse: lse_ptr.as_ref().map_or(0, |(p, _)| *p),
        cu_seqlens_q: 0,
        cu_seqlens_k: 0,
    };
    // SAFETY: the slices hold the extents the params describe; `out` and `lse` are borrowed
    // mutably, so they alias nothing else.
    unsafe { attention_raw(device, stream.cu_stream(), params, &ptrs) }
}

/// Attention over a BNSH KV cache with per-sequence lengths on the device: ONNX Runtime's
/// `GroupQueryAttention` layout. Queries `[B, S, H, D]` with rows `q_row_stride` apart (a packed
/// QKV input's row is wider than `H * D`), caches `[B, Hkv, capacity, D]`, output `[B, S, H, D]`
/// dense; sequence `b` sees `T = seqlens_k[b] + 1` keys and its first `min(S, T)` query rows
/// are its newest tokens (positions `T - min(S, T) ..`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAttentionParams {
    pub dtype: DType,
    pub batch: usize,
    pub seqlen_q: usize,
    pub capacity: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Elements between query rows (`>= H * D`, a multiple of 8).
    pub q_row_stride: usize,
    pub causal: bool,
    pub window_left: Option<usize>,
    pub scale: f32,
    pub softcap: f32,
}

impl CacheAttentionParams {
    pub fn plan(&self) -> Result<AttentionPlan> {
        let p = self;
        let dense = AttentionParams {
            dtype: p.dtype,
            batch: p.batch,
            layout: Batch::Padded { seqlen_q: p.seqlen_q, seqlen_k: p.capacity },
            heads: p.heads,
            kv_heads: p.kv_heads,
            head_dim: p.head_dim,
            causal: p.causal,
            window_left: p.window_left,
            scale: p.scale,
            softcap: p.softcap,
            lse: false,
        };
        let mut plan = dense.plan()?;
        let q_row = p.heads * p.head_dim;
        if p.capacity == 0 || p.seqlen_q == 0 {
            return Err(Error::invalid(KERNEL, "cache capacity and query length must be >= 1"));
        }
        if p.q_row_stride < q_row || !p.q_row_stride.is_multiple_of(8) {
            return Err(Error::invalid(
                KERNEL,
                format!("query row stride {} must be >= H * D = {q_row} and a multiple of 8", p.q_row_stride),
            ));
        }
        if (p.batch * p.seqlen_q).saturating_mul(p.q_row_stride) > i32::MAX as usize {
            return Err(Error::invalid(KERNEL, "queries too large for the kernel's 32-bit strides"));
        }
        plan.kernel = layout::Dtype::from_name(p.dtype.name())
            .and_then(|t| layout::entry(layout::Entry::FwdCache(t, p.head_dim)))
            .ok_or_else(|| {
                Error::invalid(KERNEL, format!("no KV-cache kernel for {} at head dim {}", p.dtype, p.head_dim))
            })?;
        let a = &mut plan.args;
        a.q_row_stride = p.q_row_stride as u32;
        a.k_row_stride = p.head_dim as u32;
        a.kv_head_stride = (p.capacity * p.head_dim) as u32;
        a.kv_batch_stride = (p.kv_heads * p.capacity * p.head_dim) as u32;
        a.cache_capacity = p.capacity as u32;
        a.out_row_stride = q_row as u32;
        Ok(plan)
    }
}

/// Cache-mode attention on raw device pointers, on `stream`.
///
/// # Safety
/// Device addresses in `device`'s context valid for the extents the parameters describe until
/// the kernel has run on `stream` (`seqlens_k`: `[batch]` i32; any values are memory-safe, the
/// kernel clamps them to the capacity); `out` distinct from the other buffers.
pub unsafe fn attention_cache_raw(
    device: &Device,
    stream: CUstream,
    params: &CacheAttentionParams,
    ptrs: [u64; 5],
) -> Result<AttentionPlan> {
    let plan = params.plan()?.on(device);
    // SAFETY: forwarded contract; the plan is this call's.
    unsafe { attention_cache_raw_planned(device, stream, &plan, ptrs)? };
    Ok(plan)
}

/// [`attention_cache_raw`] with the caller's plan (`params.plan()` or its
/// [`AttentionPlan::hopper`] variant).
///
/// # Safety
/// As [`attention_cache_raw`]; `plan` must be one of the call's plans.
pub unsafe fn attention_cache_raw_planned(
    device: &Device,
    stream: CUstream,
    plan: &AttentionPlan,
    [q, k_cache, v_cache, out, seqlens_k]: [u64; 5],
) -> Result<()> {
    for (name, ptr) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)] {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    check_pointer(KERNEL, "seqlens_k", seqlens_k, 4)?;
    // SAFETY: forwarded contract.
    unsafe { launch_planned(device, stream, plan, [q, k_cache, v_cache, out, 0, 0, seqlens_k]) }
}

/// Where rotary takes positions from, and where it writes each token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotaryPositions {
    /// `position_ids[b * seq + s]` (i64, on the device).
    PerToken,
    /// `position_ids[0] + s` (i64, on the device).
    FromFirst,
    /// From `seqlens_k` (i32, on the device): token `s` of the newest `min(seq, T)` is position
    /// `T - min(seq, T) + s` and is written to that row of a cache of `capacity` rows.
    CacheAppend { capacity: usize },
    /// As `CacheAppend`, but written to row `s` (the queries).
    CacheQuery { capacity: usize },
}

/// One strided tensor of heads: `[batch][seq][heads][head_size]` in any order of the first three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadStrides {
    pub batch: usize,
    pub seq: usize,
    pub head: usize,
}

/// Rotary embedding (or, with `rotary_dim` 0, a plain copy) of `heads` heads per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotaryParams {
    pub dtype: DType,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_size: usize,
    pub rotary_dim: usize,
    pub interleaved: bool,
    pub src: HeadStrides,
    pub dst: HeadStrides,
    pub positions: RotaryPositions,
    /// Rows of the cos / sin caches (`[max_position, rotary_dim / 2]`).
    pub max_position: usize,
}

/// Device addresses of a rotary call (`cos`, `sin`, `position_ids`, `seqlens_k` 0 where the
/// call has none).
#[derive(Clone, Copy, Debug)]
pub struct RotaryPointers {
    pub src: u64,
    pub dst: u64,
    pub cos: u64,
    pub sin: u64,
    pub position_ids: u64,
    pub seqlens_k: u64,
}

impl RotaryParams {
    /// The launch of this call with these pointers: the vector path where the heads, strides and
    /// tables allow 16-byte accesses, else the scalar path.
    pub fn plan(&self, ptrs: &RotaryPointers) -> Result<(&'static str, LaunchDims, layout::RotaryArgs)> {
        let p = self;
        let bad = |m: String| Error::invalid(KERNEL, m);
        let kernel = layout::Dtype::from_name(p.dtype.name())
            .and_then(|t| layout::entry(layout::Entry::Rotary(t)))
            .ok_or_else(|| bad(format!("rotary: dtype {} not supported (f32, f16, bf16)", p.dtype)))?;
        if !p.rotary_dim.is_multiple_of(2) || p.rotary_dim > p.head_size || p.head_size == 0 {
            return Err(bad(format!("rotary dim {} must be even and <= head size {}", p.rotary_dim, p.head_size)));
        }
        if p.batch == 0 || p.batch > 65535 || p.heads > 65535 || p.seq > i32::MAX as usize {
            return Err(bad(format!("rotary: batch {} and heads {} must be 1..=65535", p.batch, p.heads)));
        }
        let span = |s: &HeadStrides| {
            (p.batch.saturating_sub(1)) * s.batch
                + p.seq.saturating_sub(1) * s.seq
                + (p.heads.saturating_sub(1)) * s.head
        };
        let rows = match p.positions {
            RotaryPositions::CacheAppend { capacity } => capacity.max(p.seq),
            _ => p.seq,
        };
        let dst_span = (p.batch.saturating_sub(1)) * p.dst.batch
            + rows.saturating_sub(1) * p.dst.seq
            + (p.heads.saturating_sub(1)) * p.dst.head;
        if span(&p.src).max(dst_span).saturating_add(p.head_size) > i32::MAX as usize
            || p.heads.saturating_mul(p.head_size) > i32::MAX as usize
            || p.max_position > u32::MAX as usize
        {
            return Err(bad("rotary: tensors too large for the kernel's 32-bit strides".into()));
        }
        let (positions, capacity) = match p.positions {
            RotaryPositions::PerToken => (layout::POSITIONS_PER_TOKEN, 0),
            RotaryPositions::FromFirst => (layout::POSITIONS_FROM_FIRST, 0),
            RotaryPositions::CacheAppend { capacity } => (layout::POSITIONS_CACHE_APPEND, capacity),
            RotaryPositions::CacheQuery { capacity } => (layout::POSITIONS_CACHE_QUERY, capacity),
        };
        let args = layout::RotaryArgs {
            seq: p.seq as u32,
            heads: p.heads as u32,
            head_size: p.head_size as u32,
            rotary_dim: p.rotary_dim as u32,
            interleaved: p.interleaved as u32,
            src_batch_stride: p.src.batch as u32,
            src_seq_stride: p.src.seq as u32,
            src_head_stride: p.src.head as u32,
            dst_batch_stride: p.dst.batch as u32,
            dst_seq_stride: p.dst.seq as u32,
            dst_head_stride: p.dst.head as u32,
            positions,
            // Nothing to look up without rotation: every position is valid.
            max_position: if p.rotary_dim == 0 { u32::MAX } else { p.max_position as u32 },
            capacity: capacity.min(i32::MAX as usize) as u32,
            units: 0,
            heads_per_block: 1,
        };
        let args = match self.vector_units(ptrs) {
            Some(units) => layout::RotaryArgs { units, heads_per_block: layout::ROTARY_THREADS / units, ..args },
            None => args,
        };
        let dims = LaunchDims {
            grid: (p.seq as u32, p.batch as u32, args.head_groups()),
            block: (layout::ROTARY_THREADS, 1, 1),
            shared_bytes: 0,
        };
        Ok((kernel, dims, args))
    }

    /// The 16-byte units per head of the vector path, where this call can take it: whole units
    /// per head ([`layout::rotary_vector_units`]), at most one block's threads, `src` and `dst`
    /// and every stride in whole units, and the cos / sin rows aligned for their loads.
    fn vector_units(&self, ptrs: &RotaryPointers) -> Option<u32> {
        let size = self.dtype.size_bytes();
        let per_vec = 16 / size;
        let units = layout::rotary_vector_units(
            self.head_size as u32,
            self.rotary_dim as u32,
            self.interleaved,
            per_vec as u32,
        )?;
        let whole = |strides: &HeadStrides| {
            [strides.batch, strides.seq, strides.head].iter().all(|s| s.is_multiple_of(per_vec))
        };
        let table_align = if self.interleaved { 8 } else { 16 };
        let tables_aligned =
            self.rotary_dim == 0 || (ptrs.cos.is_multiple_of(table_align) && ptrs.sin.is_multiple_of(table_align));
        (units > 0
            && units <= layout::ROTARY_THREADS
            && ptrs.src.is_multiple_of(16)
            && ptrs.dst.is_multiple_of(16)
            && whole(&self.src)
            && whole(&self.dst)
            && tables_aligned)
            .then_some(units)
    }
}

/// Rotary embedding on raw device pointers, on `stream`. Nothing is launched for an empty call.
///
/// # Safety
/// Device addresses in `device`'s context valid for the extents the parameters describe until
/// the kernel has run on `stream`; `dst` distinct from `src` unless both use the same strides.
/// Positions and lengths on the device need not be valid for memory safety (out-of-range
/// positions write NaN heads, lengths are clamped to the capacity).
pub unsafe fn rotary_raw(
    device: &Device,
    stream: CUstream,
    params: &RotaryParams,
    ptrs: &RotaryPointers,
) -> Result<()> {
    let (kernel, dims, args) = params.plan(ptrs)?;
    if params.seq == 0 || params.heads == 0 {
        return Ok(());
    }
    check_rotary_pointers(params, ptrs)?;
    let kp = KernelParams::new()
        .pointers(&[ptrs.src, ptrs.dst, ptrs.cos, ptrs.sin, ptrs.position_ids, ptrs.seqlens_k])
        .value(args);
    // SAFETY: six pointers and the RotaryArgs struct, as the kernel declares; validity by contract.
    unsafe { device.launch(kernel, dims, stream, kp) }
}

fn check_rotary_pointers(params: &RotaryParams, ptrs: &RotaryPointers) -> Result<()> {
    let size = params.dtype.size_bytes() as u64;
    check_pointer(KERNEL, "src", ptrs.src, size)?;
    check_pointer(KERNEL, "dst", ptrs.dst, size)?;
    if params.rotary_dim > 0 {
        check_pointer(KERNEL, "cos_cache", ptrs.cos, size)?;
        check_pointer(KERNEL, "sin_cache", ptrs.sin, size)?;
    }
    match params.positions {
        RotaryPositions::PerToken | RotaryPositions::FromFirst if params.rotary_dim > 0 => {
            check_pointer(KERNEL, "position_ids", ptrs.position_ids, 8)
        }
        RotaryPositions::CacheAppend { .. } | RotaryPositions::CacheQuery { .. } => {
            check_pointer(KERNEL, "seqlens_k", ptrs.seqlens_k, 4)
        }
        _ => Ok(()),
    }
}

/// Up to `ROTARY_JOBS` [`rotary_raw`] calls over the same tokens (dtype, batch and sequence
/// length alike; the same cos / sin caches, positions and lengths) in one launch, which also
/// sets the `words` u32 from `status` on to 0 where `status` is not 0 (GroupQueryAttention's
/// queries, keys and values, and the flag word and arrival counters of its decode kernels: one
/// launch instead of three and a memset). Nothing is launched for an empty call.
///
/// # Safety
/// As [`rotary_raw`] for each job; no job's destination overlaps another job's source or
/// destination; `status` 0 or a 4-byte aligned device address of `device` for `words` u32
/// written by nothing else until the launch has run.
pub unsafe fn rotary_jobs_raw(
    device: &Device,
    stream: CUstream,
    jobs: &[(RotaryParams, RotaryPointers)],
    (status, words): (u64, usize),
) -> Result<()> {
    let bad = |m: String| Error::invalid(KERNEL, m);
    let Some((first, first_ptrs)) = jobs.first() else { return Err(bad("rotary: no jobs".into())) };
    if jobs.len() > layout::ROTARY_JOBS {
        return Err(bad(format!("rotary: {} jobs in one launch (at most {})", jobs.len(), layout::ROTARY_JOBS)));
    }
    let mut packed = layout::RotaryJobs { count: jobs.len() as u32, ..Default::default() };
    let mut groups = 0usize;
    for (j, (params, ptrs)) in jobs.iter().enumerate() {
        let same_tokens = (params.dtype, params.batch, params.seq) == (first.dtype, first.batch, first.seq);
        let same_tables = (ptrs.cos, ptrs.sin, ptrs.position_ids, ptrs.seqlens_k)
            == (first_ptrs.cos, first_ptrs.sin, first_ptrs.position_ids, first_ptrs.seqlens_k);
        if !same_tokens || !same_tables {
            return Err(bad(format!("rotary job {j}: other tokens, caches or positions than job 0's")));
        }
        let (_, _, args) = params.plan(ptrs)?;
        check_rotary_pointers(params, ptrs)?;
        (packed.src[j], packed.dst[j], packed.args[j]) = (ptrs.src, ptrs.dst, args);
        groups += args.head_groups() as usize;
    }
    if first.seq == 0 || groups == 0 {
        return Ok(());
    }
    if groups > 65535 {
        return Err(bad(format!("rotary: {groups} head groups over the jobs (at most 65535 in one launch)")));
    }
    let words = if status != 0 {
        check_pointer(KERNEL, "status", status, 4)?;
        u32::try_from(words).map_err(|_| bad(format!("rotary: {words} status words to clear")))?
    } else {
        0
    };
    let kernel = layout::Dtype::from_name(first.dtype.name())
        .and_then(|t| layout::entry(layout::Entry::RotaryJobs(t)))
        .ok_or_else(|| bad(format!("rotary: dtype {} not supported (f32, f16, bf16)", first.dtype)))?;
    let dims = LaunchDims {
        grid: (first.seq as u32, first.batch as u32, groups as u32),
        block: (layout::ROTARY_THREADS, 1, 1),
        shared_bytes: 0,
    };
    let p = first_ptrs;
    let kp =
        KernelParams::new().value(packed).pointers(&[p.cos, p.sin, p.position_ids, p.seqlens_k, status]).value(words);
    // SAFETY: the RotaryJobs struct, five pointers and a u32, as the kernel declares; each job checked
    // as `rotary_raw` checks its call; validity and disjointness by contract. The kernel waits
    // for the grid before it before it reads or writes anything (a programmatic dependent).
    unsafe { device.launch_overlapping_in_one_wave(kernel, dims, stream, kp) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plan that picks the Hopper kernel has tensor maps the driver takes (its documented
    /// limits, checked on the CPU), laid out as the kernel reads them: a launch never fails at
    /// encoding, and never falls back.
    #[test]
    fn every_hopper_plan_has_maps_within_the_drivers_limits() {
        let mut checked = 0;
        for d in [64, 128, 256] {
            for (heads, kv_heads) in [(1, 1), (32, 8), (16, 16), (7, 1)] {
                for dtype in [DType::F16, DType::BF16] {
                    for layout in [
                        Batch::Padded { seqlen_q: 1, seqlen_k: 1 },
                        Batch::Padded { seqlen_q: 97, seqlen_k: 1025 },
                        Batch::Packed { total_q: 4097, total_k: 0, max_seqlen_q: 4097 },
                    ] {
                        let params = AttentionParams {
                            dtype,
                            batch: 3,
                            layout,
                            heads,
                            kv_heads,
                            head_dim: d,
                            causal: true,
                            window_left: None,
                            scale: 0.1,
                            softcap: 0.0,
                            lse: false,
                        };
                        let cache = CacheAttentionParams {
                            dtype,
                            batch: 3,
                            seqlen_q: 5,
                            capacity: 4099,
                            heads,
                            kv_heads,
                            head_dim: d,
                            q_row_stride: (heads + 2 * kv_heads) * d,
                            causal: true,
                            window_left: None,
                            scale: 0.1,
                            softcap: 0.0,
                        };
                        for plan in [params.plan().unwrap(), cache.plan().unwrap()] {
                            let hopper = plan.hopper().expect("a Hopper instantiation");
                            let (element, shapes) = hopper_map_shapes(&hopper).unwrap();
                            for shape in &shapes {
                                shape
                                    .tensor(element, 0x10000)
                                    .check(KERNEL)
                                    .unwrap_or_else(|e| panic!("{hopper:?}: {e}"));
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 4 * 2 * 3 * 2);
        // The shapes themselves: Llama's packed QKV in a cache, head size 128.
        let cache = CacheAttentionParams {
            dtype: DType::BF16,
            batch: 2,
            seqlen_q: 9,
            capacity: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            q_row_stride: 48 * 128,
            causal: true,
            window_left: None,
            scale: 0.1,
            softcap: 0.0,
        };
        let (element, [q, kv]) = hopper_map_shapes(&cache.plan().unwrap().hopper().unwrap()).unwrap();
        assert_eq!(element, MapElement::Bf16);
        assert_eq!(
            (q.rank, &q.dims[..3], &q.strides[..2], &q.box_dims[..3]),
            (3, &[128, 32, 18][..], &[256, 48 * 256][..], &[64, 1, 128][..])
        );
        assert_eq!(
            (kv.rank, kv.dims, kv.strides, kv.box_dims),
            (4, [128, 4096, 8, 2], [256, 4096 * 256, 8 * 4096 * 256], [64, 128, 1, 1])
        );
        // The mma.sync kernel takes none.
        let plain = cache.plan().unwrap();
        assert!(hopper_map_shapes(&plain).unwrap_err().to_string().contains("takes no tensor maps"));
    }

    fn rotary(dtype: DType, head_size: usize, rotary_dim: usize, interleaved: bool) -> RotaryParams {
        let strides = HeadStrides { batch: 4 * 7 * head_size, seq: 4 * head_size, head: head_size };
        RotaryParams {
            dtype,
            batch: 2,
            seq: 7,
            heads: 4,
            head_size,
            rotary_dim,
            interleaved,
            src: strides,
            dst: strides,
            positions: RotaryPositions::PerToken,
            max_position: 64,
        }
    }

    const ALIGNED: RotaryPointers =
        RotaryPointers { src: 0x1000, dst: 0x2000, cos: 0x3000, sin: 0x4000, position_ids: 0x5000, seqlens_k: 0 };

    #[test]
    fn rotary_takes_the_vector_path_only_where_every_access_is_whole() {
        let units = |p: &RotaryParams, ptrs: &RotaryPointers| p.plan(ptrs).unwrap().2.units;
        // Llama's head: 8 rotated units of 8 pairs (f16), 16 heads per block.
        let llama = rotary(DType::F16, 128, 128, false);
        let (_, dims, args) = llama.plan(&ALIGNED).unwrap();
        assert_eq!((args.units, args.heads_per_block, dims.grid), (8, 16, (7, 2, 1)));
        // Partial, interleaved: 4 units of 4 pairs, then 4 of the tail.
        assert_eq!(units(&rotary(DType::F16, 64, 32, true), &ALIGNED), 8);
        // f32: 4 elements per unit; a copy is all tail.
        assert_eq!(units(&rotary(DType::F32, 80, 0, false), &ALIGNED), 20);
        // Half the rotary dim not a multiple of 8 halves: scalar.
        assert_eq!(units(&rotary(DType::F16, 64, 20, false), &ALIGNED), 0);
        // Any pointer or stride off 16 bytes: scalar, one head per block.
        for ptrs in [RotaryPointers { src: 0x1002, ..ALIGNED }, RotaryPointers { dst: 0x2008, ..ALIGNED }] {
            let (_, dims, args) = llama.plan(&ptrs).unwrap();
            assert_eq!((args.units, args.heads_per_block, dims.grid), (0, 1, (7, 2, 4)));
        }
        let odd_stride = RotaryParams { src: HeadStrides { head: 132, ..llama.src }, ..llama };
        assert_eq!(units(&odd_stride, &ALIGNED), 0);
        // The angle rows: 16 bytes apart from interleaved's 8.
        let cos8 = RotaryPointers { cos: 0x3008, ..ALIGNED };
        assert_eq!(units(&llama, &cos8), 0);
        assert_eq!(units(&rotary(DType::F16, 128, 128, true), &cos8), 16);
        // A copy reads no angles.
        assert_eq!(units(&rotary(DType::F16, 128, 0, false), &RotaryPointers { cos: 1, sin: 1, ..ALIGNED }), 16);
    }
}
