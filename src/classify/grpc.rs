//! gRPC status codes, classified: from a trailers-only response head, or from a `tonic::Status`.

use super::{Classification, FailureClass};
use crate::error::ErrorCode;

/// Classifies a gRPC status code (the numbers of `google.rpc.Code`).
///
/// | code | verdict | stormguard code |
/// |---|---|---|
/// | 0 `OK` | `Success` | - |
/// | 5 `NOT_FOUND` | `Empty` (a normal "no such record") | `not_found` |
/// | 14 `UNAVAILABLE` | `Failure(Transient)` (gRPC's retryable code: not processed) | `unavailable` |
/// | 8 `RESOURCE_EXHAUSTED` | `Failure(Transient)` | `rate_limited` |
/// | 4 `DEADLINE_EXCEEDED` | `Failure(Ambiguous)` (it may have applied) | `timeout` |
/// | 1 `CANCELLED`, 2 `UNKNOWN`, 13 `INTERNAL` | `Failure(Ambiguous)` | `internal` |
/// | 3 `INVALID_ARGUMENT`, 9 `FAILED_PRECONDITION`, 11 `OUT_OF_RANGE` | `Failure(ModelRecoverable)` | `invalid_argument` |
/// | 6 `ALREADY_EXISTS`, 10 `ABORTED` | `Failure(Permanent)` (as HTTP 409; AIP-194: retry the whole read-modify-write, not the call) | `conflict` |
/// | 7 `PERMISSION_DENIED` | `Failure(Permanent)` | `permission_denied` |
/// | 16 `UNAUTHENTICATED` | `Failure(Permanent)` | `unauthenticated` |
/// | 12 `UNIMPLEMENTED`, 15 `DATA_LOSS` | `Failure(Permanent)` | `internal` |
/// | any other number | `Failure(Ambiguous)` | `internal` |
///
/// This is the table for a code the *server* sent. `UNAVAILABLE` from the server is taken at its
/// word, as a call it did not process: `Transient` (gRPC: "most likely a transient condition";
/// AIP-194 retries it), so even an unkeyed write is retried after it; a server that says so after
/// applying a write breaks that contract. HTTP 503 is not read that way: it is `Ambiguous` (see
/// `HttpClassifier`; a proxy answers 503 after forwarding, too), and proves nothing about a write
/// unless the provider is declared with `NotProcessed`. A status the client made up is classified with more care (see the `tonic` feature's `tonic::Status` rules in
/// [`classify_error`](super::classify_error)). `DEADLINE_EXCEEDED` is `Ambiguous`: the client's
/// deadline passed, the server may have finished.
///
/// ```
/// use stormguard::classify::{classify_grpc_code, FailureClass, Verdict};
/// use stormguard::error::ErrorCode;
///
/// assert_eq!(classify_grpc_code(14).failure_class(), Some(FailureClass::Transient));
/// assert_eq!(classify_grpc_code(4).code(), Some(ErrorCode::Timeout));
/// assert_eq!(classify_grpc_code(5).verdict(), Verdict::Empty);
/// ```
pub fn classify_grpc_code(code: i32) -> Classification {
    use FailureClass::*;
    let (class, code) = match code {
        0 => return Classification::success(),
        5 => return Classification::empty(),
        14 => (Transient, ErrorCode::Unavailable),
        8 => (Transient, ErrorCode::RateLimited),
        4 => (Ambiguous, ErrorCode::Timeout),
        3 | 9 | 11 => (ModelRecoverable, ErrorCode::InvalidArgument),
        6 | 10 => (Permanent, ErrorCode::Conflict),
        7 => (Permanent, ErrorCode::PermissionDenied),
        16 => (Permanent, ErrorCode::Unauthenticated),
        12 | 15 => (Permanent, ErrorCode::Internal),
        _ => (Ambiguous, ErrorCode::Internal),
    };
    Classification::failure(class, code)
}

/// Classifies a `tonic::Status` by where it came from, then by its code.
///
/// A status the client made up is not the server's word: tonic reports a connection error, a
/// keep-alive timeout mid-call, a proxy's 502 without `grpc-status`, or a response too large to
/// decode with the same codes a server uses. So:
///
/// - a status with a [`source`](std::error::Error::source) (made from a transport error) is
///   classified by that error chain (a refused connection is `Transient`); if nothing in it is
///   recognised, by its code without the benefit of the doubt;
/// - "grpc-status header missing, mapped from HTTP status code N" (an answer that was not gRPC,
///   e.g. a proxy's) is classified by the HTTP status table, so a 502 or 504 stays `Ambiguous`;
/// - a status from the server's trailers-only answer (its metadata carries the
///   `application/grpc` content type) is classified by [`classify_grpc_code`];
/// - any other status is classified by its code without the benefit of the doubt: `Transient`
///   and `ModelRecoverable` become `Ambiguous` (a decode limit hit on the response reads as
///   `OUT_OF_RANGE` or `RESOURCE_EXHAUSTED` after the server did the work).
#[cfg(feature = "tonic")]
pub(super) fn classify_status(status: &tonic::Status) -> Classification {
    use std::error::Error;
    const MAPPED: &str = "grpc-status header missing, mapped from HTTP status code ";
    let table = classify_grpc_code(status.code() as i32);
    let c = if let Some(source) = status.source() {
        super::error::classify_chain(source).unwrap_or_else(|| doubtful(table))
    } else if let Some(code) = status.message().strip_prefix(MAPPED) {
        match code
            .parse()
            .ok()
            .and_then(|c| http::StatusCode::from_u16(c).ok())
        {
            Some(code) => super::classify_status(code),
            None => doubtful(table),
        }
    } else if sent_by_server(status) {
        table
    } else {
        doubtful(table)
    };
    if c.failure_class().is_none() {
        return c;
    }
    // Present but not text is as malformed as "abc": do not retry (gRFC A6). Without it, a
    // `google.rpc.RetryInfo` in the status details is the server's delay.
    match status.metadata().get("grpc-retry-pushback-ms") {
        Some(v) => c.with_hint(v.to_str().map_or(
            super::ServerHint::DoNotRetry,
            super::hint::parse_pushback_ms,
        )),
        None => match super::retry_info::retry_info_delay(status.details()) {
            Some(delay) => c.with_hint(super::ServerHint::RetryAfter(delay)),
            None => c,
        },
    }
}

/// Whether the status came from a gRPC server's own answer: a trailers-only response keeps its
/// headers, `content-type: application/grpc` among them, as the status's metadata.
#[cfg(feature = "tonic")]
fn sent_by_server(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A verdict we cannot prove the server gave: a failure that claims "not applied" (`Transient`)
/// or "your argument" (`ModelRecoverable`) becomes `Ambiguous`.
#[cfg(feature = "tonic")]
fn doubtful(c: Classification) -> Classification {
    match (c.failure_class(), c.code()) {
        (Some(FailureClass::Transient | FailureClass::ModelRecoverable), Some(code)) => {
            Classification::failure(FailureClass::Ambiguous, code)
        }
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Verdict;
    use FailureClass::*;

    #[test]
    fn every_code_has_its_row() {
        let rows: [(i32, Verdict, Option<ErrorCode>); 18] = [
            (0, Verdict::Success, None),
            (1, Verdict::Failure(Ambiguous), Some(ErrorCode::Internal)),
            (2, Verdict::Failure(Ambiguous), Some(ErrorCode::Internal)),
            (
                3,
                Verdict::Failure(ModelRecoverable),
                Some(ErrorCode::InvalidArgument),
            ),
            (4, Verdict::Failure(Ambiguous), Some(ErrorCode::Timeout)),
            (5, Verdict::Empty, Some(ErrorCode::NotFound)),
            (6, Verdict::Failure(Permanent), Some(ErrorCode::Conflict)),
            (
                7,
                Verdict::Failure(Permanent),
                Some(ErrorCode::PermissionDenied),
            ),
            (8, Verdict::Failure(Transient), Some(ErrorCode::RateLimited)),
            (
                9,
                Verdict::Failure(ModelRecoverable),
                Some(ErrorCode::InvalidArgument),
            ),
            (10, Verdict::Failure(Permanent), Some(ErrorCode::Conflict)),
            (
                11,
                Verdict::Failure(ModelRecoverable),
                Some(ErrorCode::InvalidArgument),
            ),
            (12, Verdict::Failure(Permanent), Some(ErrorCode::Internal)),
            (13, Verdict::Failure(Ambiguous), Some(ErrorCode::Internal)),
            (
                14,
                Verdict::Failure(Transient),
                Some(ErrorCode::Unavailable),
            ),
            (15, Verdict::Failure(Permanent), Some(ErrorCode::Internal)),
            (
                16,
                Verdict::Failure(Permanent),
                Some(ErrorCode::Unauthenticated),
            ),
            (99, Verdict::Failure(Ambiguous), Some(ErrorCode::Internal)),
        ];
        for (code, verdict, error_code) in rows {
            let c = classify_grpc_code(code);
            assert_eq!(c.verdict(), verdict, "grpc code {code}");
            assert_eq!(c.code(), error_code, "grpc code {code}");
        }
    }

    #[cfg(feature = "http")]
    #[test]
    fn a_trailers_only_head_is_classified_by_grpc_status() {
        use crate::classify::{ClassifiedResponse, Classify, HttpClassifier};
        let classify = |status: u16, grpc: Option<&str>| {
            let mut resp = http::Response::builder().status(status);
            if let Some(g) = grpc {
                resp = resp.header("grpc-status", g);
            }
            let result: Result<_, std::io::Error> = Ok(resp.body(()).unwrap());
            match HttpClassifier.classify(&result) {
                ClassifiedResponse::Ready(c) => c.verdict(),
                ClassifiedResponse::RequiresEos(_) => unreachable!("decided at the head"),
            }
        };
        assert_eq!(classify(200, Some("14")), Verdict::Failure(Transient));
        assert_eq!(classify(200, Some("3")), Verdict::Failure(ModelRecoverable));
        assert_eq!(classify(200, Some("0")), Verdict::Success);
        assert_eq!(classify(200, None), Verdict::Success);
        // Malformed: the HTTP status decides.
        assert_eq!(classify(200, Some("fourteen")), Verdict::Success);
        // Only a 2xx head is read as gRPC: a proxy's 503 stays a 503 (ambiguous: a proxy may
        // answer it after forwarding).
        assert_eq!(classify(503, Some("0")), Verdict::Failure(Ambiguous));
    }

    #[cfg(feature = "tonic")]
    mod tonic_status {
        use super::*;
        use crate::classify::{classify_error, ServerHint};
        use std::time::Duration;

        fn from_server(mut status: tonic::Status) -> tonic::Status {
            status
                .metadata_mut()
                .insert("content-type", "application/grpc".parse().unwrap());
            status
        }

        #[test]
        fn a_server_sent_unavailable_is_transient_with_its_pushback() {
            let mut status = from_server(tonic::Status::unavailable("draining"));
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", "250".parse().unwrap());
            let c = classify_error(&status);
            assert_eq!(c.verdict(), Verdict::Failure(Transient));
            assert_eq!(c.code(), Some(ErrorCode::Unavailable));
            assert_eq!(c.hint(), ServerHint::RetryAfter(Duration::from_millis(250)));
            let bad = from_server(tonic::Status::invalid_argument("invoice_id"));
            assert_eq!(
                classify_error(&bad).verdict(),
                Verdict::Failure(ModelRecoverable)
            );
        }

        #[test]
        fn a_status_the_client_made_up_gets_no_benefit_of_the_doubt() {
            // No source, no server metadata: e.g. a keep-alive timeout mid-call.
            let c = classify_error(&tonic::Status::unavailable("keep-alive timed out"));
            assert_eq!(c.verdict(), Verdict::Failure(Ambiguous));
            assert_eq!(c.code(), Some(ErrorCode::Unavailable));
            // A response over the decode limit: the server did the work.
            let too_large = tonic::Status::out_of_range(
                "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
            );
            assert_eq!(
                classify_error(&too_large).verdict(),
                Verdict::Failure(Ambiguous)
            );
            // Permanent rows stay what they are.
            let denied = tonic::Status::permission_denied("no");
            assert_eq!(
                classify_error(&denied).verdict(),
                Verdict::Failure(Permanent)
            );
        }

        #[test]
        fn a_proxy_answer_without_grpc_status_goes_through_the_http_table() {
            let mapped = |code: u16| {
                classify_error(&tonic::Status::unavailable(format!(
                    "grpc-status header missing, mapped from HTTP status code {code}"
                )))
            };
            assert_eq!(mapped(502).verdict(), Verdict::Failure(Ambiguous));
            assert_eq!(mapped(504).verdict(), Verdict::Failure(Ambiguous));
            assert_eq!(mapped(503).verdict(), Verdict::Failure(Ambiguous));
            assert_eq!(mapped(429).code(), Some(ErrorCode::RateLimited));
        }

        #[test]
        fn a_status_made_from_a_transport_error_is_classified_by_that_error() {
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            let status = tonic::Status::from_error(Box::new(refused));
            let c = classify_error(&status);
            assert_eq!(c.verdict(), Verdict::Failure(Transient), "{status}");
            let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
            let c = classify_error(&tonic::Status::from_error(Box::new(reset)));
            assert_eq!(c.verdict(), Verdict::Failure(Ambiguous));
        }
    }
}
