//! PagedAttention decode and the KV-cache write (device code: `kernels-gpu/src/paged_attention/`).
//!
//! Cache layout of ONNX Runtime's `PagedAttention`: `key_cache`/`value_cache`
//! `[num_blocks, block_size, num_kv_heads, head_size]`, a block table i32
//! `[batch, max_blocks_per_seq]` and context lengths i32 `[batch]` that count the `q_len` new
//! tokens (already written to the cache, at the end of each sequence). Queries and output are
//! `[batch, q_len, num_q_heads, head_size]`.
//!
//! The context is split into partitions processed by separate thread blocks and merged by a
//! log-sum-exp combine kernel, only as far as it takes for the grid to fill one wave of the GPU
//! (see [`PagedAttentionParams::plan`]). Block ids and context lengths live on the device, so
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
pub use layout::NewToken;
use layout::{Dims, M_TILE, THREADS};
pub use layout::{STATUS_BAD_BLOCK, STATUS_BAD_CONTEXT, STATUS_BAD_POSITION};
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

/// The device facts a decode plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    pub multiprocessors: u32,
    /// Dynamic shared memory one block may use.
    pub max_shared_bytes: u32,
    /// Blocks of the partition kernel one SM holds at once (its registers decide).
    pub resident_blocks: u32,
}

impl DecodeLimits {
    /// `device`'s, for the partition kernel of `dtype` at `head_size`. Where there is no such
    /// kernel the plan refuses the call anyway; one resident block stands in.
    pub fn of(device: &Device, dtype: DType, head_size: usize) -> Result<Self> {
        let resident_blocks = match kernel_names(dtype, head_size) {
            Some((attention, _)) => device.resident_blocks_per_sm(
                attention,
                &LaunchDims {
                    grid: (1, 1, 1),
                    block: (THREADS, 1, 1),
                    shared_bytes: layout::shared_bytes(head_size) as u32,
                },
            )?,
            None => 1,
        };
        Ok(Self {
            multiprocessors: device.multiprocessors(),
            max_shared_bytes: device.max_shared_bytes_per_block(),
            resident_blocks,
        })
    }
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
    /// With several partitions: the u32 counters ([`PagedAttentionPointers::arrivals`]) that
    /// let the partition kernel merge them itself, one per (sequence, KV head, row tile).
    pub arrival_words: usize,
    dims: Dims,
}

impl PagedAttentionPlan {
    /// The partition kernel's parameters as its launch passes them (eleven pointers, then the
    /// plan's `Dims` and `fresh`): `ptrs` as that launch reads them (`alibi` 0 without ALiBi,
    /// `arrivals` 0 where the combine kernel merges), `row_map` 0 where sequence b reads
    /// block-table row b (else each query token's sequence, as the op's mixed batches pass it).
    /// Also for timing the launch apart from the launcher's checks.
    pub fn attention_params(&self, ptrs: &PagedAttentionPointers, row_map: u64, fresh: &NewToken) -> KernelParams {
        KernelParams::new()
            .pointers(&[
                ptrs.q,
                ptrs.key_cache,
                ptrs.value_cache,
                ptrs.block_tables,
                ptrs.context_lens,
                row_map,
                ptrs.alibi,
                ptrs.out,
                ptrs.workspace,
                ptrs.arrivals,
                ptrs.status,
            ])
            .value(self.dims)
            .value(*fresh)
    }

    /// u32 words at the start of scratch laid out from the kernels' status word (what
    /// GroupQueryAttention's decode passes): the status word, then the arrival counters.
    pub fn status_words(&self) -> usize {
        1 + self.arrival_words
    }

    /// Bytes of such scratch: the status words, then the partial results from the next
    /// 256-byte boundary.
    pub fn scratch_bytes(&self) -> usize {
        self.partials_offset() + self.workspace_bytes
    }

    /// The scratch pointers for such scratch at `status` (`workspace`, `arrivals`, `status`;
    /// the others 0 for the caller to fill): arrivals and partials only where the plan has them.
    pub fn scratch_pointers(&self, status: u64) -> PagedAttentionPointers {
        PagedAttentionPointers {
            q: 0,
            key_cache: 0,
            value_cache: 0,
            block_tables: 0,
            context_lens: 0,
            alibi: 0,
            out: 0,
            workspace: if self.workspace_bytes > 0 { status + self.partials_offset() as u64 } else { 0 },
            arrivals: if self.arrival_words > 0 { status + 4 } else { 0 },
            status,
        }
    }

    fn partials_offset(&self) -> usize {
        (4 * self.status_words()).next_multiple_of(256)
    }
}

fn kernel_names(dtype: DType, head_size: usize) -> Option<(&'static str, &'static str)> {
    let t = layout::Dtype::from_name(dtype.name())?;
    Some((layout::entry(layout::Entry::Partition(t, head_size))?, layout::entry(layout::Entry::Combine(t, head_size))?))
}

impl PagedAttentionParams {
    /// Rows of queries one block handles: query heads per KV head times query tokens.
    pub fn rows(&self) -> usize {
        (self.num_q_heads / self.num_kv_heads.max(1)) * self.q_len
    }

    /// Validates the shapes and options and picks the partitioning for a device with
    /// `multiprocessors` SMs and `max_shared_bytes` of shared memory per block.
    ///
    /// Partitions: a grid of one block per (sequence, KV head, row tile) that already fills
    /// every SM's resident slots runs whole contexts, with no combine pass. A smaller one splits
    /// each context into as many partitions as fill the free slots in one wave (a second wave
    /// of short partitions would only add blocks' fixed costs and a longer combine), each a
    /// multiple of 64 tokens, one 16-token step for each of the four warps.
    pub fn plan(&self, limits: DecodeLimits) -> Result<PagedAttentionPlan> {
        let DecodeLimits { multiprocessors, max_shared_bytes, resident_blocks } = limits;
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
        if p.block_size * p.num_kv_heads * p.head_size > u32::MAX as usize {
            return Err(bad("cache blocks too large for the kernel's 32-bit strides".into()));
        }
        let d = p.head_size;
        let m_tiles = rows.div_ceil(M_TILE);
        let smem = layout::shared_bytes(d);
        let partition = if p.partition > 0 {
            p.partition
        } else {
            let slots = multiprocessors.max(1) as usize * resident_blocks.max(1) as usize;
            let blocks_per_partition = p.batch * p.num_kv_heads * m_tiles * layout::split(d);
            let parts = (slots / blocks_per_partition).max(1);
            p.max_context_len.div_ceil(parts).next_multiple_of(64)
        };
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
            table_rows: p.batch as u32,
            kv_block_stride: (p.block_size * p.num_kv_heads * p.head_size) as u32,
            kv_token_stride: (p.num_kv_heads * p.head_size) as u32,
            kv_head_stride: p.head_size as u32,
            context_bias: 0,
            q_token_stride: (p.num_q_heads * d) as u32,
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
        let (workspace_bytes, arrival_words) = if combine.is_some() {
            (p.batch * p.num_kv_heads * num_partitions * rows * (d + 2) * 4, p.batch * p.num_kv_heads * m_tiles)
        } else {
            (0, 0)
        };
        Ok(PagedAttentionPlan {
            attention,
            attention_dims,
            combine,
            partition,
            num_partitions,
            workspace_bytes,
            arrival_words,
            dims,
        })
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
    /// 0, or `plan.arrival_words` u32 counters, zero when the kernels start (the grid before
    /// may clear them; the kernel leaves them zero, so one zeroed buffer serves the calls of a
    /// stream): then the last partition block of each row tile merges the partitions and the
    /// combine kernel is not launched (one launch fewer).
    pub arrivals: u64,
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
    let plan = params.plan(DecodeLimits::of(device, params.dtype, params.head_size)?)?;
    check_pointer(KERNEL, "block_tables", ptrs.block_tables, 4)?;
    // SAFETY: forwarded.
    unsafe { launch_plan(device, stream, params, plan, ptrs, &NewToken::default()) }
}

/// The decode kernels over a BNSH KV cache `[batch, kv_heads, capacity, D]` (ONNX Runtime's
/// `GroupQueryAttention`): each sequence is one block of `capacity` tokens (no block table), and
/// its length is `seqlens_k[b] + 1`. Queries and output `[batch, q_len, num_q_heads, D]`, dense.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnshAttentionParams {
    pub dtype: DType,
    pub batch: usize,
    pub q_len: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub capacity: usize,
    /// The longest sequence's key count (host-side bound: sizes the partitions; a longer one
    /// is an error, flagged on the device and NaN in its output).
    pub max_keys: usize,
    pub scale: f32,
    pub softcap: f32,
    /// Keys a query sees, itself included (ORT's `local_window_size`); 0 for all.
    pub window: usize,
    /// Elements between consecutive query tokens: `num_q_heads * head_size` for dense queries,
    /// a packed QKV row's width for the leading heads of one (a multiple of 8).
    pub q_token_stride: usize,
}

impl BnshAttentionParams {
    fn paged(&self) -> PagedAttentionParams {
        let p = self;
        PagedAttentionParams {
            dtype: p.dtype,
            batch: p.batch,
            q_len: p.q_len,
            num_q_heads: p.num_q_heads,
            num_kv_heads: p.num_kv_heads,
            head_size: p.head_size,
            num_blocks: p.batch,
            block_size: p.capacity,
            max_blocks_per_seq: 1,
            max_context_len: p.max_keys.clamp(p.q_len, p.capacity.max(p.q_len)),
            scale: p.scale,
            softcap: p.softcap,
            window: p.window,
            alibi: false,
            partition: 0,
        }
    }

    /// Whether the decode kernels take these heads (rows of one KV head within [`MAX_ROWS`]).
    pub fn supported(&self) -> bool {
        kernel_names(self.dtype, self.head_size).is_some()
            && self.num_kv_heads > 0
            && self.num_q_heads.is_multiple_of(self.num_kv_heads)
            && self.paged().rows() <= MAX_ROWS
    }

    pub fn plan(&self, limits: DecodeLimits) -> Result<PagedAttentionPlan> {
        let p = self;
        let mut plan = p.paged().plan(limits)?;
        let block = p.num_kv_heads * p.capacity * p.head_size;
        if p.batch.saturating_mul(block) > i32::MAX as usize {
            return Err(Error::invalid(KERNEL, "BNSH cache too large for the kernel's 32-bit strides"));
        }
        let d = &mut plan.dims;
        d.kv_block_stride = block as u32;
        d.kv_token_stride = p.head_size as u32;
        d.kv_head_stride = (p.capacity * p.head_size) as u32;
        d.context_bias = 1;
        let dense = p.num_q_heads * p.head_size;
        if p.q_token_stride < dense
            || !p.q_token_stride.is_multiple_of(8)
            || p.batch.saturating_mul(p.q_len).saturating_mul(p.q_token_stride) > i32::MAX as usize
        {
            return Err(Error::invalid(
                KERNEL,
                format!(
                    "query token stride {} (a multiple of 8, at least num_q_heads x head size = {dense}, and the \
                     queries within 2^31 elements)",
                    p.q_token_stride
                ),
            ));
        }
        d.q_token_stride = p.q_token_stride as u32;
        Ok(plan)
    }
}

/// [`BnshAttentionParams`] on raw device pointers, on `stream`, as `plan` (what
/// `params.plan` gave for `device`; the caller sized the workspace by it): `ptrs.block_tables` is
/// unused (0) and `ptrs.context_lens` holds `seqlens_k`.
///
/// With a `fresh` new token (`fresh.key` not 0; `q_len` 1): the queries are rotated as they are
/// read, and each sequence's last position comes from `fresh` and is appended to the caches by
/// this launch (see the kernel's launch contract), so no rotary launch comes first; the
/// arrival counters must then be zero (a [`Device::stream_workspace`] keeps them so).
///
/// # Safety
/// As [`paged_attention_raw`]; `plan` is `params.plan(DecodeLimits::of(device, ..))`'s; with
/// `fresh`, its buffers hold `batch` rows of `kv_heads` heads at `fresh.kv_batch_stride`
/// and the caches `max_position` positions of angles, none of them written by the launch.
pub unsafe fn paged_attention_bnsh_raw(
    device: &Device,
    stream: CUstream,
    params: &BnshAttentionParams,
    plan: PagedAttentionPlan,
    ptrs: &PagedAttentionPointers,
    fresh: &NewToken,
) -> Result<PagedAttentionPlan> {
    if fresh.key != 0 {
        params.check_new_token(fresh)?;
    }
    let ptrs = PagedAttentionPointers { block_tables: 0, ..*ptrs };
    // SAFETY: forwarded; a null block table makes the kernels read sequence b's block b.
    unsafe { launch_plan(device, stream, &params.paged(), plan, &ptrs, fresh) }
}

impl BnshAttentionParams {
    /// Whether the kernel takes `fresh` with these params (what [`paged_attention_bnsh_raw`]
    /// checks first): one query token, 16-byte aligned new rows and row stride, whole 8-element
    /// rotary units, angle rows aligned for their loads. A caller with another path can ask
    /// before it launches.
    pub fn check_new_token(&self, fresh: &NewToken) -> Result<()> {
        let p = self;
        let bad = |m: String| Err(Error::invalid(KERNEL, m));
        if p.q_len != 1 {
            return bad(format!("a new-token launch takes one query token per sequence, not {}", p.q_len));
        }
        for (name, ptr) in [("new key", fresh.key), ("new value", fresh.value)] {
            check_pointer(KERNEL, name, ptr, 16)?;
        }
        let stride = fresh.kv_batch_stride as usize;
        if !stride.is_multiple_of(8) || stride < p.num_kv_heads * p.head_size {
            return bad(format!("new-token row stride {stride} (a multiple of 8, at least kv_heads x head size)"));
        }
        let rotary = fresh.rotary_dim;
        let interleaved = fresh.interleaved != 0;
        if rotary > 0 {
            if crate::ops::attention::layout::rotary_vector_units(p.head_size as u32, rotary, interleaved, 8).is_none()
            {
                return bad(format!(
                    "rotary dimension {rotary} of head size {} does not split into 8-element units",
                    p.head_size
                ));
            }
            for (name, ptr) in [("cos_cache", fresh.cos), ("sin_cache", fresh.sin)] {
                check_pointer(KERNEL, name, ptr, if interleaved { 8 } else { 16 })?;
            }
        }
        Ok(())
    }
}

/// Launches a validated plan (block table checked by the caller, or null for a BNSH cache).
///
/// # Safety
/// As [`paged_attention_raw`].
unsafe fn launch_plan(
    device: &Device,
    stream: CUstream,
    params: &PagedAttentionParams,
    plan: PagedAttentionPlan,
    ptrs: &PagedAttentionPointers,
    fresh: &NewToken,
) -> Result<PagedAttentionPlan> {
    for (name, ptr) in
        [("q", ptrs.q), ("key_cache", ptrs.key_cache), ("value_cache", ptrs.value_cache), ("out", ptrs.out)]
    {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    for (name, ptr) in [("context_lens", ptrs.context_lens), ("status", ptrs.status)] {
        check_pointer(KERNEL, name, ptr, 4)?;
    }
    if params.alibi {
        check_pointer(KERNEL, "alibi", ptrs.alibi, 4)?;
    }
    if plan.workspace_bytes > 0 {
        check_pointer(KERNEL, "workspace", ptrs.workspace, 16)?;
    }
    let arrivals = if plan.arrival_words > 0 { ptrs.arrivals } else { 0 };
    if arrivals != 0 {
        check_pointer(KERNEL, "arrivals", arrivals, 4)?;
    }
    let ptrs = PagedAttentionPointers { alibi: if params.alibi { ptrs.alibi } else { 0 }, arrivals, ..*ptrs };
    // SAFETY: validity by contract. Both kernels wait for the grid before them before they
    // read or write anything (module docs), so each may start as a programmatic dependent.
    unsafe {
        device.launch_overlapping_in_one_wave(
            plan.attention,
            plan.attention_dims,
            stream,
            plan.attention_params(&ptrs, 0, fresh),
        )?
    };
    if let Some((combine, combine_dims)) = plan.combine.filter(|_| arrivals == 0) {
        let args =
            KernelParams::new().pointers(&[ptrs.context_lens, ptrs.out, ptrs.workspace, ptrs.status]).value(plan.dims);
        // SAFETY: four pointers and the Dims struct, as the combine kernel declares.
        unsafe { device.launch_overlapping_in_one_wave(combine, combine_dims, stream, args)? };
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
    let plan = params.plan(DecodeLimits::of(device, params.dtype, params.head_size)?)?;
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
    // Zeroed, so the counters after the partials let the partition kernel merge them itself.
    let workspace = stream
        .alloc_zeros::<u8>((plan.workspace_bytes + 4 * plan.arrival_words).max(16))
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
        arrivals: if plan.arrival_words > 0 { ws_ptr + plan.workspace_bytes as u64 } else { 0 },
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
    status_error(bits.first().copied().unwrap_or(0))
}

/// The error the status bits stand for, if any.
pub fn status_error(bits: u32) -> Result<()> {
    let mut problems = Vec::new();
    if bits & STATUS_BAD_BLOCK != 0 {
        problems.push("a block-table entry (or cache slot) lies outside the cache");
    }
    if bits & STATUS_BAD_CONTEXT != 0 {
        problems.push(
            "a context length is below q_len or beyond the block table (or cumulative_sequence_length / \
             past_seqlens are inconsistent)",
        );
    }
    if bits & STATUS_BAD_POSITION != 0 {
        problems.push("a token's position lies beyond the rotary cos_cache/sin_cache rows");
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

/// Shapes and options of one `PagedAttention` op call on the device (ORT's packed layout:
/// `query [tokens, num_heads * D]`, or packed QKV `[tokens, (num_heads + 2 kv_heads) * D]`;
/// sequence `b` owns tokens `cu[b]..cu[b + 1]` at positions `past[b]..`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedOpParams {
    pub dtype: DType,
    pub batch: usize,
    pub tokens: usize,
    pub num_heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_blocks: usize,
    /// Key and value are the trailing parts of each query row.
    pub packed_qkv: bool,
    /// Rotated leading elements per head (0: no rotary), and the rows of the cos/sin caches.
    pub rotary_dim: usize,
    pub interleaved: bool,
    pub cos_rows: usize,
    pub scale: f32,
    pub softcap: f32,
    /// Keys a query sees, itself included (0: all; ORT's `local_window_size`).
    pub window: usize,
}

/// What a validated op call launches: the prologue, then the family's attention kernels with
/// every token as its own sequence (`q_len = 1`, context = its position + 1, block-table row
/// from the prologue's map), so decode, prefill and mixed batches share one path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedOpPlan {
    pub attention: PagedAttentionPlan,
    pub write_dims: LaunchDims,
    /// Device memory the call needs (status word, rotated queries, per-token map, partials).
    pub workspace_bytes: usize,
    dims: layout::WriteDims,
    offsets: [usize; 4], // q_out, token_seq, token_ctx, partials (the status word is at 0)
}

impl PagedOpParams {
    /// The attention kernels' view of the call: `tokens` sequences of one query each, contexts
    /// bounded by the block table (as ORT bounds them without `attention_metadata`).
    pub fn attention_params(&self) -> PagedAttentionParams {
        PagedAttentionParams {
            dtype: self.dtype,
            batch: self.tokens,
            q_len: 1,
            num_q_heads: self.num_heads,
            num_kv_heads: self.kv_heads,
            head_size: self.head_size,
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            max_blocks_per_seq: self.max_blocks,
            max_context_len: self.max_blocks.saturating_mul(self.block_size),
            scale: self.scale,
            softcap: self.softcap,
            window: self.window,
            alibi: false,
            partition: 0,
        }
    }

    /// Row strides of `query` and of `key`/`value`, in elements.
    pub fn strides(&self) -> (usize, usize) {
        let (q, kv) = (self.num_heads * self.head_size, self.kv_heads * self.head_size);
        if self.packed_qkv { (q + 2 * kv, q + 2 * kv) } else { (q, kv) }
    }

    /// Validates and plans the call for a device of `limits`.
    pub fn plan(&self, limits: DecodeLimits) -> Result<PagedOpPlan> {
        let p = self;
        let bad = |m: String| Error::invalid(KERNEL, m);
        if p.batch == 0 || p.batch > i32::MAX as usize - 1 {
            return Err(bad(format!("batch = {} (must be 1..2^31-1)", p.batch)));
        }
        if p.rotary_dim > p.head_size || !p.rotary_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "rotary dimension {} must be even and at most head size {}",
                p.rotary_dim, p.head_size
            )));
        }
        if p.rotary_dim > 0 && (p.cos_rows == 0 || p.cos_rows > u32::MAX as usize) {
            return Err(bad(format!("cos/sin caches of {} rows", p.cos_rows)));
        }
        let mut attention = p.attention_params().plan(limits)?;
        attention.dims.table_rows = p.batch as u32;
        let (q_stride, kv_stride) = p.strides();
        if q_stride > u32::MAX as usize || p.tokens.checked_mul(q_stride).is_none_or(|n| n > i64::MAX as usize / 4) {
            return Err(bad("query too large".into()));
        }
        let elem = p.dtype.size_bytes();
        let round = |n: usize| n.div_ceil(256) * 256;
        let q_out = 256;
        let token_seq = q_out + round(p.tokens * p.num_heads * p.head_size * elem);
        let token_ctx = token_seq + round(p.tokens * 4);
        let partials = token_ctx + round(p.tokens * 4);
        let dims = layout::WriteDims {
            batch: p.batch as u32,
            tokens: p.tokens as u32,
            num_heads: p.num_heads as u32,
            kv_heads: p.kv_heads as u32,
            head_size: p.head_size as u32,
            num_blocks: p.num_blocks as u32,
            block_size: p.block_size as u32,
            max_blocks: p.max_blocks as u32,
            rotary_dim: p.rotary_dim as u32,
            interleaved: p.interleaved as u32,
            cos_rows: p.cos_rows as u32,
            q_stride: q_stride as u32,
            kv_stride: kv_stride as u32,
        };
        Ok(PagedOpPlan {
            attention,
            write_dims: LaunchDims { grid: (p.tokens as u32, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 },
            workspace_bytes: partials + attention.workspace_bytes,
            dims,
            offsets: [q_out, token_seq, token_ctx, partials],
        })
    }
}

/// Device addresses of one op call. `key`/`value` are ignored with packed QKV (they are parts
/// of the query rows); `cos`/`sin` may be 0 without rotary.
#[derive(Clone, Copy, Debug)]
pub struct PagedOpPointers {
    pub query: u64,
    pub key: u64,
    pub value: u64,
    pub key_cache: u64,
    pub value_cache: u64,
    pub cu_seqlens: u64,
    pub past_seqlens: u64,
    pub block_table: u64,
    pub cos: u64,
    pub sin: u64,
    pub out: u64,
    /// `plan.workspace_bytes` of device memory, 256-byte aligned.
    pub workspace: u64,
}

/// The `PagedAttention` op on raw device pointers, on `stream`: writes the new keys and values
/// into the caches (rotated when `rotary_dim > 0`), then attention for every token; then waits
/// for the stream and turns the device's status bits into an error (a bad block id, length or
/// position is never dereferenced; the affected tokens' outputs are NaN).
///
/// # Safety
/// Every pointer a device address in `device`'s context valid for the extent the parameters
/// describe until the kernels have run on `stream`; `out` and the caches distinct from the
/// inputs. Lengths and block ids need not be valid (they are checked on the device).
pub unsafe fn paged_attention_op_raw(
    device: &Device,
    stream: CUstream,
    params: &PagedOpParams,
    ptrs: &PagedOpPointers,
) -> Result<PagedOpPlan> {
    let plan = params.plan(DecodeLimits::of(device, params.dtype, params.head_size)?)?;
    let p = params;
    let elem = p.dtype.size_bytes() as u64;
    let (key, value) = if p.packed_qkv {
        let q_part = (p.num_heads * p.head_size) as u64 * elem;
        (ptrs.query + q_part, ptrs.query + q_part + (p.kv_heads * p.head_size) as u64 * elem)
    } else {
        (ptrs.key, ptrs.value)
    };
    for (name, ptr) in [
        ("query", ptrs.query),
        ("key", key),
        ("value", value),
        ("key_cache", ptrs.key_cache),
        ("value_cache", ptrs.value_cache),
        ("output", ptrs.out),
    ] {
        check_pointer(KERNEL, name, ptr, 16)?;
    }
    for (name, ptr) in [
        ("cumulative_sequence_length", ptrs.cu_seqlens),
        ("past_seqlens", ptrs.past_seqlens),
        ("block_table", ptrs.block_table),
    ] {
        check_pointer(KERNEL, name, ptr, 4)?;
    }
    if p.rotary_dim > 0 {
        check_pointer(KERNEL, "cos_cache", ptrs.cos, elem)?;
        check_pointer(KERNEL, "sin_cache", ptrs.sin, elem)?;
    }
    check_pointer(KERNEL, "workspace", ptrs.workspace, 256)?;
    // The status read at the end waits for the stream: refused before anything is queued, so
    // that the caller's capture stays valid.
    // SAFETY: the caller's stream.
    if unsafe { crate::runtime::stream_is_capturing(device, stream)? } {
        return Err(Error::invalid(
            KERNEL,
            "cannot be captured into a CUDA graph: each call reads the device's status of its block \
             table and lengths back to the host (docs/ops.md, CUDA graphs)",
        ));
    }
    let ws = ptrs.workspace;
    let [q_out, token_seq, token_ctx, partials] = plan.offsets.map(|o| ws + o as u64);
    let status = ws;
    let dtype = if p.dtype == DType::F16 { layout::Dtype::F16 } else { layout::Dtype::Bf16 };
    let write = layout::entry(layout::Entry::KvWriteRotary(dtype))
        .ok_or_else(|| Error::invalid(KERNEL, format!("no prologue kernel for {}", p.dtype)))?;
    // SAFETY: the status word lies in the workspace (contract).
    unsafe { crate::runtime::memset_async(device, stream, status, 0, 4)? };
    let (cos, sin) = if p.rotary_dim > 0 { (ptrs.cos, ptrs.sin) } else { (0, 0) };
    let args = KernelParams::new()
        .pointers(&[
            ptrs.query,
            key,
            value,
            ptrs.key_cache,
            ptrs.value_cache,
            ptrs.cu_seqlens,
            ptrs.past_seqlens,
            ptrs.block_table,
            cos,
            sin,
            q_out,
            token_seq,
            token_ctx,
            status,
        ])
        .value(plan.dims);
    // SAFETY: fourteen pointers and the WriteDims struct, as the kernel declares; extents by
    // contract and the plan (the workspace regions are disjoint).
    unsafe { device.launch(write, plan.write_dims, stream, args)? };
    let a = &plan.attention;
    let attention = PagedAttentionPointers {
        q: q_out,
        key_cache: ptrs.key_cache,
        value_cache: ptrs.value_cache,
        block_tables: ptrs.block_table,
        context_lens: token_ctx,
        alibi: 0,
        out: ptrs.out,
        workspace: partials,
        arrivals: 0, // no arrival counters: the combine kernel merges
        status,
    };
    let args = a.attention_params(&attention, token_seq, &NewToken::default());
    // SAFETY: the partition kernel's parameters; it and the combine kernel wait for the grid
    // before them before they read or write anything.
    unsafe { device.launch_overlapping_in_one_wave(a.attention, a.attention_dims, stream, args)? };
    if let Some((combine, combine_dims)) = a.combine {
        let args = KernelParams::new().pointers(&[token_ctx, ptrs.out, partials, status]).value(a.dims);
        // SAFETY: four pointers and the Dims struct, as the combine kernel declares.
        unsafe { device.launch_overlapping_in_one_wave(combine, combine_dims, stream, args)? };
    }
    // SAFETY: the status word in the workspace, written on this stream.
    let bits = unsafe { crate::runtime::read_u32(device, stream, status)? };
    status_error(bits)?;
    Ok(plan)
}
