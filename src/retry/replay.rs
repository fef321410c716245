use super::Request;
use crate::class::Evidence;
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

    /// What `req` shows about its class (an HTTP POST without a key), checked against the
    /// layer's: the stricter decides (see [`Evidence`]). `None` unless overridden.
    fn evidence(&self, req: &Req) -> Option<Evidence> {
        let _ = req;
        None
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

    #[inline]
    fn evidence(&self, req: &Req) -> Option<Evidence> {
        req.evidence()
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

            fn evidence(&self, req: &$r::Request) -> Option<Evidence> {
                super::Request::evidence(req)
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

    fn evidence(&self, req: &http::Request<B>) -> Option<Evidence> {
        Replay::<http::Request<B>>::evidence(&DefaultReplay, req)
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
