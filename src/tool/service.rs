//! [`ToolService`]: what a declared tool's stack is, the refusals it makes before the stack
//! sees a call (addressed to another tool, a key field missing, no quota entry, a call the
//! held-calls book holds), and [`ToolFuture`], which tells the book how the call ended.

use super::above::Above;
use super::boxed::{BoxFuture, Boxed};
use super::call::Call;
use super::held::{self, Admit, Book, Ending, Seen};
use crate::error::{ErrorCode, ToolError};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// A tool without receipts: the book that holds its calls whose outcome is unknown.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) book: Book,
    /// The tool is a write the book tracks while in flight (the same call from another branch
    /// is refused); for the others, only an ending with the outcome unknown is held.
    pub(super) track: bool,
}

/// A declared tool's stack over its body: a `Service<`[`Call`]`>` whose errors are
/// [`ToolError`]s. Made by a [`ToolLayer`](super::ToolLayer).
///
/// Its `Ok` is an answer its classifier read as a success: a failed answer the stack does not
/// retry (a 4xx, a spent quota) ends as a `ToolError` with the dependency's own error as its
/// [`cause`](ToolError::cause), and a JSON answer that says it failed (`{"status": 503}`) is
/// read as that failure ([`AnswerStatus`](crate::classify::AnswerStatus)).
pub struct ToolService<Res> {
    inner: Boxed<Call, Res, ToolError>,
    name: Arc<str>,
    quota_context: Option<String>,
    /// The argument fields the key is made of.
    key_fields: Arc<[String]>,
    held: Option<Held>,
    /// Its last failed call, to know the clone a retry layer above sends again.
    above: Above,
}

impl<Res> ToolService<Res> {
    pub(super) fn new(
        inner: Boxed<Call, Res, ToolError>,
        name: Arc<str>,
        quota_context: Option<String>,
        key_fields: Arc<[String]>,
        held: Option<Held>,
    ) -> Self {
        ToolService {
            inner,
            name,
            quota_context,
            key_fields,
            held,
            above: Above::default(),
        }
    }
}

impl<Res> Clone for ToolService<Res> {
    fn clone(&self) -> Self {
        ToolService {
            inner: self.inner.clone(),
            name: self.name.clone(),
            quota_context: self.quota_context.clone(),
            key_fields: self.key_fields.clone(),
            held: self.held.clone(),
            above: self.above.clone(),
        }
    }
}

impl<Res> fmt::Debug for ToolService<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolService")
            .field("tool", &self.name)
            .finish()
    }
}

impl<Res: Send + 'static> Service<Call> for ToolService<Res> {
    type Response = Res;
    type Error = ToolError;
    type Future = ToolFuture<Res>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: Call) -> Self::Future {
        if let Some(to) = call.tool().filter(|to| *to != &*self.name) {
            // Its key and class would be this tool's: refused, never sent as this tool.
            let err = ToolError::new(ErrorCode::InvalidArgument)
                .with_retryable(false)
                .with_hint(format!(
                    "a call addressed to `{to}` reached the stack of `{}`",
                    self.name
                ));
            return ToolFuture::refused(err);
        }
        call.set_tool(&self.name);
        if let Some(err) = arguments_as_a_string(call.args(), &self.name) {
            return ToolFuture::refused(err);
        }
        if let Some(field) = self
            .key_fields
            .iter()
            .find(|f| call.args().get(f.as_str()).is_none())
        {
            // Named, so the model can fix its call (a key over a field it did not give cannot
            // be made).
            let err = ToolError::new(ErrorCode::InvalidArgument)
                .with_retryable(false)
                .with_hint(format!(
                    "the arguments lack `{field}`, which the tool's idempotency key is made of: give it"
                ));
            return ToolFuture::refused(err);
        }
        if let Some(entry) = &self.quota_context {
            if call.get(entry).is_none() {
                // Counted under no one's quota would be a silent default: refused instead.
                let err = ToolError::new(ErrorCode::InvalidArgument)
                    .with_retryable(false)
                    .with_hint(format!(
                        "the tool's quota is counted per `{entry}`: give it with Call::with(\"{entry}\", ..)"
                    ));
                return ToolFuture::refused(err);
            }
        }
        if let Some(err) = self.above.clone_of_failed(&self.name, call.args_shared()) {
            return ToolFuture::refused(err);
        }
        let watch = (self.above.clone(), call.args_shared().clone());
        let Some(held) = &self.held else {
            return ToolFuture::sent(self.inner.call(call), None, watch);
        };
        let mut seen = Seen::new(self.name.clone(), call.sameness(), call.step_shared());
        if held.track || held.book.holds_any(&self.name) {
            if let (Admit::Refuse(standing), step) = held.book.enter(&mut seen, held.track) {
                let step = step.unwrap_or_default();
                return ToolFuture::refused(held::refusal(standing, &mut seen, &step));
            }
        }
        let guard = Guard {
            book: held.book.clone(),
            call: Some(seen),
            polled: false,
            tracked: held.track,
        };
        ToolFuture::sent(self.inner.call(call), Some(guard), watch)
    }
}

/// The future of a [`ToolService`]: the stack's answer, or a refusal made before the stack saw
/// the call.
pub struct ToolFuture<Res> {
    state: State<Res>,
    guard: Option<Guard>,
    /// Where its ending is told, and its arguments (a refusal tells nothing).
    watch: Option<(Above, Arc<serde_json::Value>)>,
}

enum State<Res> {
    Refused(Option<ToolError>),
    Sent(BoxFuture<Res, ToolError>),
}

impl<Res> ToolFuture<Res> {
    fn refused(err: ToolError) -> Self {
        ToolFuture {
            state: State::Refused(Some(err)),
            guard: None,
            watch: None,
        }
    }

    fn sent(
        future: BoxFuture<Res, ToolError>,
        guard: Option<Guard>,
        watch: (Above, Arc<serde_json::Value>),
    ) -> Self {
        ToolFuture {
            state: State::Sent(future),
            guard,
            watch: Some(watch),
        }
    }
}

impl<Res> fmt::Debug for ToolFuture<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolFuture")
            .field("refused", &matches!(self.state, State::Refused(_)))
            .finish()
    }
}

// Nothing in it is pinned in place: the stack's future is boxed.
impl<Res> Unpin for ToolFuture<Res> {}

impl<Res> Future for ToolFuture<Res> {
    type Output = Result<Res, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let out = match &mut this.state {
            State::Refused(err) => match err.take() {
                Some(err) => Err(err),
                None => Err(ToolError::new(ErrorCode::Internal)
                    .with_hint("a ToolFuture was polled after it completed")),
            },
            State::Sent(future) => {
                if let Some(guard) = &mut this.guard {
                    guard.polled = true;
                }
                std::task::ready!(future.as_mut().poll(cx))
            }
        };
        if let Some(mut guard) = this.guard.take() {
            guard.end(match &out {
                Ok(_) => Ending::Answered,
                Err(e) => held::ending_of(e),
            });
        }
        if let Some((above, args)) = this.watch.take() {
            match &out {
                Ok(_) => above.answered(),
                Err(e) => above.ended(args, e),
            }
        }
        Poll::Ready(out)
    }
}

/// Tells the book how a call ended; dropped while in flight, the call is held (whatever was
/// sent may have acted), and dropped before it was ever polled, nothing was sent.
struct Guard {
    book: Book,
    call: Option<Seen>,
    polled: bool,
    tracked: bool,
}

impl Guard {
    fn end(&mut self, ending: Ending) {
        if let Some(call) = self.call.take() {
            // An untracked tool (a read, a keyed write) is held only when its stack said the
            // outcome is unknown: a read dropped in flight did nothing to hold.
            if self.tracked || ending == Ending::Unknown {
                self.book.end(call, ending);
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let ending = match self.polled {
            true => Ending::Dropped,
            false => Ending::NotSent,
        };
        self.end(ending);
    }
}

/// A call whose arguments are a JSON string holding an object (`"{\"q\": \"x\"}"`, as a model
/// API's tool call carries them, unparsed): sent as is, every field would be missing. Refused,
/// naming the fix, and said once per tool.
#[cold]
fn string_arguments(tool: &str) -> ToolError {
    tracing::warn!(
        tool,
        "a call's arguments are a JSON string, not an object (a model API's tool-call arguments, \
         unparsed): refused; parse them with serde_json::from_str before Call::new"
    );
    ToolError::new(ErrorCode::InvalidArgument)
        .with_retryable(false)
        .with_hint(
            "the arguments arrived as a JSON string, not an object: the caller must parse them (serde_json::from_str) before calling the tool",
        )
}

fn arguments_as_a_string(args: &serde_json::Value, tool: &str) -> Option<ToolError> {
    let text = args.as_str()?.trim_start();
    let object = text.starts_with('{')
        && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object());
    object.then(|| string_arguments(tool))
}
