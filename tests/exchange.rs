//! `dlkern_call_objects` against a framework made up here: its "objects" are boxed host
//! tensors, its exchange table the five DLPack functions over them, with counters that show
//! every allocation either handed back as an object or released. What a real framework adds
//! (PyTorch's table, its caching allocator, its current stream) is tested from Python on the
//! GPU host (tests/python/test_kernels_api.py).

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};

use dlkern::capi::*;
use dlkern::dlpack::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI,
    DLPackExchangeAPIHeader, DLPackVersion, DLTensor,
};
use dlkern::registry::CAttr;

/// A tensor object of the made-up framework: f32 or i8 host data, row-major.
struct Object {
    magic: u64,
    shape: Vec<i64>,
    dtype: DLDataType,
    bytes: Vec<u8>,
}

const MAGIC: u64 = 0x0b1ec7;

fn f32_dtype() -> DLDataType {
    DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 }
}

impl Object {
    fn f32(shape: &[i64], values: &[f32]) -> Box<Object> {
        Box::new(Object { magic: MAGIC, shape: shape.to_vec(), dtype: f32_dtype(), bytes: bytemuck_f32(values) })
    }

    fn values_f32(&self) -> Vec<f32> {
        self.bytes.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }
}

fn bytemuck_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
    static RELEASED: Cell<usize> = const { Cell::new(0) };
    static OBJECTS_MADE: Cell<usize> = const { Cell::new(0) };
    static FAIL_ALLOCATION: Cell<bool> = const { Cell::new(false) };
    /// Makes the n-th conversion to an object fail (1-based; 0: none).
    static FAIL_OBJECT_AT: Cell<usize> = const { Cell::new(0) };
}

fn bump(counter: &'static std::thread::LocalKey<Cell<usize>>) {
    counter.with(|c| c.set(c.get() + 1));
}

fn count(counter: &'static std::thread::LocalKey<Cell<usize>>) -> usize {
    counter.with(Cell::get)
}

/// A managed tensor of the framework: the versioned struct first, the object it will become.
#[repr(C)]
struct Managed {
    managed: DLManagedTensorVersioned,
    object: Box<Object>,
}

unsafe extern "C" fn release(tensor: *mut DLManagedTensorVersioned) {
    bump(&RELEASED);
    // SAFETY: every tensor this framework hands out is the head of a boxed Managed.
    drop(unsafe { Box::from_raw(tensor.cast::<Managed>()) });
}

unsafe extern "C" fn allocate(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char)>,
) -> c_int {
    if FAIL_ALLOCATION.with(Cell::get) {
        // SAFETY: dlkern passes its callback and context.
        unsafe { set_error.unwrap()(error_ctx, c"MemoryError".as_ptr(), c"no room for it".as_ptr()) };
        return -1;
    }
    // SAFETY: dlkern passes a prototype with ndim shape entries.
    let p = unsafe { &*prototype };
    let shape = unsafe { std::slice::from_raw_parts(p.shape, p.ndim as usize) }.to_vec();
    let n: i64 = shape.iter().product();
    let bytes = vec![0u8; n as usize * usize::from(p.dtype.bits / 8)];
    let mut boxed = Box::new(Managed {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 3 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(release),
            flags: dlpark::DlpackFlags::empty(),
            // SAFETY: filled in below.
            dl_tensor: unsafe { std::mem::zeroed() },
        },
        object: Box::new(Object { magic: MAGIC, shape, dtype: p.dtype, bytes }),
    });
    let object = &mut *boxed.object;
    boxed.managed.dl_tensor = DLTensor {
        data: object.bytes.as_mut_ptr().cast(),
        device: p.device,
        ndim: object.shape.len() as i32,
        dtype: object.dtype,
        shape: object.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    bump(&ALLOCATED);
    // SAFETY: out is writable.
    unsafe { *out = Box::into_raw(boxed).cast() };
    0
}

unsafe extern "C" fn to_dltensor(object: *mut c_void, out: *mut DLTensor) -> c_int {
    // SAFETY: the test passes only boxed Objects or things whose first word is not MAGIC.
    let object = unsafe { &mut *object.cast::<Object>() };
    if object.magic != MAGIC {
        return -1;
    }
    // SAFETY: out is writable.
    unsafe {
        *out = DLTensor {
            data: object.bytes.as_mut_ptr().cast(),
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: object.shape.len() as i32,
            dtype: object.dtype,
            shape: object.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    };
    0
}

unsafe extern "C" fn to_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> c_int {
    // SAFETY: tensors dlkern hands back come from `allocate`; the spec gives them to us either way.
    let managed = unsafe { Box::from_raw(tensor.cast::<Managed>()) };
    let nth = count(&OBJECTS_MADE) + 1;
    if FAIL_OBJECT_AT.with(Cell::get) == nth {
        bump(&RELEASED);
        return -1;
    }
    bump(&OBJECTS_MADE);
    // SAFETY: out is writable.
    unsafe { *out = Box::into_raw(managed.object).cast() };
    0
}

unsafe extern "C" fn unused_from_py_object(_: *mut c_void, _: *mut *mut DLManagedTensorVersioned) -> c_int {
    -1
}

unsafe extern "C" fn no_stream(_: DLDeviceType, _: i32, out: *mut *mut c_void) -> c_int {
    // SAFETY: out is writable.
    unsafe { *out = std::ptr::null_mut() };
    0
}

fn table(major: u32, prev: *mut DLPackExchangeAPIHeader) -> DLPackExchangeAPI {
    DLPackExchangeAPI {
        header: DLPackExchangeAPIHeader { version: DLPackVersion { major, minor: 0 }, prev_api: prev },
        managed_tensor_allocator: Some(allocate),
        managed_tensor_from_py_object_no_sync: Some(unused_from_py_object),
        managed_tensor_to_py_object_no_sync: Some(to_object),
        dltensor_from_py_object_no_sync: Some(to_dltensor),
        current_work_stream: Some(no_stream),
    }
}

fn last_error() -> String {
    // SAFETY: NUL-terminated, valid until this thread's next call.
    unsafe { CStr::from_ptr(dlkern_last_error()) }.to_string_lossy().into_owned()
}

fn reset_counters() {
    for c in [&ALLOCATED, &RELEASED, &OBJECTS_MADE, &FAIL_OBJECT_AT] {
        c.with(|c| c.set(0));
    }
    FAIL_ALLOCATION.with(|c| c.set(false));
}

/// One call; returns the code and the output slots.
fn call(
    api: &DLPackExchangeAPI,
    name: &CStr,
    inputs: &[*mut c_void],
    num_outputs: usize,
    attrs: &[CAttr],
) -> (i32, Vec<*mut c_void>) {
    // Non-null garbage: dlkern must clear the slots itself.
    let mut outputs = vec![std::ptr::dangling_mut::<c_void>(); num_outputs];
    // SAFETY: live objects of this framework, slots for num_outputs pointers.
    let code = unsafe {
        dlkern_call_objects(
            std::ptr::null_mut(),
            name.as_ptr(),
            (&raw const *api).cast(),
            inputs.as_ptr(),
            inputs.len() as i32,
            outputs.as_mut_ptr(),
            num_outputs as i32,
            std::ptr::null_mut(),
            attrs.as_ptr(),
            attrs.len() as i32,
        )
    };
    (code, outputs)
}

fn take(object: *mut c_void) -> Box<Object> {
    // SAFETY: objects dlkern hands back are this framework's boxed Objects.
    unsafe { Box::from_raw(object.cast::<Object>()) }
}

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / row.len() as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(w).map(move |(&v, &g)| (f64::from(v) * inv * f64::from(g)) as f32)
        })
        .collect()
}

#[test]
fn outputs_come_from_the_frameworks_allocator_and_return_as_its_objects() {
    reset_counters();
    let api = table(1, std::ptr::null_mut());
    for (rows, d) in [(1usize, 1usize), (7, 97), (3, 1025)] {
        let xv: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
        let wv: Vec<f32> = (0..d).map(|i| 0.5 + (i % 11) as f32 * 0.1).collect();
        let (x, w) = (Object::f32(&[rows as i64, d as i64], &xv), Object::f32(&[d as i64], &wv));
        let inputs = [(&raw const *x).cast_mut().cast(), (&raw const *w).cast_mut().cast()];
        let (code, outputs) = call(&api, c"dlkern.rmsnorm", &inputs, 1, &[CAttr::float(c"epsilon", 1e-6)]);
        assert_eq!(code, OK, "{}", last_error());
        let y = take(outputs[0]);
        assert_eq!(y.shape, [rows as i64, d as i64]);
        let want = rmsnorm_ref(&xv, &wv, 1e-6);
        for (got, want) in y.values_f32().iter().zip(&want) {
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{got} vs {want}");
        }
    }
    assert_eq!((count(&ALLOCATED), count(&OBJECTS_MADE), count(&RELEASED)), (3, 3, 0));

    // Two outputs of other dtypes, through a call site.
    let xv: Vec<f32> = (0..5 * 64).map(|i| ((i * 7 % 13) as f32 - 6.0) / 2.0).collect();
    let x = Object::f32(&[5, 64], &xv);
    let mut outputs = [std::ptr::null_mut(); 2];
    let site = dlkern_site_create(0);
    let inputs = [(&raw const *x).cast_mut().cast::<c_void>()];
    // SAFETY: as in `call`, with a live site.
    let code = unsafe {
        dlkern_call_objects(
            site,
            c"dlkern.quantize_per_token".as_ptr(),
            (&raw const api).cast(),
            inputs.as_ptr(),
            1,
            outputs.as_mut_ptr(),
            2,
            std::ptr::null_mut(),
            std::ptr::null(),
            0,
        )
    };
    // SAFETY: made above, used no more.
    unsafe { dlkern_site_destroy(site) };
    assert_eq!(code, OK, "{}", last_error());
    let (q, scales) = (take(outputs[0]), take(outputs[1]));
    assert_eq!((q.shape.as_slice(), q.dtype.code, q.dtype.bits), (&[5i64, 64][..], DLDataTypeCode::INT, 8));
    assert_eq!(scales.shape, [5]);
    let scales = scales.values_f32();
    for (i, &v) in xv.iter().enumerate() {
        let back = f32::from(q.bytes[i] as i8) * scales[i / 64];
        assert!((back - v).abs() <= scales[i / 64], "{back} vs {v}");
    }
}

#[test]
fn failures_release_every_output_and_say_why() {
    let api = table(1, std::ptr::null_mut());
    let x = Object::f32(&[2, 8], &[1.0; 16]);
    let w7 = Object::f32(&[7], &[1.0; 7]);
    let eps = [CAttr::float(c"epsilon", 1e-6)];
    let ptr = |o: &Object| (&raw const *o).cast_mut().cast::<c_void>();

    // The kernel refuses its inputs after its output was allocated: released, none handed out.
    reset_counters();
    let (code, outputs) = call(&api, c"dlkern.rmsnorm", &[ptr(&x), ptr(&w7)], 1, &eps);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("shape [7] (expected [8])"), "{}", last_error());
    assert_eq!(outputs, [std::ptr::null_mut()]);
    assert_eq!((count(&ALLOCATED), count(&RELEASED), count(&OBJECTS_MADE)), (1, 1, 0));

    // No kernel of that name: nothing is allocated.
    reset_counters();
    let (code, outputs) = call(&api, c"dlkern.no_such_kernel", &[ptr(&x)], 1, &[]);
    assert_eq!(code, ERR_UNKNOWN_KERNEL);
    assert_eq!(outputs, [std::ptr::null_mut()]);
    assert_eq!(count(&ALLOCATED), 0);

    // The allocator fails: its message reaches the caller.
    reset_counters();
    FAIL_ALLOCATION.with(|c| c.set(true));
    let w = Object::f32(&[8], &[1.0; 8]);
    let (code, outputs) = call(&api, c"dlkern.rmsnorm", &[ptr(&x), ptr(&w)], 1, &eps);
    assert_eq!(code, ERR_KERNEL_FAILED);
    assert!(last_error().contains("MemoryError: no room for it"), "{}", last_error());
    assert_eq!(outputs, [std::ptr::null_mut()]);

    // The second output cannot become an object: the first is in its slot, the rest released.
    reset_counters();
    FAIL_OBJECT_AT.with(|c| c.set(2));
    let (code, outputs) = call(&api, c"dlkern.quantize_per_token", &[ptr(&x)], 2, &[]);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("output 1"), "{}", last_error());
    assert!(!outputs[0].is_null() && outputs[1].is_null());
    drop(take(outputs[0]));
    assert_eq!((count(&ALLOCATED), count(&OBJECTS_MADE), count(&RELEASED)), (2, 1, 1));

    // A table without a way back to objects: refused before anything is allocated or launched.
    reset_counters();
    let mut one_way = table(1, std::ptr::null_mut());
    one_way.managed_tensor_to_py_object_no_sync = None;
    let (code, outputs) = call(&one_way, c"dlkern.rmsnorm", &[ptr(&x), ptr(&w)], 1, &eps);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("has no managed_tensor_to_py_object_no_sync"), "{}", last_error());
    assert_eq!((outputs, count(&ALLOCATED)), (vec![std::ptr::null_mut()], 0));

    // An input the table cannot describe.
    reset_counters();
    let not_a_tensor = [0u64; 8];
    let (code, _) = call(&api, c"dlkern.rmsnorm", &[ptr(&x), not_a_tensor.as_ptr().cast_mut().cast()], 1, &eps);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("input 1 is not a tensor"), "{}", last_error());

    // Bad counts and a null table.
    let (code, _) = call(&api, c"dlkern.rmsnorm", &[], 1, &eps);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    // SAFETY: a null table is refused before anything is read.
    let code = unsafe {
        dlkern_call_objects(
            std::ptr::null_mut(),
            c"dlkern.rmsnorm".as_ptr(),
            std::ptr::null(),
            [ptr(&x)].as_ptr(),
            1,
            [std::ptr::null_mut()].as_mut_ptr(),
            1,
            std::ptr::null_mut(),
            std::ptr::null(),
            0,
        )
    };
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("api is null"), "{}", last_error());
}

/// A framework that publishes a newer major version first: dlkern walks `prev_api` to the
/// table it reads, and refuses a chain without one.
#[test]
fn the_table_of_dlkerns_major_version_is_found_through_prev_api() {
    reset_counters();
    let mut v1 = table(1, std::ptr::null_mut());
    let v2 = table(2, (&raw mut v1).cast());
    let x = Object::f32(&[1, 4], &[1.0, -2.0, 3.0, -4.0]);
    let w = Object::f32(&[4], &[1.0; 4]);
    let inputs = [(&raw const *x).cast_mut().cast(), (&raw const *w).cast_mut().cast()];
    let (code, outputs) = call(&v2, c"dlkern.rmsnorm", &inputs, 1, &[CAttr::float(c"epsilon", 0.0)]);
    assert_eq!(code, OK, "{}", last_error());
    let y = take(outputs[0]).values_f32();
    let rms = (30f32 / 4.0).sqrt();
    assert!(y.iter().zip([1.0, -2.0, 3.0, -4.0]).all(|(g, v)| (g - v / rms).abs() < 1e-6), "{y:?}");

    let lonely = table(2, std::ptr::null_mut());
    let (code, _) = call(&lonely, c"dlkern.rmsnorm", &inputs, 1, &[]);
    assert_eq!(code, ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("major versions [2]; dlkern reads 1"), "{}", last_error());
}
