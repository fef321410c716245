/// How [`Retry`](super::Retry) gets a copy of a request to send again, and whether the request
/// carries an idempotency key.
///
/// tower's `Policy::clone_request` split out: the copy is taken before the first attempt (the
/// first attempt consumes the request). Return `None` for a request that cannot be replayed (a
/// streaming body); such a request gets exactly one attempt.
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
    note = "give the layer `.replay(HttpReplay)` for `http::Request` and `reqwest::Request`, `.replay(GrpcReplay)` for `tonic::Request`, `.replay(CloneReplay)` (the default) for a `Clone` request type, or implement `Replay<{Req}>` for a request that is not `Clone`"
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
    /// operation (every layer's). Nothing unless overridden; `GrpcReplay` (feature `tonic`) sets
    /// gRFC A6's `grpc-previous-rpc-attempts` metadata.
    fn mark_retry(&self, req: &mut Req, previous_attempts: u32) {
        let _ = (req, previous_attempts);
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

#[cfg(feature = "http")]
impl<B: Clone> Replay<http::Request<B>> for HttpReplay {
    fn replay(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        Some(req.clone())
    }

    fn carries_key(&self, req: &http::Request<B>) -> bool {
        req.headers().contains_key("idempotency-key")
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

#[cfg(feature = "tonic")]
impl<T: Clone> Replay<tonic::Request<T>> for GrpcReplay {
    fn replay(&self, req: &tonic::Request<T>) -> Option<tonic::Request<T>> {
        Some(tonic::Request::from_parts(
            req.metadata().clone(),
            req.extensions().clone(),
            req.get_ref().clone(),
        ))
    }

    fn carries_key(&self, req: &tonic::Request<T>) -> bool {
        req.metadata().contains_key("idempotency-key")
    }

    fn mark_retry(&self, req: &mut tonic::Request<T>, previous_attempts: u32) {
        if let Ok(value) = previous_attempts.to_string().parse() {
            req.metadata_mut()
                .insert("grpc-previous-rpc-attempts", value);
        }
    }
}
