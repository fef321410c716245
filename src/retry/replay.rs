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
pub trait Replay<Req> {
    /// A copy of `req` for the next attempt, or `None` if it cannot be sent again.
    fn replay(&self, req: &Req) -> Option<Req>;

    /// Whether `req` carries an idempotency key (decides whether an ambiguous failure of a
    /// `KeyedWrite` may be retried). `false` unless overridden.
    fn carries_key(&self, req: &Req) -> bool {
        let _ = req;
        false
    }
}

/// Replays any `Clone` request; reports no idempotency key.
#[derive(Clone, Copy, Debug, Default)]
pub struct CloneReplay;

impl<Req: Clone> Replay<Req> for CloneReplay {
    #[inline]
    fn replay(&self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// Replays `http::Request<B>` with a `Clone` body and reports a key when the request has an
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

#[cfg(feature = "http")]
impl<B: Clone> Replay<http::Request<B>> for HttpReplay {
    fn replay(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        Some(req.clone())
    }

    fn carries_key(&self, req: &http::Request<B>) -> bool {
        req.headers().contains_key("idempotency-key")
    }
}
