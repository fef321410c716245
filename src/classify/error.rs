use super::{Classification, FailureClass, ServerHint};
use crate::error::{BoxError, ErrorCode, ToolError};
use std::error::Error;
use std::io;

/// Gives a classifier the real error, so it can walk `source()` and downcast.
///
/// Implemented for tower's [`BoxError`], [`std::io::Error`], [`ToolError`], tower's and tokio's
/// `Elapsed`, `tonic::Status` (feature `tonic`), `http::Error`, `reqwest::Error` (feature
/// `reqwest`) and [`std::convert::Infallible`]. (It cannot be one blanket impl for every
/// `Error` type: that would overlap the one for `BoxError`.) For another crate's error type
/// (`tonic::transport::Error`, hyper-util's client error), box it under the classifying layer:
/// `ServiceBuilder::new().layer(classifying).map_err(tower::BoxError::from).service(client)`.
/// Implement it for your own error type in one line:
///
/// ```
/// use stormguard::classify::AsDynError;
///
/// #[derive(Debug)]
/// struct MyError;
/// impl std::fmt::Display for MyError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("my error") }
/// }
/// impl std::error::Error for MyError {}
///
/// impl AsDynError for MyError {
///     fn as_dyn_error(&self) -> &(dyn std::error::Error + 'static) { self }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "stormguard cannot read a `{Self}` error",
    label = "`{Self}` does not implement `AsDynError`",
    note = "box the client's errors under the layer: `ServiceBuilder::new().layer(..).map_err(BoxError::from).service(client)`, or `impl stormguard::classify::AsDynError for {Self}` (one line: `fn as_dyn_error(&self) -> &(dyn std::error::Error + 'static) {{ self }}`)"
)]
pub trait AsDynError {
    /// The error as a trait object.
    fn as_dyn_error(&self) -> &(dyn Error + 'static);
}

impl AsDynError for BoxError {
    fn as_dyn_error(&self) -> &(dyn Error + 'static) {
        &**self
    }
}

macro_rules! as_dyn_error {
    ($($t:ty),* $(,)?) => {$(
        impl AsDynError for $t {
            fn as_dyn_error(&self) -> &(dyn Error + 'static) {
                self
            }
        }
    )*};
}

as_dyn_error!(
    io::Error,
    ToolError,
    tower::timeout::error::Elapsed,
    tokio::time::error::Elapsed,
);

#[cfg(feature = "http")]
as_dyn_error!(::http::Error);

#[cfg(feature = "tonic")]
as_dyn_error!(tonic::Status);

#[cfg(feature = "reqwest")]
as_dyn_error!(reqwest::Error);

#[cfg(feature = "reqwest-0_13")]
as_dyn_error!(reqwest013::Error);

/// The error inside: the `reqwest::Error`, or what a middleware returned (a stormguard
/// `ToolError` from a nested guard is read by its code).
#[cfg(feature = "reqwest-middleware")]
impl AsDynError for reqwest_middleware::Error {
    fn as_dyn_error(&self) -> &(dyn Error + 'static) {
        match self {
            reqwest_middleware::Error::Reqwest(e) => e,
            reqwest_middleware::Error::Middleware(e) => e.as_ref(),
        }
    }
}

#[cfg(feature = "rmcp")]
as_dyn_error!(rmcp::service::ServiceError);

impl AsDynError for std::convert::Infallible {
    fn as_dyn_error(&self) -> &(dyn Error + 'static) {
        match *self {}
    }
}

/// Classifies an error by walking its [`source()`](Error::source) chain, outermost first.
///
/// | found in the chain | class | code |
/// |---|---|---|
/// | a [`ToolError`] | its class (`retryable: false` also forbids a retry) | its code |
/// | tower's or tokio's `Elapsed` | `Ambiguous` (the request may have been sent) | `timeout` |
/// | `io::Error` `ConnectionRefused`, `AddrNotAvailable`, `NotConnected` | `Transient` (not sent) | `unavailable` |
/// | `io::Error` `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`, `UnexpectedEof` | `Ambiguous` | `unavailable` |
/// | `io::Error` `TimedOut` | `Ambiguous` | `timeout` |
/// | `io::Error` `Interrupted`, `WouldBlock` | `Transient` | `unavailable` |
/// | `io::Error` `PermissionDenied` | `Permanent` | `permission_denied` |
/// | `io::Error` `InvalidInput`, `InvalidData` | `ModelRecoverable` | `invalid_argument` |
/// | a `reqwest::Error` (feature `reqwest`) | by its kind (`ReqwestClassifier`'s table): a connect error is `Ambiguous` here (reqwest may have sent the request and failed on a redirect); timeout = `Ambiguous`; status by the HTTP table | by kind |
/// | an [`HttpStatusError`](super::HttpStatusError) (feature `http`): a failure status a client turned into an error | by [`HttpClassifier`](super::HttpClassifier)'s table, its headers the hint (`Retry-After`, `grpc-retry-pushback-ms`) | by status |
/// | a `tonic::Status` (feature `tonic`) | by where it came from, then its code (below); `grpc-retry-pushback-ms` metadata is the hint | by code |
/// | an rmcp `ServiceError::McpError` or `ErrorData` (feature `rmcp`) | -32602 `ModelRecoverable`; -32601, -32600, -32700 `Permanent` (never processed); any other code `Ambiguous` (see `McpClassifier`) | -32602 `invalid_argument`, else `internal` |
/// | anything else | `Ambiguous` (it may have taken effect) | `internal` |
///
/// A `tonic::Status` the server sent (a trailers-only answer, whose metadata carries the
/// `application/grpc` content type) is classified by
/// [`classify_grpc_code`](super::classify_grpc_code). One the client made up is not the server's
/// word: with a `source()` (a transport error) the source chain decides (a refused connection is
/// `Transient`); "mapped from HTTP status code N" (a proxy's answer without `grpc-status`) goes
/// through the HTTP status table, so a 502 or 504 stays `Ambiguous`; anything else keeps its
/// code's row, except that `Transient` and `ModelRecoverable` become `Ambiguous` (a response
/// over the decode limit reads as `OUT_OF_RANGE` after the server did the work).
///
/// ```
/// use stormguard::classify::{classify_error, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// // An io error wrapped in another error is still found.
/// #[derive(Debug)]
/// struct Wrapper(std::io::Error);
/// impl std::fmt::Display for Wrapper {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("request failed") }
/// }
/// impl std::error::Error for Wrapper {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
/// let err = Wrapper(std::io::ErrorKind::ConnectionRefused.into());
/// let c = classify_error(&err);
/// assert_eq!(c.failure_class(), Some(FailureClass::Transient));
/// assert_eq!(c.code(), Some(ErrorCode::Unavailable));
/// ```
pub fn classify_error(err: &(dyn Error + 'static)) -> Classification {
    classify_chain(err).unwrap_or(Classification::failure(
        FailureClass::Ambiguous,
        ErrorCode::Internal,
    ))
}

/// Any layer's error as a [`ToolError`]: the one the error is (a layer's own refusal, boxed by
/// the circuit breaker, the key and receipt layers or a keyed quota), else the error as
/// [`classify_error`] reads it: its code and class, `retryable` only if nothing can have
/// happened (`Transient`) and the code allows it, the server's delay as `retry_after`, and the
/// error itself as the [`source`](Error::source). So `?` turns a `BoxError` into a `ToolError`.
///
/// ```
/// use stormguard::error::{BoxError, ErrorCode, ToolError};
///
/// let refused: BoxError = Box::new(ToolError::new(ErrorCode::CircuitOpen));
/// assert_eq!(ToolError::from(refused).code(), ErrorCode::CircuitOpen);
///
/// let io: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
/// let err = ToolError::from(io);
/// assert_eq!((err.code(), err.retryable()), (ErrorCode::Unavailable, true));
/// let reset: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
/// assert!(!ToolError::from(reset).retryable()); // it may have taken effect
/// ```
impl From<BoxError> for ToolError {
    fn from(err: BoxError) -> Self {
        let other = match err.downcast::<ToolError>() {
            Ok(tool) => return *tool,
            Err(other) => other,
        };
        let c = classify_error(&*other);
        let class = c.failure_class().unwrap_or(FailureClass::Ambiguous);
        let code = c.code().unwrap_or(ErrorCode::Internal);
        let retryable = class == FailureClass::Transient
            && code.default_retryable()
            && c.hint() != ServerHint::DoNotRetry;
        let mut tool = ToolError::new(code)
            .with_class(class)
            .with_retryable(retryable);
        if let ServerHint::RetryAfter(after) = c.hint() {
            tool = tool.with_retry_after(after);
        }
        tool.with_source(other)
    }
}

/// The first error in the chain that the table recognises, if any.
pub(super) fn classify_chain(err: &(dyn Error + 'static)) -> Option<Classification> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(c) = classify_one(e) {
            return Some(c);
        }
        // `io::Error::source` skips the error it wraps; `get_ref` does not.
        next = match e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn classify_one(e: &(dyn Error + 'static)) -> Option<Classification> {
    if let Some(tool) = e.downcast_ref::<ToolError>() {
        return Some(classify_tool_error(tool));
    }
    #[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
    if let Some(c) = super::reqwest::classify_any(e, false) {
        return Some(c);
    }
    #[cfg(feature = "tonic")]
    if let Some(status) = e.downcast_ref::<tonic::Status>() {
        return Some(super::grpc::classify_status(status));
    }
    #[cfg(feature = "rmcp")]
    if let Some(c) = super::mcp::classify_protocol_error(e) {
        return Some(c);
    }
    #[cfg(feature = "http")]
    if let Some(answer) = e.downcast_ref::<super::HttpStatusError>() {
        // A 404 is an answer (`Empty`) even as an error; a success status proves nothing here.
        let c = super::http::classify_response(answer.status(), answer.headers());
        if c.verdict() != super::Verdict::Success {
            return Some(c);
        }
    }
    if e.is::<tower::timeout::error::Elapsed>() || e.is::<tokio::time::error::Elapsed>() {
        return Some(Classification::failure(
            FailureClass::Ambiguous,
            ErrorCode::Timeout,
        ));
    }
    e.downcast_ref::<io::Error>().and_then(classify_io)
}

fn classify_tool_error(tool: &ToolError) -> Classification {
    let class = tool.class().unwrap_or(if tool.retryable() {
        FailureClass::Transient
    } else {
        FailureClass::Permanent
    });
    // A breaker's rejection is never retried by a layer: only after its retry_after, by a caller.
    let hint = if !tool.retryable() || tool.code() == ErrorCode::CircuitOpen {
        ServerHint::DoNotRetry
    } else if let Some(after) = tool.retry_after() {
        ServerHint::RetryAfter(after)
    } else {
        ServerHint::None
    };
    Classification::failure(class, tool.code()).with_hint(hint)
}

fn classify_io(e: &io::Error) -> Option<Classification> {
    use io::ErrorKind::*;
    let (class, code) = match e.kind() {
        ConnectionRefused | AddrNotAvailable | NotConnected | Interrupted | WouldBlock => {
            (FailureClass::Transient, ErrorCode::Unavailable)
        }
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
            (FailureClass::Ambiguous, ErrorCode::Unavailable)
        }
        TimedOut => (FailureClass::Ambiguous, ErrorCode::Timeout),
        PermissionDenied => (FailureClass::Permanent, ErrorCode::PermissionDenied),
        InvalidInput | InvalidData => (FailureClass::ModelRecoverable, ErrorCode::InvalidArgument),
        // An `Other` io error usually wraps something more specific: keep walking.
        Other => return None,
        _ => (FailureClass::Ambiguous, ErrorCode::Internal),
    };
    Some(Classification::failure(class, code))
}
