//! The kernel registry from Rust: built-ins on CPU tensors, registration rules, errors with
//! their messages, panics contained, and concurrent use from many threads.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Host, Rng};
use dlkern::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DLDevice, DLDeviceType, DLTensor};
use dlkern::dtype::Scalar;
use dlkern::registry::{self, AttrValue, Attributes, KernelDef, TensorSpec};
use dlkern::{DType, Element, Error};
use half::{bf16, f16};

fn rmsnorm_on_cpu<T: Element + Scalar>(shape: &[i64], seed: u64) {
    let mut rng = Rng::new(seed);
    let cols = *shape.last().unwrap() as usize;
    let n: usize = shape.iter().product::<i64>() as usize;
    let mut x = Host::<T>::new(rng.vec(n, -3.0, 3.0), shape);
    let mut w = Host::<T>::new(rng.vec(cols, -1.0, 1.0), &[cols as i64]);
    let mut y = Host::<T>::new(vec![T::from_f64(f64::NAN); n], shape);
    let attrs = Attributes::new().with("epsilon", AttrValue::Float(1e-3));
    let mut tensors = [x.dl(), w.dl(), y.dl()];
    // SAFETY: host tensors alive for the call.
    unsafe { registry::call("dlkern.rmsnorm", &mut tensors, 2, std::ptr::null_mut(), &attrs) }.unwrap();
    let expected = dlkern::ops::rmsnorm::reference::rmsnorm(&x.data, &w.data, n / cols, cols, cols, 1e-3);
    let expected_rounded: Vec<f64> = expected.iter().map(|&v| T::from_f64(v).to_f64()).collect();
    let got: Vec<f64> = y.data.iter().map(|v| v.to_f64()).collect();
    assert_eq!(got, expected_rounded, "{} {shape:?}", <T as Scalar>::DTYPE);
}

#[test]
fn builtin_rmsnorm_runs_on_cpu_tensors() {
    assert!(registry::names().contains(&"dlkern.rmsnorm".to_string()));
    rmsnorm_on_cpu::<f32>(&[3, 97], 1);
    rmsnorm_on_cpu::<f16>(&[2, 3, 80], 2);
    rmsnorm_on_cpu::<bf16>(&[1025], 3);
}

#[test]
fn builtin_rmsnorm_reports_bad_inputs() {
    let call = |tensors: &mut [DLTensor], attrs: &Attributes| {
        // SAFETY: host tensors alive for the call.
        unsafe { registry::call("dlkern.rmsnorm", tensors, 2, std::ptr::null_mut(), attrs) }.unwrap_err().to_string()
    };
    let none = Attributes::new();
    let mut x = Host::<f32>::new(vec![1.0; 12], &[3, 4]);
    let mut w = Host::<f32>::new(vec![1.0; 4], &[4]);
    let mut w_bad = Host::<f32>::new(vec![1.0; 5], &[5]);
    let mut w_half = Host::<f16>::new(vec![f16::ONE; 4], &[4]);
    let mut y = Host::<f32>::new(vec![0.0; 12], &[3, 4]);
    let mut y_bad = Host::<f32>::new(vec![0.0; 12], &[4, 3]);
    let mut xi = Host::<i32>::new(vec![0; 12], &[3, 4]);
    assert!(call(&mut [x.dl(), w_bad.dl(), y.dl()], &none).contains("tensor 'weight': shape [5] (expected [4])"));
    assert!(
        call(&mut [x.dl(), w_half.dl(), y.dl()], &none).contains("tensor 'weight': dtype f16 differs from x's f32")
    );
    assert!(call(&mut [x.dl(), w.dl(), y_bad.dl()], &none).contains("tensor 'y': shape [4, 3] (expected [3, 4])"));
    assert!(call(&mut [xi.dl(), w.dl(), y.dl()], &none).contains("tensor 'x': dtype i32"));
    let string_eps = Attributes::new().with("epsilon", AttrValue::String("tiny".into()));
    assert!(
        call(&mut [x.dl(), w.dl(), y.dl()], &string_eps).contains("attribute 'epsilon' is string (expected float)")
    );
    // A transposed x does not collapse into rows.
    x.strides = Some(vec![1, 3]);
    assert!(call(&mut [x.dl(), w.dl(), y.dl()], &none).contains("last axis must be contiguous"));
    x.strides = None;
    // Missing output.
    let mut two = [x.dl(), w.dl()];
    // SAFETY: host tensors alive for the call.
    let err = unsafe { registry::call("dlkern.rmsnorm", &mut two, 2, std::ptr::null_mut(), &none) }.unwrap_err();
    assert!(err.to_string().contains("called with 0 outputs, the kernel has 1"), "{err}");
}

/// Kernels with optional inputs refuse counts outside their range, saying which range.
#[test]
fn builtin_kernels_check_their_input_count_ranges() {
    let mut a = Host::<i8>::new(vec![1; 4], &[1, 4]);
    let mut y = Host::<f32>::new(vec![0.0; 1], &[1, 1]);
    let mut tensors = [a.dl(), a.dl(), y.dl()];
    let attrs = Attributes::new();
    // SAFETY: host tensors alive for the call (the count check comes first).
    let err = unsafe { registry::call("dlkern.matmul_w8a8", &mut tensors, 2, std::ptr::null_mut(), &attrs) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("called with 2 inputs and 1 outputs (expected 4 to 5 and 1)"), "{err}");
}

#[test]
fn unknown_names_suggest_close_matches() {
    let err = registry::get("dlkern.rmsnrom").err().unwrap();
    assert!(
        matches!(&err, Error::UnknownKernel { suggestions, .. } if suggestions.contains(&"dlkern.rmsnorm".to_string()))
    );
    assert!(err.to_string().contains("did you mean dlkern.rmsnorm?"), "{err}");
    assert!(registry::get("rmsnorm").err().unwrap().to_string().contains("dlkern.rmsnorm"));
}

fn add_one(args: &registry::KernelArgs) -> dlkern::Result<()> {
    args.expect_counts(1, 1)?;
    let x = args.input(0, "x")?;
    let y = args.output(0, "y")?;
    // SAFETY: host tensors (the kernel only accepts CPU), distinct buffers in these tests.
    let (xs, ys) = unsafe { (x.host_slice::<f32>()?, y.host_slice_mut::<f32>()?) };
    let delta = args.attrs.float("delta")?.unwrap_or(1.0) as f32;
    for (o, i) in ys.iter_mut().zip(xs) {
        *o = i + delta;
    }
    Ok(())
}

#[test]
fn rust_kernels_register_run_and_follow_the_rules() {
    let name = "test.add_one";
    registry::register(KernelDef::rust(name, DEVICE_MASK_CPU, add_one).with_outputs(1), false).unwrap();
    assert!(matches!(
        registry::register(KernelDef::rust(name, DEVICE_MASK_CPU, add_one), false),
        Err(Error::DuplicateKernel(_))
    ));
    let mut x = Host::<f32>::new(vec![1.0, 2.0, 3.0], &[3]);
    let mut y = Host::<f32>::new(vec![0.0; 3], &[3]);
    let attrs = Attributes::new().with("delta", AttrValue::Float(0.5));
    // SAFETY: host tensors alive for the call.
    unsafe { registry::call(name, &mut [x.dl(), y.dl()], 1, std::ptr::null_mut(), &attrs) }.unwrap();
    assert_eq!(y.data, vec![1.5, 2.5, 3.5]);

    // A CUDA tensor is refused before the kernel runs (no device is touched).
    let mut cuda_x = x.dl();
    cuda_x.device = DLDevice { device_type: DLDeviceType::CUDA, device_id: 0 };
    // SAFETY: the data is never read: validation rejects the device first.
    let err = unsafe { registry::call(name, &mut [cuda_x, y.dl()], 1, std::ptr::null_mut(), &attrs) }.unwrap_err();
    assert!(err.to_string().contains("input 0 is on Cuda(0), which this kernel does not accept"), "{err}");

    // Replacing swaps the implementation.
    registry::register(
        KernelDef::rust(name, DEVICE_MASK_CPU, |_| Err(Error::invalid("test", "replaced and refusing"))),
        true,
    )
    .unwrap();
    // SAFETY: host tensors alive for the call.
    let err = unsafe { registry::call(name, &mut [x.dl(), y.dl()], 1, std::ptr::null_mut(), &attrs) }.unwrap_err();
    assert!(err.to_string().contains("replaced and refusing"), "{err}");
    registry::unregister(name).unwrap();
    assert!(matches!(registry::unregister(name), Err(Error::UnknownKernel { .. })));
}

/// A Rust kernel called through `call_at` sees the site: which inputs are constant, and a slot
/// it keeps across calls (here, a count of the calls made there); a plain call sees no site.
#[test]
fn a_call_site_tells_constant_inputs_and_keeps_the_kernels_state() {
    let name = "test.counts_calls_at_its_site";
    let kernel = |args: &registry::KernelArgs| -> dlkern::Result<()> {
        let y = args.output(0, "y")?;
        // SAFETY: a host tensor (the kernel only accepts CPU), distinct from the input.
        let ys = unsafe { y.host_slice_mut::<f32>()? };
        let Some(site) = args.site else {
            ys[0] = -1.0;
            return Ok(());
        };
        let mut slot = site.cache();
        let calls = slot.get_or_insert_with(|| Box::new(0u32)).downcast_mut::<u32>().expect("this kernel's slot");
        *calls += 1;
        ys[0] = *calls as f32;
        ys[1] = if site.is_constant(0) { 1.0 } else { 0.0 };
        Ok(())
    };
    registry::register(KernelDef::rust(name, DEVICE_MASK_CPU, kernel), false).unwrap();
    let mut x = Host::<f32>::new(vec![0.0], &[1]);
    let mut y = Host::<f32>::new(vec![0.0; 2], &[2]);
    let attrs = Attributes::new();
    let (site, other) = (registry::CallSite::new(0b1), registry::CallSite::new(0));
    assert!(site.is_constant(0) && !site.is_constant(1) && !site.is_constant(64) && !other.is_constant(0));
    for (which, want) in [(&site, [1.0, 1.0]), (&site, [2.0, 1.0]), (&other, [1.0, 0.0]), (&site, [3.0, 1.0])] {
        // SAFETY: host tensors alive for the call; input 0 is the same buffer on every call.
        unsafe { registry::call_at(name, &mut [x.dl(), y.dl()], 1, std::ptr::null_mut(), &attrs, which) }.unwrap();
        assert_eq!(y.data, want);
    }
    // SAFETY: as above.
    unsafe { registry::call(name, &mut [x.dl(), y.dl()], 1, std::ptr::null_mut(), &attrs) }.unwrap();
    assert_eq!(y.data[0], -1.0);
    registry::unregister(name).unwrap();
}

#[test]
fn a_panicking_kernel_becomes_an_error() {
    let name = "test.panics";
    registry::register(KernelDef::rust(name, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, |_| panic!("boom at {}", 42)), true)
        .unwrap();
    // SAFETY: no tensors.
    let err = unsafe { registry::call(name, &mut [], 0, std::ptr::null_mut(), &Attributes::new()) }.unwrap_err();
    assert!(err.to_string().contains("panicked: boom at 42"), "{err}");
    registry::unregister(name).unwrap();
}

#[test]
fn inference_reports_output_specs() {
    let mut x = Host::<bf16>::new(vec![bf16::ZERO; 6], &[2, 3]);
    let mut w = Host::<bf16>::new(vec![bf16::ZERO; 3], &[3]);
    let mut meta = x.dl();
    meta.data = std::ptr::null_mut(); // inference needs no data
    // SAFETY: valid shape arrays.
    let specs = unsafe { registry::infer("dlkern.rmsnorm", &[meta, w.dl()], 1, &Attributes::new()) }.unwrap();
    assert_eq!(specs, vec![TensorSpec { dtype: DType::BF16, shape: vec![2, 3] }]);
    registry::register(KernelDef::rust("test.no_infer", DEVICE_MASK_CPU, |_| Ok(())), true).unwrap();
    // SAFETY: valid shape arrays.
    let err = unsafe { registry::infer("test.no_infer", &[x.dl()], 1, &Attributes::new()) }.unwrap_err();
    assert!(err.to_string().contains("has no output inference"), "{err}");
    registry::unregister("test.no_infer").unwrap();
}

#[test]
fn concurrent_registration_lookup_and_calls() {
    let calls = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..8 {
            let calls = calls.clone();
            s.spawn(move || {
                for i in 0..200 {
                    let own = format!("test.concurrent.{t}.{i}");
                    let counter = calls.clone();
                    registry::register(
                        KernelDef::rust(own.clone(), DEVICE_MASK_CPU, move |_| {
                            counter.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }),
                        false,
                    )
                    .unwrap();
                    // A shared name replaced by everyone while everyone calls it.
                    let counter = calls.clone();
                    registry::register(
                        KernelDef::rust("test.concurrent.shared", DEVICE_MASK_CPU, move |_| {
                            counter.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }),
                        true,
                    )
                    .unwrap();
                    for name in [own.as_str(), "test.concurrent.shared"] {
                        // SAFETY: no tensors.
                        unsafe { registry::call(name, &mut [], 0, std::ptr::null_mut(), &Attributes::new()) }.unwrap();
                    }
                    assert!(registry::get("dlkern.rmsnorm").is_ok());
                    registry::unregister(&own).unwrap();
                }
            });
        }
    });
    assert_eq!(calls.load(Ordering::Relaxed), 8 * 200 * 2);
    assert!(!registry::names().iter().any(|n| n.starts_with("test.concurrent.") && n != "test.concurrent.shared"));
}

#[test]
fn failed_registration_leaves_user_data_with_the_caller() {
    static DESTROYED: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn destroy(_: *mut std::ffi::c_void) {
        DESTROYED.fetch_add(1, Ordering::SeqCst);
    }
    let make = || {
        let mut def = KernelDef::rust("test.user_data", DEVICE_MASK_CPU, |_| Ok(()));
        def.user_data = Some(registry::UserData { ptr: std::ptr::null_mut(), destroy: Some(destroy) });
        def
    };
    registry::register(make(), false).unwrap();
    assert!(registry::register(make(), false).is_err());
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 0, "a refused registration must not destroy the caller's data");
    registry::unregister("test.user_data").unwrap();
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 1);
}
