//! TVM-FFI functions as registry kernels (CPU): `tests/c/tvm_ffi_plugin.c` is compiled here
//! against apache-tvm-ffi's headers and `libtvm_ffi` (found through `$DLKERN_TVM_FFI_DIR`,
//! which `scripts/env.sh` sets, or the repository's `.venv`), registered through the C ABI and
//! from Rust, and called through the registry: values, each attribute kind, the function's own
//! errors with their kind and message, and every refusal on dlkern's side. The ORT node and
//! the CUDA stream are tested from Python (tests/python/test_tvm_ffi.py).

use std::ffi::{CStr, CString, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlkern::capi::*;
use dlkern::dlpack::{DEVICE_MASK_CPU, DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use dlkern::registry::{self, AttrValue, Attributes, Infer, TvmFfiKernel};

/// apache-tvm-ffi's package folder (include/, lib/).
fn tvm_ffi_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLKERN_TVM_FFI_DIR").filter(|d| !d.is_empty()) {
        return dir.into();
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let out = Command::new(&python)
        .args(["-c", "import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {}: {e}; run scripts/setup.sh or set DLKERN_TVM_FFI_DIR", python.display())
        });
    assert!(
        out.status.success(),
        "apache-tvm-ffi is not installed in .venv: run scripts/setup.sh or set DLKERN_TVM_FFI_DIR"
    );
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// The test library, built once per process.
fn plugin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let tvm = tvm_ffi_dir();
        let dir = std::env::temp_dir().join(format!("dlkern-tvm-ffi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("libtvm_ffi_plugin.so");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/tvm_ffi_plugin.c");
        let status = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I"])
            .arg(tvm.join("include"))
            .arg(&source)
            .arg("-L")
            .arg(tvm.join("lib"))
            .arg("-ltvm_ffi")
            .arg(format!("-Wl,-rpath,{}", tvm.join("lib").display()))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("cannot run cc");
        assert!(status.success(), "cc failed on {}", source.display());
        out.to_string_lossy().into_owned()
    })
}

/// A host float tensor of `bits` bits.
fn float_tensor(data: *mut c_void, shape: &mut [i64], bits: u8) -> DLTensor {
    DLTensor {
        data,
        device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: DLDataType { code: DLDataTypeCode::FLOAT, bits, lanes: 1 },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn f32_tensor(data: &mut [f32], shape: &mut [i64]) -> DLTensor {
    float_tensor(data.as_mut_ptr().cast(), shape, 32)
}

fn attrs(items: &[(&str, AttrValue)]) -> Attributes {
    let mut a = Attributes::new();
    for (name, value) in items {
        a.set(*name, value.clone());
    }
    a
}

/// x, y and out of one call.
type Values = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Calls `name` on x, y of `n` values; returns them and the output, or the error message.
fn scale_add(name: &str, n: usize, attributes: &Attributes) -> Result<Values, String> {
    let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
    let mut y: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut out = vec![f32::NAN; n];
    let (mut sx, mut sy, mut so) = ([n as i64], [n as i64], [n as i64]);
    let (xc, yc) = (x.clone(), y.clone());
    let mut tensors = [f32_tensor(&mut x, &mut sx), f32_tensor(&mut y, &mut sy), f32_tensor(&mut out, &mut so)];
    // SAFETY: host tensors of the shapes given, alive for the call.
    unsafe { registry::call(name, &mut tensors, 2, std::ptr::null_mut(), attributes) }.map_err(|e| e.to_string())?;
    Ok((xc, yc, out))
}

static DESTROYED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_destroy(_: *mut c_void) {
    DESTROYED.fetch_add(1, Ordering::SeqCst);
}

fn register_c(name: &CStr, function: &CStr, attribute_names: &CStr) -> (i32, String) {
    let library = CString::new(plugin()).unwrap();
    let def = TvmFfiDefC {
        struct_size: size_of::<TvmFfiDefC>() as u32,
        name: name.as_ptr(),
        library: library.as_ptr(),
        function: function.as_ptr(),
        attribute_names: attribute_names.as_ptr(),
        device_mask: DEVICE_MASK_CPU,
        num_outputs: 1,
        infer: None,
        user_data: std::ptr::dangling_mut(),
        destroy: Some(count_destroy),
    };
    // SAFETY: a valid definition naming the test library.
    let code = unsafe { dlkern_register_tvm_ffi(&def, 0) };
    // SAFETY: NUL-terminated, this thread's.
    (code, unsafe { CStr::from_ptr(dlkern_last_error()) }.to_string_lossy().into_owned())
}

#[test]
fn a_tvm_ffi_function_runs_as_a_kernel_with_every_attribute_kind() {
    let (code, message) = register_c(c"tvm.scale_add", c"scale_add", c"alpha, offset,mode");
    assert_eq!(code, OK, "{message}");
    for n in [1usize, 7, 97, 1025] {
        for (mode, sign) in [("add", 1.0f32), ("sub", -1.0)] {
            let a = attrs(&[
                ("mode", AttrValue::String(mode.into())),
                ("alpha", AttrValue::Float(0.5)),
                ("offset", AttrValue::Int(3)),
                ("unused", AttrValue::Ints(vec![1, 2])),
            ]);
            let (x, y, out) = scale_add("tvm.scale_add", n, &a).unwrap();
            for i in 0..n {
                assert_eq!(out[i], 0.5 * x[i] + sign * y[i] + 3.0, "n {n} mode {mode} at {i}");
            }
        }
    }
    // The same library and function from Rust, under another name, the symbol spelled out.
    let kernel = TvmFfiKernel {
        name: "tvm.scale_add_rust".into(),
        library: plugin().into(),
        function: "__tvm_ffi_scale_add".into(),
        attribute_names: vec!["alpha".into(), "offset".into(), "mode".into()],
        device_mask: DEVICE_MASK_CPU,
        num_outputs: 1,
        infer: Infer::None,
        user_data: None,
    };
    // SAFETY: the test library follows TVM-FFI's convention.
    unsafe { registry::register_tvm_ffi(kernel, false) }.unwrap();
    let a = attrs(&[
        ("alpha", AttrValue::Float(-2.0)),
        ("offset", AttrValue::Int(0)),
        ("mode", AttrValue::String("add".into())),
    ]);
    let (x, y, out) = scale_add("tvm.scale_add_rust", 7, &a).unwrap();
    assert!((0..7).all(|i| out[i] == -2.0 * x[i] + y[i]));
    // Inference: outputs like input 0.
    let (mut x, mut sx) = (vec![0f32; 6], [2i64, 3]);
    let specs = unsafe { registry::infer("tvm.scale_add_rust", &[f32_tensor(&mut x, &mut sx)], 1, &a) }.unwrap();
    assert_eq!(specs[0].shape, [2, 3]);
}

#[test]
fn the_functions_errors_and_dlkerns_refusals_say_why() {
    let (code, message) = register_c(c"tvm.scale_add_errors", c"scale_add", c"alpha,offset,mode");
    assert_eq!(code, OK, "{message}");
    let base = [("alpha", AttrValue::Float(1.0)), ("offset", AttrValue::Int(0))];
    // Raised by the function: kind and message.
    let bad_mode = attrs(&[base[0].clone(), base[1].clone(), ("mode", AttrValue::String("mul".into()))]);
    let e = scale_add("tvm.scale_add_errors", 4, &bad_mode).unwrap_err();
    assert!(e.contains("ValueError: scale_add: mode must be \"add\" or \"sub\""), "{e}");
    // Refused by dlkern before the call.
    let e = scale_add("tvm.scale_add_errors", 4, &attrs(&base)).unwrap_err();
    assert!(e.contains("attribute 'mode' is not set"), "{e}");
    let list = attrs(&[base[0].clone(), base[1].clone(), ("mode", AttrValue::Ints(vec![1]))]);
    let e = scale_add("tvm.scale_add_errors", 4, &list).unwrap_err();
    assert!(e.contains("attribute 'mode' is a list"), "{e}");
    // Half-precision tensors: the function's TypeError.
    let mut x = vec![0u16; 4];
    let mut out = vec![0u16; 4];
    let (mut sx, mut so) = ([4i64], [4i64]);
    let mut tensors =
        [float_tensor(x.as_mut_ptr().cast(), &mut sx, 16), float_tensor(out.as_mut_ptr().cast(), &mut so, 16)];
    let ok = attrs(&[base[0].clone(), base[1].clone(), ("mode", AttrValue::String("add".into()))]);
    // SAFETY: host tensors of the shapes given.
    let e = unsafe { registry::call("tvm.scale_add_errors", &mut tensors, 1, std::ptr::null_mut(), &ok) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("TypeError: scale_add takes x, y, out, alpha, offset, mode"), "{e}");

    // A function that returns a value is not destination-passing.
    let (code, message) = register_c(c"tvm.returns_a_value", c"returns_a_value", c"");
    assert_eq!(code, OK, "{message}");
    let e = scale_add("tvm.returns_a_value", 3, &Attributes::new()).unwrap_err();
    assert!(e.contains("returned a value (TVM-FFI type index 1)"), "{e}");

    // Registration failures leave user_data to the caller (destroy not called).
    let before = DESTROYED.load(Ordering::SeqCst);
    let (code, message) = register_c(c"tvm.nope", c"nope", c"");
    assert_eq!(code, ERR_PLUGIN);
    assert!(message.contains("no TVM-FFI function `__tvm_ffi_nope`"), "{message}");
    let (code, message) = register_c(c"tvm.scale_add_errors", c"scale_add", c"");
    assert_eq!(code, ERR_DUPLICATE_KERNEL, "{message}");
    assert_eq!(DESTROYED.load(Ordering::SeqCst), before);
    // Unregistering a registered one frees its user data once.
    // SAFETY: a NUL-terminated name.
    assert_eq!(unsafe { dlkern_unregister_kernel(c"tvm.returns_a_value".as_ptr()) }, OK);
    assert_eq!(DESTROYED.load(Ordering::SeqCst), before + 1);

    let missing = TvmFfiKernel {
        name: "tvm.missing_library".into(),
        library: "/nonexistent/libnothing.so".into(),
        function: "f".into(),
        attribute_names: vec![],
        device_mask: DEVICE_MASK_CPU,
        num_outputs: 1,
        infer: Infer::None,
        user_data: None,
    };
    // SAFETY: the library does not exist, so nothing is loaded.
    let e = unsafe { registry::register_tvm_ffi(missing, false) }.unwrap_err().to_string();
    assert!(e.contains("cannot load"), "{e}");
}
