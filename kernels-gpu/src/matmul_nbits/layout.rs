// What the host launchers need of the `matmul_nbits` kernels (kernels-gpu/src/matmul_nbits/):
// the entry points' names, tile shapes, flags and the scalar arguments, also compiled into the
// host (host/ops/matmul_nbits/, `layout`): plain constants, no device code.

/// K per chunk: 4 lanes x 32 codes.
pub const CHUNK: usize = 128;
/// Shared row of the `large` variant: 128 halves + 16 bytes of padding (conflict-free `ldmatrix`).
pub const A_ROW_BYTES: usize = CHUNK * 2 + 16;

/// A variant's tiling: `mt` x `nt` `mma` tiles (16 x 8) per warp, `wm` x `wn` warps per block
/// side by side, each of them `wk` warps that split the block's K chunks.
#[derive(Clone, Copy)]
pub struct Tiling {
    pub mt: usize,
    pub nt: usize,
    pub wm: usize,
    pub wn: usize,
    pub wk: usize,
}

impl Tiling {
    /// Rows of A (M) per block.
    pub const fn block_m(self) -> usize {
        16 * self.mt * self.wm
    }

    /// Columns of the output (N) per block.
    pub const fn block_n(self) -> usize {
        8 * self.nt * self.wn
    }

    pub const fn threads(self) -> usize {
        32 * self.wm * self.wn * self.wk
    }
}

/// `small`: warp tile 16 x 32, 4 warps splitting K (block 16 x 32): enough blocks to fill the
/// GPU from N alone at LLM sizes, and the activations of a chunk serve 4 column tiles.
pub const SMALL: Tiling = Tiling { mt: 1, nt: 4, wm: 1, wn: 1, wk: 4 };
/// Rows of A per block of `decode8` (M <= 8: the `mma` rows 8..16 stay empty, so their
/// activations are never loaded). `decode16` and `small` take 16.
pub const DECODE8_ROWS: usize = 8;
/// `decode` (M <= 16, swapped operands): block tile 16 x 32 in output terms (`decode8`: 8 x
/// 32), [`DECODE_WARPS`] warps splitting K, each with 2 `mma` tiles of 16 weight columns and a
/// private ring of [`DECODE_STAGES`] K chunks of its columns' codes.
pub const DECODE_WARPS: usize = 4;
pub const DECODE: Tiling = Tiling { mt: 1, nt: 4, wm: 1, wn: 1, wk: DECODE_WARPS };
pub const DECODE_TILES: usize = 2;
pub const DECODE_COLUMNS: usize = 16 * DECODE_TILES;
pub const DECODE_STAGES: usize = 4;
pub const DECODE_STAGE_BYTES: usize = DECODE_COLUMNS * B_CHUNK_BYTES;
pub const DECODE_RING_BYTES: usize = DECODE_STAGES * DECODE_STAGE_BYTES;
/// Dynamic shared memory of `decode*`: one ring per warp.
pub const DECODE_SHARED_BYTES: usize = DECODE_WARPS * DECODE_RING_BYTES;
const _: () = assert!(DECODE_COLUMNS == DECODE.block_n());
/// `decode*_packed`: B repacked into one record per 32-column tile and K chunk (tile-major):
/// the 32 columns' 64 code bytes of the chunk (column-major, as in a `decode` stage; within a
/// column, 16-byte piece `q` holds as its word `i` the column's 8 codes at K `32 i + 8 q` of
/// the chunk, so that the 4 lanes reading a column's pieces need 64 contiguous bytes of each
/// token's activations per word), then per lane group `g` 16 bytes: the scale bits of columns
/// `g, g + 8, g + 16, g + 24` (4 x u16), their zero points (4 x u8, 8 when there are none) and
/// 4 bytes of padding. Each word's 8 codes are in [`packed_code_word`]'s nibble order.
pub const PACKED_CONSTS_BYTES: usize = 8 * 16;
/// A word of 8 codes (code `j` in bits `4j..4j+4`, as `MatMulNBits` stores them) in the
/// records' order: the even codes in nibbles 0-3, the odd ones in nibbles 4-7. The kernels'
/// OR-into-the-mantissa conversion pairs nibbles `(j, j + 4)`, so the pairs then hold codes
/// `(2j, 2j + 1)`, the K order of 2 consecutive activations: each 32-bit word of a token's
/// activations is an `mma` fragment register as loaded, with no shuffle.
pub const fn packed_code_word(word: u32) -> u32 {
    let mut out = 0;
    let mut j = 0;
    while j < 8 {
        let place = if j % 2 == 0 { j / 2 } else { 4 + j / 2 };
        out |= ((word >> (4 * j)) & 0xF) << (4 * place);
        j += 1;
    }
    out
}
const _: () = assert!(packed_code_word(0x7654_3210) == 0x7531_6420);
pub const PACKED_RECORD_BYTES: usize = DECODE_STAGE_BYTES + PACKED_CONSTS_BYTES;
pub const DECODE_PACKED_SHARED_BYTES: usize = decode_packed_shared_bytes(DECODE_WARPS, CHUNK);
/// Blocks of 32 or 64 (the builder's 32, symmetric): a chunk spans several blocks, so the
/// `decode*_packed_fine` records carry the constants of each [`FINE_STEP`] of K. Word `i` of a
/// lane's piece (K `32 i + 8 q` of the chunk) lies in step `i`, so each of a lane's 4 words has
/// one scale and zero point per column. The codes as in [`PACKED_RECORD_BYTES`]'s records, then
/// per lane group `g` [`FINE_GROUP_CONSTS_BYTES`]: the scale bits of columns `g, g + 8, g + 16,
/// g + 24` (4 x u16) for step 0, 1, 2, 3 (32 bytes: pieces 0 and 1), then per step their zero
/// points (4 x u8; 8 when there are none): piece 2, which the group's lanes `q < 3` copy.
pub const FINE_STEP: usize = 32;
pub const FINE_STEPS: usize = CHUNK / FINE_STEP;
pub const FINE_GROUP_CONSTS_BYTES: usize = 48;
pub const PACKED_FINE_CONSTS_BYTES: usize = 8 * FINE_GROUP_CONSTS_BYTES;
pub const PACKED_FINE_RECORD_BYTES: usize = DECODE_STAGE_BYTES + PACKED_FINE_CONSTS_BYTES;
/// Blocks of 16: one `mma` K step of a record word spans two blocks (lanes `q < 2` and `q >= 2`),
/// so no scaling of the f32 sums can tell them apart; the `decode*_packed_fine16` builds round
/// each weight to T before its `mma`, as `small` does. Word `i` of lane `q` (K `32 i + 8 q`)
/// lies in block `2 i + q / 2` of the chunk: the lanes of one parity `q / 2` need the blocks of
/// that parity. The codes as in [`PACKED_RECORD_BYTES`]'s records, then per lane group `g`
/// [`FINE16_GROUP_CONSTS_BYTES`]: for parity 0 then 1, the scale bits (u16) of word `i` and column
/// `g + 8 u` at `2 (4 i + u)` (32 bytes each: pieces 0-1 and 2-3), then at byte 64 their zero
/// points as nibbles, nibble `4 i + u` of parity `h`'s 8 bytes at `64 + 8 h` (8 when there are
/// none): piece 4, which lane `4 g` copies beside its piece 0.
pub const FINE16_STEP: usize = 16;
pub const FINE16_GROUP_CONSTS_BYTES: usize = 80;
pub const PACKED_FINE16_CONSTS_BYTES: usize = 8 * FINE16_GROUP_CONSTS_BYTES;
pub const PACKED_FINE16_RECORD_BYTES: usize = DECODE_STAGE_BYTES + PACKED_FINE16_CONSTS_BYTES;
/// Smallest block the packed records take.
pub const PACKED_MIN_BLOCK: usize = FINE16_STEP;
/// The K span of one scale in B repacked for blocks of `block_size` (the records' kind): a
/// chunk ([`PACKED_RECORD_BYTES`]), [`FINE_STEP`] (blocks of 32 and 64) or [`FINE16_STEP`].
pub const fn packed_step(block_size: usize) -> usize {
    if block_size >= CHUNK {
        CHUNK
    } else if block_size >= FINE_STEP {
        FINE_STEP
    } else {
        FINE16_STEP
    }
}
/// Bytes of one record of the kind `step` ([`packed_step`]). (A `decode*_packed` stage is a
/// record as it is in memory.)
pub const fn record_bytes(step: usize) -> usize {
    if step >= CHUNK {
        PACKED_RECORD_BYTES
    } else if step >= FINE_STEP {
        PACKED_FINE_RECORD_BYTES
    } else {
        PACKED_FINE16_RECORD_BYTES
    }
}
/// Bytes of one record for blocks of `block_size`.
pub const fn packed_record_bytes(block_size: usize) -> usize {
    record_bytes(packed_step(block_size))
}
/// Dynamic shared memory of a `decode*_packed[_fine|_fine16]` build of `warps` warps over the
/// records of kind `step`: a ring of [`DECODE_STAGES`] records per warp.
pub const fn decode_packed_shared_bytes(warps: usize, step: usize) -> usize {
    warps * DECODE_STAGES * record_bytes(step)
}
/// `decode8_packed_wide`: twice [`DECODE_WARPS`] on the same 32-column block tile, so that a
/// grid of as many tiles runs twice the warps (both entries are capped at 128 registers: 2
/// blocks of 256 threads per SM, against 4 of 128 for `decode8_packed`).
pub const DECODE_WIDE_WARPS: usize = 8;
pub const DECODE_WIDE: Tiling = Tiling { wk: DECODE_WIDE_WARPS, ..DECODE };
pub const DECODE_WIDE_PACKED_SHARED_BYTES: usize = decode_packed_shared_bytes(DECODE_WIDE_WARPS, CHUNK);
/// `decode16_packed_wide`: `decode16_packed` with 6 warps splitting K (192 threads: 2 blocks per
/// SM at its 158 registers, 12 warps where a one-wave grid of `decode16_packed` runs 8).
pub const DECODE16_WIDE_WARPS: usize = 6;
pub const DECODE16_WIDE: Tiling = Tiling { wk: DECODE16_WIDE_WARPS, ..DECODE };
pub const DECODE16_WIDE_PACKED_SHARED_BYTES: usize = decode_packed_shared_bytes(DECODE16_WIDE_WARPS, CHUNK);
/// `packed_wgmma` (Hopper, sm_90a module only; M <= 16 over the `decode*_packed` records): block
/// tile 128 weight columns (the records of [`PACKED_WGMMA_TILES`] 32-column tiles; two
/// warpgroups of 64, `wgmma`'s register operand) x 16 tokens (its shared-memory operand),
/// all of the block's threads on the same K chunks so that each chunk's activations are staged
/// once per block.
pub const PACKED_WGMMA_TILES: usize = 4;
pub const PACKED_WGMMA_COLUMNS: usize = PACKED_WGMMA_TILES * DECODE_COLUMNS;
pub const PACKED_WGMMA_THREADS: usize = 256;
/// Chunks of records in the ring: one being read, three loading.
pub const PACKED_WGMMA_STAGES: usize = 4;
/// Chunks of activations in their ring (a stage is rewritten only once the `wgmma`s of both
/// warpgroups that read it are known complete: see the kernel's docs).
pub const PACKED_WGMMA_ACT_STAGES: usize = 4;
/// A stage's activations: the chunk's 128 permuted K of up to 16 tokens as two 64-K halves,
/// each a 128-byte-swizzle tile of 16 rows of 128 bytes.
pub const PACKED_WGMMA_ACT_HALF_BYTES: usize = 16 * 128;
pub const PACKED_WGMMA_ACT_STAGE_BYTES: usize = 2 * PACKED_WGMMA_ACT_HALF_BYTES;
/// A stage's weights: the block's records of the chunk as they are in memory.
pub const PACKED_WGMMA_CODES_STAGE_BYTES: usize = PACKED_WGMMA_TILES * PACKED_RECORD_BYTES;
/// Dynamic shared memory of `packed_wgmma`: both rings, plus 1 KiB to align them to the swizzle
/// atom.
pub const PACKED_WGMMA_SHARED_BYTES: usize = PACKED_WGMMA_ACT_STAGES * PACKED_WGMMA_ACT_STAGE_BYTES
    + PACKED_WGMMA_STAGES * PACKED_WGMMA_CODES_STAGE_BYTES
    + 1024;
/// Threads per block of `matmul_nbits_pack_decode` (one block per record): one 16-byte piece
/// of the record's codes each.
pub const PACK_THREADS: usize = DECODE_STAGE_BYTES / 16;
/// `large`: warp tile 64 x 32, 2 x 4 warps (block 128 x 128), A staged in shared memory.
pub const LARGE: Tiling = Tiling { mt: 4, nt: 4, wm: 2, wn: 4, wk: 1 };
/// Dynamic shared memory of the `large` variant: one K chunk of its A rows.
pub const LARGE_SHARED_BYTES: usize = LARGE.block_m() * A_ROW_BYTES;

/// `tiled`: warp tile `16 mt` x 32; `wk = 2` pairs of warps split each K chunk's words. Block
/// tiles 32 x 128 and 64 x 128 (M <= 32, <= 64), 128 x 128.
pub const TILED32X128: Tiling = Tiling { mt: 2, nt: 4, wm: 1, wn: 4, wk: 2 };
pub const TILED64X128: Tiling = Tiling { mt: 4, nt: 4, wm: 1, wn: 4, wk: 2 };
pub const TILED128X128: Tiling = Tiling { mt: 4, nt: 4, wm: 2, wn: 4, wk: 1 };
/// K chunks in flight in the `tiled` ring (one being read, the rest loading).
pub const TILED_STAGES: usize = 4;
/// Bytes of one weight column per K chunk (128 codes).
pub const B_CHUNK_BYTES: usize = CHUNK / 2;

/// Dynamic shared memory of a `tiled` kernel: per stage, `block_m` activation rows of
/// [`A_ROW_BYTES`] and `block_n` weight columns of [`B_CHUNK_BYTES`].
pub const fn tiled_shared_bytes(t: Tiling) -> usize {
    TILED_STAGES * tiled_stage_bytes(t)
}

pub const fn tiled_stage_bytes(t: Tiling) -> usize {
    t.block_m() * A_ROW_BYTES + t.block_n() * B_CHUNK_BYTES
}

/// `wgmma` (Hopper, sm_90a module only), operands swapped as in `decode`: block tile 128
/// weight rows (two warpgroups of 64, the register operand) x 128 rows of A (the
/// shared-memory operand), K chunks of 128 through a ring of [`WGMMA_STAGES`].
pub const WGMMA_BM: usize = 128;
pub const WGMMA_BN: usize = 128;
pub const WGMMA_THREADS: usize = 256;
/// Chunks in the ring: one being multiplied, one being dequantized, two loading.
pub const WGMMA_STAGES: usize = 4;
/// A stage's activations: the chunk's 128 permuted K of each row as two 64-K halves, each a
/// 128-byte-swizzle tile of `WGMMA_BM` rows of 128 bytes.
pub const WGMMA_A_HALF_BYTES: usize = WGMMA_BM * 128;
pub const WGMMA_A_STAGE_BYTES: usize = 2 * WGMMA_A_HALF_BYTES;
/// A stage's codes: 64 bytes per weight row.
pub const WGMMA_CODES_STAGE_BYTES: usize = WGMMA_BN * B_CHUNK_BYTES;
/// The ring's barrier objects after it: per stage, one that completes when its activations
/// are in and one when both warpgroups' `wgmma`s have read them (8 bytes each).
pub const WGMMA_RING_BARRIER_BYTES: usize = 2 * WGMMA_STAGES * 8;
/// Dynamic shared memory of `wgmma`: the ring and its barriers, plus 1 KiB to align the ring
/// to the swizzle atom.
pub const WGMMA_SHARED_BYTES: usize =
    WGMMA_STAGES * (WGMMA_A_STAGE_BYTES + WGMMA_CODES_STAGE_BYTES) + WGMMA_RING_BARRIER_BYTES + 1024;

/// `prefill` (Hopper, sm_90a module only): `wgmma`'s operands and K chunks, warp-specialized
/// on a wider tile: a producer warpgroup copies, two consumer warpgroups of 64 weight rows
/// each dequantize and multiply `m64n256k16`, so a block tile is [`PREFILL_BN`] weight rows x
/// [`PREFILL_BM`] rows of A.
pub const PREFILL_BM: usize = 256;
pub const PREFILL_BN: usize = 128;
pub const PREFILL_THREADS: usize = 384;
/// Chunks of activations in the ring (each 64 KiB: three fill most of the shared memory).
pub const PREFILL_STAGES: usize = 3;
/// Chunks of codes in each consumer thread's ring: it refills the slot of the chunk before the
/// one it multiplies with the chunk three ahead.
pub const PREFILL_CODE_SLOTS: usize = 4;
/// A stage's activations: two 64-K halves, each a 128-byte-swizzle tile of `PREFILL_BM` rows.
pub const PREFILL_A_HALF_BYTES: usize = PREFILL_BM * 128;
pub const PREFILL_A_STAGE_BYTES: usize = 2 * PREFILL_A_HALF_BYTES;
/// A code slot: 64 bytes per weight row.
pub const PREFILL_CODES_STAGE_BYTES: usize = PREFILL_BN * B_CHUNK_BYTES;
/// Per stage, an `mbarrier` that completes when its activations have landed and one when the
/// consumers are done with it.
pub const PREFILL_BARRIER_BYTES: usize = 2 * PREFILL_STAGES * 8;
/// Dynamic shared memory of `prefill`: the rings and the barriers, plus 1 KiB to align the
/// ring to the swizzle atom.
pub const PREFILL_SHARED_BYTES: usize = PREFILL_STAGES * PREFILL_A_STAGE_BYTES
    + PREFILL_CODE_SLOTS * PREFILL_CODES_STAGE_BYTES
    + PREFILL_BARRIER_BYTES
    + 1024;
// Hopper's opt-in limit of dynamic shared memory per block (227 KiB).
const _: () = assert!(PREFILL_SHARED_BYTES <= 232_448);

/// Bytes of the permuted activations as `prefill`'s stages (`permute_image`): for each tile
/// of [`PREFILL_BM`] rows of A (rows past M zero) and each K chunk, the
/// [`PREFILL_A_STAGE_BYTES`] that chunk's stage holds, in order, so that one bulk copy fills a
/// stage's activations.
pub const fn prefill_image_bytes(m: usize, k: usize) -> usize {
    m.div_ceil(PREFILL_BM) * k.div_ceil(CHUNK) * PREFILL_A_STAGE_BYTES
}

/// Rows of A that image holds: whole tiles of [`PREFILL_BM`], the rows past M zero, all of
/// which `permute_image` writes.
pub const fn prefill_image_rows(m: usize) -> usize {
    m.div_ceil(PREFILL_BM) * PREFILL_BM
}

/// Byte offset in that image of element `e` (0..128, in the permuted order) of K chunk `chunk`
/// (of `chunks`) of row `row`: its 64-K half's tile, then the 128-byte swizzle of
/// `SharedMatrix::k_major_swizzle128` (16-byte piece `p` of row `r` at piece `p ^ (r % 8)`),
/// which the copy into a 1024-byte-aligned stage keeps.
#[inline(always)]
pub const fn prefill_image_offset(row: usize, chunk: usize, chunks: usize, e: usize) -> usize {
    let (tile, r) = (row / PREFILL_BM, row % PREFILL_BM);
    let (half, piece) = (e / 64, (e % 64) / 8);
    ((tile * chunks + chunk) * 2 + half) * PREFILL_A_HALF_BYTES + r * 128 + 16 * (piece ^ (r % 8)) + 2 * (e % 8)
}

/// `wgmma_streamk` (Hopper): the `wgmma` kernel over a stream-K partition. The grid is a
/// 1-D set of blocks (one per SM), and block `b` of `blocks` takes the iterations
/// `[begin(b), begin(b + 1))` ([`StreamKPartition`]) of the problem's `tiles x chunks`, tile-major
/// (iteration `t * chunks + c` is chunk `c` of tile `t`; tile `t` is column tile `t % tiles_n`,
/// row tile `t / tiles_n`). So every block does the same work whatever the tile count,
/// where whole tiles per block leave part of the last wave idle (224 tiles on 132 SMs: 85% of
/// two waves).
///
/// A tile split between blocks is finished by the block holding its last chunk; each lower
/// block holding a part of it stores its f32 sums into its own slot of the workspace and
/// raises its flag (see [`StreamKBlock`] for why that never waits in a cycle).
pub const WGMMA_STREAMK_SLOT_BYTES: usize = WGMMA_BM * WGMMA_BN * 4;

/// Bytes of the stream-K workspace for `blocks`: a slot of partial sums per block, then a u32
/// flag per block (zeroed before each launch).
pub const fn wgmma_streamk_workspace_bytes(blocks: usize) -> usize {
    blocks * (WGMMA_STREAMK_SLOT_BYTES + 4)
}

/// How `blocks` share `total` iterations of a stream-K grid: `total / blocks` each, and one
/// more for the first `total % blocks` (32 bits: a division of 64-bit values is a subroutine
/// call on the GPU, and its result is no longer known to be uniform across a warp, which took
/// `wgmma`'s descriptors out of the uniform registers; the planner keeps the total below
/// 2^32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamKPartition {
    per_block: u32,
    longer: u32,
}

/// `n` as a divisor, 1 for 0: dividing by a `NonZeroU32` has no panic path (the kernels
/// have none; every divisor here is at least 1 anyway).
#[inline(always)]
fn divisor(n: u32) -> core::num::NonZeroU32 {
    match core::num::NonZeroU32::new(n) {
        Some(d) => d,
        None => core::num::NonZeroU32::MIN,
    }
}

impl StreamKPartition {
    #[inline(always)]
    pub fn new(total: u32, blocks: u32) -> Self {
        StreamKPartition { per_block: total / divisor(blocks), longer: total % divisor(blocks) }
    }

    /// First iteration of `block` (`blocks` gives the total). With `blocks <= total` every
    /// block has at least one iteration.
    #[inline(always)]
    pub const fn begin(self, block: u32) -> u32 {
        block * self.per_block + if block < self.longer { block } else { self.longer }
    }
}

/// One tile's share of a stream-K block's iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamKSegment {
    /// Tile index (column tile fastest): column tile `tile_n`, row tile `tile_m`.
    pub tile: u32,
    pub tile_n: u32,
    pub tile_m: u32,
    /// The tile's chunks `[first, first + chunks)`.
    pub first: u32,
    pub chunks: u32,
    /// The segment holds the tile's last chunk: this block writes the tile's outputs.
    pub finalizes: bool,
    /// The segment holds the tile's first chunk: no lower block has a part of the tile.
    pub starts: bool,
}

/// One stream-K block's iterations, as segments of one tile each, its last tile first:
/// segment `i` is of tile `last_tile - i`.
///
/// Going down the tiles makes the only waits safe and short. A block's first segment is the
/// only one that can end inside a tile (every later one ends where the previous one began, at a
/// tile boundary), so a block publishes at most one partial tile, and it does so before it
/// waits for anything. A block waits only in its last segment (the only one that can begin
/// inside a tile), and only for lower blocks, which reach their first segment's end without
/// waiting: no cycle. In the common case the lower block finished that part at its start, long
/// before.
///
/// Each segment is computed from the block's bounds and its index alone, not stepped from the
/// previous one: values carried around the kernel's outer loop made `ptxas` treat the whole
/// loop as divergent and move `wgmma`'s descriptors out of the uniform registers (30 `R2UR`
/// and 15 more instructions per two chunks).
#[derive(Clone, Copy, Debug)]
pub struct StreamKBlock {
    begin: u32,
    end: u32,
    chunks_per_tile: u32,
    tiles_n: u32,
    last_tile: u32,
    segments: u32,
}

impl StreamKBlock {
    /// Block `block` of a grid partitioned as `partition`, for tiles of `chunks_per_tile`
    /// chunks, `tiles_n` column tiles per row tile.
    #[inline(always)]
    pub fn new(partition: StreamKPartition, block: u32, chunks_per_tile: u32, tiles_n: u32) -> Self {
        let (begin, end) = (partition.begin(block), partition.begin(block + 1));
        let (last_tile, segments) = if end > begin {
            let last_tile = (end - 1) / divisor(chunks_per_tile);
            (last_tile, last_tile - begin / divisor(chunks_per_tile) + 1)
        } else {
            (0, 0)
        };
        StreamKBlock { begin, end, chunks_per_tile, tiles_n, last_tile, segments }
    }

    pub const fn segments(&self) -> u32 {
        self.segments
    }

    /// Segment `i` (below [`Self::segments`]).
    #[inline(always)]
    pub fn segment(&self, i: u32) -> StreamKSegment {
        let tile = self.last_tile - i;
        let tile_begin = tile * self.chunks_per_tile;
        let tile_end = tile_begin + self.chunks_per_tile;
        let first = if self.begin > tile_begin { self.begin } else { tile_begin };
        let end = if self.end < tile_end { self.end } else { tile_end };
        StreamKSegment {
            tile,
            tile_n: tile % divisor(self.tiles_n),
            tile_m: tile / divisor(self.tiles_n),
            first: first - tile_begin,
            chunks: end - first,
            finalizes: end == tile_end,
            starts: first == tile_begin,
        }
    }
}

/// Threads per block of `matmul_nbits_permute_*` (one 8-element word of A each).
pub const PERMUTE_THREADS: usize = 256;
/// Smallest block size `tiled` takes: each lane's 32 codes of a chunk then lie in one block.
pub const TILED_MIN_BLOCK: usize = 32;

/// Threads per block of `matmul_nbits_reduce_*` (one output element each).
pub const REDUCE_THREADS: usize = 256;
/// Threads per block of `matmul_nbits_cook_consts_*` (one (weight row, block) each).
pub const COOK_THREADS: usize = 256;

/// `prefill_any` reads its dequantization constants cooked once per call
/// (`matmul_nbits_cook_consts_*`) rather than per chunk: per (weight row, block), a 32-bit word
/// (the scale's bits in the low half, in the high half the bits of the addend its
/// dequantization's `fma` takes: `-(z - zi) * scale` in A's type, -0 for integer zero points)
/// and a byte (`zi`: the zero point, or for one in A's type the nearest code to it, 0..=15),
/// both `[N, k_blocks]`: the words first, then the bytes, each a multiple of 256 bytes.
pub const fn cooked_consts_bytes(n: usize, k_blocks: usize) -> usize {
    cooked_zero_offset(n, k_blocks) + (n * k_blocks).next_multiple_of(256)
}
/// Offset of the bytes in [`cooked_consts_bytes`]'s layout.
pub const fn cooked_zero_offset(n: usize, k_blocks: usize) -> usize {
    (4 * n * k_blocks).next_multiple_of(256)
}

/// `flags` bits.
pub const FLAG_ZERO_U8: u32 = 1;
pub const FLAG_ZERO_T: u32 = 2;
pub const FLAG_BIAS: u32 = 4;
/// Rows of `b` start on 16-byte boundaries (and `b` is 16-byte aligned).
pub const FLAG_B_VEC16: u32 = 8;
/// `K % 8 == 0` and `a` is 16-byte aligned: 16-byte activation loads.
pub const FLAG_A_VEC16: u32 = 16;
/// `b`, the scales and the zero points were in place when the grid before this one in the
/// stream started, and that grid does not write them (a model's constants): launched as a
/// programmatic dependent, the `decode` kernels copy their first chunks of them before they
/// wait for that grid.
pub const FLAG_WEIGHTS_READY: u32 = 32;
/// The `decode` kernels let the next grid of the stream start (`griddepcontrol.launch_dependents`)
/// as soon as each block is past its wait for the previous grid; without it the next grid
/// starts as this one's blocks exit. The host sets it where this grid's blocks leave few
/// resident slots free (see `early_dependents` in the launcher).
pub const FLAG_EARLY_DEPENDENTS: u32 = 64;
/// Most K splits the `decode` kernels of the sm_90a module sum in a cluster (the portable
/// cluster size): launched in clusters of `(1, 1, splits)`, the splits of a tile sum through
/// distributed shared memory and the first stores y, so no partial sums reach the workspace
/// and no reduction kernel runs.
pub const MAX_CLUSTER_SPLITS: usize = 8;

/// Scalar arguments. The host launcher passes this very type.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Dims {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub k_blocks: u32,
    /// log2(block_size).
    pub block_shift: u32,
    /// Bytes per row of `b`: `k_blocks * block_size / 2`.
    pub row_bytes: u32,
    pub chunks_per_split: u32,
    pub flags: u32,
}

/// The element type of a kernel build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementType {
    F16,
    Bf16,
}

/// The family's kernels that have an f16 and a bf16 build, by kind. The first
/// [`PORTABLE_ENTRY_KINDS`] are in every module; the rest, the `wgmma` kernels, only in the
/// sm_90a one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Decode8,
    Decode8Ahead3,
    Decode16,
    Decode8Packed,
    Decode8PackedWide,
    Decode16Packed,
    Decode16PackedWide,
    Decode8PackedFine,
    Decode8PackedWideFine,
    Decode16PackedFine,
    Decode16PackedWideFine,
    Decode8PackedFine16,
    Decode8PackedWideFine16,
    Decode16PackedFine16,
    Decode16PackedWideFine16,
    Small,
    SmallZf,
    Large,
    LargeZf,
    Tiled32x128,
    Tiled64x128,
    Tiled128x128,
    Permute,
    Reduce,
    Wgmma,
    WgmmaPair,
    WgmmaStreamK,
    PackedWgmma16,
    Prefill,
    PermuteImage,
    WgmmaAny,
    WgmmaPairAny,
    WgmmaStreamKAny,
    PrefillAny,
    CookConsts,
}

/// How many [`Entry`] kinds, from the first, every module has.
pub const PORTABLE_ENTRY_KINDS: usize = Entry::Wgmma as usize;

impl Entry {
    /// The entry point of the build for `t`: `matmul_nbits_<variant>_<dtype>`, e.g.
    /// `matmul_nbits_decode8_f16`.
    pub const fn name(self, t: ElementType) -> &'static str {
        TYPED_ENTRIES[self as usize][t as usize]
    }
}

/// The `[f16, bf16]` entry points of each [`Entry`], in its order. The device crate cannot
/// make a kernel's symbol from a string, so its entries (`matmul_nbits/mod.rs`) spell these
/// names again; the tests check that the PTX has exactly [`ENTRIES`] and [`HOPPER_ENTRIES`].
const TYPED_ENTRIES: [[&str; 2]; 35] = [
    ["matmul_nbits_decode8_f16", "matmul_nbits_decode8_bf16"],
    ["matmul_nbits_decode8_ahead3_f16", "matmul_nbits_decode8_ahead3_bf16"],
    ["matmul_nbits_decode16_f16", "matmul_nbits_decode16_bf16"],
    ["matmul_nbits_decode8_packed_f16", "matmul_nbits_decode8_packed_bf16"],
    ["matmul_nbits_decode8_packed_wide_f16", "matmul_nbits_decode8_packed_wide_bf16"],
    ["matmul_nbits_decode16_packed_f16", "matmul_nbits_decode16_packed_bf16"],
    ["matmul_nbits_decode16_packed_wide_f16", "matmul_nbits_decode16_packed_wide_bf16"],
    ["matmul_nbits_decode8_packed_fine_f16", "matmul_nbits_decode8_packed_fine_bf16"],
    ["matmul_nbits_decode8_packed_wide_fine_f16", "matmul_nbits_decode8_packed_wide_fine_bf16"],
    ["matmul_nbits_decode16_packed_fine_f16", "matmul_nbits_decode16_packed_fine_bf16"],
    ["matmul_nbits_decode16_packed_wide_fine_f16", "matmul_nbits_decode16_packed_wide_fine_bf16"],
    ["matmul_nbits_decode8_packed_fine16_f16", "matmul_nbits_decode8_packed_fine16_bf16"],
    ["matmul_nbits_decode8_packed_wide_fine16_f16", "matmul_nbits_decode8_packed_wide_fine16_bf16"],
    ["matmul_nbits_decode16_packed_fine16_f16", "matmul_nbits_decode16_packed_fine16_bf16"],
    ["matmul_nbits_decode16_packed_wide_fine16_f16", "matmul_nbits_decode16_packed_wide_fine16_bf16"],
    ["matmul_nbits_small_f16", "matmul_nbits_small_bf16"],
    ["matmul_nbits_small_zf_f16", "matmul_nbits_small_zf_bf16"],
    ["matmul_nbits_large_f16", "matmul_nbits_large_bf16"],
    ["matmul_nbits_large_zf_f16", "matmul_nbits_large_zf_bf16"],
    ["matmul_nbits_tiled32x128_f16", "matmul_nbits_tiled32x128_bf16"],
    ["matmul_nbits_tiled64x128_f16", "matmul_nbits_tiled64x128_bf16"],
    ["matmul_nbits_tiled128x128_f16", "matmul_nbits_tiled128x128_bf16"],
    ["matmul_nbits_permute_f16", "matmul_nbits_permute_bf16"],
    ["matmul_nbits_reduce_f16", "matmul_nbits_reduce_bf16"],
    ["matmul_nbits_wgmma_f16", "matmul_nbits_wgmma_bf16"],
    ["matmul_nbits_wgmma_pair_f16", "matmul_nbits_wgmma_pair_bf16"],
    ["matmul_nbits_wgmma_streamk_f16", "matmul_nbits_wgmma_streamk_bf16"],
    ["matmul_nbits_packed_wgmma16_f16", "matmul_nbits_packed_wgmma16_bf16"],
    ["matmul_nbits_prefill_f16", "matmul_nbits_prefill_bf16"],
    ["matmul_nbits_permute_image_f16", "matmul_nbits_permute_image_bf16"],
    ["matmul_nbits_wgmma_any_f16", "matmul_nbits_wgmma_any_bf16"],
    ["matmul_nbits_wgmma_pair_any_f16", "matmul_nbits_wgmma_pair_any_bf16"],
    ["matmul_nbits_wgmma_streamk_any_f16", "matmul_nbits_wgmma_streamk_any_bf16"],
    ["matmul_nbits_prefill_any_f16", "matmul_nbits_prefill_any_bf16"],
    ["matmul_nbits_cook_consts_f16", "matmul_nbits_cook_consts_bf16"],
];

/// The repacker's entry point (one for every element type).
pub const PACK_DECODE_ENTRY: &str = "matmul_nbits_pack_decode";

/// Every entry point of the family that every module (sm_80 and sm_90a) ships.
pub const ENTRIES: &[&str] = &PORTABLE_ENTRIES;
/// The entry points that only the sm_90a module ships (on top of [`ENTRIES`]).
pub const HOPPER_ENTRIES: &[&str] = &ARCH_SPECIFIC_ENTRIES;

const PORTABLE_ENTRIES: [&str; 2 * PORTABLE_ENTRY_KINDS + 1] =
    entry_list(0, PORTABLE_ENTRY_KINDS, Some(PACK_DECODE_ENTRY));
const ARCH_SPECIFIC_ENTRIES: [&str; 2 * (TYPED_ENTRIES.len() - PORTABLE_ENTRY_KINDS)] =
    entry_list(PORTABLE_ENTRY_KINDS, TYPED_ENTRIES.len(), None);

/// The entries of kinds `from..to`, f16 and bf16 of each, then `extra`.
const fn entry_list<const N: usize>(from: usize, to: usize, extra: Option<&'static str>) -> [&'static str; N] {
    let mut out = [""; N];
    let mut n = 0;
    let mut kind = from;
    while kind < to {
        out[n] = TYPED_ENTRIES[kind][0];
        out[n + 1] = TYPED_ENTRIES[kind][1];
        n += 2;
        kind += 1;
    }
    if let Some(name) = extra {
        out[n] = name;
        n += 1;
    }
    assert!(n == N);
    out
}
