//! [`HttpStatusError`]: a failure status as an error, keeping what the classifiers read.

use crate::error::ToolError;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::fmt;

/// The most bytes of a body an [`HttpStatusError`] keeps.
pub const MAX_BODY_EXCERPT: usize = 4096;

/// A failure status an HTTP dependency answered, as an error: what a client returns when it
/// turns a status into an `Err` (a `Service` over an HTTP client whose callers want `Ok` only
/// for a success), keeping the status, the headers (`Retry-After`, `retry-after-ms`,
/// `x-should-retry`, `grpc-retry-pushback-ms`) and the start of the body.
///
/// The classifiers find it anywhere in an error's [`source`](std::error::Error::source) chain
/// and read it as they read the response itself: [`classify_error`](super::classify_error)
/// (and so the default classifier, `ReqwestClassifier` (feature `reqwest`)'s errors)
/// with [`HttpClassifier`](super::HttpClassifier)'s table, [`ModelApiClassifier`](super::ModelApiClassifier)
/// with its own (the body excerpt is its error body). So the server's delay, its "do not
/// retry" and the status's class survive the mapping; an error that keeps only the status (or
/// only a message) loses them, and the retry after a `429 Retry-After: 1` comes after the
/// backoff's few milliseconds.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::{classify_error, FailureClass, HttpStatusError};
/// use stormguard::error::BoxError;
///
/// // In a client's `call`: a failure status becomes the error, headers and all.
/// let resp = http::Response::builder().status(429).header("retry-after", "1").body("slow down").unwrap();
/// let (parts, body) = resp.into_parts();
/// let err: BoxError = Box::new(HttpStatusError::new(parts.status, parts.headers).with_body_excerpt(body.as_bytes()));
///
/// let c = classify_error(&*err);
/// assert_eq!(c.failure_class(), Some(FailureClass::Transient));
/// assert_eq!(c.hint(), ServerHint::RetryAfter(Duration::from_secs(1)));
/// assert_eq!(err.to_string(), "the dependency answered HTTP 429 Too Many Requests: slow down");
/// ```
#[derive(Clone)]
pub struct HttpStatusError {
    status: StatusCode,
    headers: HeaderMap,
    body: Option<Bytes>,
}

impl HttpStatusError {
    /// The status and headers of an answer.
    pub fn new(status: StatusCode, headers: HeaderMap) -> Self {
        HttpStatusError {
            status,
            headers,
            body: None,
        }
    }

    /// The status and headers of `resp` (copied; the body is left to the caller, see
    /// [`with_body_excerpt`](Self::with_body_excerpt)).
    ///
    /// ```
    /// use stormguard::classify::HttpStatusError;
    ///
    /// let resp = http::Response::builder().status(503).header("retry-after", "2").body(()).unwrap();
    /// let err = HttpStatusError::from_response(&resp);
    /// assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(err.headers()["retry-after"], "2");
    /// ```
    pub fn from_response<B>(resp: &http::Response<B>) -> Self {
        HttpStatusError::new(resp.status(), resp.headers().clone())
    }

    /// Keeps the first [`MAX_BODY_EXCERPT`] bytes of the body: for the person reading the error,
    /// and for [`ModelApiClassifier`](super::ModelApiClassifier), which reads a model API's error
    /// body (`insufficient_quota`, `overloaded_error`) from it.
    ///
    /// ```
    /// use stormguard::classify::{HttpStatusError, MAX_BODY_EXCERPT};
    ///
    /// let err = HttpStatusError::new(http::StatusCode::BAD_GATEWAY, http::HeaderMap::new());
    /// let err = err.with_body_excerpt(&vec![b'x'; 10_000]);
    /// assert_eq!(err.body_excerpt().unwrap().len(), MAX_BODY_EXCERPT);
    /// ```
    pub fn with_body_excerpt(mut self, body: &[u8]) -> Self {
        let end = body.len().min(MAX_BODY_EXCERPT);
        self.body = Some(Bytes::copy_from_slice(&body[..end]));
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The start of the body, as text (invalid UTF-8 cut at the first bad byte), if kept.
    pub fn body_excerpt(&self) -> Option<&str> {
        let body = self.body.as_deref()?;
        Some(match std::str::from_utf8(body) {
            Ok(text) => text,
            Err(e) => std::str::from_utf8(&body[..e.valid_up_to()]).unwrap_or_default(),
        })
    }

    /// The body excerpt's bytes, if kept.
    pub(super) fn body_bytes(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }
}

impl fmt::Display for HttpStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the dependency answered HTTP {}", self.status)?;
        match self.body_excerpt() {
            Some(body) if !body.trim().is_empty() => write!(f, ": {}", body.trim()),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for HttpStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpStatusError")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.body_excerpt())
            .finish()
    }
}

impl std::error::Error for HttpStatusError {}

/// The first `HttpStatusError` in `err`'s chain as the dependency's error (the HTTP status
/// table's code and class, its words as the hint), for a `ToolError`'s `cause`.
pub(crate) fn answered(err: &(dyn std::error::Error + 'static)) -> Option<ToolError> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(answer) = e.downcast_ref::<HttpStatusError>() {
            let tool = super::http::status_error(answer.status, &answer.headers)?;
            return Some(tool.with_hint(answer.to_string()));
        }
        next = e.source();
    }
    None
}
