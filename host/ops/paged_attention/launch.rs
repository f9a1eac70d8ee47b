//! PagedAttention decode and the KV-cache write (device code: `kernels-gpu/src/paged_attention/`).
//!
//! Cache layout of ONNX Runtime's `PagedAttention`: `key_cache`/`value_cache`
//! `[num_blocks, block_size, num_kv_heads, head_size]`, a block table i32
//! `[batch, max_blocks_per_seq]` and context lengths i32 `[batch]` that count the `q_len` new
//! tokens (already written to the cache, at the end of each sequence). Queries and output are
//! `[batch, q_len, num_q_heads, head_size]`.
//!
//! The context is split into partitions processed by separate thread blocks (chosen from batch,
//! heads and `max_context_len` so small batches with long contexts still fill the GPU) and
//! merged by a log-sum-exp combine kernel. Block ids and context lengths live on the device, so
//! they are checked there: a bad one is never dereferenced, its sequence's output is NaN, and a
//! bit is set in a status word the caller reads with [`check_status`].

use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::common::checks::{check_pointer, check_same_device, check_slice};
use crate::runtime::{Device, KernelParams, LaunchDims};

const KERNEL: &str = "paged_attention";
/// Head sizes with a kernel.
pub const HEAD_SIZES: [usize; 5] = [64, 80, 96, 128, 256];
use super::layout;
use layout::{Dims, M_TILE, THREADS};
pub use layout::{STATUS_BAD_BLOCK, STATUS_BAD_CONTEXT};
/// Most query rows (query heads per KV head times query tokens) one block handles.
pub const MAX_ROWS: usize = 64;

/// Constants for dividing `n < 2^31` by `d` with a multiply-high, a shift and an add (the
/// round-up method of Granlund and Montgomery): `q = (mulhi(n, magic) + n) >> shift`.
pub fn divmod_constants(d: u32) -> (u32, u32) {
    let d = d.max(1);
    let shift = 32 - (d - 1).leading_zeros(); // ceil(log2 d), 0 for d = 1
    let magic = ((1u64 << 32) * ((1u64 << shift) - d as u64) / d as u64 + 1) as u32;
    (magic, shift)
}

/// Shapes and options of one decode step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedAttentionParams {
    pub dtype: DType,
    pub batch: usize,
    /// New query tokens per sequence (1 for plain decoding; a few for speculative decoding).
    pub q_len: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_blocks_per_seq: usize,
    /// An upper bound of the context lengths (sizes the partitioning; longer ones are errors).
    pub max_context_len: usize,
    /// Softmax scale, usually `1 / sqrt(head_size)`.
    pub scale: f32,
    /// Logit soft cap (`cap * tanh(s / cap)`), 0 for none.
    pub softcap: f32,
    /// Sliding window in tokens, 0 for none.
    pub window: usize,
    /// Whether ALiBi slopes (`[num_q_heads]` f32) are given.
    pub alibi: bool,
    /// Tokens per partition, 0 to let the launcher choose.
    pub partition: usize,
}

/// What a validated call launches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedAttentionPlan {
    pub attention: &'static str,
    pub attention_dims: LaunchDims,
    /// The combine kernel, when the context is split into several partitions.
    pub combine: Option<(&'static str, LaunchDims)>,
    pub partition: usize,
    pub num_partitions: usize,
    /// Device memory needed beyond inputs and outputs (partial results), in bytes.
    pub workspace_bytes: usize,
    dims: Dims,
}

fn kernel_names(dtype: DType, head_size: usize) -> Option<(&'static str, &'static str)> {
    Some(match (dtype, head_size) {
        (DType::F16, 64) => ("paged_attention_f16_d64", "paged_attention_combine_f16_d64"),
        (DType::F16, 80) => ("paged_attention_f16_d80", "paged_attention_combine_f16_d80"),
        (DType::F16, 96) => ("paged_attention_f16_d96", "paged_attention_combine_f16_d96"),
        (DType::F16, 128) => ("paged_attention_f16_d128", "paged_attention_combine_f16_d128"),
        (DType::F16, 256) => ("paged_attention_f16_d256", "paged_attention_combine_f16_d256"),
        (DType::BF16, 64) => ("paged_attention_bf16_d64", "paged_attention_combine_bf16_d64"),
        (DType::BF16, 80) => ("paged_attention_bf16_d80", "paged_attention_combine_bf16_d80"),
        (DType::BF16, 96) => ("paged_attention_bf16_d96", "paged_attention_combine_bf16_d96"),
        (DType::BF16, 128) => ("paged_attention_bf16_d128", "paged_attention_combine_bf16_d128"),
        (DType::BF16, 256) => ("paged_attention_bf16_d256", "paged_attention_combine_bf16_d256"),
        _ => return None,
    })
}

impl PagedAttentionParams {
    /// Rows of queries one block handles: query heads per KV head times query tokens.
    pub fn rows(&self) -> usize {
        (self.num_q_heads / self.num_kv_heads.max(1)) * self.q_len
    }

    /// Validates the shapes and options and picks the partitioning for a device with
    /// `multiprocessors` SMs and `max_shared_bytes` of shared memory per block.
    pub fn plan(&self, multiprocessors: u32, max_shared_bytes: u32) -> Result<PagedAttentionPlan> {
        let p = self;
        let bad = |m: String| Error::invalid(KERNEL, m);
        if !matches!(p.dtype, DType::F16 | DType::BF16) {
            return Err(bad(format!("dtype {} not supported (f16, bf16)", p.dtype)));
        }
        let (attention, combine) = kernel_names(p.dtype, p.head_size)
            .ok_or_else(|| bad(format!("head size {} not supported ({HEAD_SIZES:?})", p.head_size)))?;
        for (name, v) in [
            ("batch", p.batch),
            ("q_len", p.q_len),
            ("num_q_heads", p.num_q_heads),
            ("num_kv_heads", p.num_kv_heads),
            ("num_blocks", p.num_blocks),
            ("block_size", p.block_size),
            ("max_blocks_per_seq", p.max_blocks_per_seq),
            ("max_context_len", p.max_context_len),
        ] {
            if v == 0 || v > i32::MAX as usize {
                return Err(bad(format!("{name} = {v} (must be 1..=2^31-1)")));
            }
        }
        if !p.num_q_heads.is_multiple_of(p.num_kv_heads) {
            return Err(bad(format!(
                "num_q_heads {} is not a multiple of num_kv_heads {}",
                p.num_q_heads, p.num_kv_heads
            )));
        }
        let rows = p.rows();
        if rows > MAX_ROWS {
            return Err(bad(format!("query heads per KV head x q_len = {rows} exceeds {MAX_ROWS}")));
        }
        if p.max_context_len < p.q_len {
            return Err(bad(format!("max_context_len {} < q_len {}", p.max_context_len, p.q_len)));
        }
        if p.max_context_len > p.max_blocks_per_seq * p.block_size {
            return Err(bad(format!(
                "max_context_len {} exceeds the block table's {} blocks of {} tokens",
                p.max_context_len, p.max_blocks_per_seq, p.block_size
            )));
        }
        if p.batch > 65535
            || p.num_kv_heads * rows.div_ceil(M_TILE) * layout::split(p.head_size) > 65535
            || p.num_q_heads > 65535
            || p.q_len > 65535
        {
            return Err(bad("batch, heads and q_len must each be at most 65535 (grid limits)".into()));
        }
        if !(p.scale.is_finite() && p.softcap.is_finite() && p.softcap >= 0.0) {
            return Err(bad(format!("scale {} / softcap {} must be finite (softcap >= 0)", p.scale, p.softcap)));
        }
        if (p.num_blocks as u64) * (p.block_size as u64) * (p.num_kv_heads as u64) * (p.head_size as u64)
            > i64::MAX as u64 / 4
        {
            return Err(bad("cache too large".into()));
        }
        let d = p.head_size;
        let m_tiles = rows.div_ceil(M_TILE);
        let smem = layout::shared_bytes(d);
        // Partitions of up to 1024 tokens; halve them while there are too few blocks to fill
        // the GPU (a few waves).
        let mut partition = if p.partition > 0 { p.partition } else { 1024 };
        if p.partition == 0 {
            let target = 4 * multiprocessors.max(1) as usize;
            while partition > 64 && p.batch * p.num_kv_heads * m_tiles * p.max_context_len.div_ceil(partition) < target
            {
                partition /= 2;
            }
        }
        if smem > max_shared_bytes as usize {
            return Err(Error::LaunchLimit {
                kernel: KERNEL,
                message: format!("{smem} bytes of shared memory for head size {d}"),
            });
        }
        let num_partitions = p.max_context_len.div_ceil(partition);
        if num_partitions > i32::MAX as usize {
            return Err(bad("too many partitions".into()));
        }
        let dims = Dims {
            num_blocks: p.num_blocks as u32,
            block_size: p.block_size as u32,
            kv_heads: p.num_kv_heads as u32,
            group: (p.num_q_heads / p.num_kv_heads) as u32,
            q_len: p.q_len as u32,
            max_blocks: p.max_blocks_per_seq as u32,
            partition: partition as u32,
            num_partitions: num_partitions as u32,
            window: u32::try_from(p.window).map_err(|_| bad(format!("window {} too large", p.window)))?,
            max_context: p.max_context_len as u32,
            scale: p.scale,
            softcap: p.softcap,
            m_tiles: m_tiles as u32,
            block_magic: divmod_constants(p.block_size as u32).0,
            block_shift: divmod_constants(p.block_size as u32).1,
        };
        let attention_dims = LaunchDims {
            grid: (num_partitions as u32, (p.num_kv_heads * m_tiles * layout::split(d)) as u32, p.batch as u32),
            block: (THREADS, 1, 1),
            shared_bytes: smem as u32,
        };
        let combine = (num_partitions > 1).then_some((
            combine,
            LaunchDims {
                grid: (p.num_q_heads as u32, p.q_len as u32, p.batch as u32),
                block: (THREADS, 1, 1),
                shared_bytes: 0,
            },
        ));
        let workspace_bytes =
            if combine.is_some() { p.batch * p.num_kv_heads * num_partitions * rows * (d + 2) * 4 } else { 0 };
        Ok(PagedAttentionPlan { attention, attention_dims, combine, partition, num_partitions, workspace_bytes, dims })
    }
}

/// Device addresses of one call. `alibi` may be 0 when the params say no ALiBi; `workspace`
/// may be 0 when the plan needs none.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttentionPointers {
    pub q: u64,
    pub key_cache: u64,
    pub value_cache: u64,
    pub block_tables: u64,
    pub context_lens: u64,
    pub alibi: u64,
    pub out: u64,
    pub workspace: u64,
    /// One u32 the kernels OR status bits into (zero it before the first call).
    pub status: u64,
}

/// Decode attention on raw device pointers, on `stream`.
///
/// # Safety
/// Every pointer must be a device address in `device`'s context valid for the extent the
/// parameters describe (the workspace for `plan.workspace_bytes`) until the kernels have run on
/// `stream`. Block-table entries and context lengths need not be valid: they are checked on the
/// device (see [`check_status`]).
pub unsafe fn paged_attention_raw(
    device: &Device,
    stream: CUstream,
    params: &PagedAttentionParams,
    ptrs: &PagedAttentionPointers,
) -> Result<PagedAttentionPlan> {
    let plan = params.plan(device.multiprocessors(), device.max_shared_bytes_per_block())?;
    for (name, ptr) in
        [("q", ptrs.q), ("key_cache", ptrs.key_cache), ("value_cache", ptrs.value_cache), ("out", ptrs.out)]
    {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    for (name, ptr) in
        [("block_tables", ptrs.block_tables), ("context_lens", ptrs.context_lens), ("status", ptrs.status)]
    {
        check_pointer(KERNEL, name, ptr, 4)?;
    }
    if params.alibi {
        check_pointer(KERNEL, "alibi", ptrs.alibi, 4)?;
    }
    if plan.workspace_bytes > 0 {
        check_pointer(KERNEL, "workspace", ptrs.workspace, 16)?;
    }
    let args = KernelParams::new()
        .pointers(&[
            ptrs.q,
            ptrs.key_cache,
            ptrs.value_cache,
            ptrs.block_tables,
            ptrs.context_lens,
            if params.alibi { ptrs.alibi } else { 0 },
            ptrs.out,
            ptrs.workspace,
            ptrs.status,
        ])
        .value(plan.dims);
    // SAFETY: nine pointers and the Dims struct, as the kernel declares; validity by contract.
    unsafe { device.launch(plan.attention, plan.attention_dims, stream, args)? };
    if let Some((combine, combine_dims)) = plan.combine {
        let args =
            KernelParams::new().pointers(&[ptrs.context_lens, ptrs.out, ptrs.workspace, ptrs.status]).value(plan.dims);
        // SAFETY: four pointers and the Dims struct, as the combine kernel declares.
        unsafe { device.launch(combine, combine_dims, stream, args)? };
    }
    Ok(plan)
}

/// The buffers of a paged KV cache on the device.
pub struct PagedKvCache<'a, T> {
    pub key: &'a CudaSlice<T>,
    pub value: &'a CudaSlice<T>,
}

/// Decode attention over cudarc slices (safe: lengths are checked against the params; block
/// ids and context lengths are checked on the device, see [`check_status`]). Allocates the
/// workspace it needs.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: Element>(
    device: &Device,
    stream: &Arc<CudaStream>,
    params: &PagedAttentionParams,
    q: &CudaSlice<T>,
    cache: PagedKvCache<T>,
    block_tables: &CudaSlice<i32>,
    context_lens: &CudaSlice<i32>,
    alibi: Option<&CudaSlice<f32>>,
    out: &mut CudaSlice<T>,
    status: &mut CudaSlice<u32>,
) -> Result<PagedAttentionPlan> {
    if T::DTYPE != params.dtype {
        return Err(Error::invalid(KERNEL, format!("slices hold {}, params say {}", T::DTYPE, params.dtype)));
    }
    if params.alibi != alibi.is_some() {
        return Err(Error::invalid(KERNEL, "params.alibi must match whether alibi slopes are given"));
    }
    let plan = params.plan(device.multiprocessors(), device.max_shared_bytes_per_block())?;
    let p = params;
    check_same_device(KERNEL, device, stream)?;
    let q_elems = p.batch * p.q_len * p.num_q_heads * p.head_size;
    let cache_elems = p.num_blocks * p.block_size * p.num_kv_heads * p.head_size;
    check_slice(KERNEL, "q", device, q, q_elems)?;
    check_slice(KERNEL, "key_cache", device, cache.key, cache_elems)?;
    check_slice(KERNEL, "value_cache", device, cache.value, cache_elems)?;
    check_slice(KERNEL, "block_tables", device, block_tables, p.batch * p.max_blocks_per_seq)?;
    check_slice(KERNEL, "context_lens", device, context_lens, p.batch)?;
    check_slice(KERNEL, "out", device, out, q_elems)?;
    check_slice(KERNEL, "status", device, status, 1)?;
    if let Some(a) = alibi {
        check_slice(KERNEL, "alibi", device, a, p.num_q_heads)?;
    }
    let workspace = stream
        .alloc_zeros::<u8>(plan.workspace_bytes.max(16))
        .map_err(|source| Error::Driver { call: "cuMemAllocAsync", source })?;
    let (q_ptr, _q) = q.device_ptr(stream);
    let (k_ptr, _k) = cache.key.device_ptr(stream);
    let (v_ptr, _v) = cache.value.device_ptr(stream);
    let (bt_ptr, _bt) = block_tables.device_ptr(stream);
    let (cl_ptr, _cl) = context_lens.device_ptr(stream);
    let alibi_ptr = alibi.map(|a| a.device_ptr(stream));
    let (out_ptr, _out) = out.device_ptr_mut(stream);
    let (ws_ptr, _ws) = workspace.device_ptr(stream);
    let (st_ptr, _st) = status.device_ptr_mut(stream);
    let ptrs = PagedAttentionPointers {
        q: q_ptr,
        key_cache: k_ptr,
        value_cache: v_ptr,
        block_tables: bt_ptr,
        context_lens: cl_ptr,
        alibi: alibi_ptr.as_ref().map_or(0, |(p, _)| *p),
        out: out_ptr,
        workspace: ws_ptr,
        status: st_ptr,
    };
    // SAFETY: every slice was checked to hold the extent the params describe.
    unsafe { paged_attention_raw(device, stream.cu_stream(), params, &ptrs) }
}

/// Writes `key`/`value` (`[num_tokens, num_kv_heads, head_size]`) into the cache slots
/// `slot_mapping[i]` (`block * block_size + offset`; negative: skip), on `stream`. A slot beyond
/// the cache is skipped and flagged in `status` ([`STATUS_BAD_BLOCK`]).
///
/// # Safety
/// Device addresses valid for the described extents (`key`, `value`: `num_tokens` rows;
/// caches: `num_slots` rows; rows of `row_elems` elements), in `device`'s context.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_kv_write_raw(
    device: &Device,
    stream: CUstream,
    dtype: DType,
    num_tokens: usize,
    row_elems: usize,
    num_slots: usize,
    key: u64,
    value: u64,
    key_cache: u64,
    value_cache: u64,
    slot_mapping: u64,
    status: u64,
) -> Result<()> {
    let kernel = match dtype {
        DType::F16 => "paged_kv_write_f16",
        DType::BF16 => "paged_kv_write_bf16",
        other => return Err(Error::invalid(KERNEL, format!("dtype {other} not supported (f16, bf16)"))),
    };
    if num_tokens == 0 {
        return Ok(());
    }
    if num_tokens > i32::MAX as usize || num_slots > u32::MAX as usize || row_elems > u32::MAX as usize {
        return Err(Error::invalid(KERNEL, "sizes exceed the kernel's 32-bit indices"));
    }
    if row_elems == 0 || !row_elems.is_multiple_of(8) {
        return Err(Error::invalid(
            KERNEL,
            format!("row of {row_elems} elements (kv_heads x head_size) must be a multiple of 8"),
        ));
    }
    for (name, ptr) in [("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)] {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    check_pointer(KERNEL, "slot_mapping", slot_mapping, 4)?;
    check_pointer(KERNEL, "status", status, 4)?;
    let args = KernelParams::new()
        .pointers(&[key, value, key_cache, value_cache, slot_mapping, status])
        .value(num_slots as u32)
        .value(row_elems as u32);
    let dims = LaunchDims { grid: (num_tokens as u32, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
    // SAFETY: six pointers and two u32, as the kernel declares; validity by contract.
    unsafe { device.launch(kernel, dims, stream, args) }
}

/// Reads the status word (synchronizing `stream`) and turns set bits into an error.
pub fn check_status(stream: &Arc<CudaStream>, status: &CudaSlice<u32>) -> Result<()> {
    let bits = stream.clone_dtoh(status).map_err(|source| Error::Driver { call: "cuMemcpyDtoH", source })?;
    let bits = bits.first().copied().unwrap_or(0);
    let mut problems = Vec::new();
    if bits & STATUS_BAD_BLOCK != 0 {
        problems.push("a block-table entry (or cache slot) lies outside the cache");
    }
    if bits & STATUS_BAD_CONTEXT != 0 {
        problems.push("a context length is below q_len or beyond the block table");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(
            KERNEL,
            format!("{}; the affected outputs are NaN and nothing outside the cache was read", problems.join("; ")),
        ))
    }
}
