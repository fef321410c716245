use super::future::SetIdempotencyKeyFuture;
use super::{Action, IdempotencyKey, KeyError};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::operation::ledger::with_current;
use std::fmt;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A request that can carry an idempotency key.
///
/// ```
/// use stormguard::key::{IdempotencyKey, KeyStamp};
///
/// struct SendInvoice { invoice_id: u64, key: Option<String> }
///
/// impl KeyStamp for SendInvoice {
///     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
///     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// }
///
/// let mut req = SendInvoice { invoice_id: 4471, key: None };
/// let key = IdempotencyKey::derive("run-1", "step-2", "send_invoice", &req.invoice_id).unwrap();
/// req.stamp_key(&key);
/// assert_eq!(req.stamped_key(), Some(key.as_str()));
///
/// // `http::Request` carries it as the `Idempotency-Key` header.
/// let mut http_req = http::Request::post("/send").body(()).unwrap();
/// http_req.stamp_key(&key);
/// assert_eq!(http_req.headers()["idempotency-key"], key.as_str());
/// ```
///
/// Implemented for `http::Request<B>` as the `Idempotency-Key` header, which is also how gRPC
/// metadata travels (`idempotency-key`) when the layer sits on a tonic `Channel`, and for
/// `tonic::Request<T>` (feature `tonic`) as `idempotency-key` metadata, and for
/// `reqwest::Request` (feature `reqwest`) as the header.
#[diagnostic::on_unimplemented(
    message = "an idempotency key cannot be stamped on a `{Self}`",
    label = "`{Self}` has no place for an idempotency key",
    note = "implement `KeyStamp` for `{Self}` (a field or a header holding the key), or stamp the key below the conversion to `http::Request`, `reqwest::Request` or `tonic::Request`"
)]
pub trait KeyStamp {
    /// The key the request carries already, if any.
    fn stamped_key(&self) -> Option<&str>;
    /// Puts `key` on the request.
    fn stamp_key(&mut self, key: &IdempotencyKey);

    /// Whether the request carries a key that cannot be read as one (a header that is not
    /// visible ASCII): such a request is refused, never silently given another key. The
    /// default: `false` (a typed field cannot hold an unreadable key).
    fn carries_unreadable_key(&self) -> bool {
        false
    }

    /// The operation the request carries, if its type carries one (an `http::Request` or a
    /// `tonic::Request`, in its extensions): the key is noted there, so a key layer behind a
    /// `Buffer` still tells the operation. `None` by default: the operation of the `Retry`
    /// running on this task is told instead.
    fn operation(&self) -> Option<crate::operation::Operation> {
        None
    }
}

/// Makes the [`Action`] (idempotency key and fingerprint) of a request: the one derivation a
/// stack shares. [`SetIdempotencyKeyLayer`] stamps its key; a
/// [`ReceiptGuardLayer`](crate::receipt::ReceiptGuardLayer) records it. Any
/// `Fn(&Req) -> Result<Action, KeyError>` is one (tower-http's `MakeRequestId` is the shape).
///
/// ```
/// use stormguard::key::{Action, KeyError, MakeIdempotencyKey};
///
/// /// The invoice id identifies the action; run and step come from the agent's context.
/// #[derive(Clone)]
/// struct ByInvoice { run: String, step: String }
/// impl MakeIdempotencyKey<u64> for ByInvoice {
///     fn make_key(&self, invoice: &u64) -> Result<Action, KeyError> {
///         Action::new(&self.run, &self.step, "send_invoice", invoice)
///     }
/// }
/// let maker = ByInvoice { run: "run-1".into(), step: "step-2".into() };
/// let closure = |invoice: &u64| Action::new("run-1", "step-2", "send_invoice", invoice);
/// assert_eq!(maker.make_key(&4471)?, closure.make_key(&4471)?);
/// # Ok::<(), KeyError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not make an idempotency key from a `{Req}`",
    note = "a key maker is a `Fn(&{Req}) -> Result<Action, KeyError> + Clone` closure, or a type that implements `MakeIdempotencyKey<{Req}>`"
)]
pub trait MakeIdempotencyKey<Req>: Clone {
    /// The action `req` stands for.
    fn make_key(&self, req: &Req) -> Result<Action, KeyError>;
}

impl<F, Req> MakeIdempotencyKey<Req> for F
where
    F: Fn(&Req) -> Result<Action, KeyError> + Clone,
{
    fn make_key(&self, req: &Req) -> Result<Action, KeyError> {
        self(req)
    }
}

#[cfg(feature = "http")]
fn header_key(headers: &http::HeaderMap) -> Option<&str> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok())
}

#[cfg(feature = "http")]
fn unreadable_header(headers: &http::HeaderMap) -> bool {
    headers.get("idempotency-key").is_some_and(|v| {
        v.to_str()
            .map_or(true, |k| super::IdempotencyKey::parse(k).is_err())
    })
}

#[cfg(feature = "http")]
fn stamp_header(headers: &mut http::HeaderMap, key: &IdempotencyKey) {
    // A key is visible ASCII (checked when it was made), so it is always a valid header value.
    if let Ok(value) = http::HeaderValue::from_str(key.as_str()) {
        headers.insert("idempotency-key", value);
    }
}

#[cfg(feature = "http")]
impl<B> KeyStamp for http::Request<B> {
    fn stamped_key(&self) -> Option<&str> {
        header_key(self.headers())
    }

    fn carries_unreadable_key(&self) -> bool {
        unreadable_header(self.headers())
    }

    fn stamp_key(&mut self, key: &IdempotencyKey) {
        stamp_header(self.headers_mut(), key);
    }

    fn operation(&self) -> Option<crate::operation::Operation> {
        self.extensions().get().cloned()
    }
}

/// The `Idempotency-Key` header of a reqwest request (0.12 and 0.13 alike).
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
macro_rules! reqwest_key_stamp {
    ($r:ident) => {
        impl KeyStamp for $r::Request {
            fn stamped_key(&self) -> Option<&str> {
                header_key(self.headers())
            }

            fn carries_unreadable_key(&self) -> bool {
                unreadable_header(self.headers())
            }

            fn stamp_key(&mut self, key: &IdempotencyKey) {
                stamp_header(self.headers_mut(), key);
            }
        }
    };
}

#[cfg(feature = "reqwest")]
reqwest_key_stamp!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_key_stamp!(reqwest013);

#[cfg(feature = "tonic")]
impl<T> KeyStamp for tonic::Request<T> {
    fn stamped_key(&self) -> Option<&str> {
        self.metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
    }

    fn carries_unreadable_key(&self) -> bool {
        self.metadata().get("idempotency-key").is_some_and(|v| {
            v.to_str()
                .map_or(true, |k| super::IdempotencyKey::parse(k).is_err())
        })
    }

    fn stamp_key(&mut self, key: &IdempotencyKey) {
        if let Ok(value) = key.as_str().parse() {
            self.metadata_mut().insert("idempotency-key", value);
        }
    }

    fn operation(&self) -> Option<crate::operation::Operation> {
        self.extensions().get().cloned()
    }
}

/// Stamps every request with the idempotency key of its logical action, the same on every
/// attempt.
///
/// [`new`](Self::new)'s `derive` maps a request to its [`Action`](super::Action) (a
/// [`MakeIdempotencyKey`]: any `Fn(&Req) -> Result<Action, KeyError>`), whose key it stamps. Give
/// a [`ReceiptGuardLayer`](crate::receipt::ReceiptGuardLayer) the same maker: it stamps the key itself, so
/// a stack with receipts needs no `SetIdempotencyKeyLayer`, and one maker, cloned, can never
/// derive two keys for one request. Placed below a [`Retry`](crate::retry::Retry), the layer sees
/// every attempt; it records the key's fingerprint in the operation's ledger on the first attempt
/// and refuses (`idempotency_key_changed`) an attempt whose key differs, or a request that
/// arrives with a different key already stamped. It also tells the operation that it is keyed,
/// so `Retry` may retry an ambiguous failure of a `KeyedWrite`. Every refusal is a WARN event and
/// a count of `stormguard_key_refusals_total` (label `code`).
///
/// ```
/// use serde_json::json;
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
/// use stormguard::key::{Action, SetIdempotencyKeyLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let provider = service_fn(|req: http::Request<String>| async move {
///     let key = req.headers()["idempotency-key"].to_str().unwrap().to_string();
///     Ok::<_, std::convert::Infallible>(key)
/// });
/// let mut send = ServiceBuilder::new()
///     .layer(SetIdempotencyKeyLayer::new(|req: &http::Request<String>| {
///         Action::new("run-81f2", "step-2", "send_invoice", &json!({ "invoice": req.body() }))
///     }))
///     .service(provider);
/// let req = http::Request::post("/send").body("4471".to_string()).unwrap();
/// let key = send.ready().await.unwrap().call(req).await.unwrap();
/// assert!(key.starts_with("run-81f2:step-2:send_invoice:"));
/// # }
/// ```
#[derive(Clone)]
pub struct SetIdempotencyKeyLayer<F> {
    derive: F,
}

impl<F> SetIdempotencyKeyLayer<F> {
    /// A layer that keys requests with `derive` (a [`MakeIdempotencyKey`]).
    pub fn new(derive: F) -> Self {
        SetIdempotencyKeyLayer { derive }
    }
}

impl<F> fmt::Debug for SetIdempotencyKeyLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetIdempotencyKeyLayer")
            .finish_non_exhaustive()
    }
}

impl<S, F: Clone> Layer<S> for SetIdempotencyKeyLayer<F> {
    type Service = SetIdempotencyKey<S, F>;

    fn layer(&self, inner: S) -> SetIdempotencyKey<S, F> {
        SetIdempotencyKey {
            inner,
            derive: self.derive.clone(),
        }
    }
}

/// The service [`SetIdempotencyKeyLayer`] makes: stamps each request, then calls `inner`.
///
/// ```
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::error::ToolError;
/// use stormguard::key::{Action, SetIdempotencyKeyLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let echo = service_fn(|req: http::Request<u64>| async move {
///     Ok::<_, std::convert::Infallible>(req.headers().contains_key("idempotency-key"))
/// });
/// let derive = |req: &http::Request<u64>| Action::new("run-1", "step-2", "charge", req.body());
/// let mut svc = SetIdempotencyKeyLayer::new(derive).layer(echo);
/// let stamped = svc.ready().await.unwrap().call(http::Request::new(7)).await.unwrap();
/// assert!(stamped);
///
/// // A request minted with a key of its own is refused: every attempt must carry the action's.
/// let mut minted = http::Request::new(7);
/// minted.headers_mut().insert("idempotency-key", "a-random-uuid".parse().unwrap());
/// let err = svc.ready().await.unwrap().call(minted).await.unwrap_err();
/// let err = err.downcast::<ToolError>().unwrap();
/// assert_eq!(err.code().as_str(), "idempotency_key_changed");
/// # }
/// ```
#[derive(Clone)]
pub struct SetIdempotencyKey<S, F> {
    inner: S,
    derive: F,
}

impl<S, F> SetIdempotencyKey<S, F> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, F> fmt::Debug for SetIdempotencyKey<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetIdempotencyKey")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Tells the request's operation (the one it carries, else the one running on this task, if
/// any) that its requests carry `key`: marks it keyed and records the key's fingerprint on the
/// first attempt. `false` when an earlier attempt carried another key.
pub(crate) fn note_key(req: &impl KeyStamp, key: &IdempotencyKey) -> bool {
    let fingerprint = key.fingerprint();
    let consistent = match req.operation() {
        Some(op) => Some(op.with(|op| op.note_key(fingerprint))),
        None => with_current(|op| op.note_key(fingerprint)),
    };
    consistent != Some(false)
}

/// A refused call: counted in `stormguard_key_refusals_total` (label `code`) and logged at WARN,
/// since it means a caller minted keys per attempt or sent arguments the key cannot cover.
/// Whether `req` may be stamped with `key`: it carries no key or this one, and the operation's
/// earlier attempts carried this one too.
pub(crate) fn check_stamped(req: &impl KeyStamp, key: &IdempotencyKey) -> Result<(), ToolError> {
    if req.carries_unreadable_key() {
        return Err(refuse(
            ErrorCode::InvalidArgument,
            "the request carries an Idempotency-Key that is not 1 to 255 bytes of visible ASCII; send a valid key or none",
        ));
    }
    if req.stamped_key().is_some_and(|k| k != key.as_str()) {
        return Err(refuse(
            ErrorCode::IdempotencyKeyChanged,
            "the request already carries a different idempotency key than its logical action's; do not mint keys per attempt",
        ));
    }
    if !note_key(req, key) {
        return Err(refuse(
            ErrorCode::IdempotencyKeyChanged,
            "this attempt's idempotency key differs from the first attempt's; every retry of one action must carry the same key",
        ));
    }
    Ok(())
}

fn refuse(code: ErrorCode, hint: impl Into<std::borrow::Cow<'static, str>>) -> ToolError {
    let hint = hint.into();
    tracing::warn!(
        code = code.as_str(),
        hint = &*hint,
        "idempotency key layer refused the call"
    );
    crate::telemetry::key_refused(code);
    ToolError::new(code).with_hint(hint).with_retryable(false)
}

impl<S, F, Req> Service<Req> for SetIdempotencyKey<S, F>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    F: MakeIdempotencyKey<Req>,
    Req: KeyStamp,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = SetIdempotencyKeyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let key = match self.derive.make_key(&req) {
            Ok(action) => action.into_key(),
            Err(e) => {
                let hint = format!("the idempotency key could not be derived from this request ({e}): give the identity fields it covers, or fix the run, step or tool name");
                let err = refuse(ErrorCode::InvalidArgument, hint).with_source(e);
                return SetIdempotencyKeyFuture::refused(err);
            }
        };
        if let Err(err) = check_stamped(&req, &key) {
            return SetIdempotencyKeyFuture::refused(err);
        }
        req.stamp_key(&key);
        SetIdempotencyKeyFuture::called(self.inner.call(req))
    }
}
