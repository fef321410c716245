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
    Clock, Consistency, InMemoryStore, ReadBack, ReadBackResult, ReceiptConfig, ReceiptGuardLayer,
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
type Tool = ReceiptGuardLayer<
    InMemoryStore,
    ActionFn,
    stormguard::classify::DefaultClassifier,
    stormguard::receipt::DefaultCodec,
    Log,
>;

fn layer(store: &InMemoryStore, log: Log) -> Tool {
    ReceiptGuardLayer::new(
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
        let tool = ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, action as ActionFn)
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

// ---------------------------------------------------------------------------------------------
// An unkeyed write whose client timed out, settled by an operator (issue 20, item 5): the
// request lands after the `outcome_unknown`, and the operator loop of the README must not lead
// to a second ticket.

mod support;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::net::SocketAddr;
use std::sync::Mutex;
use stormguard::budget::RetryBudget;
use stormguard::error::ErrorCode;
use stormguard::receipt::{ManualClock, ReceiptStore, Resolution, Resolved};
use stormguard::retry::{CloneReplay, RetryLayer};
use tower::ServiceBuilder;

/// A ticket desk on 127.0.0.1 that takes no idempotency key. Its first request is held until
/// the test lets it commit (the client has given up on it by then); it commits anyway, as a
/// provider does with a request whose client went away. Every commit opens a ticket.
#[derive(Clone)]
struct Desk {
    addr: SocketAddr,
    tickets: Arc<Mutex<Vec<u64>>>,
    requests: Arc<AtomicU32>,
    commit_first: Arc<tokio::sync::Notify>,
}

impl Desk {
    async fn start() -> Desk {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let desk = Desk {
            addr: listener.local_addr().unwrap(),
            tickets: Arc::default(),
            requests: Arc::default(),
            commit_first: Arc::default(),
        };
        let server = desk.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let desk = server.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let desk = desk.clone();
                            async move {
                                let body = req.into_body().collect().await?.to_bytes();
                                let order: u64 = serde_json::from_slice(&body).unwrap();
                                let n = desk.requests.fetch_add(1, Ordering::SeqCst);
                                // The commit runs on its own: a client that leaves does not stop it.
                                let commit = tokio::spawn(async move {
                                    if n == 0 {
                                        desk.commit_first.notified().await;
                                    }
                                    let mut tickets = desk.tickets.lock().unwrap();
                                    tickets.push(order);
                                    tickets.len()
                                });
                                let id = commit.await.unwrap();
                                Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(
                                    format!("\"ticket-{id}\""),
                                ))))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        desk
    }

    /// What the operator reads in the desk's own log: the ticket opened for `order`, if any.
    fn ticket_for(&self, order: u64) -> Option<String> {
        let tickets = self.tickets.lock().unwrap();
        let n = tickets.iter().position(|&o| o == order)?;
        Some(format!("ticket-{}", n + 1))
    }

    fn tickets(&self) -> usize {
        self.tickets.lock().unwrap().len()
    }
}

/// The desk's HTTP client: posts the order, answers the ticket id.
#[derive(Clone)]
struct DeskClient(SocketAddr, support::server::HttpClient);

impl tower::Service<Post> for DeskClient {
    type Response = String;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<String, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, post: Post) -> Self::Future {
        let (addr, mut client) = (self.0, self.1.clone());
        Box::pin(async move {
            let req = http::Request::post(format!("http://{addr}/tickets"))
                .body(support::server::Body::from(post.ticket.to_string()))?;
            let resp = tower::Service::call(&mut client, req).await?;
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(serde_json::from_slice(&body)?)
        })
    }
}

#[tokio::test]
async fn a_late_commit_after_outcome_unknown_never_leads_the_operator_into_a_second_ticket() {
    let desk = Desk::start().await;
    let clock = ManualClock::new(1_800_000_000_000);
    let store = InMemoryStore::with_clock(clock.clone());
    let receipts =
        ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, action as ActionFn).config(
            ReceiptConfig::builder()
                .lease(Duration::from_secs(5))
                .build()
                .unwrap(),
        );
    // The run's tool: its client gives up after 200 ms; the desk has the request by then.
    let tool = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default()).replay(CloneReplay))
        .layer(receipts)
        .timeout(Duration::from_millis(200))
        .service(DeskClient(desk.addr, support::server::HttpClient::new()));
    let err = tool.clone().oneshot(post()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(desk.requests.load(Ordering::SeqCst), 1);

    // The listing says the request may still land, for at most the in-flight bound (the lease).
    let listed = store.pending(10).await.unwrap().remove(0);
    assert_eq!(listed.lease_left_ms, 0, "its caller is gone");
    assert!(
        (1..=5_000).contains(&listed.may_still_land_for_ms),
        "{listed:?}"
    );
    assert_eq!(
        listed.last_sent_ms_ago, 0,
        "sent just now, by the store's clock"
    );
    // The operator loop of the README, run at once: the desk's log is still empty, and nothing
    // is settled; a "not done" asked for directly is refused.
    let settled = operator_loop(&store, &desk).await;
    assert!(settled.is_empty(), "{settled:?}");
    assert!(matches!(
        store
            .resolve(&listed.key, Resolution::NotDone)
            .await
            .unwrap(),
        Resolved::InFlight { .. }
    ));
    // The run resumes: still escalated, nothing sent. Then the first request lands.
    let resumed = tool.clone().oneshot(post()).await;
    assert_eq!(resumed.unwrap_err().code(), ErrorCode::OutcomeUnknown);
    desk.commit_first.notify_one();
    wait_for(|| desk.tickets() >= 1).await;
    // Past the in-flight bound, the operator finds the ticket and records it as the receipt.
    clock.advance_ms(5_000);
    assert_eq!(operator_loop(&store, &desk).await, [Resolved::Settled]);
    let again = tool.clone().oneshot(post()).await;
    assert_eq!(again.unwrap(), "ticket-1");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(desk.tickets(), 1, "two tickets");
    assert_eq!(desk.requests.load(Ordering::SeqCst), 1);
}

/// The README's operator loop: every pending intent of which nothing can still land is checked
/// with the desk's log and settled.
async fn operator_loop(store: &InMemoryStore, desk: &Desk) -> Vec<Resolved> {
    let mut settled = Vec::new();
    for intent in store.pending(100).await.unwrap() {
        if intent.may_still_land_for_ms > 0 {
            continue; // a request may still land: an empty log proves nothing yet
        }
        let resolution = match desk.ticket_for(post().ticket) {
            Some(ticket) => Resolution::Done(serde_json::to_vec(&ticket).unwrap()),
            None => Resolution::NotDone,
        };
        settled.push(store.resolve(&intent.key, resolution).await.unwrap());
    }
    settled
}

async fn wait_for(done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("waited 5 s");
}

// ---------------------------------------------------------------------------------------------
// A keyed write at a provider that checks its keys as Stripe and the IETF idempotency-key draft
// do (issue 20, items 6 and 7): 409 while a request with the key is still being processed, 422
// when the key comes back with other parameters.

use std::collections::HashMap;
use stormguard::classify::HttpClassifier;
use stormguard::receipt::Codec;

/// A charge; the memo is free text the model words, left out of the key and the fingerprint.
#[derive(Clone, Debug)]
struct Charge {
    order: u64,
    memo: &'static str,
    key: Option<String>,
}

impl KeyStamp for Charge {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

fn charge(memo: &'static str) -> Charge {
    Charge {
        order: 4471,
        memo,
        key: None,
    }
}

fn charge_action(c: &Charge) -> Result<Action, stormguard::key::KeyError> {
    Action::task(
        "run-1",
        "step-3",
        "charge",
        &serde_json::json!({"order": c.order, "memo": c.memo}),
        &["order"],
        &["order"],
    )
}

enum Entry {
    Executing {
        params: String,
        commit: Arc<tokio::sync::Notify>,
    },
    Done {
        params: String,
        charge: String,
    },
}

/// The provider. A key's first request runs until it commits: when the provider has answered a
/// 409 for the key (it finishes right after), or when the test says so.
#[derive(Clone, Default)]
struct Stripe {
    keys: Arc<Mutex<HashMap<String, Entry>>>,
    charges: Arc<AtomicU32>,
    requests: Arc<AtomicU32>,
    statuses: Arc<Mutex<Vec<u16>>>,
    /// Whether a key's first request runs until the test commits it, whatever is asked meanwhile.
    slow: Arc<std::sync::atomic::AtomicBool>,
}

impl Stripe {
    async fn start() -> (Stripe, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stripe = Stripe::default();
        let server = stripe.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let stripe = server.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let stripe = stripe.clone();
                            async move {
                                let key = req.headers()["idempotency-key"]
                                    .to_str()
                                    .unwrap()
                                    .to_string();
                                let body = req.into_body().collect().await?.to_bytes();
                                let params = String::from_utf8(body.to_vec()).unwrap();
                                let (status, answer) = stripe.answer(key, params).await;
                                stripe.statuses.lock().unwrap().push(status);
                                let resp = http::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from(answer)))
                                    .unwrap();
                                Ok::<_, hyper::Error>(resp)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (stripe, addr)
    }

    async fn answer(&self, key: String, params: String) -> (u16, String) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let commit = {
            let mut keys = self.keys.lock().unwrap();
            match keys.get(&key) {
                Some(Entry::Executing { params: p, .. } | Entry::Done { params: p, .. })
                    if *p != params =>
                {
                    return (422, r#"{"error":"idempotency_key_reused"}"#.into());
                }
                Some(Entry::Done { charge, .. }) => return (200, charge.clone()),
                Some(Entry::Executing { .. }) => {
                    drop(keys);
                    if !self.slow.load(Ordering::SeqCst) {
                        self.commit(&key);
                    }
                    return (409, r#"{"error":"idempotency_key_in_use"}"#.into());
                }
                None => {
                    let commit = Arc::new(tokio::sync::Notify::new());
                    keys.insert(
                        key.clone(),
                        Entry::Executing {
                            params,
                            commit: commit.clone(),
                        },
                    );
                    commit
                }
            }
        };
        // The first request runs on its own: a client that leaves does not stop it.
        let this = self.clone();
        let done = tokio::spawn(async move {
            commit.notified().await;
            this.commit(&key);
            match &this.keys.lock().unwrap()[&key] {
                Entry::Done { charge, .. } => charge.clone(),
                Entry::Executing { .. } => unreachable!("committed"),
            }
        });
        (200, done.await.unwrap())
    }

    /// The key's first request commits (once).
    fn commit(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap();
        if let Some(Entry::Executing { params, commit }) = keys.get(key) {
            let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
            let (params, commit) = (params.clone(), commit.clone());
            keys.insert(
                key.to_string(),
                Entry::Done {
                    params,
                    charge: format!(r#"{{"charge":"ch_{n}"}}"#),
                },
            );
            commit.notify_one();
        }
    }

    fn commit_all(&self) {
        let keys: Vec<String> = self.keys.lock().unwrap().keys().cloned().collect();
        for key in keys {
            self.commit(&key);
        }
    }
}

/// The provider's client: the answer as status and body.
#[derive(Clone)]
struct StripeClient(SocketAddr, support::server::HttpClient);

impl tower::Service<Charge> for StripeClient {
    type Response = http::Response<String>;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<http::Response<String>, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, c: Charge) -> Self::Future {
        let (addr, mut client) = (self.0, self.1.clone());
        Box::pin(async move {
            let body = serde_json::json!({"order": c.order, "memo": c.memo}).to_string();
            let req = http::Request::post(format!("http://{addr}/charges"))
                .header("idempotency-key", c.key.as_deref().unwrap_or_default())
                .body(support::server::Body::from(body))?;
            let resp = tower::Service::call(&mut client, req).await?;
            let (parts, body) = resp.into_parts();
            let body = String::from_utf8(body.collect().await?.to_bytes().to_vec())?;
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A response stored as its status and body.
#[derive(Clone)]
struct ResponseCodec;

impl Codec<http::Response<String>> for ResponseCodec {
    fn encode(&self, res: &http::Response<String>) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(&(res.status().as_u16(), res.body()))?)
    }
    fn decode(&self, bytes: &[u8]) -> Result<http::Response<String>, BoxError> {
        let (status, body): (u16, String) = serde_json::from_slice(bytes)?;
        Ok(http::Response::builder().status(status).body(body)?)
    }
}

type ChargeFn = fn(&Charge) -> Result<Action, stormguard::key::KeyError>;

fn charges(
    store: &InMemoryStore,
) -> ReceiptGuardLayer<InMemoryStore, ChargeFn, HttpClassifier, ResponseCodec> {
    ReceiptGuardLayer::new(
        store.clone(),
        ToolClass::KeyedWrite,
        charge_action as ChargeFn,
    )
    .classifier(HttpClassifier)
    .codec(ResponseCodec)
}

#[tokio::test]
async fn a_keyed_write_whose_first_attempt_commits_late_is_retried_through_409_key_in_use() {
    let (stripe, addr) = Stripe::start().await;
    let store = InMemoryStore::new();
    let tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(CloneReplay),
        )
        .layer(charges(&store))
        .timeout(Duration::from_millis(200))
        .service(StripeClient(addr, support::server::HttpClient::new()));
    // The first attempt times out; its retry (same key) is told 409 while the first is still
    // running, which commits right after; the next retry gets the charge.
    let resp = tool.oneshot(charge("for order 4471")).await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.body().as_str()),
        (200, r#"{"charge":"ch_1"}"#),
        "statuses {:?}",
        stripe.statuses.lock().unwrap()
    );
    assert_eq!(stripe.charges.load(Ordering::SeqCst), 1);
    assert_eq!(
        stripe.requests.load(Ordering::SeqCst),
        3,
        "sent, 409, the charge"
    );
    assert!(
        store.pending(10).await.unwrap().is_empty(),
        "the receipt is recorded"
    );
}

/// The first request is still running when the attempts run out: the run is told `in_progress`
/// (not `conflict`), the intent stays, and the run's reissue once it has finished gets the
/// charge, made once.
#[tokio::test]
async fn a_keyed_write_still_running_after_its_attempts_is_in_progress_and_its_reissue_gets_the_charge(
) {
    let (stripe, addr) = Stripe::start().await;
    stripe.slow.store(true, Ordering::SeqCst);
    let store = InMemoryStore::new();
    let tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(CloneReplay),
        )
        .layer(charges(&store))
        .timeout(Duration::from_millis(200))
        .service(StripeClient(addr, support::server::HttpClient::new()));
    let err = tool
        .clone()
        .oneshot(charge("for order 4471"))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.retryable()),
        (ErrorCode::InProgress, false),
        "{err}"
    );
    assert_eq!(err.attempts(), 3);
    assert_eq!(*stripe.statuses.lock().unwrap(), [409, 409]);
    assert_eq!(store.pending(10).await.unwrap().len(), 1);
    // The reissue while it still runs: told so again; once it has finished: the charge.
    let err = tool
        .clone()
        .oneshot(charge("for order 4471"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InProgress);
    stripe.commit_all();
    let resp = tool.oneshot(charge("for order 4471")).await.unwrap();
    assert_eq!(resp.body(), r#"{"charge":"ch_1"}"#);
    assert_eq!(stripe.charges.load(Ordering::SeqCst), 1);
    assert!(store.pending(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_reworded_reissue_under_the_same_key_is_told_idempotency_key_reused() {
    let (stripe, addr) = Stripe::start().await;
    let store = InMemoryStore::new();
    let client = || {
        ServiceBuilder::new()
            .timeout(Duration::from_millis(200))
            .service(StripeClient(addr, support::server::HttpClient::new()))
    };
    // The run's first attempt times out; the charge commits after.
    let first = charges(&store)
        .layer(client())
        .oneshot(charge("for order 4471"))
        .await;
    assert!(first.is_err());
    stripe.commit_all();
    // The resumed run words the memo anew: same key, other parameters; Stripe refuses it 422.
    let tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(CloneReplay),
        )
        .layer(charges(&store))
        .service(client());
    let err = tool
        .clone()
        .oneshot(charge("invoice 4471, as agreed"))
        .await
        .map(|resp| resp.status())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyReused, "{err}");
    let key = charge_action(&charge("")).unwrap().key().to_string();
    assert!(err.hint().contains(&key), "{}", err.hint());
    assert!(err.hint().contains("do not reword"), "{}", err.hint());
    assert!(!err.retryable());
    assert_eq!(stripe.charges.load(Ordering::SeqCst), 1);
    // The intent stays pending: the first request did take effect. Asked again in the first
    // wording, the provider answers the charge, and it becomes the receipt.
    assert_eq!(store.pending(10).await.unwrap().len(), 1);
    let resp = tool.oneshot(charge("for order 4471")).await.unwrap();
    assert_eq!(resp.body(), r#"{"charge":"ch_1"}"#);
    assert!(store.pending(10).await.unwrap().is_empty());
    assert_eq!(stripe.charges.load(Ordering::SeqCst), 1);
}

/// Without a receipt layer: the key layer stamps the key and the `Retry` decides. A 409 is
/// retried for a keyed write carrying its key, and stays a permanent conflict for anything else;
/// a 422 under a key ends as `idempotency_key_reused`, without one as `invalid_argument`.
#[tokio::test(start_paused = true)]
async fn a_409_is_retried_only_for_a_keyed_write_carrying_its_key_and_a_422_under_a_key_is_key_reused(
) {
    use stormguard::classify::{Classification, FailureClass, KeyConflict};
    use stormguard::key::SetIdempotencyKeyLayer;
    use stormguard::retry::HttpReplay;
    let key_of = |req: &http::Request<String>| Action::new("run-1", "step-3", "charge", req.body());
    let request = || {
        http::Request::post("/charges")
            .body("4471".to_string())
            .unwrap()
    };
    for (class, keyed, calls, status) in [
        (ToolClass::KeyedWrite, true, 2, 200),
        (ToolClass::KeyedWrite, false, 1, 409),
        (ToolClass::UnkeyedWrite, true, 1, 409),
        (ToolClass::IdempotentWrite, true, 1, 409),
        (ToolClass::Read, true, 1, 409),
    ] {
        let (count, provider) = support::http_script(409, &[], 1);
        let provider = ServiceBuilder::new()
            .map_err(BoxError::from)
            .service(provider);
        let inner = if keyed {
            tower::util::BoxCloneSyncService::new(
                SetIdempotencyKeyLayer::new(key_of).layer(provider),
            )
        } else {
            tower::util::BoxCloneSyncService::new(provider)
        };
        let svc = ServiceBuilder::new()
            .layer(
                RetryLayer::new(class, RetryBudget::default())
                    .classifier(HttpClassifier)
                    .replay(HttpReplay),
            )
            .service(inner);
        let resp = svc.oneshot(request()).await.unwrap();
        assert_eq!(
            (resp.status().as_u16(), count.load(Ordering::SeqCst)),
            (status, calls),
            "{class:?} keyed {keyed}"
        );
    }
    // A client that reports the provider's 422 as an error its classifier marks.
    let reused = |r: &Result<u32, BoxError>| match r {
        Ok(_) => Classification::success(),
        Err(_) => {
            Classification::failure(FailureClass::ModelRecoverable, ErrorCode::InvalidArgument)
                .with_key_conflict(KeyConflict::Reused)
        }
    };
    for (keyed, code) in [
        (true, ErrorCode::IdempotencyKeyReused),
        (false, ErrorCode::InvalidArgument),
    ] {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let provider = tower::service_fn(move |_: http::Request<String>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err::<u32, BoxError>("HTTP 422".into()) }
        });
        let inner = if keyed {
            tower::util::BoxCloneSyncService::new(
                SetIdempotencyKeyLayer::new(key_of).layer(provider),
            )
        } else {
            tower::util::BoxCloneSyncService::new(provider)
        };
        let svc = ServiceBuilder::new()
            .layer(
                RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                    .classifier(reused)
                    .replay(HttpReplay),
            )
            .service(inner);
        let err = svc.oneshot(request()).await.unwrap_err();
        assert_eq!(
            (err.code(), err.retryable()),
            (code, false),
            "keyed {keyed}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
