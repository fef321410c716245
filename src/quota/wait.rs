//! What a weighted call meets when its quota is short: the wait for its reserved slot, or the
//! error of a call too costly ever to go.

use crate::error::{ErrorCode, ToolError};
use crate::telemetry::QUOTA_WAITS as WAITS;
use std::borrow::Cow;
use std::pin::Pin;
use tokio::time::Sleep;

/// The error of a call that costs more than `what` lets through at once: it could never go.
pub(crate) fn too_costly(cost: u32, burst: u32, what: &str) -> ToolError {
    ToolError::new(ErrorCode::InvalidArgument)
        .with_retryable(false)
        .with_hint(format!(
            "this call costs {cost}, more than {what} allows at once ({burst}); make it smaller"
        ))
}

/// The sleep until a reserved slot comes (none if it is now), counted and traced. The name is a
/// `Cow` so the metric label is a clone of it, not a new string.
#[allow(clippy::ptr_arg)]
pub(crate) fn sleep_for(
    wait: std::time::Duration,
    quota: &Cow<'static, str>,
    cost: u32,
) -> Option<Pin<Box<Sleep>>> {
    if wait.is_zero() {
        return None;
    }
    metrics::counter!(WAITS, "quota" => quota.clone()).increment(1);
    tracing::debug!(
        quota = %quota,
        cost,
        wait_ms = wait.as_millis() as u64,
        "waiting for this key's room in the quota"
    );
    Some(Box::pin(tokio::time::sleep(wait)))
}
