//! reqwest: its responses by status, its errors by what they say about the request's fate.

use super::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    HttpClassifier, NeverClassifyEos,
};
use crate::error::ErrorCode;

/// `reqwest::Response` by the same status table and hints as `http::Response`.
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, FailureClass, HttpClassifier};
///
/// let resp = reqwest::Response::from(http::Response::builder().status(503).body("").unwrap());
/// let result: Result<_, reqwest::Error> = Ok(resp);
/// let ClassifiedResponse::Ready(c) = HttpClassifier.classify(&result) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::Transient));
/// ```
impl<E: AsDynError> Classify<reqwest::Response, E> for HttpClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(
        &self,
        result: &Result<reqwest::Response, E>,
    ) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(resp) => super::http::classify_response(resp.status(), resp.headers()),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }
}

/// A `reqwest::Error` by its kind:
///
/// | kind | class | code |
/// |---|---|---|
/// | connect (no connection was made, nothing was sent) | `Transient` | `unavailable`, or `timeout` for a connect timeout |
/// | timeout (after connecting) | `Ambiguous` | `timeout` |
/// | status (from `error_for_status`) | the HTTP status table | by status |
/// | builder (a bad URL or header: never sent) | `ModelRecoverable` | `invalid_argument` |
/// | redirect (a loop, too many) | `Permanent` | `internal` |
/// | body, decode (the server answered; the effect happened) | `Ambiguous` | `internal` |
/// | anything else | its source chain, else `Ambiguous` | |
pub(super) fn classify(err: &reqwest::Error) -> Option<Classification> {
    use FailureClass::*;
    let c = if err.is_connect() {
        let code = if err.is_timeout() {
            ErrorCode::Timeout
        } else {
            ErrorCode::Unavailable
        };
        Classification::failure(Transient, code)
    } else if err.is_timeout() {
        Classification::failure(Ambiguous, ErrorCode::Timeout)
    } else if let Some(status) = err.status() {
        super::classify_status(status)
    } else if err.is_builder() {
        Classification::failure(ModelRecoverable, ErrorCode::InvalidArgument)
    } else if err.is_redirect() {
        Classification::failure(Permanent, ErrorCode::Internal)
    } else if err.is_body() || err.is_decode() {
        Classification::failure(Ambiguous, ErrorCode::Internal)
    } else {
        return None;
    };
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Verdict;

    #[test]
    fn a_builder_error_goes_back_to_the_model() {
        let err = reqwest::Client::new().get("not a url").build().unwrap_err();
        let c = classify_error(&err);
        assert_eq!(
            c.verdict(),
            Verdict::Failure(FailureClass::ModelRecoverable)
        );
        assert_eq!(c.code(), Some(ErrorCode::InvalidArgument));
    }

    #[test]
    fn a_status_error_is_classified_by_its_status() {
        let status = |code: u16| {
            let resp = http::Response::builder().status(code).body("").unwrap();
            let err = reqwest::Response::from(resp)
                .error_for_status()
                .unwrap_err();
            classify_error(&err)
        };
        assert_eq!(
            status(503).verdict(),
            Verdict::Failure(FailureClass::Transient)
        );
        assert_eq!(
            status(504).verdict(),
            Verdict::Failure(FailureClass::Ambiguous)
        );
        assert_eq!(status(429).code(), Some(ErrorCode::RateLimited));
        assert_eq!(status(404).verdict(), Verdict::Empty);
    }
}
