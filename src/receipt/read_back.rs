//! Read-backs: how an unkeyed write whose outcome a crash left unknown is checked at the provider.

use std::future::Future;

/// Whether a read-back sees every effect that has been acknowledged.
///
/// An unkeyed write whose outcome is unknown, with a read-back declared eventually consistent:
/// its "not there" proves nothing, so it is not consulted and the call is escalated
/// (`outcome_unknown`). The [module example](super) shows both.
///
/// ```
/// use stormguard::receipt::Consistency;
/// assert_ne!(Consistency::Immediate, Consistency::Eventual);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// A read right after a write sees it: a miss means "not done". The only kind used.
    Immediate,
    /// A read may miss a recent write: a miss proves nothing, so the read-back is never used
    /// (a read-back that cannot see lagging effects is worse than none).
    Eventual,
}

/// What a read-back found.
///
/// ```
/// use stormguard::receipt::ReadBackResult;
/// let found: ReadBackResult<&str> = ReadBackResult::Found("msg-4471");
/// assert!(matches!(found, ReadBackResult::Found("msg-4471")));
/// ```
#[non_exhaustive]
#[derive(Debug)]
pub enum ReadBackResult<Res> {
    /// The action's effect is there; this is its result (recorded as the receipt).
    Found(Res),
    /// The effect is not there: safe to execute.
    Absent,
    /// The read-back could not tell: the call is escalated.
    Unknown,
}

/// Looks for an action's effect at the provider (its sent log, say) when the provider takes no
/// idempotency key and a crash left the outcome unknown. It runs only with
/// [`Consistency::Immediate`], only once the crashed call's lease has passed.
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use stormguard::receipt::{ReadBack, ReadBackResult};
///
/// /// The provider's sent log, by invoice.
/// #[derive(Clone, Default)]
/// struct SentLog(Arc<Mutex<HashMap<u64, String>>>);
/// impl ReadBack<u64, String> for SentLog {
///     async fn read_back(&self, invoice: &u64) -> ReadBackResult<String> {
///         match self.0.lock().unwrap().get(invoice) {
///             Some(id) => ReadBackResult::Found(id.clone()),
///             None => ReadBackResult::Absent,
///         }
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let log = SentLog::default();
/// log.0.lock().unwrap().insert(4471, "msg-4471".into());
/// assert!(matches!(log.read_back(&4471).await, ReadBackResult::Found(id) if id == "msg-4471"));
/// assert!(matches!(log.read_back(&4472).await, ReadBackResult::Absent));
/// # }
/// ```
pub trait ReadBack<Req, Res>: Clone + Send + Sync + 'static {
    /// Looks for `req`'s effect.
    fn read_back(&self, req: &Req) -> impl Future<Output = ReadBackResult<Res>> + Send;
}

/// No read-back: an unknown outcome of an unkeyed write is returned as `outcome_unknown`.
///
/// ```
/// use stormguard::receipt::{NoReadBack, ReadBack, ReadBackResult};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let unknown: ReadBackResult<String> = NoReadBack.read_back(&"any request").await;
/// assert!(matches!(unknown, ReadBackResult::Unknown));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoReadBack;

impl<Req, Res: Send> ReadBack<Req, Res> for NoReadBack {
    fn read_back(&self, _: &Req) -> impl Future<Output = ReadBackResult<Res>> + Send {
        std::future::ready(ReadBackResult::Unknown)
    }
}
