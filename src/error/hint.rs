//! The hints of the errors a `Retry` ends an operation with, built in one place so that each one
//! agrees with the error's `retryable: false`: none of them tells the reader to retry now.
//!
//! `may_have_acted` is true after an ambiguous failure of a write only: a read changes nothing,
//! so its hint never asks the reader to check whether it took effect.

use super::ErrorCode;
use std::borrow::Cow;
use std::time::Duration;

/// The operation's attempts are spent.
pub(crate) fn attempts_spent(attempts: u32, code: ErrorCode, may_have_acted: bool) -> String {
    format!(
        "the call failed {attempts} times ({code}); the retries of this operation are spent, do not repeat it now: {}",
        if may_have_acted {
            "the last attempt may have taken effect, check before acting again"
        } else {
            "report the failure instead of repeating the call"
        }
    )
}

/// The server asked not to be retried (a negative or malformed `grpc-retry-pushback-ms`).
pub(crate) fn pushed_back(code: ErrorCode, may_have_acted: bool) -> String {
    format!(
        "the dependency failed ({code}) and asked not to be retried; do not repeat this call now{}",
        ambiguous_tail(may_have_acted)
    )
}

/// The request could not be copied for another attempt (a streaming body).
pub(crate) fn not_replayable(code: ErrorCode, may_have_acted: bool) -> String {
    format!(
        "the call failed ({code}) and its request cannot be sent again automatically (its body is a stream); do not repeat it now{}",
        ambiguous_tail(may_have_acted)
    )
}

/// The ratio budget is spent while the dependency throttles (it is up, not down).
pub(crate) fn throttled_budget(retry_after: Option<Duration>) -> String {
    let wait = match retry_after {
        Some(after) => format!(
            "wait {} s, then ",
            after.as_secs_f64().ceil().max(1.0) as u64
        ),
        None => String::new(),
    };
    format!(
        "the dependency is rate limiting these calls and the retry budget is spent; {wait}send fewer calls at a time"
    )
}

/// The ratio budget `name` is spent: the dependency that draws on it keeps failing.
pub(crate) fn budget_spent(name: &str) -> String {
    format!(
        "the dependency keeps failing and its retry budget (`{name}`) is spent; do not retry now, report the outage of `{name}`"
    )
}

/// The deadline passed while the call waited to be sent (a quota, a pool): it was not sent.
pub(crate) fn deadline_before_sending() -> &'static str {
    "the operation's deadline passed while the call waited to be sent (for a quota or a connection), so it was not sent; do not retry within this operation"
}

/// An attempt cut off in flight by the operation's deadline, ending with `code`.
pub(crate) fn cut_off(code: ErrorCode, may_have_acted: bool) -> String {
    let what = "the operation's deadline passed while the call was in flight, so it was cut off";
    match code {
        ErrorCode::DeadlineExceeded if may_have_acted => format!(
            "{what}; it may have taken effect, and it is safe to send again: retry later with the \
             same arguments, or report the timeout"
        ),
        ErrorCode::DeadlineExceeded => {
            format!("{what}; do not retry within this operation: report the timeout")
        }
        _ => format!(
            "{what}; it may have taken effect and cannot be repeated safely: do not retry, \
             escalate to a person or verify with a consistent read"
        ),
    }
}

/// The error of a layer that waited inside its call (a keyed quota) past the operation's
/// deadline and so sends nothing.
pub(crate) fn not_sent_by_deadline() -> super::ToolError {
    super::ToolError::new(ErrorCode::DeadlineExceeded)
        .with_retryable(false)
        .with_hint(deadline_before_sending())
}

/// An escalation decided by what the request showed (an HTTP POST without a key) rather than by
/// the declared class: the hint says so, and how a developer who knows better says it.
pub(crate) fn from_evidence(hint: &str, seen: crate::class::Evidence) -> String {
    format!(
        "{hint} (decided as {}: the call is {}; a developer who knows the endpoint is safe to \
         resend declares it with trust_class)",
        seen.class().as_str(),
        seen.describe()
    )
}

/// The hint of a refusal or an escalation whose code says it all.
pub(crate) fn of(code: ErrorCode) -> Cow<'static, str> {
    Cow::Borrowed(code.default_hint())
}

fn ambiguous_tail(may_have_acted: bool) -> &'static str {
    if may_have_acted {
        "; it may have taken effect, check before acting again"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_that_may_have_acted_is_told_to_check() {
        let code = ErrorCode::Unavailable;
        for may_have_acted in [false, true] {
            for hint in [
                attempts_spent(3, code, may_have_acted),
                pushed_back(code, may_have_acted),
                not_replayable(code, may_have_acted),
            ] {
                assert_eq!(
                    hint.contains("may have taken effect"),
                    may_have_acted,
                    "{hint}"
                );
            }
        }
    }
}
