//! The attention registry kernels (`dlkern.attention`, `dlkern.attention_lse`) on CPU tensors:
//! padded and packed layouts give the same result, options reach the computation, the
//! log-sum-exp has the documented layout, inference sizes the outputs, and bad inputs are
//! refused with errors that name the problem.

mod common;

use common::{Host, Rng};
use dlkern::dlpack::DLTensor;
use dlkern::ops::attention::reference::{AttentionOptions, attention_varlen};
use dlkern::registry::{self, AttrValue, Attributes};
use half::f16;
use proptest::prelude::*;

struct Case {
    batch: usize,
    sq: usize,
    sk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn case(batch: usize, sq: usize, sk: usize, heads: usize, kv_heads: usize, d: usize, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let mut fill = |n: usize| (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<f32>>();
    let (q, k, v) = (fill(batch * sq * heads * d), fill(batch * sk * kv_heads * d), fill(batch * sk * kv_heads * d));
    Case { batch, sq, sk, heads, kv_heads, d, q, k, v }
}

fn call(name: &str, tensors: &mut [DLTensor], inputs: usize, attrs: &Attributes) -> Result<(), String> {
    // SAFETY: host tensors alive for the call.
    unsafe { registry::call(name, tensors, inputs, std::ptr::null_mut(), attrs) }.map_err(|e| e.to_string())
}

impl Case {
    /// Padded layout through `dlkern.attention_lse`: (out, lse [B, H, Sq]).
    fn padded(&self, attrs: &Attributes) -> Result<(Vec<f32>, Vec<f32>), String> {
        let (b, sq, sk, h, hkv, d) =
            (self.batch as i64, self.sq as i64, self.sk as i64, self.heads as i64, self.kv_heads as i64, self.d as i64);
        let mut q = Host::new(self.q.clone(), &[b, sq, h, d]);
        let mut k = Host::new(self.k.clone(), &[b, sk, hkv, d]);
        let mut v = Host::new(self.v.clone(), &[b, sk, hkv, d]);
        let mut out = Host::new(vec![f32::NAN; self.q.len()], &[b, sq, h, d]);
        let mut lse = Host::new(vec![f32::NAN; (b * h * sq) as usize], &[b, h, sq]);
        call("dlkern.attention_lse", &mut [q.dl(), k.dl(), v.dl(), out.dl(), lse.dl()], 3, attrs)?;
        Ok((out.data, lse.data))
    }

    /// The same batch packed (`[total, H, D]` with cumulative lengths): (out, lse [H, total_q]).
    fn packed(&self, attrs: &Attributes) -> Result<(Vec<f32>, Vec<f32>), String> {
        let (b, h, hkv, d) = (self.batch, self.heads as i64, self.kv_heads as i64, self.d as i64);
        let (tq, tk) = ((b * self.sq) as i64, (b * self.sk) as i64);
        let mut q = Host::new(self.q.clone(), &[tq, h, d]);
        let mut k = Host::new(self.k.clone(), &[tk, hkv, d]);
        let mut v = Host::new(self.v.clone(), &[tk, hkv, d]);
        let mut cu_q = Host::new((0..=b).map(|i| (i * self.sq) as i32).collect(), &[b as i64 + 1]);
        let mut cu_k = Host::new((0..=b).map(|i| (i * self.sk) as i32).collect(), &[b as i64 + 1]);
        let mut out = Host::new(vec![f32::NAN; self.q.len()], &[tq, h, d]);
        let mut lse = Host::new(vec![f32::NAN; (h * tq) as usize], &[h, tq]);
        call(
            "dlkern.attention_lse",
            &mut [q.dl(), k.dl(), v.dl(), cu_q.dl(), cu_k.dl(), out.dl(), lse.dl()],
            5,
            attrs,
        )?;
        Ok((out.data, lse.data))
    }
}

fn attrs(causal: bool) -> Attributes {
    Attributes::new().with("causal", AttrValue::Int(causal as i64))
}

#[test]
fn padded_matches_the_reference_and_the_packed_layout() {
    // GQA 4, chunked-prefill causal (Sk > Sq), head dim 80, a window and a cap.
    let c = case(2, 5, 9, 8, 2, 80, 1);
    let a = attrs(true).with("softcap", AttrValue::Float(5.0)).with("window_left", AttrValue::Int(6));
    let (out, lse) = c.padded(&a).unwrap();
    let (out_p, lse_p) = c.packed(&a).unwrap();
    assert_eq!(out, out_p, "same batch, same math");
    let cu_q: Vec<usize> = (0..=2).map(|i| i * 5).collect();
    let cu_k: Vec<usize> = (0..=2).map(|i| i * 9).collect();
    let opts = AttentionOptions {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 80,
        causal: true,
        scale: 1.0 / 80f64.sqrt(),
        softcap: 5.0,
        window_left: Some(6),
    };
    let (want, want_lse) = attention_varlen(&c.q, &c.k, &c.v, &cu_q, &cu_k, &opts);
    for (g, w) in out.iter().zip(&want) {
        assert_eq!(*g, *w as f32);
    }
    // lse: [B, H, Sq] padded, [H, total_q] packed (the reference's).
    for (g, w) in lse_p.iter().zip(&want_lse) {
        assert_eq!(*g, *w as f32);
    }
    for (b, h, i) in [(0, 0, 0), (1, 7, 4), (1, 3, 2)] {
        assert_eq!(lse[(b * 8 + h) * 5 + i], lse_p[h * 10 + b * 5 + i]);
    }
}

#[test]
fn scale_attribute_and_f16_inputs() {
    let c = case(1, 3, 3, 2, 2, 64, 2);
    // scale 0 means 1/sqrt(D); an explicit scale is used as given.
    let (default, _) = c.padded(&attrs(false)).unwrap();
    let (same, _) = c.padded(&attrs(false).with("scale", AttrValue::Float(0.125))).unwrap();
    assert_eq!(default, same);
    let (other, _) = c.padded(&attrs(false).with("scale", AttrValue::Float(1.0))).unwrap();
    assert_ne!(default, other);
    // f16 tensors through dlkern.attention (one output), matching the f32 run within f16 rounding.
    let to16 = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>();
    let mut q = Host::new(to16(&c.q), &[1, 3, 2, 64]);
    let mut k = Host::new(to16(&c.k), &[1, 3, 2, 64]);
    let mut v = Host::new(to16(&c.v), &[1, 3, 2, 64]);
    let mut out = Host::new(vec![f16::NAN; c.q.len()], &[1, 3, 2, 64]);
    call("dlkern.attention", &mut [q.dl(), k.dl(), v.dl(), out.dl()], 3, &attrs(false)).unwrap();
    for (g, w) in out.data.iter().zip(&default) {
        assert!((g.to_f32() - w).abs() < 4e-3, "{g} vs {w}");
    }
}

#[test]
fn inference_sizes_out_and_lse() {
    let mut q = Host::new(vec![0f32; 2 * 5 * 8 * 16], &[2, 5, 8, 16]);
    let mut k = Host::new(vec![0f32; 2 * 7 * 2 * 16], &[2, 7, 2, 16]);
    let mut v = Host::new(vec![0f32; 2 * 7 * 2 * 16], &[2, 7, 2, 16]);
    // SAFETY: host tensors alive for the call.
    let specs =
        unsafe { registry::infer("dlkern.attention_lse", &[q.dl(), k.dl(), v.dl()], 2, &Attributes::new()) }.unwrap();
    assert_eq!(specs[0].shape, vec![2, 5, 8, 16]);
    assert_eq!((specs[1].dtype, specs[1].shape.clone()), (dlkern::DType::F32, vec![2, 8, 5]));
}

#[test]
fn bad_inputs_are_refused_with_the_reason() {
    let c = case(2, 4, 4, 4, 2, 16, 3);
    let bad = |a: Attributes| c.padded(&a).unwrap_err();
    assert!(bad(attrs(false).with("causal", AttrValue::Int(2))).contains("causal = 2"));
    assert!(bad(attrs(false).with("window_left", AttrValue::Int(-2))).contains("window_left = -2"));
    assert!(bad(attrs(false).with("softcap", AttrValue::Float(-1.0))).contains("softcap = -1"));
    // 3 query heads over 2 KV heads.
    let odd = case(1, 2, 2, 3, 2, 16, 4);
    assert!(odd.padded(&attrs(false)).unwrap_err().contains("multiple of KV heads"));
    // Packed layouts: lengths that do not end at the total, or decrease.
    let mut q = Host::new(vec![0f32; 8 * 4 * 16], &[8, 4, 16]);
    let mut k = Host::new(vec![0f32; 8 * 2 * 16], &[8, 2, 16]);
    let mut v = Host::new(vec![0f32; 8 * 2 * 16], &[8, 2, 16]);
    let mut out = Host::new(vec![0f32; 8 * 4 * 16], &[8, 4, 16]);
    for (cq, ck, why) in [
        (vec![0, 4, 7], vec![0, 4, 8], "end at 8"),
        (vec![0, 5, 8], vec![0, 6, 4], "never decrease"),
        (vec![0, 8], vec![0, 4, 8], "batch + 1"),
    ] {
        let (nq, nk) = (cq.len() as i64, ck.len() as i64);
        let mut cu_q = Host::new(cq, &[nq]);
        let mut cu_k = Host::new(ck, &[nk]);
        let err =
            call("dlkern.attention", &mut [q.dl(), k.dl(), v.dl(), cu_q.dl(), cu_k.dl(), out.dl()], 5, &attrs(false))
                .unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    // Packed inputs without lengths; padded inputs with them; v unlike k.
    let err = call("dlkern.attention", &mut [q.dl(), k.dl(), v.dl(), out.dl()], 3, &attrs(false)).unwrap_err();
    assert!(err.contains("need cu_seqlens"), "{err}");
    let mut v_bad = Host::new(vec![0f32; 8 * 16], &[8, 1, 16]);
    let err = call("dlkern.attention", &mut [q.dl(), k.dl(), v_bad.dl(), out.dl()], 3, &attrs(false)).unwrap_err();
    assert!(err.contains("v has shape [8, 1, 16]"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Awkward shapes (seq 1 and 97, head dim 80, GQA 1/4/8, causal with Sk >= Sq): the padded
    /// and packed layouts agree and every output is finite.
    #[test]
    fn layouts_agree_on_awkward_shapes(
        batch in 1usize..3, sq in prop_oneof![Just(1usize), Just(7), Just(97)], extra in 0usize..40,
        ratio in prop_oneof![Just(1usize), Just(4), Just(8)], d in prop_oneof![Just(16usize), Just(80)],
        causal: bool, seed: u64,
    ) {
        let c = case(batch, sq, sq + extra, 2 * ratio, 2, d, seed);
        let (out, lse) = c.padded(&attrs(causal)).unwrap();
        let (out_p, _) = c.packed(&attrs(causal)).unwrap();
        prop_assert_eq!(&out, &out_p);
        prop_assert!(out.iter().all(|v| v.is_finite()));
        prop_assert!(lse.iter().all(|v| v.is_finite()), "with Sk >= Sq every causal row sees a key");
    }
}

// ---------------------------------------------------------------------------------------------
// GPU kernel (`dlkern::ops::attention::launch`) against the f64 reference.

mod gpu {
    use super::common::{Rng, gpu, unit_roundoff};
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    use dlkern::ops::attention::launch::*;
    use dlkern::ops::attention::reference::{AttentionOptions, attention_varlen, visible};
    use dlkern::{DType, Element};
    use half::{bf16, f16};
    use proptest::prelude::*;

    /// A packed problem (a padded batch is the special case of equal lengths).
    struct Problem<T> {
        lens_q: Vec<usize>,
        lens_k: Vec<usize>,
        opts: AttentionOptions,
        q: Vec<T>,
        k: Vec<T>,
        v: Vec<T>,
    }

    fn problem<T: Element>(lens_q: &[usize], lens_k: &[usize], opts: AttentionOptions, seed: u64) -> Problem<T> {
        let mut rng = Rng::new(seed);
        let (tq, tk): (usize, usize) = (lens_q.iter().sum(), lens_k.iter().sum());
        let (h, hkv, d) = (opts.num_heads, opts.num_kv_heads, opts.head_dim);
        Problem {
            lens_q: lens_q.to_vec(),
            lens_k: lens_k.to_vec(),
            opts,
            q: rng.vec(tq * h * d, -1.0, 1.0),
            k: rng.vec(tk * hkv * d, -1.0, 1.0),
            v: rng.vec(tk * hkv * d, -1.0, 1.0),
        }
    }

    fn cumulative(lens: &[usize]) -> Vec<usize> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |acc, &l| {
                *acc += l;
                Some(*acc)
            }))
            .collect()
    }

    impl<T: Element> Problem<T> {
        fn padded(&self) -> bool {
            self.lens_q.windows(2).all(|w| w[0] == w[1]) && self.lens_k.windows(2).all(|w| w[0] == w[1])
        }

        /// Runs the mma.sync kernel, or the Hopper kernel when `hopper` (None where the device
        /// or the head size has none), on the padded layout when the lengths allow, else
        /// packed: (out, lse in the reference's [H, total_q] order).
        fn run(&self, force_packed: bool, hopper: bool) -> Option<(Vec<T>, Vec<f32>)> {
            let (device, stream) = gpu();
            let o = &self.opts;
            let (cu_q, cu_k) = (cumulative(&self.lens_q), cumulative(&self.lens_k));
            let (tq, tk) = (*cu_q.last().unwrap(), *cu_k.last().unwrap());
            let batch = self.lens_q.len();
            let padded = self.padded() && !force_packed;
            let layout = if padded {
                Batch::Padded { seqlen_q: self.lens_q[0], seqlen_k: self.lens_k[0] }
            } else {
                Batch::Packed { total_q: tq, total_k: tk, max_seqlen_q: *self.lens_q.iter().max().unwrap() }
            };
            let params = AttentionParams {
                dtype: T::DTYPE,
                batch,
                layout,
                heads: o.num_heads,
                kv_heads: o.num_kv_heads,
                head_dim: o.head_dim,
                causal: o.causal,
                window_left: o.window_left,
                scale: o.scale as f32,
                softcap: o.softcap as f32,
                lse: true,
            };
            let (qd, kd, vd) = (
                stream.clone_htod(&self.q).unwrap(),
                stream.clone_htod(&self.k).unwrap(),
                stream.clone_htod(&self.v).unwrap(),
            );
            let cuq: Vec<i32> = cu_q.iter().map(|&x| x as i32).collect();
            let cuk: Vec<i32> = cu_k.iter().map(|&x| x as i32).collect();
            let (cuq_d, cuk_d) = (stream.clone_htod(&cuq).unwrap(), stream.clone_htod(&cuk).unwrap());
            let mut out = stream.clone_htod(&vec![T::from_f64(-7.0); self.q.len()]).unwrap();
            let mut lse = stream.alloc_zeros::<f32>(params.lse_len()).unwrap();
            {
                let s = &stream;
                let ptrs = AttentionPointers {
                    q: qd.device_ptr(s).0,
                    k: kd.device_ptr(s).0,
                    v: vd.device_ptr(s).0,
                    out: out.device_ptr_mut(s).0,
                    lse: lse.device_ptr_mut(s).0,
                    cu_seqlens_q: cuq_d.device_ptr(s).0,
                    cu_seqlens_k: cuk_d.device_ptr(s).0,
                };
                let plan = params.plan().unwrap();
                let plan = if hopper { plan.hopper().filter(|_| device.has_wgmma())? } else { plan };
                // SAFETY: buffers of the described extents, valid cumulative lengths.
                unsafe { attention_raw_planned(&device, s.cu_stream(), &params, &plan, &ptrs) }
                    .unwrap_or_else(|e| panic!("{params:?} on {}: {e}", plan.kernel));
            }
            stream.synchronize().unwrap();
            let (out, lse) = (stream.clone_dtoh(&out).unwrap(), stream.clone_dtoh(&lse).unwrap());
            // Padded lse is [B, H, Sq]: reorder to [H, total_q].
            let lse = if padded {
                let (h, sq) = (o.num_heads, self.lens_q[0]);
                (0..h * tq)
                    .map(|x| {
                        let (hh, row) = (x / tq, x % tq);
                        lse[((row / sq) * h + hh) * sq + row % sq]
                    })
                    .collect()
            } else {
                lse
            };
            Some((out, lse))
        }

        /// What a same-precision implementation computes: f32 math, probabilities and output
        /// rounded to T.
        fn naive(&self) -> Vec<f64> {
            let o = &self.opts;
            let (h, hkv, d) = (o.num_heads, o.num_kv_heads, o.head_dim);
            let (cu_q, cu_k) = (cumulative(&self.lens_q), cumulative(&self.lens_k));
            let mut out = vec![0.0; self.q.len()];
            let round = |x: f32| T::from_f64(x as f64).to_f64() as f32;
            for b in 0..self.lens_q.len() {
                let (sq, sk) = (self.lens_q[b], self.lens_k[b]);
                for head in 0..h {
                    let kvh = head / (h / hkv);
                    for i in 0..sq {
                        let qrow = &self.q[((cu_q[b] + i) * h + head) * d..][..d];
                        let s: Vec<Option<f32>> = (0..sk)
                            .map(|j| {
                                visible(o, i, j, sq, sk).then(|| {
                                    let krow = &self.k[((cu_k[b] + j) * hkv + kvh) * d..][..d];
                                    let dot: f32 =
                                        qrow.iter().zip(krow).map(|(a, b)| a.to_f64() as f32 * b.to_f64() as f32).sum();
                                    let x = dot * o.scale as f32;
                                    if o.softcap > 0.0 { o.softcap as f32 * (x / o.softcap as f32).tanh() } else { x }
                                })
                            })
                            .collect();
                        let m = s.iter().flatten().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        if m == f32::NEG_INFINITY {
                            continue;
                        }
                        let l: f32 = s.iter().flatten().map(|x| (x - m).exp()).sum();
                        let dst = &mut out[((cu_q[b] + i) * h + head) * d..][..d];
                        for (j, sj) in s.iter().enumerate() {
                            if let Some(sj) = sj {
                                let p = round((sj - m).exp());
                                let vrow = &self.v[((cu_k[b] + j) * hkv + kvh) * d..][..d];
                                for (o, v) in dst.iter_mut().zip(vrow) {
                                    *o += (p * v.to_f64() as f32) as f64;
                                }
                            }
                        }
                        dst.iter_mut().for_each(|x| *x = round((*x / l as f64) as f32) as f64);
                    }
                }
            }
            out
        }

        /// The accuracy rule: max error against the f64 reference at most twice the
        /// naive same-precision implementation's, plus a floor of two roundoffs; and the lse
        /// within 1e-3 of the reference's.
        fn check(&self, force_packed: bool) {
            // The references once for both kernels (the f64 and the naive one cost more than
            // the GPU runs at the long lengths).
            let mut expected = None;
            for hopper in [false, true] {
                if let Some((got, lse)) = self.run(force_packed, hopper) {
                    let (want, want_lse, naive_err) = expected.get_or_insert_with(|| {
                        let (cu_q, cu_k) = (cumulative(&self.lens_q), cumulative(&self.lens_k));
                        let (want, want_lse) = attention_varlen(&self.q, &self.k, &self.v, &cu_q, &cu_k, &self.opts);
                        let naive_err = max_error(&self.naive(), &want);
                        (want, want_lse, naive_err)
                    });
                    self.check_result(&got, &lse, hopper, want, want_lse, *naive_err);
                }
            }
        }

        fn check_result(&self, got: &[T], lse: &[f32], hopper: bool, want: &[f64], want_lse: &[f64], naive_err: f64) {
            let got64: Vec<f64> = got.iter().map(|x| x.to_f64()).collect();
            let gpu_err = max_error(&got64, want);
            let bound = 2.0 * naive_err + 2.0 * unit_roundoff(T::DTYPE);
            let kernel = if hopper { "wgmma" } else { "mma.sync" };
            let what = format!("{kernel}: {:?} lens_q {:?} lens_k {:?}", self.opts, self.lens_q, self.lens_k);
            assert!(gpu_err <= bound, "{what}: error {gpu_err:.3e} > 2 x naive {naive_err:.3e} + floor");
            for (i, (g, w)) in lse.iter().zip(want_lse).enumerate() {
                let ok = if w.is_finite() {
                    ((*g as f64) - w).abs() <= 1e-3 * (1.0 + w.abs())
                } else {
                    g.is_infinite() && *g < 0.0
                };
                assert!(ok, "{what}: lse[{i}] = {g} vs {w}");
            }
        }
    }

    fn max_error(got: &[f64], want: &[f64]) -> f64 {
        got.iter().zip(want).map(|(x, w)| (x - w).abs()).fold(0.0, f64::max)
    }

    fn opts(h: usize, hkv: usize, d: usize, causal: bool) -> AttentionOptions {
        AttentionOptions {
            num_heads: h,
            num_kv_heads: hkv,
            head_dim: d,
            causal,
            scale: 1.0 / (d as f64).sqrt(),
            softcap: 0.0,
            window_left: None,
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matches_reference_across_head_dims_and_gqa() {
        let mut seed = 1;
        for d in HEAD_DIMS {
            for (h, hkv) in [(4, 4), (8, 2), (8, 1)] {
                for causal in [false, true] {
                    seed += 1;
                    problem::<f16>(&[97, 97], &[130, 130], opts(h, hkv, d, causal), seed).check(false);
                }
            }
            problem::<bf16>(&[65, 65], &[65, 65], opts(4, 2, d, true), seed + 50).check(false);
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_long_sequences_and_options() {
        problem::<f16>(&[1025], &[1025], opts(4, 1, 128, true), 3).check(false);
        problem::<f16>(&[4097], &[4097], opts(2, 2, 64, false), 4).check(false);
        problem::<bf16>(&[1025], &[2049], opts(2, 1, 256, false), 9).check(false);
        problem::<f16>(&[1025, 97], &[1025, 200], opts(4, 2, 256, true), 10).check(false);
        let windowed = AttentionOptions { window_left: Some(100), softcap: 5.0, ..opts(8, 2, 128, true) };
        problem::<bf16>(&[300, 300], &[700, 700], windowed, 5).check(false);
    }

    /// Small problems of every kernel variant for compute-sanitizer (memcheck, racecheck,
    /// synccheck): a lone query, lengths past one block and one key tile, partial tiles, GQA,
    /// causal, window and soft cap.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_small_problems_of_every_variant() {
        for d in HEAD_DIMS {
            problem::<f16>(&[1, 130], &[7, 200], opts(4, 2, d, true), 11).check(true);
        }
        let o = AttentionOptions { window_left: Some(50), softcap: 4.0, ..opts(4, 1, 128, true) };
        problem::<bf16>(&[97], &[260], o, 12).check(false);
        problem::<bf16>(&[129], &[129], opts(2, 2, 64, false), 13).check(false);
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_packed_batches() {
        // Lengths 1, 97, 1025; more keys than queries; a sequence with no keys visible to its
        // first queries (causal with Sk < Sq): zero output, lse -inf.
        let lens_q = [1, 97, 1025, 40];
        let lens_k = [5, 97, 1100, 10];
        problem::<f16>(&lens_q, &lens_k, opts(8, 2, 128, true), 6).check(true);
        // Head size 64 is another instantiation of the Hopper kernel: its rows that see no key
        // (40 queries over 10 keys, causal) must stay exactly 0 too.
        problem::<f16>(&lens_q, &lens_k, opts(8, 2, 64, true), 9).check(true);
        problem::<f16>(&lens_q, &lens_k, opts(8, 8, 80, false), 7).check(true);
        // Padded data through the packed path gives the same answer as the padded path.
        let p = problem::<f16>(&[50, 50], &[60, 60], opts(4, 2, 64, true), 8);
        for hopper in [false, true] {
            if let (Some(padded), Some(packed)) = (p.run(false, hopper), p.run(true, hopper)) {
                assert_eq!(padded.0, packed.0, "hopper {hopper}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
        #[test]
        #[ignore = "needs a CUDA device"]
        fn gpu_matches_reference_on_random_problems(
            lens in proptest::collection::vec((1usize..300, 0usize..100), 1..4), d_idx in 0usize..5,
            ratio in prop_oneof![Just(1usize), Just(4), Just(8)], causal: bool,
            window in proptest::option::of(0usize..200), bf: bool, seed: u64,
        ) {
            let (lens_q, lens_k): (Vec<usize>, Vec<usize>) = lens.iter().map(|&(q, extra)| (q, q + extra)).unzip();
            let o = AttentionOptions { window_left: window, ..opts(2 * ratio, 2, HEAD_DIMS[d_idx], causal) };
            if bf { problem::<bf16>(&lens_q, &lens_k, o, seed).check(true) } else { problem::<f16>(&lens_q, &lens_k, o, seed).check(true) }
        }
    }

    #[test]
    fn plan_validates() {
        let ok = AttentionParams {
            dtype: DType::F16,
            batch: 2,
            layout: Batch::Padded { seqlen_q: 100, seqlen_k: 100 },
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
            causal: true,
            window_left: None,
            scale: 0.1,
            softcap: 0.0,
            lse: false,
        };
        let plan = ok.plan().unwrap();
        assert_eq!(plan.dims.grid, (1, 8, 2)); // 128 query rows per block up to head dim 128
        let d256 = AttentionParams { head_dim: 256, ..ok }.plan().unwrap();
        assert_eq!(d256.dims.grid, (2, 8, 2)); // 64 at 256
        // The Hopper kernel: 128 rows per block of 384 threads, for head sizes 64, 128 and 256.
        let hopper = plan.hopper().unwrap();
        assert!(hopper.is_hopper() && !plan.is_hopper());
        assert_eq!((hopper.dims.grid, hopper.dims.block), ((1, 8, 2), (384, 1, 1)));
        assert!(hopper.kernel.contains("wgmma_f16_d128"), "{}", hopper.kernel);
        let long = AttentionParams { layout: Batch::Padded { seqlen_q: 4097, seqlen_k: 4097 }, ..ok }.plan().unwrap();
        assert_eq!(long.hopper().unwrap().dims.grid.0, 33);
        // Head size 256: 64-key tiles in two stages, 128 rows per block all the same.
        let d256_hopper = d256.hopper().unwrap();
        assert_eq!(d256_hopper.dims.grid, (1, 8, 2));
        assert!(d256_hopper.kernel.ends_with("wgmma_f16_d256"), "{}", d256_hopper.kernel);
        assert!(d256_hopper.dims.shared_bytes as usize <= 227 * 1024, "{}", d256_hopper.dims.shared_bytes);
        assert!(AttentionParams { head_dim: 80, ..ok }.plan().unwrap().hopper().is_none());
        let d64 = AttentionParams { head_dim: 64, dtype: DType::BF16, ..ok }.plan().unwrap();
        assert!(d64.hopper().unwrap().kernel.ends_with("wgmma_bf16_d64"));
        let err = |p: AttentionParams| p.plan().unwrap_err().to_string();
        assert!(err(AttentionParams { head_dim: 72, ..ok }).contains("head dim 72"));
        assert!(err(AttentionParams { kv_heads: 3, ..ok }).contains("not a multiple"));
        assert!(err(AttentionParams { dtype: DType::F32, ..ok }).contains("not supported on the GPU"));
        assert!(err(AttentionParams { softcap: -1.0, ..ok }).contains("softcap"));
    }
}
