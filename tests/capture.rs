//! A decode step of one transformer layer through the C ABI (`dlkern_call`), captured into a
//! CUDA graph and replayed: what ONNX Runtime's `enable_cuda_graph` and a C caller's
//! `cuStreamBeginCapture` do with dlkern's ops. The step, as the builder's int4 Llama has it:
//! `SimplifiedLayerNormalization`, the QKV `MatMulNBits` (block 32, the general kernel with its
//! K-split reduction), `GroupQueryAttention` over a shared past/present cache (packed QKV,
//! rotary), the output `MatMulNBits` (block 128, the decode kernel, whose K splits sum in
//! clusters on Hopper) and `SkipSimplifiedLayerNormalization`. Every replay must give the
//! eager run's results bit for bit.

mod common;

#[cfg(test)]
mod gpu {
    use super::common::{self, Rng};
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
    use dlkern::DType;
    use dlkern::capi::dlkern_call;
    use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dtype_to_dl};
    use dlkern::registry::CAttr;
    use half::f16;
    use std::ffi::CStr;
    use std::sync::Arc;

    const HIDDEN: usize = 256;
    const HEADS: usize = 4;
    const KV_HEADS: usize = 2;
    const HEAD: usize = 64;
    const QKV: usize = (HEADS + 2 * KV_HEADS) * HEAD;
    /// Cache capacity and the tokens before the step.
    const CAPACITY: usize = 64;
    const PAST: usize = 40;
    const REPLAYS: usize = 1000;

    /// A tensor for the C ABI: `dtype` of `shape` at `address` (CUDA device 0, or the host).
    struct Tensor {
        address: u64,
        dtype: DType,
        shape: Vec<i64>,
        cuda: bool,
    }

    impl Tensor {
        fn cuda(address: u64, dtype: DType, shape: &[i64]) -> Self {
            Tensor { address, dtype, shape: shape.to_vec(), cuda: true }
        }
        /// An absent optional tensor: zero elements, no data.
        fn absent(dtype: DType) -> Self {
            Tensor { address: 0, dtype, shape: vec![0], cuda: true }
        }
        fn dl(&mut self) -> DLTensor {
            let device_type = if self.cuda { DLDeviceType::CUDA } else { DLDeviceType::CPU };
            DLTensor {
                data: self.address as *mut std::ffi::c_void,
                device: DLDevice { device_type, device_id: 0 },
                ndim: self.shape.len() as i32,
                dtype: dtype_to_dl(self.dtype),
                shape: self.shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            }
        }
    }

    /// One `dlkern_call` of the step: its tensors (inputs first) and attributes.
    struct Call {
        name: &'static CStr,
        tensors: Vec<Tensor>,
        inputs: usize,
        attrs: Vec<CAttr>,
    }

    impl Call {
        fn run(&mut self, stream: &CudaStream) {
            let mut tensors: Vec<DLTensor> = self.tensors.iter_mut().map(Tensor::dl).collect();
            // SAFETY: the header's contract: a NUL-terminated name, valid DLTensors over live
            // buffers of the shapes given (host data owned by the step), the attributes'
            // names 'static, the stream live.
            let code = unsafe {
                dlkern_call(
                    self.name.as_ptr(),
                    tensors.as_mut_ptr(),
                    self.inputs as i32,
                    (tensors.len() - self.inputs) as i32,
                    stream.cu_stream().cast(),
                    self.attrs.as_ptr(),
                    self.attrs.len() as i32,
                )
            };
            let message = if code == 0 {
                String::new()
            } else {
                // SAFETY: dlkern_last_error returns this thread's NUL-terminated message.
                unsafe { CStr::from_ptr(dlkern::capi::dlkern_last_error()) }.to_string_lossy().into_owned()
            };
            assert_eq!(code, 0, "{}: {message}", self.name.to_string_lossy());
        }
    }

    /// The layer's buffers on the device and the step's calls over them.
    struct Step {
        calls: Vec<Call>,
        /// What the step writes: normed x, qkv, attention, projection, y, residual sum, caches.
        outputs: Vec<CudaSlice<f16>>,
        _inputs: Vec<CudaSlice<f16>>,
        _weights: Vec<CudaSlice<u8>>,
        _lengths: CudaSlice<i32>,
        /// `total_sequence_length`, a host tensor the step points at.
        _total: Box<i32>,
    }

    impl Step {
        fn new(stream: &Arc<CudaStream>, rng: &mut Rng) -> Self {
            let up = |v: Vec<f16>| stream.clone_htod(&v).unwrap();
            let x = up(rng.vec::<f16>(HIDDEN, -1.0, 1.0));
            let gamma = up(rng.vec::<f16>(HIDDEN, 0.5, 1.5));
            let gamma2 = up(rng.vec::<f16>(HIDDEN, 0.5, 1.5));
            let angles: Vec<f64> =
                (0..CAPACITY * HEAD / 2).map(|i| (i / (HEAD / 2)) as f64 * 0.1 / (1 + i % (HEAD / 2)) as f64).collect();
            let cos = up(angles.iter().map(|&a| f16::from_f64(a.cos())).collect());
            let sin = up(angles.iter().map(|&a| f16::from_f64(a.sin())).collect());
            let scales_qkv = up(rng.vec::<f16>(QKV * HIDDEN / 32, 0.005, 0.02));
            let scales_o = up(rng.vec::<f16>(HIDDEN * HIDDEN / 128, 0.005, 0.02));
            // The caches: PAST valid positions, the rest of the capacity garbage the step must
            // not read.
            let cache_len = KV_HEADS * CAPACITY * HEAD;
            let key_cache = up(rng.vec::<f16>(cache_len, -1.0, 1.0));
            let value_cache = up(rng.vec::<f16>(cache_len, -1.0, 1.0));
            let codes = |n: usize, rng: &mut Rng| (0..n).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
            let b_qkv = stream.clone_htod(&codes(QKV * HIDDEN / 2, rng)).unwrap();
            let b_o = stream.clone_htod(&codes(HIDDEN * HIDDEN / 2, rng)).unwrap();
            let lengths = stream.clone_htod(&[PAST as i32]).unwrap();
            let mut total = Box::new(PAST as i32 + 1);
            let zeros = |n: usize| stream.alloc_zeros::<f16>(n).unwrap();
            let (normed, qkv, attention, projection, y, sum) =
                (zeros(HIDDEN), zeros(QKV), zeros(HIDDEN), zeros(HIDDEN), zeros(HIDDEN), zeros(HIDDEN));
            let at = |s: &CudaSlice<f16>| s.device_ptr(stream).0;
            let at8 = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
            let h = HIDDEN as i64;
            let f = DType::F16;
            let cache_shape = [1, KV_HEADS as i64, CAPACITY as i64, HEAD as i64];
            let calls = vec![
                Call {
                    name: c"dlkern.simplified_layer_normalization",
                    tensors: vec![
                        Tensor::cuda(at(&x), f, &[1, h]),
                        Tensor::cuda(at(&gamma), f, &[h]),
                        Tensor::cuda(at(&normed), f, &[1, h]),
                    ],
                    inputs: 2,
                    attrs: vec![CAttr::float(c"epsilon", 1e-5), CAttr::int(c"axis", -1), CAttr::int(c"stash_type", 1)],
                },
                Call {
                    name: c"dlkern.matmul_nbits",
                    tensors: vec![
                        Tensor::cuda(at(&normed), f, &[1, h]),
                        Tensor::cuda(at8(&b_qkv), DType::U8, &[QKV as i64, h / 32, 16]),
                        Tensor::cuda(at(&scales_qkv), f, &[QKV as i64, h / 32]),
                        Tensor::cuda(at(&qkv), f, &[1, QKV as i64]),
                    ],
                    inputs: 3,
                    attrs: vec![
                        CAttr::int(c"K", h),
                        CAttr::int(c"N", QKV as i64),
                        CAttr::int(c"bits", 4),
                        CAttr::int(c"block_size", 32),
                    ],
                },
                Call {
                    name: c"dlkern.group_query_attention",
                    tensors: vec![
                        Tensor::cuda(at(&qkv), f, &[1, 1, QKV as i64]),
                        Tensor::absent(f),
                        Tensor::absent(f),
                        Tensor::cuda(at(&key_cache), f, &cache_shape),
                        Tensor::cuda(at(&value_cache), f, &cache_shape),
                        Tensor::cuda(lengths.device_ptr(stream).0, DType::I32, &[1]),
                        Tensor { address: (&raw mut *total) as u64, dtype: DType::I32, shape: vec![1], cuda: false },
                        Tensor::cuda(at(&cos), f, &[CAPACITY as i64, HEAD as i64 / 2]),
                        Tensor::cuda(at(&sin), f, &[CAPACITY as i64, HEAD as i64 / 2]),
                        Tensor::cuda(at(&attention), f, &[1, 1, h]),
                        Tensor::cuda(at(&key_cache), f, &cache_shape),
                        Tensor::cuda(at(&value_cache), f, &cache_shape),
                    ],
                    inputs: 9,
                    attrs: vec![
                        CAttr::int(c"num_heads", HEADS as i64),
                        CAttr::int(c"kv_num_heads", KV_HEADS as i64),
                        CAttr::int(c"do_rotary", 1),
                        CAttr::int(c"local_window_size", -1),
                        CAttr::float(c"softcap", 0.0),
                        CAttr::float(c"scale", 1.0 / (HEAD as f64).sqrt()),
                    ],
                },
                Call {
                    name: c"dlkern.matmul_nbits",
                    tensors: vec![
                        Tensor::cuda(at(&attention), f, &[1, h]),
                        Tensor::cuda(at8(&b_o), DType::U8, &[h, h / 128, 64]),
                        Tensor::cuda(at(&scales_o), f, &[h, h / 128]),
                        Tensor::cuda(at(&projection), f, &[1, h]),
                    ],
                    inputs: 3,
                    attrs: vec![
                        CAttr::int(c"K", h),
                        CAttr::int(c"N", h),
                        CAttr::int(c"bits", 4),
                        CAttr::int(c"block_size", 128),
                    ],
                },
                Call {
                    name: c"dlkern.skip_simplified_layer_normalization",
                    tensors: vec![
                        Tensor::cuda(at(&projection), f, &[1, h]),
                        Tensor::cuda(at(&x), f, &[1, h]),
                        Tensor::cuda(at(&gamma2), f, &[h]),
                        Tensor::cuda(at(&y), f, &[1, h]),
                        Tensor::absent(DType::F32),
                        Tensor::absent(DType::F32),
                        Tensor::cuda(at(&sum), f, &[1, h]),
                    ],
                    inputs: 3,
                    attrs: vec![CAttr::float(c"epsilon", 1e-5)],
                },
            ];
            Step {
                calls,
                outputs: vec![normed, qkv, attention, projection, y, sum, key_cache, value_cache],
                _inputs: vec![x, gamma, gamma2, cos, sin, scales_qkv, scales_o],
                _weights: vec![b_qkv, b_o],
                _lengths: lengths,
                _total: total,
            }
        }

        fn run(&mut self, stream: &CudaStream) {
            for call in &mut self.calls {
                call.run(stream);
            }
        }

        fn results(&self, stream: &Arc<CudaStream>) -> Vec<Vec<u16>> {
            let bits = |s: &CudaSlice<f16>| stream.clone_dtoh(s).unwrap().into_iter().map(f16::to_bits).collect();
            self.outputs.iter().map(bits).collect()
        }

        /// Zeroes what the step computes (not the caches, whose past it reads).
        fn clear(&mut self, stream: &Arc<CudaStream>) {
            for out in &mut self.outputs[..6] {
                stream.memset_zeros(out).unwrap();
            }
        }
    }

    /// A `MatMulNBits` node's call site (constant weights, as the ORT op has them): its first
    /// call repacks the weights and waits for the stream, which a capture cannot hold, so a
    /// capture of it is refused with an error that says what to do, and leaves the capture
    /// valid; after one call outside a capture (ORT's warm-up run), the capture replays.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matmul_nbits_site_refuses_capture_until_repacked() {
        use dlkern::kernel::{AttrValue, Attributes, CallSite};
        let (_device, stream) = common::gpu();
        let mut rng = Rng::new(46);
        let (n, k) = (512usize, 1024usize);
        let a = stream.clone_htod(&rng.vec::<f16>(k, -1.0, 1.0)).unwrap();
        let codes: Vec<u8> = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
        let b = stream.clone_htod(&codes).unwrap();
        let scales = stream.clone_htod(&rng.vec::<f16>(n * k / 32, 0.005, 0.02)).unwrap();
        let y = stream.alloc_zeros::<f16>(n).unwrap();
        let at = |s: &CudaSlice<f16>| s.device_ptr(&stream).0;
        let mut tensors = [
            Tensor::cuda(at(&a), DType::F16, &[1, k as i64]),
            Tensor::cuda(b.device_ptr(&stream).0, DType::U8, &[n as i64, k as i64 / 32, 16]),
            Tensor::cuda(at(&scales), DType::F16, &[n as i64, k as i64 / 32]),
            Tensor::cuda(at(&y), DType::F16, &[1, n as i64]),
        ];
        let attrs = Attributes::new()
            .with("K", AttrValue::Int(k as i64))
            .with("N", AttrValue::Int(n as i64))
            .with("bits", AttrValue::Int(4))
            .with("block_size", AttrValue::Int(32));
        let site = CallSite::new(0b110);
        let call = |tensors: &mut [Tensor]| {
            let mut dl: Vec<DLTensor> = tensors.iter_mut().map(Tensor::dl).collect();
            // SAFETY: device tensors of the shapes described, alive for the test; B and the
            // scales are the same buffers at every call of the site.
            unsafe {
                dlkern::registry::call_at("dlkern.matmul_nbits", &mut dl, 3, stream.cu_stream().cast(), &attrs, &site)
            }
        };
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream.begin_capture(mode).unwrap();
        let refused = call(&mut tensors);
        stream.end_capture(CUgraphInstantiate_flags(0)).expect("the capture is still valid after the refusal");
        let e = refused.unwrap_err().to_string();
        assert!(e.contains("run it once before capturing"), "{e}");
        call(&mut tensors).unwrap();
        let eager = stream.clone_dtoh(&y).unwrap();
        assert!(eager.iter().any(|v| v.to_f32() != 0.0));
        let mut y = y;
        stream.memset_zeros(&mut y).unwrap();
        stream.begin_capture(mode).unwrap();
        call(&mut tensors).unwrap();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
        graph.launch().unwrap();
        assert_eq!(stream.clone_dtoh(&y).unwrap(), eager, "the replay differs from the eager call");
    }

    const NAMES: [&str; 8] =
        ["normed x", "qkv", "attention", "projection", "y", "residual sum", "key cache", "value cache"];

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_decode_step_replays_from_a_cuda_graph_through_the_c_abi() {
        let (_device, stream) = common::gpu();
        let mut step = Step::new(&stream, &mut Rng::new(45));
        // Eager twice: the step is idempotent (it writes the new token at the same position).
        step.run(&stream);
        let eager = step.results(&stream);
        step.clear(&stream);
        step.run(&stream);
        assert_eq!(step.results(&stream), eager, "a second eager step differs from the first");
        for (name, out) in NAMES.iter().zip(&eager).take(6) {
            assert!(out.iter().any(|&v| v != 0), "{name}: all zeros");
        }
        // Thread-local: the other tests' threads keep using the device meanwhile, and anything
        // the step does that a capture forbids (a synchronization, a copy to the host) fails.
        step.clear(&stream);
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        step.run(&stream);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
        // Capturing launched nothing.
        assert!(step.results(&stream)[..6].iter().all(|out| out.iter().all(|&v| v == 0)), "the capture ran kernels");
        for replay in 1..=REPLAYS {
            graph.launch().unwrap();
            if replay == 1 || replay % 250 == 0 {
                let got = step.results(&stream);
                for ((name, got), want) in NAMES.iter().zip(&got).zip(&eager) {
                    assert!(got == want, "replay {replay}: {name} differs from the eager step");
                }
                step.clear(&stream);
            }
        }
    }
}
