//! A client that turns a failure status into an error (the invoice example's and the README's
//! pattern) keeps what the server said: `Retry-After`, `retry-after-ms`, "do not retry", the
//! status's class. Over a real HTTP server on 127.0.0.1.
mod support;

use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{Classify, HttpClassifier, HttpStatusError, ModelApiClassifier};
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::retry::RetryLayer;
use support::call;
use support::server::{serve, status, Body, HttpClient};
use tokio::time::Instant;
use tower::{Layer, Service};

/// How the client turns a failure status into its error.
#[derive(Clone, Copy, Debug)]
enum Mapping {
    /// `HttpClassifier`'s `dependency_error`, as `examples/invoice` did.
    DependencyError,
    /// `HttpStatusError::from_response`, body excerpt included.
    StatusError,
}

/// An HTTP client that answers a 2xx (its body read) and fails on any other status.
#[derive(Clone)]
struct Client {
    http: HttpClient,
    addr: std::net::SocketAddr,
    mapping: Mapping,
}

impl Service<()> for Client {
    type Response = http::Response<bytes::Bytes>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let (mut http, addr, mapping) = (self.http.clone(), self.addr, self.mapping);
        Box::pin(async move {
            let req = http::Request::post(format!("http://{addr}/send"))
                .body(Body::default())
                .unwrap();
            let resp = http.call(req).await?;
            if resp.status().is_success() {
                let (parts, body) = resp.into_parts();
                let body = body.collect().await?.to_bytes();
                return Ok(http::Response::from_parts(parts, body));
            }
            Err(match mapping {
                Mapping::DependencyError => {
                    let err = Classify::<_, BoxError>::dependency_error(&HttpClassifier, &resp);
                    Box::new(err.expect("a failure status")) as BoxError
                }
                Mapping::StatusError => {
                    let (parts, body) = resp.into_parts();
                    let body = body.collect().await?.to_bytes();
                    let err = HttpStatusError::new(parts.status, parts.headers);
                    Box::new(err.with_body_excerpt(&body))
                }
            })
        })
    }
}

/// One scripted answer: status, headers, body.
type Answer = (u16, &'static [(&'static str, &'static str)], &'static str);

/// `answers[n]` for the `n`-th request, 200 after them.
async fn server(
    answers: Vec<Answer>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU32>,
) {
    serve(move |n| match answers.get(n as usize) {
        Some(&(code, headers, body)) => {
            let mut resp = status(code, headers);
            *resp.body_mut() = Body::from(body);
            resp
        }
        None => status(200, &[]),
    })
    .await
}

/// The issue's case: `429 Retry-After: 1` from a client that maps the status to an error. The
/// retry waited about 66 ms (the Read class's backoff): the header was lost on the way.
#[tokio::test(start_paused = true)]
async fn the_retry_after_a_mapped_429_waits_what_the_server_asked() {
    for mapping in [Mapping::DependencyError, Mapping::StatusError] {
        let (addr, count) = server(vec![(429, &[("retry-after", "1")], "")]).await;
        let client = Client {
            http: HttpClient::new(),
            addr,
            mapping,
        };
        let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(client);
        let start = Instant::now();
        call(&mut svc, ()).await.unwrap();
        let waited = start.elapsed();
        assert_eq!(count.load(Ordering::SeqCst), 2, "{mapping:?}");
        assert!(
            waited >= Duration::from_secs(1),
            "{mapping:?}: retried after {waited:?}"
        );
    }
}

/// "Do not retry" (a negative gRPC pushback) survives too, and a 503 stays ambiguous: an
/// unkeyed write sent once ends `outcome_unknown`, with the status in the source chain.
#[tokio::test(start_paused = true)]
async fn do_not_retry_and_an_ambiguous_503_survive_the_mapping() {
    for mapping in [Mapping::DependencyError, Mapping::StatusError] {
        let (addr, count) = server(vec![(503, &[("grpc-retry-pushback-ms", "-1")], "")]).await;
        let client = Client {
            http: HttpClient::new(),
            addr,
            mapping,
        };
        let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(client);
        let err = call(&mut svc, ()).await.unwrap_err();
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "{mapping:?}: retried a 'do not retry'"
        );
        assert_eq!(err.code(), ErrorCode::Unavailable);

        let (addr, count) = server(vec![(503, &[], "upstream reset")]).await;
        let client = Client {
            http: HttpClient::new(),
            addr,
            mapping,
        };
        let mut svc =
            RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default()).layer(client);
        let err = call(&mut svc, ()).await.unwrap_err();
        assert_eq!(count.load(Ordering::SeqCst), 1, "{mapping:?}");
        assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
        let status = source_of::<HttpStatusError>(&err).expect("the status in the chain");
        assert_eq!(status.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        // The evidence the model reads: what the dependency answered.
        let cause = &err.to_json()["cause"];
        assert_eq!(cause["code"], "unavailable", "{mapping:?}");
        assert!(
            cause["hint"].as_str().unwrap().contains("HTTP 503"),
            "{cause}"
        );
        if let Mapping::StatusError = mapping {
            assert_eq!(status.body_excerpt(), Some("upstream reset"));
            assert!(
                cause["hint"]
                    .as_str()
                    .unwrap()
                    .ends_with(": upstream reset"),
                "{cause}"
            );
        }
    }
}

/// With `ModelApiClassifier`, a mapped answer is read as a model API's: `retry-after-ms`
/// first, and a 429 whose body says the quota is used up is not retried at all.
#[tokio::test(start_paused = true)]
async fn a_model_api_classifier_reads_a_mapped_answer_as_its_own() {
    let (addr, count) = server(vec![(
        429,
        &[("retry-after-ms", "1500"), ("retry-after", "30")],
        "",
    )])
    .await;
    let client = Client {
        http: HttpClient::new(),
        addr,
        mapping: Mapping::StatusError,
    };
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(ModelApiClassifier)
        .layer(client);
    let start = Instant::now();
    call(&mut svc, ()).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1_500) && waited < Duration::from_secs(30),
        "{waited:?}"
    );

    const QUOTA: &str = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}"#;
    let (addr, count) = server(vec![(429, &[("retry-after", "1")], QUOTA)]).await;
    let client = Client {
        http: HttpClient::new(),
        addr,
        mapping: Mapping::StatusError,
    };
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(ModelApiClassifier)
        .layer(client);
    let err = call(&mut svc, ()).await.unwrap_err();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(err.code(), ErrorCode::QuotaExhausted);
}

fn source_of<T: std::error::Error + 'static>(err: &ToolError) -> Option<&T> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        next = e.source();
    }
    None
}

/// A 404 turned into an error is still the answer "no such record" (not retried, not a
/// dependency failure); a success status in an error proves nothing and is read as any
/// unknown error.
#[test]
fn a_mapped_404_is_an_empty_answer_and_a_mapped_200_proves_nothing() {
    use stormguard::classify::{classify_error, FailureClass, Verdict};
    let not_found = HttpStatusError::new(http::StatusCode::NOT_FOUND, http::HeaderMap::new());
    assert_eq!(classify_error(&not_found).verdict(), Verdict::Empty);
    let ok = HttpStatusError::new(http::StatusCode::OK, http::HeaderMap::new());
    assert_eq!(
        classify_error(&ok).verdict(),
        Verdict::Failure(FailureClass::Ambiguous)
    );
}

/// The same reading on a reqwest client's stack (`ModelApiClassifier` over `reqwest::Response`).
#[cfg(feature = "reqwest")]
#[test]
fn a_model_api_classifier_over_reqwest_reads_a_mapped_answer_too() {
    use stormguard::classify::hint::ServerHint;
    use stormguard::classify::{ClassifiedResponse, FailureClass};
    let classify = |err: HttpStatusError| {
        let result: Result<reqwest::Response, BoxError> = Err(Box::new(err));
        match ModelApiClassifier.classify(&result) {
            ClassifiedResponse::Ready(c) => c,
            _ => unreachable!(),
        }
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after-ms", "1500".parse().unwrap());
    let c = classify(HttpStatusError::new(
        http::StatusCode::TOO_MANY_REQUESTS,
        headers,
    ));
    assert_eq!(c.failure_class(), Some(FailureClass::Transient));
    assert_eq!(
        c.hint(),
        ServerHint::RetryAfter(Duration::from_millis(1_500))
    );
    let quota = HttpStatusError::new(http::StatusCode::TOO_MANY_REQUESTS, http::HeaderMap::new())
        .with_body_excerpt(br#"{"error":{"type":"insufficient_quota"}}"#);
    assert_eq!(classify(quota).code(), Some(ErrorCode::QuotaExhausted));
}
