//! The attention registry kernels (`dlkern.attention`, `dlkern.attention_lse`) on CPU tensors:
//! padded and packed layouts give the same result, options reach the computation, the
//! log-sum-exp has the documented layout, inference sizes the outputs, and bad inputs are
//! refused with errors that name the problem.

mod common;

use common::{Host, Rng};
use dlkern::dlpack::DLTensor;
use dlkern::reference::attention::{AttentionOptions, attention_varlen};
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
