//! A declared tool's call sent again by a retry layer above its stack (tower's `Retry` around
//! the `ToolService`): the same `Call`, cloned, back after the stack had already retried it as
//! declared. Its attempts would multiply (3 x 4 = 12 requests for one read); the stack answers
//! the clone with the ending it already gave, sends nothing, and says so once.
//!
//! A clone is told from a model's reissue by its arguments: a `Call` made anew holds its own
//! arguments; a clone shares them (`Arc::ptr_eq`). The ending is kept for [`WINDOW`].

use crate::error::{ErrorCode, FailureClass, ToolError};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long after its ending a clone of a failed call is answered with it.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// The counter of clones answered without being sent.
pub(crate) const RETRIED_ABOVE: &str = "stormguard_retried_above_total";

/// The last failed call of one tool's stack and its clones: shared by the `ToolService`'s
/// clones (a retry layer above clones the service with the call).
#[derive(Clone, Default)]
pub(super) struct Above(Arc<Shared>);

#[derive(Default)]
struct Shared {
    /// Whether `last` holds anything (the first try reads this only).
    any: AtomicBool,
    warned: AtomicBool,
    last: Mutex<Option<Ended>>,
}

struct Ended {
    args: Arc<Value>,
    at: Instant,
    code: ErrorCode,
    class: Option<FailureClass>,
    hint: String,
}

impl Above {
    /// The failed call `args` ended with `err`.
    pub(super) fn ended(&self, args: Arc<Value>, err: &ToolError) {
        let ended = Ended {
            args,
            at: Instant::now(),
            code: err.code(),
            class: err.class(),
            hint: err.hint().to_owned(),
        };
        *self.0.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(ended);
        self.0.any.store(true, Ordering::Release);
    }

    /// A call that succeeded: no clone of an earlier failure is pending any more.
    pub(super) fn answered(&self) {
        // A load first: the first try of a healthy tool writes nothing shared.
        if self.0.any.load(Ordering::Acquire) && self.0.any.swap(false, Ordering::AcqRel) {
            *self.0.last.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// The answer to `args` when it is a clone of the failed call, within the window.
    pub(super) fn clone_of_failed(&self, tool: &str, args: &Arc<Value>) -> Option<ToolError> {
        if !self.0.any.load(Ordering::Acquire) {
            return None;
        }
        let last = self.0.last.lock().unwrap_or_else(PoisonError::into_inner);
        let ended = last.as_ref()?;
        let since = ended.at.elapsed();
        if !Arc::ptr_eq(&ended.args, args) || since > WINDOW {
            return None;
        }
        metrics::counter!(RETRIED_ABOVE, "tool" => tool.to_owned()).increment(1);
        if !self.0.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                tool,
                since_ms = since.as_millis() as u64,
                "the same call came back to the tool's stack after it had ended it: a retry layer above the stack (tower's Retry?) multiplies its attempts; answered with its ending, not sent; remove that layer, the stack retries as declared"
            );
        }
        let mut err = ToolError::new(ended.code)
            .with_retryable(false)
            .with_attempts(0)
            .with_hint(format!(
                "{} (this call came back {} ms after the tool's stack ended it, a clone from a retry layer above the stack: not sent again, its attempts are the stack's to make)",
                ended.hint,
                since.as_millis()
            ));
        if let Some(class) = ended.class {
            err = err.with_class(class);
        }
        Some(err)
    }
}
