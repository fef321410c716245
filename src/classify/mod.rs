//! Classification: turn a call's `Result` into a verdict that retry, breaker and metrics share.
//!
//! Classification is separate from action, as in tower-http's `classify` module: a classifier
//! only says what happened ([`Verdict`]), what the failure means for a retry ([`FailureClass`]),
//! which [`ErrorCode`] describes it, and what the server asked for ([`ServerHint`]). The
//! [`Retry`](crate::retry::Retry) layer decides what to do with it.
//!
//! Unlike tower-http, the classifier sees the real error as `&(dyn Error + 'static)`
//! ([`AsDynError`]), so it walks [`source()`](std::error::Error::source) and downcasts instead of
//! parsing strings: [`classify_error`] finds a [`std::io::Error`], tower's or tokio's `Elapsed`,
//! a [`ToolError`], or (feature `http`) an `HttpStatusError` (a failure status a client turned
//! into an error, its headers kept) anywhere in the chain.
//!
//! | verdict | meaning | retried? | counted by a breaker? |
//! |---|---|---|---|
//! | `Success` | the call did what was asked | - | as a success |
//! | `Empty` | a normal "nothing there" answer (404, no such record) | no | no |
//! | `Failure(Transient)` | the effect did not happen (refused, throttled) | yes, by class | as a failure |
//! | `Failure(Ambiguous)` | the effect may have happened (timeout after sending, reset, 500/502/503/504) | only reads, idempotent writes and keyed writes with a key | as a failure |
//! | `Failure(ModelRecoverable)` | a bad argument: give it back to the model | no | no |
//! | `Failure(Permanent)` | bad credential, forbidden, conflict | no | no |
//! | `Failure(Policy)` | a guardrail tripped: halt | no | no |
//!
//! ```
//! use stormguard::classify::{Classify, ClassifiedResponse, DefaultClassifier, FailureClass, Verdict};
//! use std::io;
//!
//! let refused: Result<(), io::Error> = Err(io::Error::from(io::ErrorKind::ConnectionRefused));
//! let ClassifiedResponse::Ready(c) = DefaultClassifier.classify(&refused) else { unreachable!() };
//! assert_eq!(c.verdict(), Verdict::Failure(FailureClass::Transient));
//!
//! let reset: Result<(), io::Error> = Err(io::Error::from(io::ErrorKind::ConnectionReset));
//! let ClassifiedResponse::Ready(c) = DefaultClassifier.classify(&reset) else { unreachable!() };
//! assert_eq!(c.verdict(), Verdict::Failure(FailureClass::Ambiguous));
//! ```

mod answer;
#[cfg(feature = "http")]
mod body;
mod classification;
mod error;
mod grpc;
pub mod hint;
mod json_status;
mod status_table;
pub(crate) use hint::ServerHint;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "rmcp")]
mod mcp;
#[cfg(feature = "http")]
mod model_api;
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
mod reqwest;
mod retry_info;
#[cfg(feature = "http")]
mod status_error;
mod stream;
#[cfg(feature = "http")]
mod streamed;

pub use answer::{Answer, OkIsSuccess};
#[cfg(feature = "http")]
pub use body::{ClassifiedBody, GrpcClassifier, GrpcEos};
pub use classification::{Classification, KeyConflict, Verdict};
pub use error::{classify_error, AsDynError};
pub use grpc::classify_grpc_code;
#[cfg(feature = "http")]
pub use http::{classify_status, HttpClassifier, HttpStatus, NotProcessed};
pub use json_status::{answer_status, AnswerStatus};
#[cfg(feature = "rmcp")]
pub use mcp::McpClassifier;
#[cfg(feature = "http")]
pub use model_api::ModelApiClassifier;
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
pub use reqwest::ReqwestClassifier;
pub use retry_info::retry_info_delay;
#[cfg(feature = "http")]
pub(crate) use status_error::answered;
#[cfg(feature = "http")]
pub use status_error::{HttpStatusError, MAX_BODY_EXCERPT};
pub use stream::{StreamEnd, WatchStream};
#[cfg(feature = "http")]
pub use streamed::{StreamClassifier, StreamEos};

pub use crate::error::failure::FailureClass;
use crate::error::{ErrorCode, ToolError};

/// The result of [`Classify::classify`]: decided now, or only at the end of the stream.
///
/// `RequiresEos` leaves room for protocols whose outcome arrives after the body (gRPC trailers),
/// as tower-http's `ClassifiedResponse::RequiresEos` does. A response whose head has arrived is
/// committed (gRPC A6's rule): [`Retry`](crate::retry::Retry) returns it to the caller and never
/// retries it.
///
/// ```
/// use stormguard::classify::{Classification, ClassifiedResponse, Classify, DefaultClassifier};
///
/// let ok: Result<u32, std::io::Error> = Ok(7);
/// match DefaultClassifier.classify(&ok) {
///     ClassifiedResponse::Ready(c) => assert_eq!(c, Classification::success()),
///     ClassifiedResponse::RequiresEos(never) => match never {},
/// }
/// ```
#[derive(Debug)]
pub enum ClassifiedResponse<Eos> {
    /// The outcome is known now.
    Ready(Classification),
    /// The outcome is known only once the stream ends; `Eos` classifies it then.
    RequiresEos(Eos),
}

/// Classifies the end of a stream (for example gRPC trailers).
///
/// ```
/// use stormguard::classify::{Classification, ClassifyEos, FailureClass};
/// # use stormguard::error::ErrorCode;
///
/// struct Whole; // a stream is whole only if its trailers say so
/// impl ClassifyEos for Whole {
///     type Trailers = bool;
///     fn classify_eos(self, whole: Option<&bool>) -> Classification {
///         if whole == Some(&true) { return Classification::success(); }
///         Classification::failure(FailureClass::Ambiguous, ErrorCode::Unavailable)
///     }
/// }
/// assert_eq!(Whole.classify_eos(None).failure_class(), Some(FailureClass::Ambiguous));
/// ```
pub trait ClassifyEos {
    /// What the stream ends with (trailers, for HTTP/2 and gRPC).
    type Trailers;

    /// The outcome, given the trailers if there were any.
    fn classify_eos(self, trailers: Option<&Self::Trailers>) -> Classification;

    /// The outcome of a stream that broke before its end (the body returned an error: a reset,
    /// a dropped connection). By default an `Ambiguous` `unavailable`: what was asked may have
    /// been done, and the dependency failed to finish the answer.
    fn classify_broken(self) -> Classification
    where
        Self: Sized,
    {
        Classification::failure(FailureClass::Ambiguous, ErrorCode::Unavailable)
    }
}

/// A [`ClassifyEos`] that cannot be built: for classifiers that always decide from the head.
///
/// ```
/// use stormguard::classify::{Classification, ClassifiedResponse, Classify, DefaultClassifier};
///
/// let ok: Result<(), std::io::Error> = Ok(());
/// // `DefaultClassifier`'s end-of-stream type is `NeverClassifyEos`: `Ready` is the only case.
/// let ClassifiedResponse::Ready(c) = DefaultClassifier.classify(&ok);
/// assert_eq!(c, Classification::success());
/// ```
#[derive(Debug, Clone, Copy)]
pub enum NeverClassifyEos {}

impl ClassifyEos for NeverClassifyEos {
    type Trailers = ();

    fn classify_eos(self, _: Option<&()>) -> Classification {
        match self {}
    }
}

/// Turns the result of a call into a [`Classification`].
///
/// Implemented by the stock classifiers ([`DefaultClassifier`], `HttpClassifier`) and by any
/// closure `Fn(&Result<Res, E>) -> Classification`:
///
/// ```
/// use stormguard::classify::{Classification, Classify, ClassifiedResponse, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// // A tool whose answer `None` means "no such record".
/// let classifier = |r: &Result<Option<u32>, std::io::Error>| match r {
///     Ok(Some(_)) => Classification::success(),
///     Ok(None) => Classification::empty(),
///     Err(_) => Classification::failure(FailureClass::Transient, ErrorCode::Unavailable),
/// };
/// assert!(matches!(classifier.classify(&Ok(None)), ClassifiedResponse::Ready(c) if c == Classification::empty()));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify a `Result<{Res}, {E}>`",
    label = "this classifier does not know `{Res}` answers or `{E}` errors",
    note = "the default classifier reads the answer by its type and the error by its chain: if `{E}` is your client's own error type (hyper-util's `legacy::Error`, say), box it under the layer with `ServiceBuilder::map_err(BoxError::from)` or `impl stormguard::classify::AsDynError for {E}`; if `{Res}` is your own answer type, `impl stormguard::classify::Answer for {Res} {{}}`",
    note = "a classifier for one kind of answer: `HttpClassifier` for `http::Response` (and `reqwest::Response`), `GrpcClassifier` for tonic, `ModelApiClassifier` for a model API, `McpClassifier` for rmcp results, or a closure `|r: &Result<{Res}, {E}>| -> Classification`"
)]
pub trait Classify<Res, E> {
    /// The end-of-stream classifier for responses that need one, and how it watches a
    /// response until then ([`WatchStream`]). [`NeverClassifyEos`] for a classifier that always
    /// decides at the head: its watched response is the response itself.
    type ClassifyEos: ClassifyEos + WatchStream<Res>;

    /// Classifies one result.
    fn classify(&self, result: &Result<Res, E>) -> ClassifiedResponse<Self::ClassifyEos>;

    /// The dependency's own structured error in a response this classifier called a failure (an
    /// HTTP status, an MCP result with `isError`, an error body already read), kept as the
    /// [`cause`](crate::error::ToolError::cause) of the error a [`Retry`](crate::retry::Retry)
    /// gives up with. `None` by default; for an `Err` the error itself is kept.
    ///
    /// ```
    /// use stormguard::classify::{Classify, HttpClassifier};
    /// use stormguard::error::ErrorCode;
    ///
    /// let resp = http::Response::builder().status(503).body(()).unwrap();
    /// let theirs = Classify::<_, std::io::Error>::dependency_error(&HttpClassifier, &resp).unwrap();
    /// assert_eq!(theirs.code(), ErrorCode::Unavailable);
    /// assert!(theirs.hint().contains("503"));
    /// ```
    fn dependency_error(&self, response: &Res) -> Option<ToolError> {
        let _ = response;
        None
    }
}

impl<F, Res, E> Classify<Res, E> for F
where
    F: Fn(&Result<Res, E>) -> Classification,
{
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Res, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(self(result))
    }
}

/// The classifier every layer has unless given another: an `Ok` answer by what its type says
/// ([`Answer`]: an `http::Response` or `reqwest::Response` by status, as [`HttpClassifier`]
/// does; an MCP `CallToolResult` by `isError`; a plain value is a success), every `Err` by
/// [`classify_error`].
///
/// So a `Retry`, a `ReceiptGuardLayer` or a breaker left on its default over an HTTP client reads a
/// 503 as the failure it is: a retry decides on it, a breaker counts it, and a receipt layer
/// never stores it as the receipt. An answer type that does not implement [`Answer`] does not
/// compile with it: implement `Answer`, or give the layer [`OkIsSuccess`] or a closure.
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, DefaultClassifier, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// let r: Result<(), std::io::Error> = Err(std::io::ErrorKind::TimedOut.into());
/// let ClassifiedResponse::Ready(c) = DefaultClassifier.classify(&r) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::Ambiguous));
/// assert_eq!(c.code(), Some(ErrorCode::Timeout));
///
/// let unavailable = http::Response::builder().status(503).body(()).unwrap();
/// let ClassifiedResponse::Ready(c) = DefaultClassifier.classify(&Ok::<_, std::io::Error>(unavailable)) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::Ambiguous)); // never a receipt
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl<Res: Answer, E: AsDynError> Classify<Res, E> for DefaultClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Res, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(answer) => answer.classify_answer(),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }

    fn dependency_error(&self, response: &Res) -> Option<ToolError> {
        response.answer_error()
    }
}
