//! Device-module self-tests on the GPU: the `mma.sync` fragment layouts as loaded by `cp.async`
//! and `ldmatrix` (all four variants) and the fast-math instructions, against CPU references;
//! and the read-only ceiling kernel of the benches, which must read every byte. The probe
//! kernels are in PTX modules of their own (`common/probe.rs`), not in the library's.

mod common;
#[path = "common/probe.rs"]
mod probe;

use std::sync::Arc;

use common::{Rng, gpu};
use cudarc::driver::CudaStream;
use half::{bf16, f16};
use probe::{
    MmaProbe, Probes, STREAM_READ_THREADS, StreamReadOrder, StreamReadPlan, fast_math, mma, stream_read,
    stream_read_constant, stream_read_wave,
};

const TILES: usize = 7;

/// The GPU with the probe module, and a stream.
fn gpu_probes() -> (Probes, Arc<CudaStream>) {
    let (device, stream) = gpu();
    (Probes::new(&device).expect("the probe module for this GPU"), stream)
}

/// f32 accumulation of 16 exact products: error bounded by k * 2^-24 * sum|a*b|.
fn check_f32_tile(what: &str, got: &[f32], a: &[f64], b_nt: &[f64], tile: usize) {
    let expected = matmul_nt(a, b_nt, 16, 8, 16);
    let magnitude = matmul_nt(
        &a.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        &b_nt.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        16,
        8,
        16,
    );
    for i in 0..128 {
        let bound = 16.0 * f32::EPSILON as f64 * magnitude[i] + 1e-30;
        assert!(
            (got[i] as f64 - expected[i]).abs() <= bound,
            "{what} tile {tile} element ({}, {}): {} vs {}",
            i / 8,
            i % 8,
            got[i],
            expected[i]
        );
    }
}

fn run_16bit<T: dlkern::Element>(probe: MmaProbe, seed: u64) {
    let (probes, stream) = gpu_probes();
    let mut rng = Rng::new(seed);
    let a: Vec<T> = rng.vec(TILES * 256, -2.0, 2.0);
    let b: Vec<T> = rng.vec(TILES * 128, -2.0, 2.0);
    let a_dev = stream.clone_htod(&a).unwrap();
    let b_dev = stream.clone_htod(&b).unwrap();
    let mut c_dev = stream.clone_htod(&vec![f32::NAN; TILES * 128]).unwrap();
    mma(&probes, &stream, probe, &a_dev, &b_dev, &mut c_dev, TILES).unwrap();
    let c: Vec<f32> = stream.clone_dtoh(&c_dev).unwrap();
    for t in 0..TILES {
        let a64: Vec<f64> = a[t * 256..(t + 1) * 256].iter().map(|v| v.to_f64()).collect();
        let b_tile: Vec<f64> = b[t * 128..(t + 1) * 128].iter().map(|v| v.to_f64()).collect();
        // B is n-major [8][16], or k-major [16][8] for the ldmatrix.trans probe.
        let b_nt: Vec<f64> = if probe == MmaProbe::F16KMajorB {
            (0..8).flat_map(|n| (0..16).map(move |k| (n, k))).map(|(n, k)| b_tile[k * 8 + n]).collect()
        } else {
            b_tile
        };
        check_f32_tile(&format!("{probe:?}"), &c[t * 128..(t + 1) * 128], &a64, &b_nt, t);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn mma_f16_matches_reference() {
    run_16bit::<f16>(MmaProbe::F16, 1);
}

#[test]
#[ignore = "needs a CUDA device"]
fn mma_bf16_matches_reference() {
    run_16bit::<bf16>(MmaProbe::Bf16, 2);
}

#[test]
#[ignore = "needs a CUDA device"]
fn mma_f16_with_k_major_b_matches_reference() {
    run_16bit::<f16>(MmaProbe::F16KMajorB, 3);
}

#[test]
#[ignore = "needs a CUDA device"]
fn mma_s8_is_exact_including_extremes() {
    let (probes, stream) = gpu_probes();
    let mut rng = Rng::new(4);
    let mut a = rng.vec_i8(TILES * 512);
    let mut b = rng.vec_i8(TILES * 256);
    // Tile 0 at the extremes: every product is (-128)*(-128), the largest int8 product.
    a[..512].fill(-128);
    b[..256].fill(-128);
    let a_dev = stream.clone_htod(&a).unwrap();
    let b_dev = stream.clone_htod(&b).unwrap();
    let mut c_dev = stream.clone_htod(&vec![i32::MIN; TILES * 128]).unwrap();
    mma(&probes, &stream, MmaProbe::S8, &a_dev, &b_dev, &mut c_dev, TILES).unwrap();
    let c: Vec<i32> = stream.clone_dtoh(&c_dev).unwrap();
    for t in 0..TILES {
        let expected = matmul_nt_i8(&a[t * 512..(t + 1) * 512], &b[t * 256..(t + 1) * 256], 16, 8, 32);
        let got: Vec<i64> = c[t * 128..(t + 1) * 128].iter().map(|&v| v as i64).collect();
        assert_eq!(got, expected, "tile {t}");
    }
    assert_eq!(c[0], 32 * 128 * 128);
}

#[test]
#[ignore = "needs a CUDA device"]
fn mma_probe_rejects_wrong_element_sizes() {
    let (probes, stream) = gpu_probes();
    let a = stream.alloc_zeros::<f32>(256).unwrap();
    let mut c = stream.alloc_zeros::<f32>(128).unwrap();
    let err = mma(&probes, &stream, MmaProbe::F16, &a, &a, &mut c, 1).unwrap_err();
    assert!(err.to_string().contains("2-byte inputs"), "{err}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn fast_math_is_within_its_documented_error() {
    let (probes, stream) = gpu_probes();
    let mut rng = Rng::new(9);
    let x: Vec<f32> = (0..10_000).map(|_| rng.uniform(-20.0, 20.0) as f32).filter(|v| v.abs() > 1e-3).collect();
    let positive: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let x_dev = stream.clone_htod(&x).unwrap();
    let p_dev = stream.clone_htod(&positive).unwrap();
    let n = x.len();
    let mut e = stream.alloc_zeros::<f32>(n).unwrap();
    let mut r = stream.alloc_zeros::<f32>(n).unwrap();
    let mut s = stream.alloc_zeros::<f32>(n).unwrap();
    fast_math(&probes, &stream, &x_dev, &mut e, &mut r, &mut s).unwrap();
    let (exp2, recip) = (stream.clone_dtoh(&e).unwrap(), stream.clone_dtoh(&r).unwrap());
    fast_math(&probes, &stream, &p_dev, &mut e, &mut r, &mut s).unwrap();
    let rsqrt = stream.clone_dtoh(&s).unwrap();
    let rel = |got: f32, want: f64| ((got as f64 - want) / want).abs();
    for i in 0..n {
        let v = x[i] as f64;
        assert!(rel(exp2[i], v.exp2()) < 2f64.powi(-21), "ex2({v}) = {}", exp2[i]);
        assert!(rel(recip[i], 1.0 / v) < 2f64.powi(-22), "rcp({v}) = {}", recip[i]);
        let p = positive[i] as f64;
        assert!(rel(rsqrt[i], 1.0 / p.sqrt()) < 2f64.powi(-21), "rsqrt({p}) = {}", rsqrt[i]);
    }
}

/// XOR of the first `words` words the kernel left in `out`.
fn folded(out: &[u32], words: usize) -> u32 {
    out[..words].iter().fold(0, |acc, w| acc ^ w)
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_stream_read_reads_every_word() {
    let (probes, stream) = gpu_probes();
    let wave = stream_read_wave(&probes).unwrap();
    let mut rng = Rng::new(21);
    // One vector; a count off every step and block boundary; two whole steps per block of a
    // wave; a W4-sized buffer (in a wave only: the sanitizers run this test too).
    for bytes in [16usize, 16 * 1001, 16 * 2048 * 2 * wave as usize, 34_603_008] {
        let host: Vec<u8> = (0..bytes).map(|_| rng.uniform(0.0, 256.0) as u8).collect();
        let src = stream.clone_htod(&host).unwrap();
        let block_counts = if bytes > 1 << 24 { vec![wave] } else { vec![1, 3, wave] };
        for blocks in block_counts {
            let plan = StreamReadPlan::new(bytes, blocks).unwrap();
            for order in [0, 1, 2, 3, 4] {
                // Words the kernel must overwrite, each of them, or the XOR comes out wrong.
                let junk: Vec<u32> =
                    (0..plan.out_words + 1).map(|i| 0x9e37_79b9u32.wrapping_mul(i as u32 + 1)).collect();
                let mut out = stream.clone_htod(&junk).unwrap();
                match order {
                    0 => stream_read(&probes, &stream, &src, &mut out, blocks, StreamReadOrder::Serialized).unwrap(),
                    1 | 2 => {
                        let order = StreamReadOrder::Overlapped { early_dependents: order == 2 };
                        stream_read(&probes, &stream, &src, &mut out, blocks, order).unwrap()
                    }
                    // SAFETY: nothing writes `src` after its upload.
                    _ => unsafe { stream_read_constant(&probes, &stream, &src, &mut out, blocks, order == 4) }.unwrap(),
                }
                let got: Vec<u32> = stream.clone_dtoh(&out).unwrap();
                assert_eq!(
                    folded(&got, plan.out_words),
                    xor_words(&host),
                    "{bytes} bytes, {blocks} blocks, order {order}"
                );
                assert_eq!(got[plan.out_words], junk[plan.out_words], "wrote past its words");
            }
        }
    }
}

/// A chain of launches into the same output, each reading before its wait: every launch's
/// words come after the one before it, so the output is the last launch's.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_stream_read_chain_keeps_the_last_result() {
    let (probes, stream) = gpu_probes();
    let wave = stream_read_wave(&probes).unwrap();
    let bytes = 4 << 20;
    let hosts: Vec<Vec<u8>> =
        (0..3u8).map(|c| (0..bytes).map(|i| (i * 131) as u8 ^ c.wrapping_mul(77)).collect()).collect();
    let srcs: Vec<_> = hosts.iter().map(|h| stream.clone_htod(h).unwrap()).collect();
    let plan = StreamReadPlan::new(bytes, wave).unwrap();
    let mut out = stream.alloc_zeros::<u32>(plan.out_words).unwrap();
    for early in [false, true] {
        for last in 0..3 {
            for i in 0..=last {
                // SAFETY: nothing writes the sources after their upload.
                unsafe { stream_read_constant(&probes, &stream, &srcs[i % 3], &mut out, wave, early) }.unwrap();
            }
            let got: Vec<u32> = stream.clone_dtoh(&out).unwrap();
            assert_eq!(
                folded(&got, plan.out_words),
                xor_words(&hosts[last % 3]),
                "early {early}, {} launches",
                last + 1
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_stream_read_rejects_bad_buffers() {
    let (probes, stream) = gpu_probes();
    let src = stream.alloc_zeros::<u8>(4096).unwrap();
    let mut small = stream.alloc_zeros::<u32>(7).unwrap();
    let err = stream_read(&probes, &stream, &src, &mut small, 1, StreamReadOrder::Serialized).unwrap_err();
    assert!(err.to_string().contains("out"), "{err}");
    let odd = stream.alloc_zeros::<u8>(4100).unwrap();
    let mut out = stream.alloc_zeros::<u32>(8).unwrap();
    let err = stream_read(&probes, &stream, &odd, &mut out, 1, StreamReadOrder::Serialized).unwrap_err();
    assert!(err.to_string().contains("multiple of 16"), "{err}");
}

#[test]
fn stream_read_plan_covers_every_vector_in_whole_steps() {
    let step = (STREAM_READ_THREADS * probe::layout::STREAM_READ_UNROLL) as usize;
    let cases = [(16, 1), (16 * 1001, 3), (34_603_008, 1056), (121_110_528, 528), (16 << 20, 7), (1 << 35, 1 << 16)];
    for (bytes, blocks) in cases {
        let plan = StreamReadPlan::new(bytes, blocks).unwrap();
        assert_eq!(plan.vectors as usize * 16, bytes);
        assert!((plan.per_block as usize).is_multiple_of(step) && plan.per_block > 0);
        // Every vector lies in some block, the shares are even up to a step (trailing
        // blocks may read nothing), and the blocks' spans stay below 2^32.
        assert!(plan.blocks as u64 * plan.per_block as u64 >= plan.vectors as u64);
        assert!((plan.per_block as usize) < (plan.vectors as usize).div_ceil(blocks as usize) + step);
        assert!((plan.blocks as u64 * plan.per_block as u64) < 1 << 32);
        assert_eq!(plan.out_words, blocks as usize * 8);
    }
}

#[test]
fn stream_read_plan_rejects_bad_sizes() {
    for (bytes, blocks, what) in [
        (0, 1, "nonzero"),
        (24, 1, "multiple of 16"),
        ((1 << 35) + 16, 1, "2^35"),
        (16, 0, "blocks"),
        (16, (1 << 16) + 1, "blocks"),
    ] {
        let err = StreamReadPlan::new(bytes, blocks).unwrap_err().to_string();
        assert!(err.contains(what), "{bytes} bytes, {blocks} blocks: {err}");
    }
}

// The probes' oracles.

/// `C[m][n] = sum_k A[m][k] * B[n][k]` (B given n-major, "NT") in f64.
fn matmul_nt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
        }
    }
    c
}

/// `C[m][n] = sum_k A[m][k] * B[n][k]` in exact integer arithmetic (i64, so no overflow for
/// any int8 inputs with k < 2^48).
fn matmul_nt_i8(a: &[i8], b: &[i8], m: usize, n: usize, k: usize) -> Vec<i64> {
    let mut c = vec![0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] as i64 * b[j * k + p] as i64).sum();
        }
    }
    c
}

/// The XOR of `bytes`' little-endian 32-bit words (`bytes.len() % 4 == 0`): what
/// `probe_stream_read` leaves in its output.
fn xor_words(bytes: &[u8]) -> u32 {
    bytes.chunks_exact(4).fold(0, |acc, w| acc ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// One TMA copy per case through a tensor map passed as the kernel's first parameter: the box
/// lands in shared memory swizzled as the map says, with zeros wherever it leaves the tensor
/// (past either end of any dimension, including rows that lie in memory but outside the map's
/// extent: how a KV cache's unused rows must read).
#[test]
#[ignore = "needs a CUDA device"]
fn tma_box_lands_swizzled_with_zeros_outside_the_tensor() {
    use cudarc::driver::DevicePtr;
    use dlkern::runtime::tensor_map::{MapElement, MapSwizzle, TensorMap, TiledTensor};
    let (probes, stream) = gpu_probes();
    if !probes.device().has_wgmma() {
        eprintln!("skipped: the TMA probe is in the sm_90a module, and this GPU is not Hopper");
        return;
    }
    // Every element distinct and nonzero: element i of the allocation holds i + 1.
    let (cols, rows, planes, padded_rows) = (136usize, 97usize, 5usize, 100usize);
    let total = cols * padded_rows * planes;
    let host: Vec<u16> = (0..total).map(|i| (i % 65535 + 1) as u16).collect();
    let src = stream.clone_htod(&host).unwrap();
    let (address, _src) = src.device_ptr(&stream);
    struct Case {
        dims: Vec<u64>,
        strides: Vec<u64>,
        box_dims: Vec<u32>,
        swizzle: MapSwizzle,
        coords: Vec<i32>,
    }
    let row = (cols * 2) as u64;
    let plane = row * padded_rows as u64;
    let two_d = |swizzle, box_dims: [u32; 2], coords: [i32; 2]| Case {
        dims: vec![cols as u64, rows as u64],
        strides: vec![row],
        box_dims: box_dims.to_vec(),
        swizzle,
        coords: coords.to_vec(),
    };
    let cases = [
        two_d(MapSwizzle::Bytes128, [64, 32], [0, 0]),
        two_d(MapSwizzle::Bytes128, [64, 32], [64, 80]), // rows past the end
        two_d(MapSwizzle::Bytes128, [64, 32], [128, 16]), // columns past the end
        two_d(MapSwizzle::Bytes128, [64, 128], [-8, -3]), // before the start, 128 rows (a K tile)
        two_d(MapSwizzle::Bytes64, [32, 16], [40, 7]),
        two_d(MapSwizzle::None, [8, 8], [128, 96]),
        // A cache-like layout: planes of `rows` rows, each padded to `padded_rows` in memory.
        Case {
            dims: vec![cols as u64, rows as u64, planes as u64],
            strides: vec![row, plane],
            box_dims: vec![64, 32, 1],
            swizzle: MapSwizzle::Bytes128,
            coords: vec![64, 80, 3],
        },
    ];
    for element in [MapElement::F16, MapElement::Bf16] {
        for case in &cases {
            let tensor = TiledTensor {
                element,
                address,
                dims: &case.dims,
                strides: &case.strides,
                box_dims: &case.box_dims,
                swizzle: case.swizzle,
            };
            let map = TensorMap::tiled("probe_tma_load", &tensor).unwrap();
            let box_elems: usize = case.box_dims.iter().map(|&b| b as usize).product();
            let box_bytes = box_elems * 2;
            let what = format!("{element:?} box {:?} at {:?}, {:?}", case.box_dims, case.coords, case.swizzle);
            let got = probe::tma_load(&probes, &stream, &map, &case.coords, box_bytes)
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .unwrap_or_else(|| panic!("{what}: the copy did not land within the probe's wait"));
            let mut want = vec![0u8; box_bytes];
            let (b0, b1) = (case.box_dims[0] as usize, case.box_dims[1] as usize);
            for e in 0..box_elems {
                let (c, r, p) = (e % b0, (e / b0) % b1, e / (b0 * b1));
                let x = case.coords[0] as i64 + c as i64;
                let y = case.coords[1] as i64 + r as i64;
                let z = case.coords.get(2).map_or(0, |&z| z as i64) + p as i64;
                let inside = x >= 0
                    && (x as u64) < case.dims[0]
                    && y >= 0
                    && (y as u64) < case.dims[1]
                    && z >= 0
                    && (z as u64) < case.dims.get(2).copied().unwrap_or(1);
                let value =
                    if inside { host[z as usize * cols * padded_rows + y as usize * cols + x as usize] } else { 0 };
                let at = case.swizzle.apply((e * 2) as u64) as usize;
                want[at..at + 2].copy_from_slice(&value.to_le_bytes());
            }
            if let Some(i) = (0..box_bytes).step_by(2).find(|&i| got.bytes[i..i + 2] != want[i..i + 2]) {
                panic!(
                    "{what}: shared byte {i} holds {:?}, expected {:?} ({} polls)",
                    &got.bytes[i..i + 2],
                    &want[i..i + 2],
                    got.polls
                );
            }
        }
    }
}
