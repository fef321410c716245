//! Every metric name of the crate, and the helpers that record them (tracing events are written
//! where they happen).
//!
//! The hot path records one counter through a static key (no allocation); the rest are recorded
//! only when something goes wrong.

use crate::class::ToolClass;
use metrics::{Key, Label, Level, Metadata};

pub(crate) const OPERATIONS: &str = "stormguard_operations_total";
pub(crate) const RETRIES: &str = "stormguard_retries_total";
pub(crate) const ACCEPTED_RETRIES: &str = "stormguard_retries_paid_by_acceptance_total";
pub(crate) const REFUSALS: &str = "stormguard_retry_refusals_total";
pub(crate) const ESCALATIONS: &str = "stormguard_escalations_total";
pub(crate) const CLASS_TIGHTENED: &str = "stormguard_class_tightened_total";
pub(crate) const CLASS_FROM_EVIDENCE: &str = "stormguard_class_from_evidence_total";
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
pub(crate) const UNREAD_QUOTA_BODIES: &str = "stormguard_unread_quota_bodies_total";
pub(crate) const KEYS_NOT_DELIVERED: &str = "stormguard_keys_not_delivered_total";
pub(crate) const ANSWER_STATUS_OVERRULED: &str = "stormguard_answer_status_overruled_total";
pub(crate) const TOOLBOX_REBUILDS: &str = "stormguard_toolbox_rebuilds_total";
pub(crate) const UNCARRIED: &str = "stormguard_operations_uncarried_total";
pub(crate) const SAGA_EVENTS: &str = "stormguard_saga_events_total";
pub(crate) const BREAKER_STATE: &str = "stormguard_breaker_state";
pub(crate) const BREAKER_TRANSITIONS: &str = "stormguard_breaker_transitions_total";
pub(crate) const BREAKER_REJECTIONS: &str = "stormguard_breaker_rejections_total";
pub(crate) const BREAKER_OUTCOMES: &str = "stormguard_breaker_outcomes_total";
pub(crate) const RECEIPT_OUTCOMES: &str = "stormguard_receipt_outcomes_total";
pub(crate) const KEY_REFUSALS: &str = "stormguard_key_refusals_total";
pub(crate) const HELD_CALLS: &str = "stormguard_held_calls_total";
pub(crate) const QUOTA_WAITS: &str = "stormguard_quota_waits_total";
pub(crate) const LOANS_REFUSED: &str = "stormguard_budget_loans_refused_total";
pub(crate) const FAILOVER_MOVES: &str = "stormguard_failover_moves_total";
#[cfg(feature = "redis")]
pub(crate) const FLEET_UP: &str = "stormguard_fleet_up";
#[cfg(feature = "redis")]
pub(crate) const FLEET_TRANSITIONS: &str = "stormguard_fleet_transitions_total";
#[cfg(feature = "redis")]
pub(crate) const FLEET_LOCAL: &str = "stormguard_fleet_local_decisions_total";

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

/// A retry the dependency's acceptance paid for (not the ratio balance).
pub(crate) fn retry_accepted(class: ToolClass) {
    metrics::counter!(ACCEPTED_RETRIES, "class" => class.as_str()).increment(1);
}

/// A run was sent to the floor because it may not borrow: `reason` is `run_share` or
/// `lending_limit`.
pub(crate) fn loan_refused(reason: &'static str) {
    metrics::counter!(LOANS_REFUSED, "reason" => reason).increment(1);
}

pub(crate) fn retry_refused(class: ToolClass, reason: &'static str) {
    metrics::counter!(REFUSALS, "class" => class.as_str(), "reason" => reason).increment(1);
}

pub(crate) fn escalated(class: ToolClass, code: &'static str) {
    metrics::counter!(ESCALATIONS, "class" => class.as_str(), "code" => code).increment(1);
}

/// A layer joined an operation with a stricter class than it had (see `Retry`'s docs).
pub(crate) fn class_tightened(from: ToolClass, to: ToolClass) {
    metrics::counter!(CLASS_TIGHTENED, "from" => from.as_str(), "to" => to.as_str()).increment(1);
}

/// A layer decided stricter than declared, from what its request or its name shows (labels
/// `declared`, `seen`, `evidence`).
pub(crate) fn class_from_evidence(declared: ToolClass, seen: ToolClass, evidence: &'static str) {
    metrics::counter!(
        CLASS_FROM_EVIDENCE,
        "declared" => declared.as_str(),
        "seen" => seen.as_str(),
        "evidence" => evidence
    )
    .increment(1);
}

/// A JSON answer said it failed where its classifier called it a success (labels `layer`,
/// `status`).
pub(crate) fn answer_status_overruled(layer: &str, status: u16) {
    metrics::counter!(
        ANSWER_STATUS_OVERRULED,
        "layer" => layer.to_owned(),
        "status" => status.to_string()
    )
    .increment(1);
}

/// A model API's 429 was classified without its body (see `unread_model_429`).
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
pub(crate) fn unread_quota_body() {
    metrics::counter!(UNREAD_QUOTA_BODIES).increment(1);
}

/// A keyed write's body never read the key stamped on its call (label `tool`).
pub(crate) fn key_not_delivered(tool: &str) {
    metrics::counter!(KEYS_NOT_DELIVERED, "tool" => tool.to_owned()).increment(1);
}

/// A toolbox declaration was built again in this process.
pub(crate) fn toolbox_rebuilt() {
    metrics::counter!(TOOLBOX_REBUILDS).increment(1);
}

/// A nested retry layer found no operation to join (label `layer`: its name).
pub(crate) fn operation_uncarried(layer: &str) {
    metrics::counter!(UNCARRIED, "layer" => layer.to_owned()).increment(1);
}

/// A saga run's event (label `saga`: its name; `event`: started, step_done, completed,
/// compensating, compensated, halted).
pub(crate) fn saga_event(saga: &str, event: &'static str) {
    metrics::counter!(SAGA_EVENTS, "saga" => saga.to_owned(), "event" => event).increment(1);
}

macro_rules! outcome_keys {
    ($name:expr; $($outcome:literal),*) => {{
        [$(($outcome, {
            static LABELS: [Label; 1] = [Label::from_static_parts("outcome", $outcome)];
            Key::from_static_parts($name, &LABELS)
        })),*]
    }};
}

/// The receipt layer's outcomes, each with its key made once (a key with a label made per call
/// allocates, recorder or not: once per write).
static RECEIPT_KEYS: [(&str, Key); 10] = outcome_keys!(RECEIPT_OUTCOMES;
    "fresh", "recorded", "receipt", "left_pending", "abandoned", "resumed_with_key",
    "read_back_found", "read_back_absent", "receipt_not_stored", "store_unavailable");

/// A receipt layer's outcome (hot path: a static key for every known outcome).
pub(crate) fn receipt_outcome(outcome: &'static str) {
    match RECEIPT_KEYS.iter().find(|(name, _)| *name == outcome) {
        Some((_, key)) => {
            metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
        }
        None => metrics::counter!(RECEIPT_OUTCOMES, "outcome" => outcome).increment(1),
    }
}

/// The held-calls book's events for `tool`: `held`, `refused_unknown`, `refused_in_flight`,
/// `refused_done`, `resolved`, `forgotten`.
pub(crate) fn held_call(tool: &str, event: &'static str) {
    metrics::counter!(HELD_CALLS, "tool" => tool.to_owned(), "event" => event).increment(1);
}

pub(crate) fn key_refused(code: crate::error::ErrorCode) {
    metrics::counter!(KEY_REFUSALS, "code" => code.as_str()).increment(1);
}

/// A call left a failover target (label `target`: its name; `reason`: why).
pub(crate) fn failover_left(target: &str, reason: &'static str) {
    metrics::counter!(FAILOVER_MOVES, "target" => target.to_string(), "reason" => reason)
        .increment(1);
}
