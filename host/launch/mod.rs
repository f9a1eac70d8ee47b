//! TEMPORARY until the probe move lands: the probe launchers.
pub mod probe;
pub(crate) use crate::ops::common::checks::{check_same_device, check_slice};
