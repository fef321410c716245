//! reqwest: its responses by status, its errors by what they say about the request's fate.

use super::model_api::{classify_model_response, model_dependency_error, model_status_error};
use super::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    HttpClassifier, ModelApiClassifier, NeverClassifyEos,
};
use crate::error::ErrorCode;
use crate::peek::ErrorBody;

/// `reqwest::Response` by the same status table and hints as `http::Response` (reqwest 0.12 with
/// the feature `reqwest`, 0.13 with `reqwest-0_13`; the same code for both).
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, FailureClass, HttpClassifier};
///
/// let resp = reqwest::Response::from(http::Response::builder().status(503).body("").unwrap());
/// let result: Result<_, reqwest::Error> = Ok(resp);
/// let ClassifiedResponse::Ready(c) = HttpClassifier.classify(&result) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::Ambiguous)); // a proxy may send it after forwarding
/// ```
macro_rules! reqwest_classifiers {
    ($r:ident) => {
        impl<E: AsDynError> Classify<$r::Response, E> for HttpClassifier {
            type ClassifyEos = NeverClassifyEos;

            fn classify(
                &self,
                result: &Result<$r::Response, E>,
            ) -> ClassifiedResponse<NeverClassifyEos> {
                ReqwestClassifier::following_redirects().classify(result)
            }

            fn dependency_error(&self, resp: &$r::Response) -> Option<crate::error::ToolError> {
                super::http::status_error(resp.status(), resp.headers())
            }
        }

        impl<E: AsDynError> Classify<$r::Response, E> for ReqwestClassifier {
            type ClassifyEos = NeverClassifyEos;

            fn classify(
                &self,
                result: &Result<$r::Response, E>,
            ) -> ClassifiedResponse<NeverClassifyEos> {
                ClassifiedResponse::Ready(match result {
                    Ok(resp) => {
                        unread_model_429(resp.status(), resp.url().path());
                        super::http::classify_response(resp.status(), resp.headers())
                    }
                    Err(e) => {
                        let e = e.as_dyn_error();
                        let mut next = Some(e);
                        // The first reqwest error in the chain decides, with this classifier's
                        // trust.
                        while let Some(err) = next {
                            if let Some(c) = classify_any(err, self.connect_means_unsent) {
                                return ClassifiedResponse::Ready(c);
                            }
                            next = err.source();
                        }
                        classify_error(e)
                    }
                })
            }

            fn dependency_error(&self, resp: &$r::Response) -> Option<crate::error::ToolError> {
                super::http::status_error(resp.status(), resp.headers())
            }
        }

        impl<E: AsDynError> Classify<$r::Response, E> for ModelApiClassifier {
            type ClassifyEos = NeverClassifyEos;

            fn classify(
                &self,
                result: &Result<$r::Response, E>,
            ) -> ClassifiedResponse<NeverClassifyEos> {
                match result {
                    Ok(resp) => {
                        let body = resp.extensions().get::<ErrorBody>();
                        // Declared a model API, and its 429's body not read: on any path.
                        if body.is_none() && resp.status() == http::StatusCode::TOO_MANY_REQUESTS {
                            unread_quota_body(resp.url().path());
                        }
                        ClassifiedResponse::Ready(classify_model_response(
                            resp.status(),
                            resp.headers(),
                            body,
                        ))
                    }
                    // A failure status a client turned into an error: this table reads it.
                    Err(e) => match model_status_error(e.as_dyn_error()) {
                        Some(c) => ClassifiedResponse::Ready(c),
                        None => ReqwestClassifier::following_redirects().classify(result),
                    },
                }
            }

            fn dependency_error(&self, resp: &$r::Response) -> Option<crate::error::ToolError> {
                model_dependency_error(
                    resp.status(),
                    resp.headers(),
                    resp.extensions().get::<ErrorBody>(),
                )
            }
        }

        impl ErrorKinds for $r::Error {
            fn is_connect(&self) -> bool {
                $r::Error::is_connect(self)
            }
            fn is_timeout(&self) -> bool {
                $r::Error::is_timeout(self)
            }
            fn status(&self) -> Option<http::StatusCode> {
                $r::Error::status(self)
            }
            fn is_builder(&self) -> bool {
                $r::Error::is_builder(self)
            }
            fn is_redirect(&self) -> bool {
                $r::Error::is_redirect(self)
            }
            fn is_body(&self) -> bool {
                $r::Error::is_body(self)
            }
            fn is_decode(&self) -> bool {
                $r::Error::is_decode(self)
            }
        }
    };
}

#[cfg(feature = "reqwest")]
reqwest_classifiers!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_classifiers!(reqwest013);

/// A 429 from a model API's answer path, read without its body: a spent quota
/// (`insufficient_quota`, no wait fixes it) cannot be told from a rate limit, so it is retried
/// as one. Said once per process (WARN) and counted (`stormguard_unread_quota_bodies_total`),
/// with the fix: a `PeekErrorBodyLayer` under the retry, or the body read into memory. Under
/// `ModelApiClassifier`, a 429 on any path.
#[inline]
pub(crate) fn unread_model_429(status: http::StatusCode, path: &str) {
    if status == http::StatusCode::TOO_MANY_REQUESTS && crate::class::answer_path(path) {
        unread_quota_body(path);
    }
}

#[cold]
fn unread_quota_body(path: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    crate::telemetry::unread_quota_body();
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            path,
            "a model API answered 429 and its body was not read: a spent quota (insufficient_quota) \
             looks like a rate limit and is retried; put a PeekErrorBodyLayer under the retry (or \
             read the body into memory) so the classifier can tell them apart"
        );
    }
}

/// What a reqwest error says about the request's fate (the same methods in 0.12 and 0.13).
pub(super) trait ErrorKinds {
    fn is_connect(&self) -> bool;
    fn is_timeout(&self) -> bool;
    fn status(&self) -> Option<http::StatusCode>;
    fn is_builder(&self) -> bool;
    fn is_redirect(&self) -> bool;
    fn is_body(&self) -> bool;
    fn is_decode(&self) -> bool;
}

/// A reqwest error of either version, by its kind; `None` if `err` is not one, or says nothing.
pub(super) fn classify_any(
    err: &(dyn std::error::Error + 'static),
    connect_means_unsent: bool,
) -> Option<Classification> {
    #[cfg(feature = "reqwest")]
    if let Some(e) = err.downcast_ref::<reqwest::Error>() {
        return classify(e, connect_means_unsent);
    }
    #[cfg(feature = "reqwest-0_13")]
    if let Some(e) = err.downcast_ref::<reqwest013::Error>() {
        return classify(e, connect_means_unsent);
    }
    let _ = (err, connect_means_unsent);
    None
}

/// Classifies reqwest results, and says whether a connect error proves the request unsent.
///
/// A connect error on the request itself means nothing was sent, so even an unkeyed write may be
/// retried. But reqwest follows redirects inside the call: a POST the server carried out and
/// answered with a `303` is followed by a GET on a new connection, and if *that* connect fails,
/// the error still reads as a connect error. So by default (and through [`HttpClassifier`] or
/// [`classify_error`]) a connect error is `Ambiguous`. Build your client with
/// `reqwest::redirect::Policy::none()` and without reqwest's own retries, and classify with
/// [`ReqwestClassifier::without_redirects`], to have connect errors count as not sent.
///
/// | `reqwest::Error` kind | class | code |
/// |---|---|---|
/// | connect | `Transient` with [`without_redirects`](Self::without_redirects), else `Ambiguous` | `unavailable`, or `timeout` for a connect timeout |
/// | timeout (after connecting) | `Ambiguous` | `timeout` |
/// | status (from `error_for_status`) | the HTTP status table | by status |
/// | builder (a bad URL or header: never sent) | `ModelRecoverable` | `invalid_argument` |
/// | redirect (a loop, too many) | `Permanent` | `internal` |
/// | body, decode (the server answered; the effect happened) | `Ambiguous` | `internal` |
/// | anything else | its source chain, else `Ambiguous` | |
///
/// Responses are classified by the status table and hints of [`HttpClassifier`].
///
/// ```
/// use stormguard::classify::{ReqwestClassifier, Classify, ClassifiedResponse, FailureClass};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let client = reqwest::Client::builder()
///     .redirect(reqwest::redirect::Policy::none())
///     .build()
///     .unwrap();
/// let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
/// let refused = client.post(format!("http://127.0.0.1:{port}/charges")).send().await;
/// let classify = |c: ReqwestClassifier| match c.classify(&refused) {
///     ClassifiedResponse::Ready(c) => c.failure_class(),
///     ClassifiedResponse::RequiresEos(_) => unreachable!(),
/// };
/// assert_eq!(classify(ReqwestClassifier::without_redirects()), Some(FailureClass::Transient));
/// assert_eq!(classify(ReqwestClassifier::default()), Some(FailureClass::Ambiguous));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ReqwestClassifier {
    connect_means_unsent: bool,
}

impl ReqwestClassifier {
    /// For a client that follows redirects (reqwest's default): a connect error is `Ambiguous`.
    pub const fn following_redirects() -> Self {
        ReqwestClassifier {
            connect_means_unsent: false,
        }
    }

    /// For a client built with `redirect::Policy::none()` and no retries of its own: a connect
    /// error means the request was never sent, and is `Transient`.
    pub const fn without_redirects() -> Self {
        ReqwestClassifier {
            connect_means_unsent: true,
        }
    }
}

/// A `reqwest::Error` by its kind (see [`ReqwestClassifier`]); `None` for a kind that says
/// nothing, so the caller walks on down the chain.
pub(super) fn classify(
    err: &impl ErrorKinds,
    connect_means_unsent: bool,
) -> Option<Classification> {
    use FailureClass::*;
    let c = if err.is_connect() {
        let code = if err.is_timeout() {
            ErrorCode::Timeout
        } else {
            ErrorCode::Unavailable
        };
        Classification::failure(
            if connect_means_unsent {
                Transient
            } else {
                Ambiguous
            },
            code,
        )
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

#[cfg(all(test, feature = "reqwest"))]
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
            Verdict::Failure(FailureClass::Ambiguous)
        );
        assert_eq!(
            status(504).verdict(),
            Verdict::Failure(FailureClass::Ambiguous)
        );
        assert_eq!(status(429).code(), Some(ErrorCode::RateLimited));
        assert_eq!(status(404).verdict(), Verdict::Empty);
    }
}
