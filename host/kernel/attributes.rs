//! Kernel attributes: named ints, floats, strings and lists, as ONNX node attributes carry
//! them, with typed getters whose errors name the attribute.

use crate::error::{Error, Result};

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    String(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

impl AttrValue {
    fn kind(&self) -> &'static str {
        match self {
            AttrValue::Int(_) => "int",
            AttrValue::Float(_) => "float",
            AttrValue::String(_) => "string",
            AttrValue::Ints(_) => "ints",
            AttrValue::Floats(_) => "floats",
        }
    }
}

/// The attributes of one call, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attributes {
    items: Vec<(String, AttrValue)>,
}

impl Attributes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `n` attributes without growing (a converted C list's length).
    pub(crate) fn with_capacity(n: usize) -> Self {
        Attributes { items: Vec::with_capacity(n) }
    }

    /// Adds (or replaces) an attribute; builder style.
    pub fn with(mut self, name: impl Into<String>, value: AttrValue) -> Self {
        self.set(name, value);
        self
    }

    /// Adds or replaces an attribute.
    pub fn set(&mut self, name: impl Into<String>, value: AttrValue) {
        let name = name.into();
        match self.items.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.items.push((name, value)),
        }
    }

    /// [`set`](Self::set) into a list being refilled whose first `filled` items are this fill's
    /// so far: an earlier one of the same name takes the value; otherwise item `filled` takes
    /// the name (reusing its buffer) and the value. Returns the new count of filled items.
    pub(crate) fn refill_at(&mut self, filled: usize, name: &str, value: AttrValue) -> usize {
        if let Some(slot) = self.items[..filled].iter_mut().find(|(n, _)| n == name) {
            slot.1 = value;
            return filled;
        }
        match self.items.get_mut(filled) {
            Some(item) => {
                if item.0 != name {
                    item.0.clear();
                    item.0.push_str(name);
                }
                item.1 = value;
            }
            None => self.items.push((name.to_owned(), value)),
        }
        filled + 1
    }

    /// Keeps the first `len` attributes.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.items.truncate(len);
    }

    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.items.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.items.iter().map(|(n, v)| (n.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn wrong(name: &str, want: &str, got: &AttrValue) -> Error {
        Error::InvalidArgument {
            kernel: "attributes",
            message: format!("attribute '{name}' is {} (expected {want})", got.kind()),
        }
    }

    /// Integer attribute, or `None` when absent.
    pub fn int(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name) {
            None => Ok(None),
            Some(AttrValue::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(Self::wrong(name, "int", other)),
        }
    }

    /// Float attribute (an int is accepted and widened), or `None` when absent.
    pub fn float(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(AttrValue::Float(v)) => Ok(Some(*v)),
            Some(AttrValue::Int(v)) => Ok(Some(*v as f64)),
            Some(other) => Err(Self::wrong(name, "float", other)),
        }
    }

    /// String attribute, or `None` when absent.
    pub fn string(&self, name: &str) -> Result<Option<&str>> {
        match self.get(name) {
            None => Ok(None),
            Some(AttrValue::String(v)) => Ok(Some(v)),
            Some(other) => Err(Self::wrong(name, "string", other)),
        }
    }

    /// Integer attribute that must be present.
    pub fn require_int(&self, name: &str) -> Result<i64> {
        self.int(name)?.ok_or_else(|| Self::missing(name))
    }

    fn missing(name: &str) -> Error {
        Error::InvalidArgument { kernel: "attributes", message: format!("required attribute '{name}' is missing") }
    }
}
