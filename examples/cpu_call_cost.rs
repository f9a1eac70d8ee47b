//! The C ABI's and an op's own host cost, without a GPU: `dlkern_call` of
//! `dlkern.group_query_attention` on tiny CPU tensors (1 sequence, 2 / 1 heads of 16, 4 cached
//! positions, packed QKV with rotary) in a tight loop, reporting microseconds per call. The CPU
//! op's attention is part of it (about half); the rest is what a CUDA call pays too before its
//! launch: name lookup, attribute conversion, tensor views and checks. Profile it with
//! `perf record --call-graph dwarf target/release/examples/cpu_call_cost`.
//!
//!     cargo run --release --example cpu_call_cost [calls]

use dlkern::DType;
use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dense_tensor};
use dlkern::registry::CAttr;
use std::time::Instant;

/// A dense CPU DLTensor over `data` (null for an absent input).
fn t(data: *mut f32, dtype: DType, shape: &mut [i64]) -> DLTensor {
    dense_tensor(data.cast(), DLDevice { device_type: DLDeviceType::CPU, device_id: 0 }, dtype, shape)
}

fn main() {
    let (h, hkv, d, ctx) = (2i64, 1i64, 16i64, 4i64);
    let mut q = vec![0.1f32; ((h + 2 * hkv) * d) as usize];
    let mut kc = vec![0.1f32; (hkv * ctx * d) as usize];
    let mut vc = vec![0.1f32; (hkv * ctx * d) as usize];
    let mut seq = vec![ctx as i32 - 1];
    let mut total = vec![ctx as i32];
    let mut cos = vec![1.0f32; (ctx * d / 2) as usize];
    let mut sin = vec![0.0f32; (ctx * d / 2) as usize];
    let mut out = vec![0.0f32; (h * d) as usize];
    let mut shapes = [
        vec![1, 1, (h + 2 * hkv) * d],
        vec![0],
        vec![0],
        vec![1, hkv, ctx, d],
        vec![1, hkv, ctx, d],
        vec![1],
        vec![1],
        vec![ctx, d / 2],
        vec![ctx, d / 2],
        vec![1, 1, h * d],
        vec![1, hkv, ctx, d],
        vec![1, hkv, ctx, d],
    ];
    let [sq, sk, sv, spk, spv, sl, st, sc, ss, so, sok, sov] = &mut shapes;
    let kp = kc.as_mut_ptr();
    let vp = vc.as_mut_ptr();
    let mut tensors = [
        t(q.as_mut_ptr(), DType::F32, sq),
        t(std::ptr::null_mut(), DType::F32, sk),
        t(std::ptr::null_mut(), DType::F32, sv),
        t(kp, DType::F32, spk),
        t(vp, DType::F32, spv),
        t(seq.as_mut_ptr().cast(), DType::I32, sl),
        t(total.as_mut_ptr().cast(), DType::I32, st),
        t(cos.as_mut_ptr(), DType::F32, sc),
        t(sin.as_mut_ptr(), DType::F32, ss),
        t(out.as_mut_ptr(), DType::F32, so),
        t(kp, DType::F32, sok),
        t(vp, DType::F32, sov),
    ];
    let attrs = [
        CAttr::int(c"num_heads", h),
        CAttr::int(c"kv_num_heads", hkv),
        CAttr::int(c"do_rotary", 1),
        CAttr::int(c"local_window_size", -1),
        CAttr::float(c"softcap", 0.0),
        CAttr::float(c"scale", 0.25),
    ];
    let name = c"dlkern.group_query_attention";
    let n: u32 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let start = Instant::now();
    for _ in 0..n {
        // SAFETY: the header's contract: a NUL-terminated name, twelve valid DLTensors over host
        // buffers of their shapes that outlive the loop, nine of them inputs, attributes with
        // 'static names.
        let code = unsafe {
            dlkern::capi::dlkern_call(
                name.as_ptr(),
                tensors.as_mut_ptr(),
                9,
                3,
                std::ptr::null_mut(),
                attrs.as_ptr(),
                attrs.len() as i32,
            )
        };
        if code != 0 {
            // SAFETY: dlkern_last_error returns this thread's NUL-terminated message.
            let m = unsafe { std::ffi::CStr::from_ptr(dlkern::capi::dlkern_last_error()) };
            panic!("{}", m.to_string_lossy());
        }
    }
    println!("{:.3} us per call", start.elapsed().as_secs_f64() * 1e6 / n as f64);
}
