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
/// | 10 `ABORTED` | `Failure(Transient)` (the transaction was rolled back) | `conflict` |
/// | 4 `DEADLINE_EXCEEDED` | `Failure(Ambiguous)` (it may have applied) | `timeout` |
/// | 1 `CANCELLED`, 2 `UNKNOWN`, 13 `INTERNAL` | `Failure(Ambiguous)` | `internal` |
/// | 3 `INVALID_ARGUMENT`, 9 `FAILED_PRECONDITION`, 11 `OUT_OF_RANGE` | `Failure(ModelRecoverable)` | `invalid_argument` |
/// | 6 `ALREADY_EXISTS` | `Failure(Permanent)` | `conflict` |
/// | 7 `PERMISSION_DENIED` | `Failure(Permanent)` | `permission_denied` |
/// | 16 `UNAUTHENTICATED` | `Failure(Permanent)` | `unauthenticated` |
/// | 12 `UNIMPLEMENTED`, 15 `DATA_LOSS` | `Failure(Permanent)` | `internal` |
/// | any other number | `Failure(Ambiguous)` | `internal` |
///
/// `UNAVAILABLE` as `Transient` follows gRPC's own guidance (AIP-194: the one code that is
/// safe to retry for any method); a server that returns it after applying a write breaks that
/// contract. `DEADLINE_EXCEEDED` is `Ambiguous`: the client's deadline passed, the server may have
/// finished.
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
        10 => (Transient, ErrorCode::Conflict),
        4 => (Ambiguous, ErrorCode::Timeout),
        3 | 9 | 11 => (ModelRecoverable, ErrorCode::InvalidArgument),
        6 => (Permanent, ErrorCode::Conflict),
        7 => (Permanent, ErrorCode::PermissionDenied),
        16 => (Permanent, ErrorCode::Unauthenticated),
        12 | 15 => (Permanent, ErrorCode::Internal),
        _ => (Ambiguous, ErrorCode::Internal),
    };
    Classification::failure(class, code)
}

#[cfg(feature = "tonic")]
pub(super) fn classify_status(status: &tonic::Status) -> Classification {
    let c = classify_grpc_code(status.code() as i32);
    if c.failure_class().is_none() {
        return c;
    }
    let hint = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(super::hint::parse_pushback_ms);
    match hint {
        Some(hint) => c.with_hint(hint),
        None => c,
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
            (10, Verdict::Failure(Transient), Some(ErrorCode::Conflict)),
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
        // Only a 2xx head is read as gRPC: a proxy's 503 stays a 503.
        assert_eq!(classify(503, Some("0")), Verdict::Failure(Transient));
    }
}
