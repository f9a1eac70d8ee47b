//! Warpgroup-level asynchronous tensor-core matrix multiply (PTX ISA §9.7.15 `wgmma`), Hopper
//! only: compiled into the arch-specific `sm_90a` module alone (`cfg(dlkern_arch_specific)`).
//!
//! A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; every `wgmma`
//! instruction here must be executed by all 128 of its threads. Operands come from shared
//! memory through [`SharedMatrix`] descriptors (A from registers in the `_register_a` forms,
//! in `mma.sync`'s A fragment layout per warp); accumulators live in registers, in the layout
//! of `mma.sync`'s 16 x 8 C fragment repeated: warp `w` of the group owns rows `16 w..16 w + 16`,
//! and register `4 j + c` of lane `l` holds row `16 w + l / 4 + 8 (c / 2)`, column
//! `8 j + 2 (l % 4) + c % 2`.

use core::arch::asm;

use super::SharedAddr;

/// A `wgmma` shared-memory matrix descriptor (PTX ISA §9.7.15.5.1.2.2): start address, leading
/// and stride byte offsets (all in 16-byte units) and the swizzle mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct SharedMatrix(u64);

impl SharedMatrix {
    /// Bytes of one 128-byte-swizzle atom: 8 rows of 128 bytes.
    pub const SWIZZLE128_ATOM_BYTES: u32 = 1024;

    /// A K-major operand in rows of 128 bytes with the 128-byte swizzle: byte `b` of row `r`
    /// lives at `tile + 128 r + 16 ((b / 16) ^ (r % 8)) + b % 16`, 8-row groups 1024 bytes
    /// apart. `tile` must be 1024-byte aligned; [`Self::advance_k`] selects a K slice.
    #[inline(always)]
    pub const fn k_major_swizzle128(tile: SharedAddr) -> Self {
        let start = ((tile.0 & 0x3_ffff) >> 4) as u64;
        let leading = 1u64; // unused by swizzled K-major layouts (conventionally 1)
        let stride = (Self::SWIZZLE128_ATOM_BYTES >> 4) as u64;
        SharedMatrix(start | (leading << 16) | (stride << 32) | (1u64 << 62))
    }

    /// Byte offset, within a tile of [`Self::k_major_swizzle128`]'s layout, of 16-byte chunk
    /// `chunk` (0..8) of row `row`: where the copies into such a tile must write.
    #[inline(always)]
    pub const fn swizzle128_offset(row: usize, chunk: usize) -> u32 {
        (row * 128 + 16 * (chunk ^ (row % 8))) as u32
    }

    /// The first swizzle-atom (1024-byte) boundary at or after `addr`: where such tiles may
    /// start (a kernel's dynamic shared memory is only 128-byte aligned).
    #[inline(always)]
    pub const fn atom_aligned(addr: SharedAddr) -> SharedAddr {
        let mask = Self::SWIZZLE128_ATOM_BYTES - 1;
        SharedAddr((addr.0 + mask) & !mask)
    }

    /// The same matrix starting `bytes` further along K (a multiple of 16 below 128): the
    /// hardware applies the swizzle to the resulting addresses, so K slices of an atom are
    /// addressed by moving the start alone.
    #[inline(always)]
    pub const fn advance_k(self, bytes: u32) -> Self {
        SharedMatrix(self.0 + (bytes >> 4) as u64)
    }

    /// An MN-major operand (a B tile stored `[K][N]`, N contiguous) with the 128-byte swizzle:
    /// columns in blocks of 64 halves, block `c` a `[K rows][128 bytes]` array in
    /// [`Self::k_major_swizzle128`]'s physical layout, blocks `block_bytes` apart (the leading
    /// byte offset); 8-row groups along K 1024 bytes apart (the stride byte offset). `tile` must
    /// be 1024-byte aligned; a K step of 16 rows moves the start by 2048 bytes.
    #[inline(always)]
    pub const fn mn_major_swizzle128(tile: SharedAddr, block_bytes: u32) -> Self {
        let start = ((tile.0 & 0x3_ffff) >> 4) as u64;
        let leading = ((block_bytes >> 4) & 0x3fff) as u64;
        let stride = (Self::SWIZZLE128_ATOM_BYTES >> 4) as u64;
        SharedMatrix(start | (leading << 16) | (stride << 32) | (1u64 << 62))
    }
}

/// `wgmma.fence.sync.aligned` (PTX ISA §9.7.15.5.3): orders this thread's earlier register
/// writes to accumulators (and shared-memory writes) before the next `wgmma.mma_async`.
///
/// # Safety
/// All threads of the warpgroup must execute it.
#[inline(always)]
pub unsafe fn fence() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// `wgmma.commit_group.sync.aligned` (PTX ISA §9.7.15.5.4): closes the group of `mma_async`
/// operations issued since the last commit.
///
/// # Safety
/// As [`fence`].
#[inline(always)]
pub unsafe fn commit_group() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// `wgmma.wait_group.sync.aligned N` (PTX ISA §9.7.15.5.5): waits until at most `PENDING`
/// committed groups are still running; only then may their accumulators be read, or their
/// shared-memory operands be overwritten.
///
/// # Safety
/// As [`fence`].
#[inline(always)]
pub unsafe fn wait_group<const PENDING: u32>() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.wait_group.sync.aligned {};", const PENDING, options(nostack)) };
}

/// `fence.proxy.async.shared::cta` (PTX ISA §9.7.13.4.18): makes this thread's generic-proxy
/// writes to shared memory (`st.shared`, `cp.async`, `mbarrier.init`) visible to the async
/// proxy: to `wgmma`, which reads operands through it, and to bulk and tensor copies, which
/// complete their bytes on barriers through it. Each writing thread fences, then a barrier
/// publishes the writes.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// Expands to `"{}, {}, ..., {}"`: one positional operand per listed index.
macro_rules! operand_list {
    ($first:literal $($rest:literal)*) => { concat!("{}" $(, operand_list!(@comma $rest))*) };
    (@comma $i:literal) => { ", {}" };
}

/// One `wgmma.mma_async` of form `$form` (shape and types) on the accumulators `$acc[$i]`:
/// `D = A * B (+ D when scale-d != 0)`, A given by `$a` (a descriptor, or the register list
/// of the `_register_a` forms) with its operands `$a_name`, scale-d the operand `[$scale_d]`
/// (`in(reg32) x`, or `const X`: an immediate, so that no instruction between two `wgmma`s
/// defines a register they read, which makes ptxas serialize them, C7513), then `$immediates`
/// (the floating-point forms' scale and transpose immediates; none for integers).
macro_rules! mma_async {
    (
        $acc:ident, $a:literal { $($a_name:ident: $a_class:ident = $a_value:expr),+ }, $b:expr,
        [$($scale_d:tt)+], $form:expr, $immediates:literal; $($i:literal)+
    ) => {
        asm!(
            concat!(
                "{{ .reg .pred p; setp.ne.b32 p, {scale_d}, 0; wgmma.mma_async.sync.aligned.",
                $form,
                " {{",
                operand_list!($($i)+),
                "}}, ",
                $a,
                ", {b}, p",
                $immediates,
                "; }}"
            ),
            $(inout(reg32) $acc[$i],)+
            $($a_name = in($a_class) $a_value,)+
            b = in(reg64) $b,
            scale_d = $($scale_d)+,
            options(nostack)
        )
    };
}

/// [`mma_async`] with A the 4 registers `$a` (A and B unscaled, B not transposed; D kept when
/// the immediate `$scale_d` is not 0).
macro_rules! mma_async_register_a {
    ($acc:ident, $a:expr, $b:expr, $scale_d:expr, $form:literal; $($i:literal)+) => {
        mma_async!(
            $acc, "{{{a0}, {a1}, {a2}, {a3}}}" { a0: reg32 = $a[0], a1: reg32 = $a[1], a2: reg32 = $a[2], a3: reg32 = $a[3] },
            $b, [const $scale_d], $form, ", 1, 1, 0"; $($i)+
        )
    };
}

/// The indices `0..128` of a 64 x 256 tile's accumulators, for the macros above.
macro_rules! with_acc128 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
            32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
            64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
            96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121
            122 123 124 125 126 127)
    };
}

/// The indices `0..64` of a 64 x 128 f32 tile's accumulators.
macro_rules! with_acc64 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
            32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63)
    };
}

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16` with A in registers (PTX ISA
/// §9.7.15.5.2): starts `acc += A * B^T` for a 64 x 16 f16 tile of A held as `mma.sync`'s A
/// fragment per warp (warp `w` of the group: rows `16 w..16 w + 16`; lane `l` holds row
/// `l / 4 (+ 8)`, columns `2 (l % 4) (+ 1) (+ 8)` as `[row, row + 8, row (col + 8), row + 8
/// (col + 8)]`) and a 128 x 16 f16 tile of B, K-major in shared memory.
///
/// # Safety
/// As [`mma_async_m64n256k32_s8`]; in addition `a` must not be overwritten until a
/// [`wait_group`] covers the operation's group.
#[inline(always)]
pub unsafe fn mma_async_m64n128k16_f16_register_a(acc: &mut [f32; 64], a: [u32; 4], b: SharedMatrix) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { with_acc64!(mma_async_register_a!(acc, a, b.0, 1, "m64n128k16.f32.f16.f16")) };
}

/// As [`mma_async_m64n128k16_f16_register_a`] for bfloat16.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_m64n128k16_bf16_register_a(acc: &mut [f32; 64], a: [u32; 4], b: SharedMatrix) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { with_acc64!(mma_async_register_a!(acc, a, b.0, 1, "m64n128k16.f32.bf16.bf16")) };
}

/// `wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16` with A in registers: as
/// [`mma_async_m64n128k16_f16_register_a`] for a B tile of 8 rows (4 accumulators per thread,
/// columns `2 (l % 4) (+ 1)`), and `acc = A * B^T` (the old value ignored) unless `ACCUMULATE`.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_m64n8k16_f16_register_a<const ACCUMULATE: bool>(
    acc: &mut [f32; 4],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { mma_async_register_a!(acc, a, b.0, ACCUMULATE as u32, "m64n8k16.f32.f16.f16"; 0 1 2 3) };
}

/// As [`mma_async_m64n8k16_f16_register_a`] for bfloat16.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_m64n8k16_bf16_register_a<const ACCUMULATE: bool>(
    acc: &mut [f32; 4],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { mma_async_register_a!(acc, a, b.0, ACCUMULATE as u32, "m64n8k16.f32.bf16.bf16"; 0 1 2 3) };
}

/// `wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16` with A in registers: as
/// [`mma_async_m64n8k16_f16_register_a`] for a B tile of 16 rows (8 accumulators per thread:
/// register `4 j + c` is column `8 j + 2 (l % 4) + c % 2`).
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_m64n16k16_f16_register_a<const ACCUMULATE: bool>(
    acc: &mut [f32; 8],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { mma_async_register_a!(acc, a, b.0, ACCUMULATE as u32, "m64n16k16.f32.f16.f16"; 0 1 2 3 4 5 6 7) };
}

/// As [`mma_async_m64n16k16_f16_register_a`] for bfloat16.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_m64n16k16_bf16_register_a<const ACCUMULATE: bool>(
    acc: &mut [f32; 8],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe { mma_async_register_a!(acc, a, b.0, ACCUMULATE as u32, "m64n16k16.f32.bf16.bf16"; 0 1 2 3 4 5 6 7) };
}

/// The indices `0..32` of a 64 x 64 f32 tile's accumulators.
macro_rules! with_acc32 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    };
}

/// `acc` as an array of `W` accumulators.
///
/// # Safety
/// `N == W`.
#[inline(always)]
unsafe fn width<const N: usize, const W: usize>(acc: &mut [f32; N]) -> &mut [f32; W] {
    // SAFETY: the caller guarantees the two array types are the same.
    unsafe { &mut *(acc as *mut [f32; N]).cast::<[f32; W]>() }
}

/// Expands `$issue!(view, form)` for the `m64n{N/2}k16` form of `$dtype` that fits `$acc`
/// (`[f32; N]`, N in 32, 64, 128), with `view` the accumulators at that width.
macro_rules! by_width {
    ($n:ident, $acc:ident, $issue:ident, $dtype:literal) => {{
        const { assert!($n == 32 || $n == 64 || $n == 128, "wgmma f32 tiles of 64 x 64, 64 x 128 or 64 x 256") };
        if $n == 32 {
            // SAFETY: N == 32 in this branch.
            let view = unsafe { width::<$n, 32>($acc) };
            with_acc32!($issue!(view, concat!("m64n64k16.f32.", $dtype)))
        } else if $n == 64 {
            // SAFETY: N == 64 in this branch.
            let view = unsafe { width::<$n, 64>($acc) };
            with_acc64!($issue!(view, concat!("m64n128k16.f32.", $dtype)))
        } else {
            // SAFETY: N == 128 in this branch.
            let view = unsafe { width::<$n, 128>($acc) };
            with_acc128!($issue!(view, concat!("m64n256k16.f32.", $dtype)))
        }
    }};
}

/// `wgmma.mma_async.sync.aligned.m64n{N/2}k16.f32.{f16,bf16}` with both operands K-major in
/// shared memory (PTX ISA §9.7.15.5.2): starts `acc (+)= A * B^T` for a 64 x 16 tile of A and an
/// `N/2` x 16 tile of B (`acc` is this thread's `N` accumulators, layout in the module docs;
/// `N` is 32, 64 or 128), bfloat16 when `BF16`; `acc`'s old value is ignored unless
/// `ACCUMULATE`.
///
/// # Safety
/// As [`mma_async_m64n256k32_s8`].
#[inline(always)]
pub unsafe fn mma_async_k16_shared<const BF16: bool, const N: usize, const ACCUMULATE: bool>(
    acc: &mut [f32; N],
    a: SharedMatrix,
    b: SharedMatrix,
) {
    macro_rules! issue {
        ($acc:ident, $form:expr; $($i:literal)+) => {
            // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
            unsafe { mma_async!($acc, "{a}" {a: reg64 = a.0}, b.0, [const ACCUMULATE as u32], $form, ", 1, 1, 0, 0"; $($i)+) }
        };
    }
    if BF16 { by_width!(N, acc, issue, "bf16.bf16") } else { by_width!(N, acc, issue, "f16.f16") }
}

/// `wgmma.mma_async.sync.aligned.m64n{N/2}k16.f32.{f16,bf16}` with A in registers (as
/// [`mma_async_m64n128k16_f16_register_a`]) and B K-major in shared memory
/// ([`SharedMatrix::k_major_swizzle128`]): starts `acc += A * B^T` for an `N/2` x 16 tile of B;
/// `N` is 32, 64 or 128; bfloat16 when `BF16`.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_k16_register_a<const BF16: bool, const N: usize>(
    acc: &mut [f32; N],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: forwarded contract.
    unsafe { mma_async_k16_register_a_either::<BF16, N, false>(acc, a, b) }
}

/// `wgmma.mma_async.sync.aligned.m64n{N/2}k16.f32.{f16,bf16}` with A in registers (as
/// [`mma_async_m64n128k16_f16_register_a`]) and B MN-major in shared memory (transposed,
/// [`SharedMatrix::mn_major_swizzle128`]): starts `acc += A * B` for a 16 x `N/2` tile of B
/// stored row by row; `N` is 32, 64 or 128; bfloat16 when `BF16`.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
pub unsafe fn mma_async_k16_register_a_mn_b<const BF16: bool, const N: usize>(
    acc: &mut [f32; N],
    a: [u32; 4],
    b: SharedMatrix,
) {
    // SAFETY: forwarded contract.
    unsafe { mma_async_k16_register_a_either::<BF16, N, true>(acc, a, b) }
}

/// The two above: B MN-major (the transpose immediate set) when `MN_B`.
///
/// # Safety
/// As [`mma_async_m64n128k16_f16_register_a`].
#[inline(always)]
unsafe fn mma_async_k16_register_a_either<const BF16: bool, const N: usize, const MN_B: bool>(
    acc: &mut [f32; N],
    a: [u32; 4],
    b: SharedMatrix,
) {
    macro_rules! issue_with {
        ($acc:ident, $form:expr, $immediates:literal; $($i:literal)+) => {
            // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
            unsafe {
                mma_async!(
                    $acc, "{{{a0}, {a1}, {a2}, {a3}}}" { a0: reg32 = a[0], a1: reg32 = a[1], a2: reg32 = a[2], a3: reg32 = a[3] },
                    b.0, [const 1], $form, $immediates; $($i)+
                )
            }
        };
    }
    macro_rules! issue_mn {
        ($acc:ident, $form:expr; $($i:literal)+) => { issue_with!($acc, $form, ", 1, 1, 1"; $($i)+) };
    }
    macro_rules! issue_k {
        ($acc:ident, $form:expr; $($i:literal)+) => { issue_with!($acc, $form, ", 1, 1, 0"; $($i)+) };
    }
    match (BF16, MN_B) {
        (true, true) => by_width!(N, acc, issue_mn, "bf16.bf16"),
        (false, true) => by_width!(N, acc, issue_mn, "f16.f16"),
        (true, false) => by_width!(N, acc, issue_k, "bf16.bf16"),
        (false, false) => by_width!(N, acc, issue_k, "f16.f16"),
    }
}

macro_rules! touch_registers {
    ($acc:ident; $($i:literal)+) => {
        asm!(concat!("// pinned: ", operand_list!($($i)+)), $(inout(reg32) $acc[$i],)+ options(nostack))
    };
}

/// An `asm` of one comment that reads and redefines all 128 accumulators: after [`wait_group`] it keeps
/// the compiler from moving reads of the accumulators above the wait (the wait names no
/// registers, so without this the epilogue's conversions may be hoisted into the running
/// `wgmma`'s window, which `ptxas` then serializes, warning C7514).
#[inline(always)]
pub fn pin_accumulators(acc: &mut [i32; 128]) {
    // SAFETY: an empty instruction sequence; it only constrains the compiler's scheduling.
    unsafe { with_acc128!(touch_registers!(acc)) };
}

/// As [`pin_accumulators`], for `N` (32, 64 or 128) f32 accumulators.
#[inline(always)]
pub fn pin_accumulators_f32<const N: usize>(acc: &mut [f32; N]) {
    macro_rules! touch {
        ($acc:ident, $form:expr; $($i:literal)+) => {
            // SAFETY: an instruction-free `asm`; it only constrains the compiler's scheduling.
            unsafe { touch_registers!($acc; $($i)+) }
        };
    }
    by_width!(N, acc, touch, "")
}

/// `N` f32 accumulators set to 0.0, as one `memset` of the array. (`[0.0; N]` is a store loop in
/// rustc's output, which LLVM unrolls only partially at `N` = 128: the loop's indexed stores
/// then keep the whole array in local memory, 2 KB of spills at head size 256.)
#[inline(always)]
pub fn zeroed_accumulators_f32<const N: usize>() -> [f32; N] {
    // SAFETY: all-zero bits are a valid f32 (0.0).
    unsafe { core::mem::zeroed() }
}

/// As [`pin_accumulators`], for the 4 f32 accumulators of each 64 x 8 tile in `acc`.
#[inline(always)]
pub fn pin_accumulators_f32x4<const G: usize>(acc: &mut [[f32; 4]; G]) {
    for tile in acc.iter_mut() {
        // SAFETY: an instruction-free `asm`; it only constrains the compiler's scheduling.
        unsafe { touch_registers!(tile; 0 1 2 3) };
    }
}

/// `wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8` (PTX ISA §9.7.15.5.2): starts
/// `acc += A * B^T` (or `acc = A * B^T` when `accumulate` is false) for a 64 x 32 int8 tile of A
/// and a 256 x 32 int8 tile of B, both K-major in shared memory; int32 accumulation, wrapping.
/// `acc` is this thread's 128 accumulators (layout in the module docs).
///
/// # Safety
/// All 128 threads of the warpgroup must execute it with the same descriptors, after
/// [`fence`]; the operands must stay unchanged and `acc` must not be read or written by other
/// instructions until a [`wait_group`] covers the operation's group.
#[inline(always)]
pub unsafe fn mma_async_m64n256k32_s8(acc: &mut [i32; 128], a: SharedMatrix, b: SharedMatrix, accumulate: bool) {
    let accumulate = accumulate as u32;
    // SAFETY: the caller upholds the warpgroup, descriptor and ordering contract.
    unsafe {
        with_acc128!(mma_async!(acc, "{a}" {a: reg64 = a.0}, b.0, [in(reg32) accumulate], "m64n256k32.s32.s8.s8", ""))
    };
}
