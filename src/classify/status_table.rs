//! The HTTP status table, by number: what [`classify_status`](super::classify_status) reads an
//! HTTP response's status as, and [`answer_status`](super::answer_status) a JSON answer's.

use super::{Classification, FailureClass, KeyConflict};
use crate::error::ErrorCode;

/// The classification of HTTP status `code` (see the table of
/// [`HttpClassifier`](super::HttpClassifier)).
pub(crate) fn classify_status_code(code: u16) -> Classification {
    use FailureClass::*;
    let (class, code) = match code {
        100..=399 => return Classification::success(),
        404 | 410 => return Classification::empty(),
        408 => (Transient, ErrorCode::Timeout),
        429 => (Transient, ErrorCode::RateLimited),
        500 | 502 | 503 => (Ambiguous, ErrorCode::Unavailable),
        504 => (Ambiguous, ErrorCode::Timeout),
        401 => (Permanent, ErrorCode::Unauthenticated),
        403 => (Permanent, ErrorCode::PermissionDenied),
        409 => {
            return Classification::failure(Permanent, ErrorCode::Conflict)
                .with_key_conflict(KeyConflict::InProgress)
        }
        422 => {
            return Classification::failure(ModelRecoverable, ErrorCode::InvalidArgument)
                .with_key_conflict(KeyConflict::Reused)
        }
        451 => (Policy, ErrorCode::PolicyViolation),
        400..=499 => (ModelRecoverable, ErrorCode::InvalidArgument),
        _ => (Ambiguous, ErrorCode::Internal),
    };
    Classification::failure(class, code)
}
