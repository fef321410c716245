//! Server hints: `Retry-After` and `grpc-retry-pushback-ms`, parsed by pure functions.
//!
//! A malformed `Retry-After` is ignored (`None`), never guessed at. A malformed
//! `grpc-retry-pushback-ms` means "do not retry", as gRFC A6 says. Huge values are clamped to
//! [`MAX_HINT`] here, and again by each retry policy's own maximum. Value by value:
//!
//! | hint | a delay | huge (or infinite, where the syntax has it) | negative | otherwise malformed (NaN, text, a fraction where the syntax has none) |
//! |---|---|---|---|---|
//! | `Retry-After` (RFC 9110: digits or an HTTP date) | that delay; a past date is zero | clamped | ignored | ignored |
//! | `retry-after-ms` (the model SDKs': a decimal number of milliseconds) | that delay | clamped (`1e400`, `inf`, `Infinity` too) | ignored | ignored |
//! | `grpc-retry-pushback-ms` (gRFC A6: a 32-bit integer) | that delay | clamped up to `i32::MAX`; beyond it is malformed | do not retry | do not retry |
//! | gRPC `RetryInfo` (a `google.protobuf.Duration`) | that delay | clamped | ignored | ignored |
//!
//! An ignored `retry-after-ms` leaves `Retry-After` to be read; an ignored `RetryInfo` leaves
//! no hint. `tests/hint_values.rs` holds the whole table.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use stormguard::classify::hint::{parse_pushback_ms, parse_retry_after, ServerHint};
//!
//! assert_eq!(parse_retry_after("30", SystemTime::now()), Some(Duration::from_secs(30)));
//! assert_eq!(parse_retry_after("in a bit", SystemTime::now()), None); // ignored, not guessed
//! assert_eq!(parse_pushback_ms("oops"), ServerHint::DoNotRetry); // gRFC A6: do not retry
//! ```

use std::time::{Duration, SystemTime};

/// The largest delay a parsed hint can carry (one day); larger values are clamped to it.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::{parse_pushback_ms, ServerHint, MAX_HINT};
///
/// assert_eq!(MAX_HINT, Duration::from_secs(86_400));
/// // `i32::MAX` milliseconds is about 24.8 days: clamped to one day.
/// assert_eq!(parse_pushback_ms("2147483647"), ServerHint::RetryAfter(MAX_HINT));
/// ```
pub const MAX_HINT: Duration = Duration::from_secs(24 * 60 * 60);

/// What the server asked the client to do.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::classify_error;
/// use stormguard::error::{ErrorCode, ToolError};
///
/// assert_eq!(ServerHint::default(), ServerHint::None);
/// let wait = Duration::from_secs(2);
/// let throttled = ToolError::new(ErrorCode::RateLimited).with_retry_after(wait);
/// assert_eq!(classify_error(&throttled).hint(), ServerHint::RetryAfter(wait));
/// let bad_arg = ToolError::new(ErrorCode::InvalidArgument); // not retryable
/// assert_eq!(classify_error(&bad_arg).hint(), ServerHint::DoNotRetry);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ServerHint {
    /// No hint.
    #[default]
    None,
    /// Wait at least this long before the next attempt.
    RetryAfter(Duration),
    /// Do not retry (a negative or malformed gRPC pushback, or an error already marked
    /// non-retryable).
    DoNotRetry,
}

/// Parses an HTTP `Retry-After` value: delay-seconds, or an HTTP-date relative to `now`.
///
/// Returns `None` for a malformed value; a date in the past gives `Duration::ZERO`; anything above
/// [`MAX_HINT`] is clamped to it.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::classify::hint::{parse_retry_after, MAX_HINT};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now), Some(Duration::from_secs(10)));
/// assert_eq!(parse_retry_after("soon", now), None);
/// assert_eq!(parse_retry_after("-5", now), None);
/// assert_eq!(parse_retry_after("99999999999999999999", now), Some(MAX_HINT));
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: delay-seconds. Too many digits to fit is still a valid, huge delay.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_HINT));
    }
    parse_http_date(value, now)
}

#[cfg(feature = "http")]
fn parse_http_date(value: &str, now: SystemTime) -> Option<Duration> {
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_HINT),
    )
}

#[cfg(not(feature = "http"))]
fn parse_http_date(_value: &str, _now: SystemTime) -> Option<Duration> {
    None
}

/// Parses the model SDKs' `retry-after-ms` (OpenAI's and Anthropic's): a decimal number of
/// milliseconds, read first, before `Retry-After`.
///
/// Returns `None` for a value that is no delay (negative, NaN, not a number), so `Retry-After`
/// is read instead; anything above [`MAX_HINT`] is clamped to it, an infinite value (`1e400`,
/// `inf`, `Infinity`) included.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::{parse_retry_after_ms, MAX_HINT};
///
/// assert_eq!(parse_retry_after_ms("1500"), Some(Duration::from_millis(1_500)));
/// assert_eq!(parse_retry_after_ms("12.5"), Some(Duration::from_micros(12_500)));
/// assert_eq!(parse_retry_after_ms("1e400"), Some(MAX_HINT));
/// assert_eq!(parse_retry_after_ms("Infinity"), Some(MAX_HINT));
/// assert_eq!(parse_retry_after_ms("-5"), None);
/// assert_eq!(parse_retry_after_ms("NaN"), None);
/// ```
pub fn parse_retry_after_ms(value: &str) -> Option<Duration> {
    let ms = value.trim().parse::<f64>().ok()?;
    if ms.is_nan() || ms < 0.0 {
        return None;
    }
    // An infinite or huge value does not fit a `Duration`: it is the longest wait there is.
    Some(
        Duration::try_from_secs_f64(ms / 1000.0)
            .unwrap_or(MAX_HINT)
            .min(MAX_HINT),
    )
}

/// Parses gRPC's `grpc-retry-pushback-ms` (gRFC A6): a non-negative 32-bit count of
/// milliseconds to wait before the retry.
///
/// A negative value means "do not retry", and so does a malformed one (not an integer, empty,
/// out of the 32-bit range): A6 says a pushback that is not a valid non-negative integer "will
/// be seen as the server asking the client not to retry at all".
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::{parse_pushback_ms, ServerHint};
///
/// assert_eq!(parse_pushback_ms("250"), ServerHint::RetryAfter(Duration::from_millis(250)));
/// assert_eq!(parse_pushback_ms("-1"), ServerHint::DoNotRetry);
/// for malformed in ["abc", "1.5", "", " ", "99999999999", "+-3"] {
///     assert_eq!(parse_pushback_ms(malformed), ServerHint::DoNotRetry, "{malformed:?}");
/// }
/// ```
pub fn parse_pushback_ms(value: &str) -> ServerHint {
    match value.trim().parse::<i32>().map(u64::try_from) {
        Ok(Ok(ms)) => ServerHint::RetryAfter(Duration::from_millis(ms).min(MAX_HINT)),
        _ => ServerHint::DoNotRetry,
    }
}
