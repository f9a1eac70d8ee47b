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

/// Attribute names the kernels read, for [`fuzz_kernels_with_malformed_dlpack`].
const FUZZ_ATTRS: [&std::ffi::CStr; 14] = [
    c"epsilon",
    c"K",
    c"N",
    c"bits",
    c"block_size",
    c"num_heads",
    c"kv_num_heads",
    c"causal",
    c"scale",
    c"axis",
    c"out_dtype",
    c"w_layout",
    c"do_rotary",
    c"window_left",
];

/// One fuzzed tensor's metadata: dims (and, with `overflow`, two dims before them whose product
/// passes 2^64), strides (None: dense), dtype, device, where its data starts in the shared
/// buffer (None: null data) and its byte offset.
#[derive(Debug, Clone)]
struct FuzzTensor {
    dims: Vec<i64>,
    overflow: bool,
    strides: Option<Vec<i64>>,
    code: u8,
    bits: u8,
    lanes: u16,
    device: u32,
    start: Option<usize>,
    byte_offset: u64,
}

fn fuzz_tensor_strategy() -> impl Strategy<Value = FuzzTensor> {
    (
        proptest::collection::vec(-2i64..6, 0..5),
        proptest::bool::weighted(0.1),
        proptest::option::weighted(0.3, proptest::collection::vec(-2i64..9, 0..5)),
        (0u8..8, prop_oneof![Just(8u8), Just(16), Just(32), Just(64), any::<u8>()], prop_oneof![Just(1u16), 0u16..4]),
        prop_oneof![4 => Just(1u32), 1 => Just(2u32), 1 => 0u32..20],
        proptest::option::weighted(0.85, 0usize..4),
        prop_oneof![Just(0u64), Just(1), Just(2), Just(8), Just(24)],
    )
        .prop_map(|(dims, overflow, strides, (code, bits, lanes), device, start, byte_offset)| FuzzTensor {
            dims,
            overflow,
            strides,
            code,
            bits,
            lanes,
            device,
            start,
            byte_offset,
        })
}

proptest! {
    // (DLKERN_FUZZ_CASES: a longer campaign.)
    #![proptest_config(ProptestConfig {
        cases: std::env::var("DLKERN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000),
        ..ProptestConfig::default()
    })]
    /// Malformed DLPack tensors (null data with elements, negative dims and strides, strides of
    /// another rank, byte offsets and unaligned data, unknown dtypes and lanes, other devices,
    /// dims whose product overflows) and attributes of every kind and value, against every
    /// registered kernel through `dlkern_call` and `dlkern_infer`: each returns a code, and no
    /// panic is ever contained (one would mean a check is missing). The data, where not null,
    /// lies in a buffer larger than any extent the small dims can describe; only dims whose
    /// product overflows are huge, as a valid caller's tensor never is.
    #[test]
    fn fuzz_kernels_with_malformed_dlpack(
        kernel in any::<prop::sample::Index>(),
        tensors in proptest::collection::vec(fuzz_tensor_strategy(), 0..12),
        num_inputs in 0usize..12,
        attrs in proptest::collection::vec((0usize..FUZZ_ATTRS.len(), -1i32..6, prop_oneof![
            Just(0i64), Just(1), Just(4), Just(32), Just(-1), Just(1 << 40), Just(i64::MIN), Just(i64::MAX)]), 0..5),
    ) {
        let names = dlkern::registry::names();
        let name = CString::new(kernel.get(&names).as_str()).unwrap();
        let mut buffer = vec![0u64; 1 << 13];
        let base = buffer.as_mut_ptr() as usize;
        let mut shapes: Vec<Vec<i64>> = tensors
            .iter()
            .map(|t| if t.overflow { [&[1i64 << 33, 1 << 33][..], &t.dims[..]].concat() } else { t.dims.clone() })
            .collect();
        let mut strides: Vec<Option<Vec<i64>>> = tensors.iter().map(|t| t.strides.clone()).collect();
        let mut dl: Vec<DLTensor> = tensors
            .iter()
            .zip(shapes.iter_mut().zip(strides.iter_mut()))
            .map(|(t, (shape, strides))| DLTensor {
                // Host memory only on host devices: a CUDA tensor (kDLCUDA, kDLCUDAManaged)
                // over host memory is no malformed tensor but a caller's broken promise, which
                // a GPU host would turn into a device fault.
                data: t.start.filter(|_| ![2, 13].contains(&t.device)).map_or(0, |s| base + 64 + s) as *mut _,
                device: DLDevice { device_type: DLDeviceType(t.device), device_id: 0 },
                ndim: shape.len() as i32,
                dtype: DLDataType { code: DLDataTypeCode(t.code), bits: t.bits, lanes: t.lanes },
                shape: shape.as_mut_ptr(),
                // Strides of their own length: another rank than the shape's is a malformed
                // tensor the ABI must refuse (it reads `ndim` of them, so pad to that).
                strides: strides.as_mut().map_or(std::ptr::null_mut(), |s| {
                    s.resize(s.len().max(shape.len()), 1);
                    s.as_mut_ptr()
                }),
                byte_offset: t.byte_offset,
            })
            .collect();
        let ints = [3i64, -1, 1 << 40];
        let floats = [1e-5f64, -1.0, f64::NAN];
        let text = c"f16";
        let c_attrs: Vec<CAttr> = attrs
            .iter()
            .map(|&(n, kind, i)| CAttr {
                name: FUZZ_ATTRS[n].as_ptr(),
                kind,
                i,
                f: i as f64,
                s: text.as_ptr(),
                ints: ints.as_ptr(),
                floats: floats.as_ptr(),
                count: (i.rem_euclid(4)).min(3),
            })
            .collect();
        let num_inputs = num_inputs.min(dl.len());
        // SAFETY: every pointer is null or valid for what it describes: the name, the tensors'
        // shape and stride arrays (ndim elements each), data in `buffer` past every extent the
        // small dims describe, attribute strings and arrays of `count` elements.
        let code = unsafe {
            dlkern_call(
                name.as_ptr(),
                dl.as_mut_ptr(),
                num_inputs as i32,
                (dl.len() - num_inputs) as i32,
                std::ptr::null_mut(),
                c_attrs.as_ptr(),
                c_attrs.len() as i32,
            )
        };
        prop_assert!((0..ERR_INTERNAL).contains(&code), "{name:?}: code {code}: a panic was contained, which is a bug");
        let mut out_shapes = [[0i64; 16]; 4];
        let mut outs: Vec<DLTensor> = out_shapes.iter_mut().map(|s| fuzz_tensor(s, 0, 0, 2, 32, 1)).collect();
        // SAFETY: as above.
        let code = unsafe {
            dlkern_infer(name.as_ptr(), dl.as_ptr(), num_inputs as i32, outs.as_mut_ptr(), 4, c_attrs.as_ptr(), c_attrs.len() as i32)
        };
        prop_assert!((0..ERR_INTERNAL).contains(&code), "{name:?}: code {code}: a panic was contained, which is a bug");
        drop(buffer);
    }
}

/// A call site through the C ABI: `dlkern_call_at` gives what `dlkern_call` gives (the CPU
/// kernels keep nothing with it; CUDA `dlkern.matmul_nbits` keeps its repacked weights there),
/// a NULL site is an error that says how to make one, and destroying NULL does nothing.
#[test]
fn call_sites_through_the_c_abi() {
    let (rows, d) = (3usize, 8usize);
    let x: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.1).collect();
    let (mut y_plain, mut y_site) = (vec![0f32; rows * d], vec![0f32; rows * d]);
    let (mut xs, mut ws, mut ys) = ([rows as i64, d as i64], [d as i64], [rows as i64, d as i64]);
    let tensor = |data: *mut f32, shape: &mut [i64]| DLTensor {
        data: data.cast(),
        device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let attrs = [CAttr::float(c"epsilon", 1e-6)];
    let name = c"dlkern.rmsnorm";
    let (xp, wp) = (x.as_ptr().cast_mut(), w.as_ptr().cast_mut());
    let mut plain = [tensor(xp, &mut xs), tensor(wp, &mut ws), tensor(y_plain.as_mut_ptr(), &mut ys)];
    // SAFETY: host tensors of the shapes given, alive for the calls; the scale is constant.
    unsafe {
        assert_eq!(dlkern_call(name.as_ptr(), plain.as_mut_ptr(), 2, 1, std::ptr::null_mut(), attrs.as_ptr(), 1), OK);
        let site = dlkern_site_create(0b10);
        assert!(!site.is_null());
        for _ in 0..3 {
            let mut through = [tensor(xp, &mut xs), tensor(wp, &mut ws), tensor(y_site.as_mut_ptr(), &mut ys)];
            let code = dlkern_call_at(
                site,
                name.as_ptr(),
                through.as_mut_ptr(),
                2,
                1,
                std::ptr::null_mut(),
                attrs.as_ptr(),
                1,
            );
            assert_eq!(code, OK);
            assert_eq!(y_site, y_plain);
        }
        dlkern_site_destroy(site);
        dlkern_site_destroy(std::ptr::null_mut());
        let mut through = [tensor(xp, &mut xs), tensor(wp, &mut ws), tensor(y_site.as_mut_ptr(), &mut ys)];
        let code = dlkern_call_at(
            std::ptr::null(),
            name.as_ptr(),
            through.as_mut_ptr(),
            2,
            1,
            std::ptr::null_mut(),
            attrs.as_ptr(),
            1,
        );
        assert_eq!(code, ERR_INVALID_ARGUMENT);
        let message = std::ffi::CStr::from_ptr(dlkern_last_error()).to_string_lossy().into_owned();
        assert!(message.contains("site is NULL"), "{message}");
    }
}
