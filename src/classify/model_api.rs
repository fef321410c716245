//! Model APIs (OpenAI, Anthropic and the SDKs generated for them): their statuses, their retry
//! headers, and the error bodies that tell one 429 from another.

use super::http::{classify_response, status_error};
use super::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    NeverClassifyEos, ServerHint,
};
use crate::error::{ErrorCode, ToolError};
use crate::peek::ErrorBody;
use http::{HeaderMap, Response, StatusCode};
use std::time::Duration;

/// Classifies a model API's answers as its official SDKs read them, on top of
/// [`HttpClassifier`](super::HttpClassifier)'s table:
///
/// | answer | verdict | code |
/// |---|---|---|
/// | 429 whose error body's `type` or `code` is `insufficient_quota` (OpenAI) | `Failure(Permanent)`: no wait fixes it | `quota_exhausted` |
/// | other 429 | `Failure(Transient)` | `rate_limited` |
/// | 529 (Anthropic "overloaded"), or an error body of type `overloaded_error` | `Failure(Transient)`: not processed | `unavailable` |
/// | 409 (a lock timeout; the SDKs retry it) | `Failure(Transient)` | `conflict` (a model API's 409 only: elsewhere a 409 may mean a write was applied, and [`HttpClassifier`](super::HttpClassifier) keeps it `Permanent`; classify other APIs with that) |
/// | `x-should-retry: false` on a failure | its class, with the hint "do not retry" | - |
/// | `x-should-retry: true` on a failure the table would not retry (`Permanent`, `ModelRecoverable`) | `Failure(Transient)` | its code |
/// | anything else | as [`HttpClassifier`](super::HttpClassifier) | |
///
/// The delay is `retry-after-ms` (milliseconds, as the SDKs read it first), else `Retry-After`
/// (seconds or an HTTP date), both clamped to [`MAX_HINT`](super::hint::MAX_HINT) (an infinite
/// `retry-after-ms` too; the [`hint`](super::hint) module has every value's rule).
/// `x-should-retry: true` never makes an `Ambiguous` failure (a 500, a 503) look unprocessed: a
/// write the server may have applied is still retried only if its class allows it.
///
/// The error body is read by a [`PeekErrorBodyLayer`](crate::peek::PeekErrorBodyLayer) below the
/// classifying layers (bounded in size and time, the body still handed on whole); without one,
/// a 429 is `rate_limited` whatever its body says.
///
/// On a reqwest client (features `reqwest`, `reqwest-0_13`) it classifies `reqwest::Response`
/// too, by its status and headers (`x-should-retry`, `retry-after-ms`, 529, 409) and its errors
/// as `ReqwestClassifier` (feature `reqwest`) does. The peek works on `http::Response`:
/// for the error body's signals put `.map_response(http::Response::from)` between the client
/// and the [`PeekErrorBodyLayer`](crate::peek::PeekErrorBodyLayer), and the stack answers
/// `http::Response` (the README's "Guarding a model API" has the stack).
///
/// ```
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::{Classify, ClassifiedResponse, ModelApiClassifier, FailureClass};
/// use stormguard::peek::ErrorBody;
/// use stormguard::error::ErrorCode;
/// use std::time::Duration;
///
/// let classify = |resp: http::Response<()>| {
///     let ClassifiedResponse::Ready(c) = ModelApiClassifier.classify(&Ok::<_, std::io::Error>(resp)) else { unreachable!() };
///     c
/// };
/// // OpenAI's 429 for a used-up quota: permanent.
/// let mut resp = http::Response::builder().status(429).body(()).unwrap();
/// resp.extensions_mut().insert(ErrorBody::parse(br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#));
/// let c = classify(resp);
/// assert_eq!((c.failure_class(), c.code()), (Some(FailureClass::Permanent), Some(ErrorCode::QuotaExhausted)));
///
/// // Anthropic's 529 with the SDKs' millisecond header.
/// let resp = http::Response::builder().status(529).header("retry-after-ms", "1500").body(()).unwrap();
/// let c = classify(resp);
/// assert_eq!(c.failure_class(), Some(FailureClass::Transient));
/// assert_eq!(c.hint(), ServerHint::RetryAfter(Duration::from_millis(1500)));
///
/// // The server says not to retry.
/// let resp = http::Response::builder().status(500).header("x-should-retry", "false").body(()).unwrap();
/// assert_eq!(classify(resp).hint(), ServerHint::DoNotRetry);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelApiClassifier;

impl<B, E: AsDynError> Classify<Response<B>, E> for ModelApiClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Response<B>, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(resp) => classify_model_response(
                resp.status(),
                resp.headers(),
                resp.extensions().get::<ErrorBody>(),
            ),
            Err(e) => classify_model_error(e.as_dyn_error()),
        })
    }

    fn dependency_error(&self, resp: &Response<B>) -> Option<ToolError> {
        model_dependency_error(
            resp.status(),
            resp.headers(),
            resp.extensions().get::<ErrorBody>(),
        )
    }
}

/// An error, read as a model API's: a failure status a client turned into an
/// [`HttpStatusError`](super::HttpStatusError) by this table (its body excerpt as the error
/// body), anything else by [`classify_error`].
pub(super) fn classify_model_error(err: &(dyn std::error::Error + 'static)) -> Classification {
    model_status_error(err).unwrap_or_else(|| classify_error(err))
}

/// The first `HttpStatusError` in `err`'s chain, by this table, unless a `ToolError` (a layer's
/// own word) comes before it.
pub(super) fn model_status_error(
    err: &(dyn std::error::Error + 'static),
) -> Option<Classification> {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<ToolError>() {
            return None;
        }
        if let Some(answer) = e.downcast_ref::<super::HttpStatusError>() {
            let body = answer.body_bytes().map(ErrorBody::parse);
            let c = classify_model_response(answer.status(), answer.headers(), body.as_ref());
            // A success status proves nothing: read as any other error.
            return (c.verdict() != super::Verdict::Success).then_some(c);
        }
        next = e.source();
    }
    None
}

/// The error an operation that ends on this answer gives up with: the provider's own words.
pub(super) fn model_dependency_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<&ErrorBody>,
) -> Option<ToolError> {
    let c = classify_model_response(status, headers, body);
    let (class, code) = (c.failure_class()?, c.code()?);
    let err = match body.and_then(|b| b.kind.clone().or_else(|| b.code.clone())) {
        Some(kind) => {
            let what = format!("HTTP {} {kind}", status.as_u16());
            let hint = match body.and_then(|b| b.message.as_deref()) {
                Some(message) => format!("the model API answered {what}: {message}"),
                None => format!("the model API answered {what}"),
            };
            ToolError::new(code).with_class(class).with_hint(hint)
        }
        None => status_error(status, headers)?.with_class(class),
    };
    // The server's delay, even beside "do not retry": the model may come back after it (but no
    // wait fixes a used-up quota or a bad request).
    Some(match delay(headers) {
        Some(after) if matches!(class, FailureClass::Transient | FailureClass::Ambiguous) => {
            err.with_retry_after(after)
        }
        _ => err,
    })
}

/// The table of [`ModelApiClassifier`].
pub(super) fn classify_model_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<&ErrorBody>,
) -> Classification {
    use FailureClass::*;
    let overloaded = status.as_u16() == 529 || body.is_some_and(|b| b.is("overloaded_error"));
    let base = match status.as_u16() {
        _ if status.is_success() => return classify_response(status, headers),
        429 if body.is_some_and(|b| b.is("insufficient_quota")) => {
            // No wait fixes a used-up quota, whatever the headers say.
            return Classification::failure(Permanent, ErrorCode::QuotaExhausted);
        }
        409 => Classification::failure(Transient, ErrorCode::Conflict),
        _ if overloaded => Classification::failure(Transient, ErrorCode::Unavailable),
        _ => classify_response(status, headers),
    };
    let (Some(class), Some(code)) = (base.failure_class(), base.code()) else {
        return base;
    };
    let c = match should_retry(headers) {
        Some(true) if matches!(class, Permanent | ModelRecoverable) => {
            Classification::failure(Transient, code)
        }
        _ => Classification::failure(class, code),
    };
    c.with_hint(hint(headers))
}

/// `x-should-retry`, if it says `true` or `false`.
fn should_retry(headers: &HeaderMap) -> Option<bool> {
    match headers.get("x-should-retry")?.to_str().ok()?.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn hint(headers: &HeaderMap) -> ServerHint {
    if should_retry(headers) == Some(false) {
        return ServerHint::DoNotRetry;
    }
    delay(headers).map_or(ServerHint::None, ServerHint::RetryAfter)
}

/// The server's delay: `retry-after-ms`, else `Retry-After`, clamped to `MAX_HINT`.
fn delay(headers: &HeaderMap) -> Option<Duration> {
    let ms = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(super::hint::parse_retry_after_ms);
    if ms.is_some() {
        return ms;
    }
    match super::http::server_hint(headers) {
        ServerHint::RetryAfter(after) => Some(after),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::hint::MAX_HINT;

    fn c(status: u16, headers: &[(&str, &str)], body: Option<&str>) -> Classification {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let body = body.map(|b| ErrorBody::parse(b.as_bytes()));
        classify_model_response(StatusCode::from_u16(status).unwrap(), &map, body.as_ref())
    }

    type Case = (
        u16,
        &'static [(&'static str, &'static str)],
        Option<&'static str>,
        Option<FailureClass>,
        Option<ErrorCode>,
    );

    #[test]
    fn the_table() {
        use FailureClass::*;
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let limit = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let cases: [Case; 11] = [
            (200, &[], None, None, None),
            (
                429,
                &[],
                Some(quota),
                Some(Permanent),
                Some(ErrorCode::QuotaExhausted),
            ),
            (
                429,
                &[("x-should-retry", "true")],
                Some(quota),
                Some(Permanent),
                Some(ErrorCode::QuotaExhausted),
            ),
            (
                429,
                &[],
                Some(limit),
                Some(Transient),
                Some(ErrorCode::RateLimited),
            ),
            (
                429,
                &[],
                None,
                Some(Transient),
                Some(ErrorCode::RateLimited),
            ),
            (
                529,
                &[],
                Some(overloaded),
                Some(Transient),
                Some(ErrorCode::Unavailable),
            ),
            (
                529,
                &[],
                None,
                Some(Transient),
                Some(ErrorCode::Unavailable),
            ),
            (409, &[], None, Some(Transient), Some(ErrorCode::Conflict)),
            (
                400,
                &[("x-should-retry", "true")],
                None,
                Some(Transient),
                Some(ErrorCode::InvalidArgument),
            ),
            // `true` never makes a 500 look unprocessed.
            (
                500,
                &[("x-should-retry", "true")],
                None,
                Some(Ambiguous),
                Some(ErrorCode::Unavailable),
            ),
            (
                400,
                &[],
                None,
                Some(ModelRecoverable),
                Some(ErrorCode::InvalidArgument),
            ),
        ];
        for (status, headers, body, class, code) in cases {
            let got = c(status, headers, body);
            assert_eq!(
                (got.failure_class(), got.code()),
                (class, code),
                "{status} {headers:?} {body:?}"
            );
        }
    }

    #[test]
    fn the_delay_headers() {
        assert_eq!(
            c(429, &[("retry-after-ms", "250")], None).hint(),
            ServerHint::RetryAfter(Duration::from_millis(250))
        );
        assert_eq!(
            c(
                429,
                &[("retry-after-ms", "12.5"), ("retry-after", "30")],
                None
            )
            .hint(),
            ServerHint::RetryAfter(Duration::from_micros(12_500))
        );
        assert_eq!(
            c(
                429,
                &[("retry-after-ms", "soon"), ("retry-after", "3")],
                None
            )
            .hint(),
            ServerHint::RetryAfter(Duration::from_secs(3))
        );
        assert_eq!(
            c(429, &[("retry-after-ms", "-5")], None).hint(),
            ServerHint::None
        );
        assert_eq!(
            c(429, &[("retry-after-ms", "1e30")], None).hint(),
            ServerHint::RetryAfter(MAX_HINT)
        );
        assert_eq!(
            c(
                503,
                &[("x-should-retry", "false"), ("retry-after", "3")],
                None
            )
            .hint(),
            ServerHint::DoNotRetry
        );
        assert_eq!(
            c(503, &[("x-should-retry", "maybe")], None).hint(),
            ServerHint::None
        );
    }
}
