//! The C ABI: a C program built against `include/dlkern.h` and `libdlkern.so` (layout static
//! asserts, built-in and user kernels, errors, a plug-in), the header in C++, the Rust mirrors
//! of the header's structs, and fuzzing of every entry point.

use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};
use std::process::Command;

use dlkern::capi::*;
use dlkern::dlpack::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use dlkern::registry::CAttr;
use proptest::prelude::*;

/// The source tree: where this test was built, or the working directory when the test
/// executable was carried to another machine (the GPU host runs it from the repository root).
fn root() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"));
    if built_in.join("include/dlkern.h").is_file() { built_in.to_path_buf() } else { std::env::current_dir().unwrap() }
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dlkern-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Directory of `libdlkern.so`: the GPU bundle's lib dir, or the target dir of this build.
fn lib_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLKERN_BUNDLE_LIB_DIR") {
        return dir.into();
    }
    // `cargo test` builds the cdylib next to the test executables (target/<profile>/deps) and
    // does not always refresh the copy one level up.
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn c_program_uses_the_abi_and_a_plugin() {
    let lib = lib_dir();
    assert!(lib.join("libdlkern.so").is_file(), "no libdlkern.so in {}", lib.display());
    let out = scratch_dir();
    let plugin = out.join("libdlkern_cpu_plugin.so");
    let include = root().join("include");
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I"])
        .arg(&include)
        .arg(root().join("tests/c/cpu_plugin.c"))
        .arg("-o")
        .arg(&plugin));
    let exe = out.join("capi_test");
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&include)
        .arg(root().join("tests/c/capi_test.c"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-ldlkern", "-lm", "-o"])
        .arg(&exe));
    // cargo's LD_LIBRARY_PATH may list a stale copy of the library before ours: use the rpath.
    let text = run(Command::new(&exe).arg(&plugin).env_remove("LD_LIBRARY_PATH"));
    assert!(text.contains("capi_test: all checks passed"), "{text}");
}

#[test]
fn header_compiles_as_cpp() {
    run(Command::new("c++")
        .args(["-std=c++17", "-Wall", "-Werror", "-fsyntax-only", "-x", "c++", "-I"])
        .arg(root().join("include"))
        .arg(root().join("include/dlkern.h")));
}

#[test]
fn rust_mirrors_match_the_header_layout() {
    assert_eq!(size_of::<CAttr>(), 64);
    assert_eq!(std::mem::offset_of!(CAttr, count), 56);
    assert_eq!(size_of::<KernelDefC>(), 56);
    assert_eq!(std::mem::offset_of!(KernelDefC, user_data), 40);
    assert_eq!(size_of::<dlkern::capi::PluginApi>(), 24);
}

#[test]
fn last_error_is_per_thread() {
    let bad = CString::new("no.such.kernel").unwrap();
    // SAFETY: valid arguments; the kernel does not exist.
    assert_eq!(unsafe { dlkern_unregister_kernel(bad.as_ptr()) }, ERR_UNKNOWN_KERNEL);
    // SAFETY: dlkern_last_error returns a NUL-terminated string.
    let here = unsafe { std::ffi::CStr::from_ptr(dlkern_last_error()) }.to_string_lossy().into_owned();
    assert!(here.contains("no kernel named 'no.such.kernel'"), "{here}");
    let other = std::thread::spawn(|| {
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(dlkern_last_error()) }.to_string_lossy().into_owned()
    })
    .join()
    .unwrap();
    assert_eq!(other, "");
}

fn fuzz_tensor(shape: &mut [i64], ndim: i32, data: usize, code: u8, bits: u8, device: u32) -> DLTensor {
    DLTensor {
        data: data as *mut _,
        device: DLDevice { device_type: DLDeviceType(device), device_id: 0 },
        ndim,
        dtype: DLDataType { code: DLDataTypeCode(code), bits, lanes: 1 },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]
    /// Hostile arguments to every entry point return error codes; none crashes. Tensor data
    /// pointers are null or point at a real buffer, as the ABI requires of valid callers; the
    /// metadata around them is arbitrary.
    #[test]
    fn fuzz_entry_points(
        name in prop_oneof![Just("dlkern.rmsnorm".to_string()), "[a-z.]{0,12}", Just(String::new())],
        null_name in any::<bool>(), null_tensors in any::<bool>(),
        num_inputs in -2i32..5, num_outputs in -2i32..4, num_attrs in -2i32..3,
        shape in proptest::collection::vec(-3i64..6, 4), ndim in -2i32..5,
        code in 0u8..6, bits in prop_oneof![Just(8u8), Just(16), Just(32), any::<u8>()], device in 0u32..4,
        use_buffer in any::<bool>(), attr_kind in -1i32..6,
    ) {
        let mut buffer = vec![0u64; 4096];
        let data = if use_buffer { buffer.as_mut_ptr() as usize } else { 0 };
        let mut shapes = [shape.clone(), shape.clone(), shape.clone(), shape.clone(), shape.clone(), shape.clone(), shape.clone(), shape.clone()];
        let mut tensors: Vec<DLTensor> = shapes.iter_mut().map(|s| fuzz_tensor(s, ndim.min(4), data, code, bits, device)).collect();
        let c_name = CString::new(name).unwrap();
        let attr_name = CString::new("epsilon").unwrap();
        let attrs = [CAttr { name: attr_name.as_ptr(), kind: attr_kind, i: 1, f: 1e-5, s: std::ptr::null(), ints: std::ptr::null(), floats: std::ptr::null(), count: 3 }];
        let name_ptr: *const c_char = if null_name { std::ptr::null() } else { c_name.as_ptr() };
        let tensor_ptr = if null_tensors { std::ptr::null_mut() } else { tensors.as_mut_ptr() };
        // Only CPU tensors may carry our buffer into a kernel; CUDA tensors must be refused
        // before a launch (there is no device here) or reach a device error.
        // SAFETY: pointers are null or valid for the counts used (<= 8 tensors, 1 attribute).
        let code = unsafe {
            dlkern_call(name_ptr, tensor_ptr, num_inputs, num_outputs, std::ptr::null_mut(), attrs.as_ptr(), num_attrs.min(1))
        };
        prop_assert!((0..ERR_INTERNAL).contains(&code), "code {code}: a panic was contained, which is a bug");
        let mut out_shapes = [[0i64; 16]; 4];
        let mut outs: Vec<DLTensor> = out_shapes.iter_mut().map(|s| fuzz_tensor(s, 0, 0, 2, 32, 1)).collect();
        // SAFETY: as above.
        let code = unsafe {
            dlkern_infer(name_ptr, tensor_ptr, num_inputs.min(8), outs.as_mut_ptr(), num_outputs.min(4), attrs.as_ptr(), num_attrs.min(1))
        };
        prop_assert!((0..ERR_INTERNAL).contains(&code), "code {code}: a panic was contained, which is a bug");
        // SAFETY: as above.
        prop_assert_ne!(unsafe { dlkern_unregister_kernel(if null_name { std::ptr::null() } else { c_string_not_builtin(&c_name) }) }, ERR_INTERNAL);
        drop(buffer);
    }
}

/// Never unregister the built-in the other tests use: map it to a name that does not exist.
fn c_string_not_builtin(name: &CString) -> *const c_char {
    static MISSING: &[u8] = b"fuzz.not.registered\0";
    if name.as_bytes() == b"dlkern.rmsnorm" { MISSING.as_ptr().cast() } else { name.as_ptr() }
}
