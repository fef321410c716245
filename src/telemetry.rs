//! Metric names and the helpers that record them (tracing events are written where they happen).
//!
//! The hot path records one counter through a static key (no allocation); the rest are recorded
//! only when something goes wrong.

use crate::class::ToolClass;
use metrics::{Key, Label, Level, Metadata};

pub(crate) const OPERATIONS: &str = "stormguard_operations_total";
pub(crate) const RETRIES: &str = "stormguard_retries_total";
pub(crate) const REFUSALS: &str = "stormguard_retry_refusals_total";
pub(crate) const ESCALATIONS: &str = "stormguard_escalations_total";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

macro_rules! class_keys {
    ($name:expr; $($class:literal),*) => {{
        [$({
            static LABELS: [Label; 1] = [Label::from_static_parts("class", $class)];
            Key::from_static_parts($name, &LABELS)
        }),*]
    }};
}

static OPERATION_KEYS: [Key; 5] = class_keys!(OPERATIONS; "read", "idempotent_write", "keyed_write", "unkeyed_write", "multi_step");

fn class_index(class: ToolClass) -> usize {
    match class {
        ToolClass::Read => 0,
        ToolClass::IdempotentWrite => 1,
        ToolClass::KeyedWrite => 2,
        ToolClass::UnkeyedWrite => 3,
        ToolClass::MultiStep => 4,
    }
}

/// One logical operation opened (hot path: a static key, no allocation).
#[inline]
pub(crate) fn operation_opened(class: ToolClass) {
    let key = &OPERATION_KEYS[class_index(class)];
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

pub(crate) fn retry_granted(class: ToolClass, failure: &'static str) {
    metrics::counter!(RETRIES, "class" => class.as_str(), "failure" => failure).increment(1);
}

pub(crate) fn retry_refused(class: ToolClass, reason: &'static str) {
    metrics::counter!(REFUSALS, "class" => class.as_str(), "reason" => reason).increment(1);
}

pub(crate) fn escalated(class: ToolClass, code: &'static str) {
    metrics::counter!(ESCALATIONS, "class" => class.as_str(), "code" => code).increment(1);
}
