//! W4A16 matmul in ONNX Runtime's `MatMulNBits` format (bits = 4): the whole family's device
//! code, its host-shared layout in [`layout`].

pub mod decode;
pub mod layout;
#[cfg(dlkern_arch_specific)]
pub mod packed_wgmma;
#[cfg(dlkern_arch_specific)]
pub mod wgmma;
