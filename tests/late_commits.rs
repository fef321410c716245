//! A read-back is never run while the request it checks may still land: found by the episode
//! simulator (`examples/episodes`), where a parallel duplicate of an unkeyed write read back the
//! moment the first attempt timed out, found nothing, sent, and the first attempt's late commit
//! landed too.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ToolError};
use stormguard::key::{Action, IdempotencyKey, KeyStamp};
use stormguard::receipt::{
    Clock, Consistency, InMemoryStore, ReadBack, ReadBackResult, ReceiptConfig, ReceiptLayer,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

#[derive(Clone)]
struct Post {
    ticket: u64,
    key: Option<String>,
}

impl KeyStamp for Post {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

/// The store's clock is tokio's paused one.
#[derive(Clone)]
struct Paused(Instant);

impl Clock for Paused {
    fn now_ms(&self) -> u64 {
        1_800_000_000_000 + self.0.elapsed().as_millis() as u64
    }
}

/// The provider's log, consistent: the effects it has applied.
#[derive(Clone)]
struct Log(Arc<AtomicU32>);

impl ReadBack<Post, String> for Log {
    fn read_back(&self, _: &Post) -> impl Future<Output = ReadBackResult<String>> + Send {
        let found = self.0.load(Ordering::SeqCst) > 0;
        async move {
            if found {
                ReadBackResult::Found("ticket-1".to_string())
            } else {
                ReadBackResult::Absent
            }
        }
    }
}

/// A provider without keys whose first request times out at 1 s and lands at 1.5 s (inside its
/// 2 s in-flight bound); later requests apply at once.
fn provider(
    effects: Arc<AtomicU32>,
) -> impl tower::Service<Post, Response = String, Error = BoxError, Future: Send> + Clone {
    provider_after(
        effects,
        Duration::from_secs(1),
        Duration::from_millis(1_500),
    )
}

/// The same, failing at `fail` and landing at `land`.
fn provider_after(
    effects: Arc<AtomicU32>,
    fail: Duration,
    land: Duration,
) -> impl tower::Service<Post, Response = String, Error = BoxError, Future: Send> + Clone {
    let calls = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |_: Post| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let effects = effects.clone();
        async move {
            if n == 0 {
                let late = effects.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(land).await;
                    late.fetch_add(1, Ordering::SeqCst);
                });
                tokio::time::sleep(fail).await;
                return Err::<String, BoxError>(Box::new(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                )));
            }
            effects.fetch_add(1, Ordering::SeqCst);
            Ok("ticket-1".to_string())
        }
    })
}

fn action(p: &Post) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-4", "post_ticket", &p.ticket)
}

type ActionFn = fn(&Post) -> Result<Action, stormguard::key::KeyError>;
type Tool = ReceiptLayer<
    InMemoryStore,
    ActionFn,
    stormguard::classify::DefaultClassifier,
    stormguard::receipt::JsonCodec,
    Log,
>;

fn layer(store: &InMemoryStore, log: Log) -> Tool {
    ReceiptLayer::new(
        store.clone(),
        ToolClass::UnkeyedWrite,
        action as fn(&_) -> _,
    )
    .config(
        ReceiptConfig::builder()
            .lease(Duration::from_secs(5))
            .wait(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
    .read_back(log, Consistency::Immediate)
}

fn post() -> Post {
    Post {
        ticket: 4471,
        key: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_parallel_duplicate_reads_back_only_once_the_late_commit_cannot_still_land() {
    let effects = Arc::new(AtomicU32::new(0));
    let store = InMemoryStore::with_clock(Paused(Instant::now()));
    let tool = layer(&store, Log(effects.clone())).layer(provider(effects.clone()));
    let start = Instant::now();
    let (a, b) = tokio::join!(tool.clone().oneshot(post()), async {
        tokio::task::yield_now().await;
        tool.clone().oneshot(post()).await
    });
    // The first attempt timed out: unknown. The duplicate waited out the lease, read back, and
    // found the late effect instead of sending a second one.
    assert!(a.is_err());
    assert_eq!(b.unwrap(), "ticket-1");
    assert!(
        start.elapsed() >= Duration::from_secs(5),
        "read back before the lease passed"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the late commit and a resend: two tickets"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reissue_right_after_an_ambiguous_failure_waits_for_the_lease_before_reading_back() {
    let effects = Arc::new(AtomicU32::new(0));
    let store = InMemoryStore::with_clock(Paused(Instant::now()));
    let tool = layer(&store, Log(effects.clone())).layer(provider(effects.clone()));
    let err = tool.clone().oneshot(post()).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<ToolError>().map(|e| e.code()),
        None,
        "the provider's own timeout"
    );
    // The model reissues at once: it must not read back while the first request may land.
    let again = tool.clone().oneshot(post()).await.unwrap();
    assert_eq!(again, "ticket-1");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A keyed write whose key window is shorter than the lease: it crosses the window during the
/// attempt (or before the reissue), and is then read back, so the lease must run out first
/// (outside review: the hold was judged at the attempt's start, and the read-back ran at once).
#[tokio::test(start_paused = true)]
async fn a_keyed_write_crossing_its_key_window_is_read_back_only_after_its_lease() {
    for (fail, land, pause) in [
        // Fails past the window, lands after.
        (
            Duration::from_millis(1_500),
            Duration::from_secs(3),
            Duration::ZERO,
        ),
        // Fails inside the window, reissued past it, lands after the reissue.
        (
            Duration::from_millis(500),
            Duration::from_secs(2),
            Duration::from_millis(700),
        ),
    ] {
        let effects = Arc::new(AtomicU32::new(0));
        let store = InMemoryStore::with_clock(Paused(Instant::now()));
        let tool = ReceiptLayer::new(store.clone(), ToolClass::KeyedWrite, action as ActionFn)
            .config(
                ReceiptConfig::builder()
                    .lease(Duration::from_secs(5))
                    .wait(Duration::from_secs(10))
                    .key_window(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            )
            .read_back(Log(effects.clone()), Consistency::Immediate)
            .layer(provider_after(effects.clone(), fail, land));
        assert!(tool.clone().oneshot(post()).await.is_err());
        tokio::time::sleep(pause).await;
        assert_eq!(tool.clone().oneshot(post()).await.unwrap(), "ticket-1");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            effects.load(Ordering::SeqCst),
            1,
            "failing at {fail:?}: sent twice"
        );
    }
}
