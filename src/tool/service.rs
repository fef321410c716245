//! [`ToolService`]: what a declared tool's stack is, and the refusals it makes before the
//! stack sees a call (addressed to another tool, a key field missing, no quota entry).

use super::boxed::{BoxFuture, Boxed};
use super::call::Call;
use crate::error::{ErrorCode, ToolError};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// A declared tool's stack over its body: a `Service<`[`Call`]`>` whose errors are
/// [`ToolError`]s. Made by a [`ToolLayer`](super::ToolLayer).
pub struct ToolService<Res> {
    inner: Boxed<Call, Res, ToolError>,
    name: Arc<str>,
    quota_context: Option<String>,
    /// The argument fields the key is made of.
    key_fields: Arc<[String]>,
}

impl<Res> ToolService<Res> {
    pub(super) fn new(
        inner: Boxed<Call, Res, ToolError>,
        name: Arc<str>,
        quota_context: Option<String>,
        key_fields: Arc<[String]>,
    ) -> Self {
        ToolService {
            inner,
            name,
            quota_context,
            key_fields,
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
    type Future = BoxFuture<Res, ToolError>;

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
            return Box::pin(std::future::ready(Err(err)));
        }
        call.set_tool(&self.name);
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
            return Box::pin(std::future::ready(Err(err)));
        }
        if let Some(entry) = &self.quota_context {
            if call.get(entry).is_none() {
                // Counted under no one's quota would be a silent default: refused instead.
                let err = ToolError::new(ErrorCode::InvalidArgument)
                    .with_retryable(false)
                    .with_hint(format!(
                        "the tool's quota is counted per `{entry}`: give it with Call::with(\"{entry}\", ..)"
                    ));
                return Box::pin(std::future::ready(Err(err)));
            }
        }
        self.inner.call(call)
    }
}
