//! [`Request`]: a request type that knows how to be sent again, and its implementations.

#[cfg(doc)]
use super::DefaultReplay;
use crate::class::Evidence;
use crate::operation::Operation;

/// A request type that knows how to be sent again: the [`DefaultReplay`] strategy asks it.
///
/// Implemented for `http::Request<B>` with a `Clone` body and `tonic::Request<T>` with a `Clone`
/// message (copied with their extensions; `Idempotency-Key` reported, a POST or PATCH as
/// [`evidence`](Request::evidence); the operation carried in the extensions), and for plain values (numbers, strings, `()`, tuples, `Vec`, `Option`,
/// JSON), which are cloned and carry nothing. `reqwest::Request` is not: its extensions are
/// private to reqwest, so it cannot carry an operation; give its layers
/// `.replay(HttpReplay)`.
///
/// For your own request type, say how it is copied (and, if it can hold one, where its key and
/// its operation go):
///
/// ```
/// use stormguard::operation::Operation;
/// use stormguard::retry::Request;
///
/// #[derive(Clone)]
/// struct ToolCall { name: String, key: Option<String>, operation: Option<Operation> }
///
/// impl Request for ToolCall {
///     fn replay(&self) -> Option<Self> { Some(self.clone()) }
///     fn carries_key(&self) -> bool { self.key.is_some() }
///     fn operation(&self) -> Option<Operation> { self.operation.clone() }
///     fn can_carry() -> bool { true }
///     fn attach(&mut self, op: &Operation) { self.operation = Some(op.clone()); }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "stormguard does not know how to send a `{Self}` again",
    label = "`{Self}` does not implement `stormguard::retry::Request`",
    note = "implement `stormguard::retry::Request` for `{Self}` (`fn replay(&self) -> Option<Self> {{ Some(self.clone()) }}`), or give the layer `.replay(CloneReplay)` (a `Clone` request, no key, no operation carried)"
)]
pub trait Request: Sized {
    /// A copy for the next attempt, or `None` if this request cannot be sent again.
    fn replay(&self) -> Option<Self>;

    /// Whether the request carries an idempotency key. `false` unless overridden.
    fn carries_key(&self) -> bool {
        false
    }

    /// What the request shows about its class, checked against the layer's (the stricter
    /// decides; see [`Evidence`]). `None` unless overridden; an `http::Request` and a
    /// `reqwest::Request` report a POST or PATCH ([`Evidence::http`]).
    fn evidence(&self) -> Option<Evidence> {
        None
    }

    /// Marks the copy about to be sent as a retry after `previous_attempts` attempts.
    fn mark_retry(&mut self, previous_attempts: u32) {
        let _ = previous_attempts;
    }

    /// The operation the request carries. `None` unless overridden.
    fn operation(&self) -> Option<Operation> {
        None
    }

    /// Whether the type can carry an operation. `false` unless overridden.
    fn can_carry() -> bool {
        false
    }

    /// Puts the operation on the request. Nothing unless overridden.
    fn attach(&mut self, operation: &Operation) {
        let _ = operation;
    }
}

macro_rules! plain_requests {
    ($($t:ty),* $(,)?) => {
        $(impl Request for $t {
            #[inline]
            fn replay(&self) -> Option<Self> {
                Some(self.clone())
            }
        })*
    };
}

plain_requests!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
    serde_json::Value,
);

impl Request for &str {
    fn replay(&self) -> Option<Self> {
        Some(self)
    }
}
impl<T: Clone> Request for Vec<T> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}
impl<T: Clone> Request for Option<T> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}
impl<T> Request for std::sync::Arc<T> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}
impl<A: Clone> Request for (A,) {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}
impl<A: Clone, B: Clone> Request for (A, B) {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}
impl<A: Clone, B: Clone, C: Clone> Request for (A, B, C) {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

#[cfg(feature = "http")]
impl Request for bytes::Bytes {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Copied with its extensions; `Idempotency-Key` reported; the operation carried in the
/// extensions. A copy leaves the operation out (the `Retry` that sends it puts it back), so a
/// request that carries nothing else copies without allocating for its extensions.
#[cfg(feature = "http")]
impl<B: Clone> Request for http::Request<B> {
    #[inline]
    fn replay(&self) -> Option<Self> {
        let extensions = self.extensions();
        if extensions.len() == 1 && extensions.get::<Operation>().is_some() {
            let mut copy = http::Request::new(self.body().clone());
            *copy.method_mut() = self.method().clone();
            *copy.uri_mut() = self.uri().clone();
            *copy.version_mut() = self.version();
            *copy.headers_mut() = self.headers().clone();
            return Some(copy);
        }
        Some(self.clone())
    }

    fn carries_key(&self) -> bool {
        self.headers().contains_key("idempotency-key")
    }

    #[inline]
    fn evidence(&self) -> Option<Evidence> {
        let method = self.method();
        if method != http::Method::POST && method != http::Method::PATCH {
            return None;
        }
        Evidence::http(method.as_str(), self.uri().path(), self.carries_key())
    }

    #[inline]
    fn operation(&self) -> Option<Operation> {
        self.extensions().get::<Operation>().cloned()
    }

    fn can_carry() -> bool {
        true
    }

    fn attach(&mut self, operation: &Operation) {
        self.extensions_mut().insert(operation.clone());
    }
}

/// Copied with its metadata and extensions; `idempotency-key` metadata reported; a retry marked
/// with gRFC A6's `grpc-previous-rpc-attempts`; the operation carried in the extensions.
#[cfg(feature = "tonic")]
impl<T: Clone> Request for tonic::Request<T> {
    fn replay(&self) -> Option<Self> {
        Some(tonic::Request::from_parts(
            self.metadata().clone(),
            self.extensions().clone(),
            self.get_ref().clone(),
        ))
    }

    fn carries_key(&self) -> bool {
        self.metadata().contains_key("idempotency-key")
    }

    fn mark_retry(&mut self, previous_attempts: u32) {
        if let Ok(value) = previous_attempts.to_string().parse() {
            self.metadata_mut()
                .insert("grpc-previous-rpc-attempts", value);
        }
    }

    fn operation(&self) -> Option<Operation> {
        self.extensions().get::<Operation>().cloned()
    }

    fn can_carry() -> bool {
        true
    }

    fn attach(&mut self, operation: &Operation) {
        self.extensions_mut().insert(operation.clone());
    }
}

/// `reqwest::Request` (features `reqwest`, `reqwest-0_13`): copied with `try_clone` (a streaming
/// body gets one attempt), `Idempotency-Key` reported. It cannot carry the operation (reqwest
/// keeps its extensions private): behind a `Buffer` or a spawned task, carry it by hand.
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
macro_rules! reqwest_request {
    ($r:ident) => {
        impl Request for $r::Request {
            fn replay(&self) -> Option<Self> {
                self.try_clone()
            }

            fn carries_key(&self) -> bool {
                self.headers().contains_key("idempotency-key")
            }

            fn evidence(&self) -> Option<Evidence> {
                let method = self.method().as_str();
                Evidence::http(method, self.url().path(), self.carries_key())
            }
        }
    };
}

#[cfg(feature = "reqwest")]
reqwest_request!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_request!(reqwest013);

/// An MCP tool call (feature `rmcp`): cloned; it carries no operation (its fields all go on the
/// wire), so a client stack behind a `Buffer` takes the operation with
/// [`carry`](crate::operation::carry).
#[cfg(feature = "rmcp")]
impl Request for rmcp::model::CallToolRequestParams {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn carries_key(&self) -> bool {
        crate::key::KeyStamp::stamped_key(self).is_some()
    }
}
