//! [`AnswerStatus`]: a JSON answer that says it failed (`{"status": 503}`) is read as the
//! failure it says, whatever the classifier it was given says. A tool body that folds an HTTP
//! response into JSON below the stack, under `OkIsSuccess`, would otherwise store a 503 as the
//! invoice's receipt and tell the model "success".

use super::{Classification, ClassifiedResponse, Classify, FailureClass, Verdict};
use crate::error::{ErrorCode, ToolError};
use serde_json::Value;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The top-level fields a JSON answer carries an HTTP status in, in the order they are read.
const STATUS_FIELDS: &[&str] = &["status", "status_code", "statusCode", "http_status", "code"];

/// The HTTP status a JSON object states: the first of [`STATUS_FIELDS`] holding an integer, or a
/// string of three digits (`"503"`).
fn stated_status(object: &serde_json::Map<String, Value>) -> Option<u64> {
    STATUS_FIELDS.iter().find_map(|f| match object.get(*f)? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        _ => None,
    })
}

/// What a JSON answer says of itself: the failure its HTTP status field (`status`,
/// `status_code`, `statusCode`, `http_status` or `code`, the first that holds an integer or a
/// three-digit string, from 400 to 599) stands for, by the
/// table of [`HttpClassifier`](super::HttpClassifier) (404 and 410 stay "no such record"), with
/// the two provider signals it reads from a body: a 429 whose `error.type` or `error.code` is
/// `insufficient_quota` is a spent quota, and a 529 or an `overloaded_error` an overload. `None`
/// for an answer that says nothing of the kind (`{"status": "active"}`, `{"status": 200}`).
///
/// ```
/// use serde_json::json;
/// use stormguard::classify::{answer_status, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// let c = answer_status(&json!({ "status": 503, "error": "upstream reset" })).unwrap();
/// assert_eq!((c.failure_class(), c.code()), (Some(FailureClass::Ambiguous), Some(ErrorCode::Unavailable)));
/// let spent = json!({ "status_code": 429, "error": { "type": "insufficient_quota" } });
/// assert_eq!(answer_status(&spent).unwrap().code(), Some(ErrorCode::QuotaExhausted));
/// assert!(answer_status(&json!({ "status": "active", "id": 7 })).is_none());
/// // A status folded as a string, or under `code`, says the same.
/// assert_eq!(answer_status(&json!({ "status": "503" })).unwrap().code(), Some(ErrorCode::Unavailable));
/// assert_eq!(answer_status(&json!({ "code": 502, "body": {} })).unwrap().code(), Some(ErrorCode::Unavailable));
/// assert!(answer_status(&json!({ "code": "E1001" })).is_none());
/// assert!(answer_status(&json!({ "status": 201 })).is_none());
/// assert!(answer_status(&json!({ "status": 404 })).is_none()); // "no such record", not a failure
/// // A provider's error envelope and nothing else (a 5xx body read as JSON, its status lost):
/// let lost = json!({ "error": { "type": "api_error", "message": "upstream connect error" } });
/// assert_eq!(answer_status(&lost).unwrap().failure_class(), Some(FailureClass::Ambiguous));
/// let google = json!({ "error": { "code": 503, "message": "unavailable", "status": "UNAVAILABLE" } });
/// assert_eq!(answer_status(&google).unwrap().code(), Some(ErrorCode::Unavailable));
/// assert!(answer_status(&json!({ "id": 7, "error": null })).is_none());
/// assert!(answer_status(&json!({ "id": 7, "error": { "message": "a field the answer has" } })).is_none());
/// ```
pub fn answer_status(answer: &Value) -> Option<Classification> {
    let object = answer.as_object()?;
    let Some(status) = stated_status(object) else {
        return error_envelope(object);
    };
    let status = Some(status).filter(|s| (400..=599).contains(s))?;
    let said = |field: &str, what: &str| {
        let error = object.get("error");
        [field, "code"]
            .iter()
            .any(|f| error.and_then(|e| e.get(*f)).and_then(Value::as_str) == Some(what))
    };
    use FailureClass::*;
    let signal = match status {
        429 if said("type", "insufficient_quota") => Some((Permanent, ErrorCode::QuotaExhausted)),
        529 => Some((Transient, ErrorCode::Unavailable)),
        _ if said("type", "overloaded_error") => Some((Transient, ErrorCode::Unavailable)),
        _ => None,
    };
    if let Some((class, code)) = signal {
        return Some(Classification::failure(class, code));
    }
    // The HTTP table; 404 and 410 are "no such record", not a failure.
    let c = super::status_table::classify_status_code(u16::try_from(status).ok()?);
    matches!(c.verdict(), Verdict::Failure(_)).then_some(c)
}

/// The top-level fields an error envelope may carry beside `error` (Anthropic's `type: "error"`,
/// a request id); any other field makes the object an answer that happens to hold an error.
const ENVELOPE_FIELDS: &[&str] = &["error", "type", "request_id", "requestId"];

/// A provider's error envelope, and nothing else: `{"error": {...}}` (OpenAI, Google), or
/// `{"type": "error", "error": {...}}` (Anthropic), its status lost (a 5xx body read as JSON by
/// `.json()`). Its status from `error.code` or `error.status` where one is stated, else its
/// `error.type`: a spent quota, an overload, a rate limit, a refused argument or credential;
/// anything else an `Ambiguous` `internal` (it failed, and whether it took effect is not known).
/// A not-found is "no such record", as a 404: `None`.
fn error_envelope(object: &serde_json::Map<String, Value>) -> Option<Classification> {
    let error = object.get("error")?.as_object()?;
    if !object.keys().all(|k| ENVELOPE_FIELDS.contains(&k.as_str())) {
        return None;
    }
    if let Some(status) = stated_status(error) {
        let mut folded = serde_json::Map::new();
        folded.insert("status".into(), status.into());
        folded.insert("error".into(), Value::Object(error.clone()));
        return answer_status(&Value::Object(folded));
    }
    let kind = ["type", "code"]
        .iter()
        .find_map(|f| error.get(*f).and_then(Value::as_str))
        .unwrap_or("");
    use FailureClass::*;
    let (class, code) = match kind {
        "insufficient_quota" => (Permanent, ErrorCode::QuotaExhausted),
        "overloaded_error" | "server_overloaded" => (Transient, ErrorCode::Unavailable),
        "rate_limit_error" | "rate_limit_exceeded" => (Transient, ErrorCode::RateLimited),
        "invalid_request_error" => (Permanent, ErrorCode::InvalidArgument),
        "authentication_error" | "invalid_api_key" => (Permanent, ErrorCode::Unauthenticated),
        "permission_error" => (Permanent, ErrorCode::PermissionDenied),
        "not_found_error" => return None,
        _ => (Ambiguous, ErrorCode::Internal),
    };
    Some(Classification::failure(class, code))
}

/// A classifier that reads a `serde_json::Value` answer's own status ([`answer_status`]) before
/// the classifier it wraps: where the answer says it failed and the classifier says success, the
/// answer wins, and the crate says so (a WARN once, and
/// `stormguard_answer_status_overruled_total{layer, status}`). Every declared tool's stack
/// reads its answers through one ([`ToolLayer`](crate::tool::ToolLayer)), so a tool body that
/// turns a 503 into `{"status": 503}` is retried as a 503, and no receipt records it.
///
/// For any other answer type it is the classifier it wraps.
///
/// ```
/// use serde_json::{json, Value};
/// use stormguard::classify::{AnswerStatus, ClassifiedResponse, Classify, OkIsSuccess, Verdict, FailureClass};
///
/// let classifier = AnswerStatus::new(OkIsSuccess, "send_invoice");
/// let said = |v: Value| match classifier.classify(&Ok::<_, std::io::Error>(v)) {
///     ClassifiedResponse::Ready(c) => c,
/// };
/// assert_eq!(said(json!({ "status": 503 })).failure_class(), Some(FailureClass::Ambiguous));
/// assert_eq!(said(json!({ "sent": true })).verdict(), Verdict::Success);
/// // Not JSON: as `OkIsSuccess` says.
/// let ClassifiedResponse::Ready(c) = classifier.classify(&Ok::<_, std::io::Error>(503u16));
/// assert_eq!(c.verdict(), Verdict::Success);
/// ```
#[derive(Clone, Debug)]
pub struct AnswerStatus<C> {
    inner: C,
    layer: Arc<str>,
    /// Whether this copy reports (one per stack, so that a call counts once).
    reports: bool,
    warned: Arc<AtomicBool>,
    /// A declared read's flag, set when it answers `201 Created` (the tool's `Retry` then
    /// weighs its calls as a write's), with the declared class.
    creates: Option<(Arc<AtomicBool>, crate::class::ToolClass)>,
}

impl<C> AnswerStatus<C> {
    /// `inner`, with JSON answers read for their own status; `layer` names it in the WARN and
    /// the metric.
    pub fn new(inner: C, layer: impl Into<Arc<str>>) -> Self {
        AnswerStatus {
            inner,
            layer: layer.into(),
            reports: true,
            warned: Arc::new(AtomicBool::new(false)),
            creates: None,
        }
    }

    /// Sets `creates` when an answer says `201 Created` (a tool declared `declared`, a read,
    /// that creates something), said once and counted.
    pub(crate) fn watching_creates(
        mut self,
        creates: Arc<AtomicBool>,
        declared: crate::class::ToolClass,
    ) -> Self {
        self.creates = Some((creates, declared));
        self
    }

    /// Notes a `201 Created` answer of a tool that is not declared to create.
    #[inline]
    fn watch_created<Res: 'static>(&self, res: &Res) {
        let Some((creates, declared)) = &self.creates else {
            return;
        };
        if creates.load(Ordering::Relaxed) || http_status(res as &dyn Any) != Some(201) {
            return;
        }
        if !creates.swap(true, Ordering::Relaxed) {
            created(&self.layer, *declared);
        }
    }

    /// A copy that overrules as this one does and reports nothing (for the other layers of one
    /// stack: one call is counted once).
    pub(crate) fn silent(&self) -> Self
    where
        C: Clone,
    {
        AnswerStatus {
            reports: false,
            ..self.clone()
        }
    }

    /// The failure an answer says (a JSON answer's status field, an HTTP response's status),
    /// where `said` (the wrapped classifier's reading) calls it a success.
    fn overrules<Res: 'static>(&self, res: &Res, said: &Classification) -> Option<Classification> {
        if !matches!(said.verdict(), Verdict::Success | Verdict::Empty) {
            return None;
        }
        let (c, status) = answer_says(res as &dyn Any)?;
        if self.reports {
            self.report(status);
        }
        Some(c)
    }

    #[cold]
    fn report(&self, status: u16) {
        crate::telemetry::answer_status_overruled(&self.layer, status);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                layer = %self.layer,
                status,
                "the tool's answer says it failed (status {status}) and its classifier called \
                 it a success: it is read as the failure it says (retried as one, no receipt \
                 recorded); leave the layer on its default classifier (it reads the status), \
                 or give one that reads it"
            );
        }
    }
}

/// What an answer says of itself: a JSON answer's status field ([`answer_status`]), an
/// in-memory HTTP response's status and body (`http::Response` of `String`, `Vec<u8>`, `Bytes`,
/// `()`, `Value`; a `reqwest::Response`'s status), as the default classifier reads them; with
/// the status, for the report. `None` where it says no failure.
fn answer_says(res: &dyn Any) -> Option<(Classification, u16)> {
    if let Some(answer) = res.downcast_ref::<Value>() {
        return Some((answer_status(answer)?, status_of(answer).unwrap_or(0)));
    }
    #[cfg(feature = "http")]
    {
        macro_rules! http_answers {
            ($($body:ty),*) => {$(
                if let Some(resp) = res.downcast_ref::<http::Response<$body>>() {
                    let c = super::http::classify_answer(resp);
                    return matches!(c.verdict(), Verdict::Failure(_))
                        .then(|| (c, resp.status().as_u16()));
                }
            )*};
        }
        http_answers!(String, Vec<u8>, bytes::Bytes, (), Value);
    }
    #[cfg(feature = "reqwest")]
    if let Some(resp) = res.downcast_ref::<reqwest::Response>() {
        let c = super::http::classify_response(resp.status(), resp.headers());
        return matches!(c.verdict(), Verdict::Failure(_)).then(|| (c, resp.status().as_u16()));
    }
    None
}

/// The dependency's own error in an answer [`answer_says`] reads as a failure.
fn answer_says_error(res: &dyn Any) -> Option<ToolError> {
    #[cfg(feature = "http")]
    {
        macro_rules! http_errors {
            ($($body:ty),*) => {$(
                if let Some(resp) = res.downcast_ref::<http::Response<$body>>() {
                    return super::http::answer_error(resp);
                }
            )*};
        }
        http_errors!(String, Vec<u8>, bytes::Bytes, (), Value);
    }
    #[cfg(feature = "reqwest")]
    if let Some(resp) = res.downcast_ref::<reqwest::Response>() {
        return super::http::status_error(resp.status(), resp.headers());
    }
    let (c, status) = answer_says(res)?;
    Some(
        ToolError::new(c.code()?)
            .with_class(c.failure_class()?)
            .with_hint(format!(
                "the tool's answer says status {status}, though its classifier called it a success"
            )),
    )
}

/// A tool declared `declared` answered `201 Created`: from now on it decides as a write.
#[cold]
fn created(layer: &str, declared: crate::class::ToolClass) {
    let to = crate::class::ToolClass::UnkeyedWrite;
    crate::telemetry::class_from_evidence(declared, to, "created_answer");
    tracing::warn!(
        layer,
        declared = declared.as_str(),
        "the tool answered 201 Created, so its calls create something, and it is declared \
         {declared}: from now on an ambiguous failure of it is not resent (decided as an unkeyed \
         write); declare its class (a keyed write with a key the provider dedupes), or \
         trust_class = true if resending it is safe",
        declared = declared.as_str()
    );
}

/// The HTTP status of an in-memory HTTP answer (the types [`answer_says`] reads).
fn http_status(res: &dyn Any) -> Option<u16> {
    #[cfg(feature = "http")]
    {
        macro_rules! statuses {
            ($($body:ty),*) => {$(
                if let Some(resp) = res.downcast_ref::<http::Response<$body>>() {
                    return Some(resp.status().as_u16());
                }
            )*};
        }
        statuses!(String, Vec<u8>, bytes::Bytes, (), Value);
    }
    #[cfg(feature = "reqwest")]
    if let Some(resp) = res.downcast_ref::<reqwest::Response>() {
        return Some(resp.status().as_u16());
    }
    let _ = res;
    None
}

fn status_of(answer: &Value) -> Option<u16> {
    stated_status(answer.as_object()?).and_then(|s| u16::try_from(s).ok())
}

impl<Res: 'static, E, C> Classify<Res, E> for AnswerStatus<C>
where
    C: Classify<Res, E, ClassifyEos = super::NeverClassifyEos>,
{
    type ClassifyEos = super::NeverClassifyEos;

    fn classify(&self, result: &Result<Res, E>) -> ClassifiedResponse<Self::ClassifyEos> {
        let ClassifiedResponse::Ready(said) = self.inner.classify(result);
        match result {
            Ok(res) => match self.overrules(res, &said) {
                Some(c) => ClassifiedResponse::Ready(c),
                None => {
                    self.watch_created(res);
                    ClassifiedResponse::Ready(said)
                }
            },
            Err(_) => ClassifiedResponse::Ready(said),
        }
    }

    fn dependency_error(&self, response: &Res) -> Option<ToolError> {
        if let Some(theirs) = self.inner.dependency_error(response) {
            return Some(theirs);
        }
        answer_says_error(response as &dyn Any)
    }
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// For every status, the JSON answer is read as `classify_status` reads the status
        /// (404 and 410: "no such record", not overruled; below 400: nothing said).
        #[test]
        fn a_json_status_reads_as_the_http_table(status in 100u16..600, field in 0usize..4) {
            let answer = json!({ STATUS_FIELDS[field]: status, "id": 7 });
            let http = super::super::classify_status(http::StatusCode::from_u16(status).unwrap());
            match answer_status(&answer) {
                None => prop_assert!(matches!(http.verdict(), Verdict::Success | Verdict::Empty)),
                Some(c) if status == 529 => prop_assert_eq!(c.code(), Some(ErrorCode::Unavailable)),
                Some(c) => {
                    prop_assert_eq!(c.failure_class(), http.failure_class());
                    prop_assert_eq!(c.code(), http.code());
                }
            }
        }
    }

    #[test]
    fn a_failure_the_classifier_saw_is_left_as_it_is() {
        let classifier = AnswerStatus::new(
            |_: &Result<Value, ()>| {
                Classification::failure(FailureClass::Permanent, ErrorCode::Internal)
            },
            "t",
        );
        let ClassifiedResponse::Ready(c) = classifier.classify(&Ok(json!({ "status": 503 })));
        assert_eq!(c.failure_class(), Some(FailureClass::Permanent));
    }
}
