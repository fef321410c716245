use crate::operation::Operation;

/// How [`Retry`](super::Retry) gets a copy of a request to send again, whether the request
/// carries an idempotency key, and how the [operation](crate::operation) travels with it.
///
/// tower's `Policy::clone_request` split out: the copy is taken before the first attempt (the
/// first attempt consumes the request). Return `None` for a request that cannot be replayed (a
/// streaming body); such a request gets exactly one attempt.
///
/// The stock strategy, [`DefaultReplay`], asks the request type ([`Request`]): an
/// `http::Request` or a `tonic::Request` is copied with its extensions, reports its
/// `Idempotency-Key`, and carries the operation in its extensions, so the layers behind a
/// `Buffer` or a spawned task join it; a plain value is cloned. [`CloneReplay`] clones any
/// `Clone` request and carries nothing.
///
/// ```
/// use stormguard::retry::Replay;
///
/// struct SendInvoice { invoice_id: u64, idempotency_key: Option<String> }
///
/// struct InvoiceReplay;
/// impl Replay<SendInvoice> for InvoiceReplay {
///     fn replay(&self, req: &SendInvoice) -> Option<SendInvoice> {
///         Some(SendInvoice { invoice_id: req.invoice_id, idempotency_key: req.idempotency_key.clone() })
///     }
///     fn carries_key(&self, req: &SendInvoice) -> bool {
///         req.idempotency_key.is_some()
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot copy a `{Req}` for a retry",
    label = "this replay strategy does not know `{Req}`",
    note = "the default strategy asks the request type: implement `stormguard::retry::Request` for `{Req}`, or give the layer `.replay(CloneReplay)` for a `Clone` request (it carries no key and no operation), or implement `Replay<{Req}>` on a strategy of your own"
)]
pub trait Replay<Req> {
    /// A copy of `req` for the next attempt, or `None` if it cannot be sent again.
    fn replay(&self, req: &Req) -> Option<Req>;

    /// Whether `req` carries an idempotency key (decides whether an ambiguous failure of a
    /// `KeyedWrite` may be retried). `false` unless overridden.
    fn carries_key(&self, req: &Req) -> bool {
        let _ = req;
        false
    }

    /// Marks the copy about to be sent as a retry after `previous_attempts` attempts of the
    /// operation (every layer's). Nothing unless overridden; a `tonic::Request` gets gRFC A6's
    /// `grpc-previous-rpc-attempts` metadata.
    fn mark_retry(&self, req: &mut Req, previous_attempts: u32) {
        let _ = (req, previous_attempts);
    }

    /// The operation `req` carries, if its type can carry one. `None` unless overridden.
    fn operation(&self, req: &Req) -> Option<Operation> {
        let _ = req;
        None
    }

    /// Whether requests of this type can carry an operation ([`attach`](Self::attach) keeps
    /// it). `false` unless overridden: the outermost layer then keeps its ledger on its own
    /// task, where only layers on that task (or given it with
    /// [`carry`](crate::operation::carry)) can join it.
    fn can_carry(&self) -> bool {
        false
    }

    /// Puts `operation` on `req`. Nothing unless overridden.
    fn attach(&self, req: &mut Req, operation: &Operation) {
        let _ = (req, operation);
    }
}

/// A request type that knows how to be sent again: the [`DefaultReplay`] strategy asks it.
///
/// Implemented for `http::Request<B>` with a `Clone` body and `tonic::Request<T>` with a `Clone`
/// message (copied with their extensions; `Idempotency-Key` reported; the operation carried in
/// the extensions), and for plain values (numbers, strings, `()`, tuples, `Vec`, `Option`,
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

/// The stock strategy: asks the request type ([`Request`]). Over `http::Request` and
/// `tonic::Request` it reports the idempotency key and carries the operation with the request.
///
/// ```
/// use stormguard::retry::{DefaultReplay, Replay};
///
/// let req = http::Request::post("/charges").header("idempotency-key", "run-1:step-2").body(String::new()).unwrap();
/// assert!(DefaultReplay.carries_key(&req));
/// assert!(Replay::<http::Request<String>>::can_carry(&DefaultReplay));
/// assert_eq!(DefaultReplay.replay(&7u32), Some(7));
/// assert!(!Replay::<u32>::can_carry(&DefaultReplay));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultReplay;

impl<Req: Request> Replay<Req> for DefaultReplay {
    #[inline]
    fn replay(&self, req: &Req) -> Option<Req> {
        req.replay()
    }

    #[inline]
    fn carries_key(&self, req: &Req) -> bool {
        req.carries_key()
    }

    fn mark_retry(&self, req: &mut Req, previous_attempts: u32) {
        req.mark_retry(previous_attempts);
    }

    #[inline]
    fn operation(&self, req: &Req) -> Option<Operation> {
        req.operation()
    }

    #[inline]
    fn can_carry(&self) -> bool {
        Req::can_carry()
    }

    fn attach(&self, req: &mut Req, operation: &Operation) {
        req.attach(operation);
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

/// Replays any `Clone` request; reports no idempotency key.
///
/// ```
/// use stormguard::retry::{CloneReplay, Replay};
///
/// assert_eq!(CloneReplay.replay(&"search storm"), Some("search storm"));
/// assert!(!CloneReplay.carries_key(&"search storm"));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CloneReplay;

impl<Req: Clone> Replay<Req> for CloneReplay {
    #[inline]
    fn replay(&self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// Replays `http::Request<B>` with a `Clone` body (and, with feature `reqwest`, a
/// `reqwest::Request` whose body is not a stream) and reports a key when the request has an
/// `Idempotency-Key` header.
///
/// ```
/// use stormguard::retry::{HttpReplay, Replay};
/// let req = http::Request::post("/charges").header("idempotency-key", "run-1:step-2").body(String::new()).unwrap();
/// assert!(HttpReplay.carries_key(&req));
/// ```
#[cfg(feature = "http")]
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpReplay;

/// `reqwest::Request` (features `reqwest`, `reqwest-0_13`): replayed with `try_clone`, so a
/// streaming body gets one attempt.
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
macro_rules! reqwest_replay {
    ($r:ident) => {
        impl Replay<$r::Request> for HttpReplay {
            fn replay(&self, req: &$r::Request) -> Option<$r::Request> {
                req.try_clone()
            }

            fn carries_key(&self, req: &$r::Request) -> bool {
                req.headers().contains_key("idempotency-key")
            }
        }
    };
}

#[cfg(feature = "reqwest")]
reqwest_replay!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_replay!(reqwest013);

/// As [`DefaultReplay`]: the operation travels with the request.
#[cfg(feature = "http")]
impl<B: Clone> Replay<http::Request<B>> for HttpReplay {
    fn replay(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        DefaultReplay.replay(req)
    }

    fn carries_key(&self, req: &http::Request<B>) -> bool {
        DefaultReplay.carries_key(req)
    }

    fn operation(&self, req: &http::Request<B>) -> Option<Operation> {
        Replay::<http::Request<B>>::operation(&DefaultReplay, req)
    }

    fn can_carry(&self) -> bool {
        true
    }

    fn attach(&self, req: &mut http::Request<B>, operation: &Operation) {
        DefaultReplay.attach(req, operation);
    }
}

/// Replays `tonic::Request<T>` with a `Clone` message (metadata and extensions copied) and
/// reports a key when the request carries `idempotency-key` metadata. A streaming request
/// (`T` a stream) is not `Clone` and cannot be replayed.
///
/// ```
/// use stormguard::retry::{GrpcReplay, Replay};
///
/// let mut req = tonic::Request::new("send invoice 4471".to_string());
/// req.metadata_mut().insert("idempotency-key", "run-1:step-2".parse().unwrap());
/// let mut again = GrpcReplay.replay(&req).unwrap();
/// assert_eq!(again.get_ref(), req.get_ref());
/// assert!(GrpcReplay.carries_key(&again));
/// // A retry says how many attempts came before it (gRFC A6).
/// GrpcReplay.mark_retry(&mut again, 2);
/// assert_eq!(again.metadata().get("grpc-previous-rpc-attempts").unwrap(), "2");
/// ```
#[cfg(feature = "tonic")]
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcReplay;

/// As [`DefaultReplay`]: the operation travels with the request.
#[cfg(feature = "tonic")]
impl<T: Clone> Replay<tonic::Request<T>> for GrpcReplay {
    fn replay(&self, req: &tonic::Request<T>) -> Option<tonic::Request<T>> {
        DefaultReplay.replay(req)
    }

    fn carries_key(&self, req: &tonic::Request<T>) -> bool {
        DefaultReplay.carries_key(req)
    }

    fn mark_retry(&self, req: &mut tonic::Request<T>, previous_attempts: u32) {
        DefaultReplay.mark_retry(req, previous_attempts);
    }

    fn operation(&self, req: &tonic::Request<T>) -> Option<Operation> {
        Replay::<tonic::Request<T>>::operation(&DefaultReplay, req)
    }

    fn can_carry(&self) -> bool {
        true
    }

    fn attach(&self, req: &mut tonic::Request<T>, operation: &Operation) {
        DefaultReplay.attach(req, operation);
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
}
