//! DLPack views and managed tensors: layout, every validation error, and fuzzing of the
//! validation with arbitrary (including hostile) field values.

use std::sync::atomic::{AtomicUsize, Ordering};

use dlkern::dlpack::*;
use dlkern::{DType, Error};
use proptest::prelude::*;

fn tensor(data: usize, device: DLDeviceType, dtype: DType, shape: &mut [i64], strides: Option<&mut [i64]>) -> DLTensor {
    DLTensor {
        data: data as *mut _,
        device: DLDevice { device_type: device, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: dtype_to_dl(dtype),
        shape: shape.as_mut_ptr(),
        strides: strides.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
        byte_offset: 0,
    }
}

fn error_of(t: &DLTensor) -> String {
    // SAFETY: the test's tensors have valid shape/stride arrays.
    match unsafe { TensorView::from_raw("t", t) } {
        Err(e @ Error::InvalidTensor { .. }) => e.to_string(),
        other => panic!("expected InvalidTensor, got {other:?}"),
    }
}

#[test]
fn layouts_match_dlpack_h() {
    assert_eq!(size_of::<DLTensor>(), 48);
    assert_eq!(size_of::<DLManagedTensor>(), 64);
    assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
    assert_eq!(size_of::<DLDataType>(), 4);
    assert_eq!(size_of::<DLDevice>(), 8);
    assert_eq!(std::mem::offset_of!(DLTensor, byte_offset), 40);
    assert_eq!(std::mem::offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
}

#[test]
fn dtypes_round_trip() {
    for d in [DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64] {
        assert_eq!(dtype_from_dl(dtype_to_dl(d)), Some(d));
    }
    assert_eq!(dtype_from_dl(DLDataType { code: DLDataTypeCode::FLOAT, bits: 64, lanes: 1 }), None);
    assert_eq!(dtype_from_dl(DLDataType { code: DLDataTypeCode::FLOAT, bits: 16, lanes: 2 }), None);
}

#[test]
fn validation_errors_name_the_problem() {
    let mut shape = [2i64, 3];
    let ok = tensor(0x1000, DLDeviceType::CUDA, DType::F16, &mut shape, None);
    // SAFETY: valid arrays.
    let view = unsafe { TensorView::from_raw("t", &ok) }.unwrap();
    assert_eq!((view.len(), view.dim(-1), view.device()), (6, Some(3), DeviceKind::Cuda(0)));
    // SAFETY: null is allowed and reported.
    let null = unsafe { TensorView::from_raw("t", std::ptr::null()) }.unwrap_err();
    assert!(null.to_string().contains("DLTensor pointer is null"), "{null}");

    assert!(error_of(&DLTensor { data: std::ptr::null_mut(), ..ok }).contains("data is a null pointer"));
    assert!(error_of(&DLTensor { shape: std::ptr::null_mut(), ..ok }).contains("shape is a null pointer"));
    let mut negative = [2i64, -3];
    assert!(
        error_of(&tensor(0x1000, DLDeviceType::CPU, DType::F32, &mut negative, None))
            .contains("dimension 1 is negative")
    );
    assert!(
        error_of(&DLTensor { device: DLDevice { device_type: DLDeviceType::OPENCL, device_id: 0 }, ..ok })
            .contains("unsupported device type 4")
    );
    let f64_dtype = DLDataType { code: DLDataTypeCode::FLOAT, bits: 64, lanes: 1 };
    assert!(error_of(&DLTensor { dtype: f64_dtype, ..ok }).contains("unsupported dtype"));
    assert!(error_of(&DLTensor { data: 0x1001 as *mut _, ..ok }).contains("not aligned to its 2-byte f16 elements"));
    assert!(error_of(&DLTensor { byte_offset: 3, ..ok }).contains("not aligned"));
    assert!(error_of(&DLTensor { ndim: -1, ..ok }).contains("ndim = -1"));
    assert!(error_of(&DLTensor { ndim: 99, ..ok }).contains("ndim = 99"));
    let mut neg_strides = [3i64, -1];
    assert!(
        error_of(&tensor(0x1000, DLDeviceType::CPU, DType::F32, &mut shape.clone(), Some(&mut neg_strides)))
            .contains("stride 1 is negative")
    );
    let mut huge = [i64::MAX, 4];
    assert!(error_of(&tensor(0x1000, DLDeviceType::CPU, DType::F32, &mut huge, None)).contains("overflows"));
    // An empty tensor may have a null data pointer.
    let mut empty = [0i64, 5];
    let e = tensor(0, DLDeviceType::CPU, DType::F32, &mut empty, None);
    // SAFETY: valid arrays.
    assert!(unsafe { TensorView::from_raw("t", &e) }.unwrap().is_empty());
}

#[test]
fn contiguity_and_expectations() {
    let mut shape = [4i64, 1, 8];
    let mut transposed = [1i64, 32, 4];
    let t = tensor(0x1000, DLDeviceType::CPU, DType::F32, &mut shape, Some(&mut transposed));
    // SAFETY: valid arrays.
    let v = unsafe { TensorView::from_raw("x", &t) }.unwrap();
    assert!(!v.is_contiguous());
    assert!(v.expect_contiguous().unwrap_err().to_string().contains("tensor 'x': strides [1, 32, 4]"));
    // Size-1 axes may carry any stride (PyTorch does this).
    let mut odd_unit = [8i64, 12345, 1];
    let t = tensor(0x1000, DLDeviceType::CPU, DType::F32, &mut shape, Some(&mut odd_unit));
    // SAFETY: valid arrays.
    let v = unsafe { TensorView::from_raw("x", &t) }.unwrap();
    assert!(v.is_contiguous());
    assert!(
        v.expect_dtype(&[DType::F16, DType::BF16])
            .unwrap_err()
            .to_string()
            .contains("dtype f32 (expected f16 or bf16)")
    );
    assert!(v.expect_rank(2, 2).unwrap_err().to_string().contains("rank 3 (expected 2)"));
    assert!(v.expect_device(DeviceKind::Cuda(0)).is_err());
    assert_eq!(row_major_strides(&[4, 1, 8]), vec![8, 8, 1]);
}

static DELETED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: allocated by Box in the test.
    drop(unsafe { Box::from_raw(t) });
}

#[test]
fn managed_tensors_call_their_deleter_exactly_once() {
    let shape = Box::leak(Box::new([3i64]));
    let mut make = |major: u32| {
        Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: dlpark::DlpackFlags::READ_ONLY,
            dl_tensor: tensor(0x1000, DLDeviceType::CPU, DType::F32, shape, None),
        }))
    };
    let before = DELETED.load(Ordering::SeqCst);
    {
        // SAFETY: a valid tensor handed over.
        let m = unsafe { ManagedTensor::from_versioned(make(1)) }.unwrap();
        assert!(m.is_read_only());
        assert_eq!(m.view("m").unwrap().shape(), &[3]);
        assert_eq!(DELETED.load(Ordering::SeqCst), before);
    }
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);
    // SAFETY: a valid tensor of another major version: refused and released.
    let err = unsafe { ManagedTensor::from_versioned(make(2)) }.err().unwrap();
    assert!(err.to_string().contains("major version 2"), "{err}");
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    /// Arbitrary field values never crash validation, and accepted views are self-consistent.
    #[test]
    fn fuzz_validation(
        data in prop_oneof![Just(0usize), any::<usize>()],
        device_type in 0u32..20, device_id in any::<i32>(),
        ndim in -3i32..20, code in 0u8..20, bits in any::<u8>(), lanes in 0u16..3,
        shape in proptest::collection::vec(-5i64..1 << 20, 0..20),
        strides in proptest::option::of(proptest::collection::vec(-5i64..1 << 20, 20..=20)),
        byte_offset in any::<u64>(), null_shape in any::<bool>(),
    ) {
        let mut shape_buf = shape.clone();
        shape_buf.resize(20, 1);
        let mut stride_buf = strides.clone();
        let t = DLTensor {
            data: data as *mut _,
            device: DLDevice { device_type: DLDeviceType(device_type), device_id },
            ndim: ndim.min(shape.len() as i32),
            dtype: DLDataType { code: DLDataTypeCode(code), bits, lanes },
            shape: if null_shape { std::ptr::null_mut() } else { shape_buf.as_mut_ptr() },
            strides: stride_buf.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset,
        };
        // SAFETY: shape/strides hold 20 >= ndim elements or are null.
        if let Ok(v) = unsafe { TensorView::from_raw("f", &t) } {
            prop_assert!(v.shape().iter().all(|&d| d >= 0));
            prop_assert_eq!(v.len(), v.shape().iter().product::<i64>() as usize);
            if !v.is_empty() {
                prop_assert!(v.data_address().is_multiple_of(v.dtype().size_bytes() as u64));
            }
            prop_assert_eq!(v.strides().len(), v.ndim());
        }
    }
}
