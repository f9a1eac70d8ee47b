//! Attributes as C passes them (`dlkern_attr` in `include/dlkern.h`), both ways.

use std::ffi::{CStr, c_char};

use crate::error::{Error, Result};
use crate::kernel::{AttrValue, Attributes};

impl Attributes {
    /// Converts C attributes (see `include/dlkern.h`).
    ///
    /// # Safety
    /// `attrs` must be null (with `count` 0) or point to `count` valid `dlkern_attr`s whose
    /// strings are NUL-terminated and whose arrays hold `count` elements.
    pub unsafe fn from_c(attrs: *const CAttr, count: i32) -> Result<Self> {
        let mut out = Attributes::with_capacity(count.max(0) as usize);
        // SAFETY: forwarded contract.
        unsafe { out.refill_from_c(attrs, count)? };
        Ok(out)
    }

    /// As [`from_c`](Self::from_c), into `self`, whose names' buffers it reuses: a caller that
    /// passes the same attributes call after call (the C ABI's per-thread list) allocates
    /// nothing for them. On an error `self` holds an unspecified list.
    ///
    /// # Safety
    /// As [`from_c`](Self::from_c).
    pub(crate) unsafe fn refill_from_c(&mut self, attrs: *const CAttr, count: i32) -> Result<()> {
        let bad = |message: String| Error::InvalidArgument { kernel: "attributes", message };
        if count < 0 || (count > 0 && attrs.is_null()) {
            return Err(bad(format!("{count} attributes at {attrs:?}")));
        }
        let mut filled = 0;
        for i in 0..count as usize {
            // SAFETY: the caller guarantees count valid elements.
            let a = unsafe { &*attrs.add(i) };
            // SAFETY: the caller guarantees NUL-terminated strings.
            let name = unsafe { c_str(a.name) }.ok_or_else(|| bad(format!("attribute {i} has no valid name")))?;
            let list_len = |n: i64| -> Result<usize> {
                if !(0..=(1 << 24)).contains(&n) {
                    Err(bad(format!("attribute '{name}' has count {n}")))
                } else {
                    Ok(n as usize)
                }
            };
            let value = match a.kind {
                ATTR_INT => AttrValue::Int(a.i),
                ATTR_FLOAT => AttrValue::Float(a.f),
                ATTR_STRING => AttrValue::String(
                    // SAFETY: as above.
                    unsafe { c_string(a.s) }.ok_or_else(|| bad(format!("attribute '{name}' has no valid string")))?,
                ),
                ATTR_INTS | ATTR_FLOATS => {
                    let n = list_len(a.count)?;
                    let null = if a.kind == ATTR_INTS { a.ints.is_null() } else { a.floats.is_null() };
                    if n > 0 && null {
                        return Err(bad(format!("attribute '{name}' has a null array")));
                    }
                    // SAFETY: non-null with n elements by the caller's contract.
                    unsafe {
                        if a.kind == ATTR_INTS {
                            AttrValue::Ints(if n == 0 {
                                vec![]
                            } else {
                                std::slice::from_raw_parts(a.ints, n).to_vec()
                            })
                        } else {
                            AttrValue::Floats(if n == 0 {
                                vec![]
                            } else {
                                std::slice::from_raw_parts(a.floats, n).to_vec()
                            })
                        }
                    }
                }
                other => return Err(bad(format!("attribute '{name}' has unknown kind {other}"))),
            };
            filled = self.refill_at(filled, name, value);
        }
        self.truncate(filled);
        Ok(())
    }
}

/// `dlkern_attr` kinds.
pub const ATTR_INT: i32 = 0;
pub const ATTR_FLOAT: i32 = 1;
pub const ATTR_STRING: i32 = 2;
pub const ATTR_INTS: i32 = 3;
pub const ATTR_FLOATS: i32 = 4;

/// `dlkern_attr` from `include/dlkern.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CAttr {
    pub name: *const c_char,
    pub kind: i32,
    pub i: i64,
    pub f: f64,
    pub s: *const c_char,
    pub ints: *const i64,
    pub floats: *const f64,
    pub count: i64,
}

impl CAttr {
    /// An integer attribute, as a Rust caller of `dlkern_call` writes one.
    pub const fn int(name: &'static std::ffi::CStr, value: i64) -> Self {
        CAttr {
            name: name.as_ptr(),
            kind: ATTR_INT,
            i: value,
            f: 0.0,
            s: std::ptr::null(),
            ints: std::ptr::null(),
            floats: std::ptr::null(),
            count: 0,
        }
    }

    /// A float attribute, as a Rust caller of `dlkern_call` writes one.
    pub const fn float(name: &'static std::ffi::CStr, value: f64) -> Self {
        CAttr { kind: ATTR_FLOAT, i: 0, f: value, ..Self::int(name, 0) }
    }
}

/// Attributes laid out for a C kernel: the `CAttr` array and the storage it points into.
pub(crate) struct CAttrs<'a> {
    _source: std::marker::PhantomData<&'a Attributes>,
    _names: Vec<std::ffi::CString>,
    _strings: Vec<std::ffi::CString>,
    pub attrs: Vec<CAttr>,
}

impl<'a> CAttrs<'a> {
    pub(crate) fn new(attrs: &'a Attributes) -> Self {
        let names: Vec<std::ffi::CString> =
            attrs.iter().map(|(n, _)| std::ffi::CString::new(n.replace('\0', "")).unwrap_or_default()).collect();
        let strings: Vec<std::ffi::CString> = attrs
            .iter()
            .map(|(_, v)| match v {
                AttrValue::String(s) => std::ffi::CString::new(s.replace('\0', "")).unwrap_or_default(),
                _ => std::ffi::CString::default(),
            })
            .collect();
        let c = attrs
            .iter()
            .enumerate()
            .map(|(i, (_, v))| {
                let mut a = CAttr {
                    name: names[i].as_ptr(),
                    kind: ATTR_INT,
                    i: 0,
                    f: 0.0,
                    s: std::ptr::null(),
                    ints: std::ptr::null(),
                    floats: std::ptr::null(),
                    count: 0,
                };
                match v {
                    AttrValue::Int(x) => a.i = *x,
                    AttrValue::Float(x) => (a.kind, a.f) = (ATTR_FLOAT, *x),
                    AttrValue::String(_) => (a.kind, a.s) = (ATTR_STRING, strings[i].as_ptr()),
                    AttrValue::Ints(x) => (a.kind, a.ints, a.count) = (ATTR_INTS, x.as_ptr(), x.len() as i64),
                    AttrValue::Floats(x) => (a.kind, a.floats, a.count) = (ATTR_FLOATS, x.as_ptr(), x.len() as i64),
                }
                a
            })
            .collect();
        CAttrs { _source: std::marker::PhantomData, _names: names, _strings: strings, attrs: c }
    }
}

/// A NUL-terminated UTF-8 string, or `None` for null/invalid UTF-8.
///
/// # Safety
/// `p` must be null or a NUL-terminated string.
pub(crate) unsafe fn c_string(p: *const c_char) -> Option<String> {
    // SAFETY: forwarded contract.
    unsafe { c_str(p) }.map(str::to_owned)
}

/// [`c_string`] borrowed: valid while the caller's string is (the call, for the C ABI's
/// arguments).
///
/// # Safety
/// `p` must be null or a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refill(kept: &mut Attributes, attrs: &[CAttr]) -> Result<()> {
        // SAFETY: a slice of valid attributes with 'static names.
        unsafe { kept.refill_from_c(attrs.as_ptr(), attrs.len() as i32) }
    }

    fn listed(a: &Attributes) -> Vec<(String, AttrValue)> {
        a.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()
    }

    #[test]
    fn a_refilled_list_equals_a_fresh_one_and_reuses_its_names() {
        let first = [CAttr::int(c"num_heads", 32), CAttr::float(c"scale", 0.5), CAttr::int(c"do_rotary", 1)];
        let mut kept = Attributes::new();
        refill(&mut kept, &first).unwrap();
        // SAFETY: as in `refill`.
        let fresh = unsafe { Attributes::from_c(first.as_ptr(), first.len() as i32) }.unwrap();
        assert_eq!(listed(&kept), listed(&fresh));
        let names: Vec<*const u8> = kept.iter().map(|(n, _)| n.as_ptr()).collect();
        let again = [CAttr::int(c"num_heads", 16), CAttr::float(c"scale", 0.25), CAttr::int(c"do_rotary", 0)];
        refill(&mut kept, &again).unwrap();
        assert_eq!(kept.int("num_heads").unwrap(), Some(16));
        assert_eq!(kept.float("scale").unwrap(), Some(0.25));
        assert_eq!(names, kept.iter().map(|(n, _)| n.as_ptr()).collect::<Vec<_>>(), "names reallocated");
    }

    #[test]
    fn a_refill_drops_what_the_new_list_lacks_and_keeps_the_last_of_a_name() {
        let mut kept = Attributes::new();
        refill(&mut kept, &[CAttr::int(c"a", 1), CAttr::int(c"b", 2), CAttr::int(c"c", 3)]).unwrap();
        refill(&mut kept, &[CAttr::int(c"c", 4), CAttr::int(c"c", 5)]).unwrap();
        assert_eq!(listed(&kept), vec![("c".to_string(), AttrValue::Int(5))]);
        refill(&mut kept, &[]).unwrap();
        assert!(kept.is_empty());
    }

    #[test]
    fn a_failed_refill_is_an_error_and_the_next_one_starts_over() {
        let mut kept = Attributes::new();
        let nameless = CAttr { name: std::ptr::null(), ..CAttr::int(c"x", 1) };
        refill(&mut kept, &[CAttr::int(c"a", 1), nameless]).unwrap_err();
        // SAFETY: a negative count is refused before anything is read.
        assert!(unsafe { kept.refill_from_c(std::ptr::null(), -1) }.is_err());
        refill(&mut kept, &[CAttr::int(c"b", 2)]).unwrap();
        assert_eq!(listed(&kept), vec![("b".to_string(), AttrValue::Int(2))]);
    }
}
