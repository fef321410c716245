//! What an `Ok` answer says by its type: the [`DefaultClassifier`](super::DefaultClassifier)'s
//! view, so that a layer left on its default classifier reads an HTTP 503 as a failure.

use super::{Classification, ClassifiedResponse, Classify, NeverClassifyEos};
use crate::classify::{classify_error, AsDynError};
use crate::error::ToolError;

/// What an answer that arrived as `Ok` says about the call, by its type.
///
/// The [`DefaultClassifier`](super::DefaultClassifier) asks it, so a layer left on its default
/// classifier judges an answer the way its type requires: an `http::Response` (and a
/// `reqwest::Response`) by its status, as [`HttpClassifier`](super::HttpClassifier) does (a 503
/// is a failure, never a receipt); an rmcp `CallToolResult` by `isError`, as
/// `McpClassifier` (feature `rmcp`) does; a plain value (a number, a string, `()`, a
/// `Vec`, an `Option`, JSON, a tuple) is a success.
///
/// For your own answer type, say what it means: `impl Answer for MyAnswer {}` for "every `Ok` is
/// a success", or override [`classify_answer`](Self::classify_answer). For a type of another crate
/// (which you cannot implement this for), give the layer a classifier:
/// [`OkIsSuccess`](super::OkIsSuccess) or a closure.
///
/// ```
/// use stormguard::classify::{Answer, Classification, FailureClass, Verdict};
/// use stormguard::error::ErrorCode;
///
/// // The provider's answer: a delivered message, or a bounce it reports in the body.
/// struct Delivery { bounced: bool }
/// impl Answer for Delivery {
///     fn classify_answer(&self) -> Classification {
///         if self.bounced {
///             Classification::failure(FailureClass::Permanent, ErrorCode::InvalidArgument)
///         } else {
///             Classification::success()
///         }
///     }
/// }
/// assert_eq!(Delivery { bounced: false }.classify_answer().verdict(), Verdict::Success);
///
/// let unavailable = http::Response::builder().status(503).body(()).unwrap();
/// assert_eq!(unavailable.classify_answer().failure_class(), Some(FailureClass::Ambiguous));
/// assert_eq!(42u32.classify_answer().verdict(), Verdict::Success);
/// ```
#[diagnostic::on_unimplemented(
    message = "stormguard's default classifier does not know what a `{Self}` answer means",
    label = "`{Self}` does not implement `Answer`",
    note = "for your own type: `impl stormguard::classify::Answer for {Self} {{}}` (every `Ok` is a success) or override `classify_answer`; for a type of another crate, give the layer `.classifier(OkIsSuccess)` or a closure `|r: &Result<{Self}, _>| -> Classification`",
    note = "a `serde_json::Value` is not read as a success by default: a tool's JSON may carry a failure (`{{\"status\":502}}`); turn the HTTP response into the tool's JSON above the stormguard layers, where they still see the status, or give a classifier that reads it"
)]
pub trait Answer {
    /// This answer's classification when it arrives as `Ok`. A success unless overridden.
    fn classify_answer(&self) -> Classification {
        Classification::success()
    }

    /// The dependency's own error in an answer classified as a failure (an HTTP status, an MCP
    /// tool's structured error), kept as the `cause` of the final error. `None` unless
    /// overridden.
    fn answer_error(&self) -> Option<ToolError> {
        None
    }
}

macro_rules! plain_answers {
    ($($t:ty),* $(,)?) => {
        $(impl Answer for $t {})*
    };
}

plain_answers!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
    std::time::Duration,
);

impl Answer for &str {}
impl<T> Answer for Vec<T> {}
impl<T> Answer for Option<T> {}
impl<T: Answer + ?Sized> Answer for Box<T> {
    fn classify_answer(&self) -> Classification {
        (**self).classify_answer()
    }

    fn answer_error(&self) -> Option<ToolError> {
        (**self).answer_error()
    }
}
impl<T: Answer + ?Sized> Answer for std::sync::Arc<T> {
    fn classify_answer(&self) -> Classification {
        (**self).classify_answer()
    }

    fn answer_error(&self) -> Option<ToolError> {
        (**self).answer_error()
    }
}
impl<A> Answer for (A,) {}
impl<A, B> Answer for (A, B) {}
impl<A, B, C> Answer for (A, B, C) {}
impl<A, B, C, D> Answer for (A, B, C, D) {}

#[cfg(feature = "http")]
impl Answer for bytes::Bytes {}

/// By its status, and by its body where that is in memory (a spent quota, an overload), as
/// [`HttpClassifier`](super::HttpClassifier) reads it.
#[cfg(feature = "http")]
impl<B: 'static> Answer for http::Response<B> {
    fn classify_answer(&self) -> Classification {
        super::http::classify_answer(self)
    }

    fn answer_error(&self) -> Option<ToolError> {
        super::http::answer_error(self)
    }
}

#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
macro_rules! reqwest_answer {
    ($r:ident) => {
        impl Answer for $r::Response {
            fn classify_answer(&self) -> Classification {
                super::reqwest::unread_model_429(self.status(), self.url().path());
                super::http::classify_response(self.status(), self.headers())
            }

            fn answer_error(&self) -> Option<ToolError> {
                super::http::status_error(self.status(), self.headers())
            }
        }
    };
}
#[cfg(feature = "reqwest")]
reqwest_answer!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_answer!(reqwest013);

/// A tonic response is an answer; gRPC failures arrive as `Err(Status)`, classified by code.
#[cfg(feature = "tonic")]
impl<T> Answer for tonic::Response<T> {}

#[cfg(feature = "rmcp")]
impl Answer for rmcp::model::CallToolResult {
    fn classify_answer(&self) -> Classification {
        super::mcp::classify_call_tool_result(self)
    }

    fn answer_error(&self) -> Option<ToolError> {
        ToolError::from_call_tool_result(self)
    }
}

/// Every `Ok` is a success, whatever its type; every `Err` is classified by [`classify_error`].
///
/// For an answer type of another crate that carries no failure (an SDK's typed response whose
/// failures all arrive as errors). For your own types prefer implementing [`Answer`], so that
/// every layer's default agrees.
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, OkIsSuccess, Verdict};
///
/// // Even a 503 is a success to it: use it only where failures arrive as errors.
/// let resp = http::Response::builder().status(503).body(()).unwrap();
/// let ClassifiedResponse::Ready(c) = OkIsSuccess.classify(&Ok::<_, std::io::Error>(resp)) else { unreachable!() };
/// assert_eq!(c.verdict(), Verdict::Success);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct OkIsSuccess;

impl<Res, E: AsDynError> Classify<Res, E> for OkIsSuccess {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Res, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(_) => Classification::success(),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }
}
