// What every kernel family's table of entry points (`ENTRIES` in its layout.rs) is made of: the
// element types in entry names, and the lookup. No device code: each layout.rs `include!`s this
// file, so that the device crate, the host launchers and tests/ptx.rs compile it alike.

/// The element type an entry point is for: the `_dtype` part of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    /// The name part, spelled as the host's `DType::name` spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// The element type called `name` (`f32`, `f16`, `bf16`), if entry points are made for it.
    pub fn from_name(name: &str) -> Option<Dtype> {
        [Dtype::F32, Dtype::F16, Dtype::Bf16].into_iter().find(|d| d.name() == name)
    }
}

/// The symbol `table` pairs with `key`, if it has one.
fn find<K: Copy + PartialEq>(table: &[(K, &'static str)], key: K) -> Option<&'static str> {
    table.iter().find(|&&(k, _)| k == key).map(|&(_, name)| name)
}
