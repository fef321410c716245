use super::model_api::{classify_model_response, model_dependency_error};
use super::{
    classify_error, classify_grpc_code, AsDynError, Classification, ClassifiedResponse, Classify,
    FailureClass, NeverClassifyEos, ServerHint,
};
use crate::classify::hint::{parse_pushback_ms, parse_retry_after};
use crate::error::ToolError;
use crate::peek::ErrorBody;
use http::{HeaderMap, Response, StatusCode};
use std::any::Any;
use std::time::SystemTime;

/// Classifies `http::Response`s by status and server hint, and errors by [`classify_error`].
///
/// | status | verdict | code |
/// |---|---|---|
/// | 1xx, 2xx, 3xx | `Success` | - |
/// | 404, 410 | `Empty` (a normal "no such record") | `not_found` |
/// | 408 | `Failure(Transient)` (the server never got the whole request) | `timeout` |
/// | 429 | `Failure(Transient)` | `rate_limited` |
/// | 500, 502, 503 | `Failure(Ambiguous)` (a write may have applied) | `unavailable` |
/// | 504 | `Failure(Ambiguous)` | `timeout` |
/// | other 5xx | `Failure(Ambiguous)` | `internal` |
/// | 401 | `Failure(Permanent)` | `unauthenticated` |
/// | 403 | `Failure(Permanent)` | `permission_denied` |
/// | 409 | `Failure(Permanent)`, [`KeyConflict::InProgress`](super::KeyConflict::InProgress) | `conflict` |
/// | 451 | `Failure(Policy)` | `policy_violation` |
/// | 422 | `Failure(ModelRecoverable)`, [`KeyConflict::Reused`](super::KeyConflict::Reused) | `invalid_argument` |
/// | 400 and other 4xx | `Failure(ModelRecoverable)` | `invalid_argument` |
///
/// **Provider signals without opting in.** Two answers of model APIs are told from their body
/// wherever the body is already in memory (a `String`, `Vec<u8>`, `Bytes` or `&'static str`
/// body, or an [`ErrorBody`] a [`PeekErrorBodyLayer`](crate::peek::PeekErrorBodyLayer) left),
/// so that forgetting [`ModelApiClassifier`](super::ModelApiClassifier) cannot resend a spent
/// quota: a 429 whose error is `insufficient_quota` is `Failure(Permanent)`, `quota_exhausted`
/// (no wait fixes it), and a 529 or an `overloaded_error` is `Failure(Transient)`,
/// `unavailable` (not processed). Everything else is the table above.
///
/// ```
/// use stormguard::classify::{Classify, ClassifiedResponse, FailureClass, HttpClassifier};
/// use stormguard::error::ErrorCode;
///
/// let spent = http::Response::builder()
///     .status(429)
///     .body(r#"{"error":{"type":"insufficient_quota","message":"You exceeded your quota"}}"#.to_string())
///     .unwrap();
/// let ClassifiedResponse::Ready(c) = HttpClassifier.classify(&Ok::<_, std::io::Error>(spent)) else { unreachable!() };
/// assert_eq!((c.failure_class(), c.code()), (Some(FailureClass::Permanent), Some(ErrorCode::QuotaExhausted)));
/// ```
///
/// **409 and 422 under an idempotency key.** A provider that checks keys (Stripe, the IETF
/// `Idempotency-Key` draft) answers 409 while a request with the same key is still being
/// processed and 422 when the key comes back with another payload. The classifier cannot tell
/// whether the request carried a key; it marks both ([`KeyConflict`](super::KeyConflict)) and the
/// [`Retry`](crate::retry::Retry) decides: for a keyed write carrying its key a 409 is retried
/// (with backoff, within its attempts), and a 422 under a key ends as `idempotency_key_reused`,
/// not `invalid_argument` (which tells a model to reword and try again). Under receipts, the
/// key's first send (no earlier request of the key recorded) is answered for itself: a 409 is
/// `conflict`, a 422 `invalid_argument` (a provider's "already sent", "amount must be positive").
///
/// **503 is ambiguous.** A provider may document 503 as "not processed", but a proxy in front of
/// it (Envoy, a load balancer) answers 503 after an upstream reset on a request it had already
/// forwarded, so a 503 does not prove that a write did nothing. Reads, idempotent writes and
/// keyed writes still retry it; an unkeyed write ends `outcome_unknown` and its receipt intent
/// stays pending. Where the provider's documentation promises that a status means "not
/// processed" and nothing sits between you and it, say so with [`NotProcessed`].
///
/// Any status may carry `Retry-After` (seconds or HTTP-date) or `grpc-retry-pushback-ms`; both
/// become a [`ServerHint`]. A malformed `Retry-After` is ignored; a malformed
/// `grpc-retry-pushback-ms` means "do not retry" (gRFC A6), as a negative one does.
///
/// A gRPC call that fails before sending a message answers "trailers-only": HTTP 200 with
/// `grpc-status` in the head. A 2xx head carrying `grpc-status` is classified by that code
/// ([`classify_grpc_code`]), so the classifier works on a tonic `Channel`. A status that arrives
/// in the trailers of a streamed body is not seen from the head: the response counts as a
/// success here; [`GrpcClassifier`](super::GrpcClassifier) reads it from the trailers
/// ([`ClassifiedResponse::RequiresEos`]) for a breaker below the tonic client.
///
/// ```
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::{Classify, ClassifiedResponse, HttpClassifier, Verdict, FailureClass};
/// use std::time::Duration;
///
/// let resp = http::Response::builder().status(429).header("retry-after", "2").body(()).unwrap();
/// let result: Result<_, std::io::Error> = Ok(resp);
/// let ClassifiedResponse::Ready(c) = HttpClassifier.classify(&result) else { unreachable!() };
/// assert_eq!(c.verdict(), Verdict::Failure(FailureClass::Transient));
/// assert_eq!(c.hint(), ServerHint::RetryAfter(Duration::from_secs(2)));
///
/// // A trailers-only gRPC answer: UNAVAILABLE, with a pushback.
/// let resp = http::Response::builder()
///     .header("grpc-status", "14")
///     .header("grpc-retry-pushback-ms", "250")
///     .body(())
///     .unwrap();
/// let ClassifiedResponse::Ready(c) = HttpClassifier.classify(&Ok::<_, std::io::Error>(resp)) else { unreachable!() };
/// assert_eq!(c.verdict(), Verdict::Failure(FailureClass::Transient));
/// assert_eq!(c.hint(), ServerHint::RetryAfter(Duration::from_millis(250)));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpClassifier;

impl<B: 'static, E: AsDynError> Classify<Response<B>, E> for HttpClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Response<B>, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(resp) => classify_answer(resp),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }

    fn dependency_error(&self, resp: &Response<B>) -> Option<ToolError> {
        answer_error(resp)
    }
}

/// An HTTP answer by its status, and by its body where that is in memory and says a quota is
/// spent or the provider is overloaded: what [`HttpClassifier`] and the default classifier read.
pub(super) fn classify_answer<B: 'static>(resp: &Response<B>) -> Classification {
    match provider_signal(resp) {
        Some(body) => classify_model_response(resp.status(), resp.headers(), Some(&body)),
        None => classify_response(resp.status(), resp.headers()),
    }
}

/// The dependency's own error in an HTTP answer read as [`classify_answer`] reads it.
pub(super) fn answer_error<B: 'static>(resp: &Response<B>) -> Option<ToolError> {
    match provider_signal(resp) {
        Some(body) => model_dependency_error(resp.status(), resp.headers(), Some(&body)),
        None => status_error(resp.status(), resp.headers()),
    }
}

/// The error body of an answer that is one of the well-known provider signals no classifier
/// needs to be asked for: a 429 that says the quota is spent (`insufficient_quota`: no wait
/// fixes it, so it is not resent) and an overload (`overloaded_error`, or Anthropic's 529: not
/// processed). Read where the body is in memory (a `String`, `Vec<u8>`, `Bytes` or
/// `&'static str` body) or an [`ErrorBody`] a peek layer left; `None` for anything else, which
/// the status table decides.
fn provider_signal<B: 'static>(resp: &Response<B>) -> Option<ErrorBody> {
    let status = resp.status().as_u16();
    if !matches!(status, 429 | 503 | 529) {
        return None;
    }
    let body = match resp.extensions().get::<ErrorBody>() {
        Some(body) => body.clone(),
        None => ErrorBody::parse(bytes_of(resp.body())?),
    };
    let signal = (status == 429 && body.is("insufficient_quota"))
        || status == 529
        || body.is("overloaded_error");
    signal.then_some(body)
}

/// The bytes of a body that is already in memory.
fn bytes_of<B: 'static>(body: &B) -> Option<&[u8]> {
    let any = body as &dyn Any;
    if let Some(s) = any.downcast_ref::<String>() {
        return Some(s.as_bytes());
    }
    if let Some(v) = any.downcast_ref::<Vec<u8>>() {
        return Some(v);
    }
    if let Some(b) = any.downcast_ref::<bytes::Bytes>() {
        return Some(b);
    }
    any.downcast_ref::<&'static str>().map(|s| s.as_bytes())
}

/// What an HTTP answer classified as a failure said, as the dependency's own error: its code,
/// class and server hint (a delay as `retry_after` where waiting can help, "do not retry" as
/// `retryable: false`), with the status and headers as its source.
pub(super) fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<ToolError> {
    let c = classify_response(status, headers);
    let (class, code) = (c.failure_class()?, c.code()?);
    let what = match headers.get("grpc-status").and_then(|v| v.to_str().ok()) {
        Some(grpc) if status.is_success() => format!("gRPC status {grpc}"),
        _ => format!("HTTP {status}"),
    };
    let err = ToolError::new(code)
        .with_class(class)
        .with_hint(format!("the dependency answered {what}"));
    let err = match c.hint() {
        // A delay helps only a failure that waiting can fix, never a bad request.
        ServerHint::RetryAfter(after) if class.is_dependency_failure() => {
            err.with_retry_after(after)
        }
        ServerHint::RetryAfter(_) => err,
        ServerHint::DoNotRetry => err.with_retryable(false),
        ServerHint::None => err,
    };
    Some(err.with_source(super::HttpStatusError::new(status, headers.clone())))
}

pub(super) fn classify_response(status: StatusCode, headers: &HeaderMap) -> Classification {
    let grpc = status
        .is_success()
        .then(|| headers.get("grpc-status"))
        .flatten()
        .and_then(|v| v.to_str().ok()?.parse::<i32>().ok());
    let c = match grpc {
        Some(code) => classify_grpc_code(code),
        None => classify_status(status),
    };
    if c.failure_class().is_none() {
        return c;
    }
    c.with_hint(server_hint(headers))
}

pub(super) fn server_hint(headers: &HeaderMap) -> ServerHint {
    if let Some(v) = headers.get("grpc-retry-pushback-ms") {
        // Malformed (or not text) means "do not retry" (gRFC A6).
        return v.to_str().map_or(ServerHint::DoNotRetry, parse_pushback_ms);
    }
    headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
        .map_or(ServerHint::None, ServerHint::RetryAfter)
}

/// The status table of [`HttpClassifier`], without headers.
///
/// ```
/// use stormguard::classify::{classify_status, Verdict};
/// assert_eq!(classify_status(http::StatusCode::NOT_FOUND).verdict(), Verdict::Empty);
/// ```
pub fn classify_status(status: StatusCode) -> Classification {
    super::status_table::classify_status_code(status.as_u16())
}

/// The HTTP status of a response, for classifiers that look at it.
///
/// ```
/// use stormguard::classify::HttpStatus;
/// let resp = http::Response::builder().status(503).body(()).unwrap();
/// assert_eq!(resp.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);
/// ```
pub trait HttpStatus {
    /// The status.
    fn http_status(&self) -> StatusCode;
}

impl<B> HttpStatus for Response<B> {
    fn http_status(&self) -> StatusCode {
        self.status()
    }
}

#[cfg(feature = "reqwest")]
impl HttpStatus for reqwest::Response {
    fn http_status(&self) -> StatusCode {
        self.status()
    }
}

#[cfg(feature = "reqwest-0_13")]
impl HttpStatus for reqwest013::Response {
    fn http_status(&self) -> StatusCode {
        self.status()
    }
}

/// A provider's documented promise that some 5xx statuses mean "not processed": a failure with
/// one of them is `Transient` (retried for every class) instead of `Ambiguous`. An explicit,
/// per-provider opt-in: only where the provider documents it and no proxy that answers such a
/// status after forwarding sits in between. Everything else is `inner`'s verdict.
///
/// ```
/// use http::StatusCode;
/// use stormguard::classify::{Classify, ClassifiedResponse, FailureClass, HttpClassifier, NotProcessed};
///
/// let classify = |c: &dyn Fn(&Result<http::Response<()>, std::io::Error>) -> Option<FailureClass>| {
///     let resp = http::Response::builder().status(503).body(()).unwrap();
///     c(&Ok(resp))
/// };
/// let plain = |r: &Result<http::Response<()>, std::io::Error>| match HttpClassifier.classify(r) {
///     ClassifiedResponse::Ready(c) => c.failure_class(),
///     _ => None,
/// };
/// let documented = NotProcessed::new(HttpClassifier, [StatusCode::SERVICE_UNAVAILABLE]).unwrap();
/// let trusted = |r: &Result<http::Response<()>, std::io::Error>| match documented.classify(r) {
///     ClassifiedResponse::Ready(c) => c.failure_class(),
///     _ => None,
/// };
/// assert_eq!(classify(&plain), Some(FailureClass::Ambiguous));
/// assert_eq!(classify(&trusted), Some(FailureClass::Transient));
/// // Only 5xx statuses can be declared.
/// assert_eq!(NotProcessed::new(HttpClassifier, [StatusCode::OK]).unwrap_err().field(), "statuses");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct NotProcessed<C> {
    inner: C,
    /// Bit `n` set: status `500 + n` means "not processed".
    statuses: u128,
}

impl<C> NotProcessed<C> {
    /// `inner`, with `statuses` (each 500 to 599) declared "not processed".
    pub fn new(
        inner: C,
        statuses: impl IntoIterator<Item = StatusCode>,
    ) -> Result<Self, crate::error::ConfigError> {
        let mut bits = 0u128;
        for status in statuses {
            let n = status.as_u16();
            if !(500..=599).contains(&n) {
                return Err(crate::error::ConfigError::new(
                    "statuses",
                    "only 5xx statuses can be declared not processed",
                ));
            }
            bits |= 1 << (n - 500);
        }
        Ok(NotProcessed {
            inner,
            statuses: bits,
        })
    }

    fn declared(&self, status: StatusCode) -> bool {
        let n = status.as_u16();
        (500..=599).contains(&n) && self.statuses & (1 << (n - 500)) != 0
    }
}

impl<R: HttpStatus, E, C: Classify<R, E>> Classify<R, E> for NotProcessed<C> {
    type ClassifyEos = C::ClassifyEos;

    fn classify(&self, result: &Result<R, E>) -> ClassifiedResponse<C::ClassifyEos> {
        let classified = self.inner.classify(result);
        let (Ok(resp), ClassifiedResponse::Ready(c)) = (result, &classified) else {
            return classified;
        };
        match (c.failure_class(), c.code()) {
            (Some(FailureClass::Ambiguous), Some(code)) if self.declared(resp.http_status()) => {
                ClassifiedResponse::Ready(
                    Classification::failure(FailureClass::Transient, code).with_hint(c.hint()),
                )
            }
            _ => classified,
        }
    }

    fn dependency_error(&self, resp: &R) -> Option<ToolError> {
        self.inner.dependency_error(resp)
    }
}
