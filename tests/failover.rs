//! Failover: a call moves to the next target only when its target cannot serve now and did
//! nothing; it is sticky to a healthy target, comes back to an earlier one after one probe, and
//! stays inside the operation's attempts and its budget. Fake targets on tokio's paused clock
//! for the rules; real HTTP servers on 127.0.0.1 with the model-API classifier for the recipe.

mod support;

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::failover::{Exhausted, Failover, Leave};
use stormguard::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

type Target = BoxCloneSyncService<u32, u32, BoxError>;

/// What a fake target answers now (changed by the test).
const OK: u8 = 0;
const QUOTA: u8 = 1;
const OVERLOADED: u8 = 2;
const INVALID: u8 = 3;
const RESET: u8 = 4;
const LIMITED_LONG: u8 = 5;
const LIMITED_SHORT: u8 = 6;
const CIRCUIT_OPEN: u8 = 7;

struct Fake {
    mode: Arc<AtomicU8>,
    calls: Arc<AtomicU32>,
}

impl Fake {
    fn new(mode: u8) -> (Fake, Target) {
        let fake = Fake {
            mode: Arc::new(AtomicU8::new(mode)),
            calls: Arc::new(AtomicU32::new(0)),
        };
        let (m, c) = (fake.mode.clone(), fake.calls.clone());
        let svc = service_fn(move |req: u32| {
            let mode = m.load(Ordering::SeqCst);
            if mode != CIRCUIT_OPEN {
                c.fetch_add(1, Ordering::SeqCst);
            }
            async move {
                let err = |e: ToolError| Err::<u32, BoxError>(e.into());
                match mode {
                    OK => Ok(req),
                    QUOTA => err(ToolError::new(ErrorCode::QuotaExhausted)),
                    OVERLOADED => Err(support::error_for(
                        stormguard::classify::FailureClass::Transient,
                    )),
                    INVALID => err(ToolError::new(ErrorCode::InvalidArgument)),
                    RESET => Err(support::error_for(
                        stormguard::classify::FailureClass::Ambiguous,
                    )),
                    LIMITED_LONG => err(ToolError::new(ErrorCode::RateLimited)
                        .with_retry_after(Duration::from_secs(30))),
                    LIMITED_SHORT => err(ToolError::new(ErrorCode::RateLimited)
                        .with_retry_after(Duration::from_millis(100))),
                    _ => err(ToolError::new(ErrorCode::CircuitOpen)),
                }
            }
        });
        (fake, BoxCloneSyncService::new(svc))
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

fn three(modes: [u8; 3]) -> ([Fake; 3], Failover<Target>) {
    let (a, ta) = Fake::new(modes[0]);
    let (b, tb) = Fake::new(modes[1]);
    let (c, tc) = Fake::new(modes[2]);
    let failover = Failover::builder(RetryBudget::default(), "a", ta)
        .or("b", tb)
        .or("c", tc)
        .probe_every(Duration::from_secs(1))
        .build()
        .unwrap();
    ([a, b, c], failover)
}

async fn call(svc: &Failover<Target>, n: u32) -> Result<u32, BoxError> {
    svc.clone().oneshot(n).await
}

fn tool_error(err: &BoxError) -> &ToolError {
    err.downcast_ref::<ToolError>()
        .unwrap_or_else(|| panic!("not a ToolError: {err}"))
}

#[tokio::test(start_paused = true)]
async fn a_spent_quota_moves_on_and_the_target_is_skipped_until_its_probe() {
    let ([a, b, c], failover) = three([QUOTA, OK, OK]);
    for n in 0..20 {
        assert_eq!(call(&failover, n).await.unwrap(), n);
    }
    // One call found the quota spent; the next 19 went straight to b, none to c.
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 20, 0));
    assert_eq!(failover.skipped()[0].1, Leave::QuotaExhausted);

    // Within the probe interval nothing more reaches a, whatever the traffic.
    tokio::time::advance(Duration::from_millis(900)).await;
    call(&failover, 0).await.unwrap();
    assert_eq!(a.calls(), 1);

    // Its wait passed: one call probes it (still spent), the rest skip it again.
    tokio::time::advance(Duration::from_millis(200)).await;
    for n in 0..10 {
        call(&failover, n).await.unwrap();
    }
    assert_eq!(a.calls(), 2, "one probe per interval, not one per call");

    // Healed: the next probe finds it, and calls stay there.
    a.set(OK);
    tokio::time::advance(Duration::from_secs(1)).await;
    let b_before = b.calls();
    for n in 0..10 {
        call(&failover, n).await.unwrap();
    }
    assert_eq!((a.calls(), b.calls()), (12, b_before));
    assert!(failover.skipped().is_empty());
}

#[tokio::test(start_paused = true)]
async fn only_cannot_serve_signals_move_a_call_on() {
    // (what a answers, whether the call reaches b)
    for (mode, moves) in [
        (QUOTA, true),
        (OVERLOADED, true),
        (CIRCUIT_OPEN, true),
        (LIMITED_LONG, true),
        (LIMITED_SHORT, false),
        (INVALID, false),
        (RESET, false),
    ] {
        let ([a, b, _], failover) = three([mode, OK, OK]);
        let result = call(&failover, 7).await;
        assert_eq!(b.calls() == 1, moves, "mode {mode}");
        assert_eq!(result.is_ok(), moves, "mode {mode}");
        // A breaker that answers for its target sends nothing there.
        assert_eq!(a.calls(), u32::from(mode != CIRCUIT_OPEN), "mode {mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_unkeyed_write_is_not_sent_to_another_target() {
    let ([a, b, c], failover) = three([RESET, OK, OK]);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::UnkeyedWrite,
            RetryBudget::default(),
        ))
        .service(failover);
    let err = stack.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn when_no_target_can_serve_the_error_names_each_and_why() {
    let ([a, b, c], failover) = three([QUOTA, OVERLOADED, CIRCUIT_OPEN]);
    let err = call(&failover, 1).await.unwrap_err();
    let tool = tool_error(&err);
    assert_eq!(tool.code(), ErrorCode::CircuitOpen);
    assert!(
        tool.hint()
            .contains("a quota_exhausted, b unavailable, c circuit_open (not sent)"),
        "{}",
        tool.hint()
    );
    let exhausted = std::error::Error::source(tool)
        .and_then(|s| s.downcast_ref::<Exhausted>())
        .expect("the source lists the targets");
    let why: Vec<_> = exhausted
        .tried()
        .iter()
        .map(|t| (t.target.as_ref(), t.why, t.sent))
        .collect();
    assert_eq!(
        why,
        [
            ("a", Leave::QuotaExhausted, true),
            ("b", Leave::Unavailable, true),
            ("c", Leave::CircuitOpen, false)
        ]
    );
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0));

    // The next call sends nothing: every target is skipped, and the error says for how long.
    let err = call(&failover, 2).await.unwrap_err();
    let tool = tool_error(&err);
    assert_eq!((a.calls(), b.calls()), (1, 1));
    assert_eq!(tool.retry_after(), Some(Duration::from_secs(1)));
    assert!(tool.hint().contains("(not sent)"));
}

#[tokio::test(start_paused = true)]
async fn moves_count_as_attempts_of_the_operation() {
    // A Retry above allows 2 attempts: the first target plus one move, then the call ends.
    let ([a, b, c], failover) = three([OVERLOADED, OVERLOADED, OK]);
    let policy = stormguard::class::ClassPolicy::builder(ToolClass::Read)
        .max_attempts(2)
        .build()
        .unwrap();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(policy, RetryBudget::default()))
        .service(failover);
    let err = stack.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0), "{err}");
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_keeps_the_call_at_its_first_target() {
    let (a, ta) = Fake::new(OVERLOADED);
    let (b, tb) = Fake::new(OK);
    let budget = support::no_floor(); // nothing deposited, no floor: no move is granted
    let failover = Failover::builder(budget, "a", ta)
        .or("b", tb)
        .build()
        .unwrap();
    let err = call(&failover, 1).await.unwrap_err();
    assert_eq!(tool_error(&err).code(), ErrorCode::Unavailable);
    assert_eq!((a.calls(), b.calls()), (1, 0));
}

#[tokio::test]
async fn a_request_that_cannot_be_copied_goes_to_one_target() {
    struct Once;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = |calls: Arc<AtomicU32>| {
        BoxCloneSyncService::new(service_fn(move |_: Once| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<u32, BoxError>(ToolError::new(ErrorCode::QuotaExhausted).into()) }
        }))
    };
    let failover = Failover::builder(RetryBudget::default(), "a", counted(calls.clone()))
        .or("b", counted(calls.clone()))
        .replay(NoCopy)
        .build()
        .unwrap();
    let err = failover.oneshot(Once).await.unwrap_err();
    assert_eq!(tool_error(&err).code(), ErrorCode::QuotaExhausted);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    #[derive(Clone, Copy)]
    struct NoCopy;
    impl stormguard::retry::Replay<Once> for NoCopy {
        fn replay(&self, _: &Once) -> Option<Once> {
            None
        }
    }
}

#[test]
fn two_targets_with_one_name_are_refused() {
    let (_, t) = Fake::new(OK);
    let err = Failover::builder(RetryBudget::default(), "a", t.clone())
        .or("a", t)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "failover.targets");
}

/// Three model providers on 127.0.0.1, as a user would stack them: the agent's `Retry` over the
/// failover, each target the provider's client behind the error-body peek, classified by the
/// model-API classifier. The first has spent its quota (OpenAI's 429 `insufficient_quota`), the
/// second is overloaded (Anthropic's 529), the third answers.
#[tokio::test]
async fn model_providers_over_http_a_spent_quota_and_an_overload_are_left_the_third_answers() {
    use bytes::Bytes;
    use http_body_util::Full;
    use stormguard::classify::ModelApiClassifier;
    use stormguard::peek::PeekErrorBodyLayer;
    use support::server::{serve, status, HttpClient};

    const SPENT: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let spent = Arc::new(AtomicU8::new(1));
    let still_spent = spent.clone();
    let (a, a_calls) = serve(move |_| {
        if still_spent.load(Ordering::SeqCst) == 1 {
            let mut r = status(429, &[("content-type", "application/json")]);
            *r.body_mut() = Full::new(Bytes::from_static(SPENT.as_bytes()));
            r
        } else {
            status(200, &[])
        }
    })
    .await;
    let (b, b_calls) = serve(|_| status(529, &[])).await;
    let (c, c_calls) = serve(|_| status(200, &[])).await;

    let target = |addr: std::net::SocketAddr| {
        let client = ServiceBuilder::new()
            .layer(PeekErrorBodyLayer::builder().build().unwrap())
            .map_request(move |mut req: http::Request<Full<Bytes>>| {
                *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                    .parse()
                    .unwrap();
                req
            })
            .service(HttpClient::new());
        BoxCloneSyncService::new(client)
    };
    let failover = Failover::builder(RetryBudget::default(), "openai", target(a))
        .or("anthropic", target(b))
        .or("local", target(c))
        .classifier(ModelApiClassifier)
        .probe_every(Duration::from_millis(200))
        .build()
        .unwrap();
    let agent = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default()).classifier(ModelApiClassifier),
        )
        .service(failover);
    let ask = || {
        http::Request::post("http://model/v1/chat/completions")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };

    let started = std::time::Instant::now();
    for _ in 0..10 {
        let answer = agent
            .clone()
            .oneshot(ask())
            .await
            .expect("every request answered");
        assert_eq!(answer.status(), 200);
    }
    let counts = || {
        (
            a_calls.load(Ordering::SeqCst),
            b_calls.load(Ordering::SeqCst),
            c_calls.load(Ordering::SeqCst),
        )
    };
    // Each broken provider was asked once, then skipped: at most one probe each per 200 ms
    // (none if the ten calls took less, as they do on a machine that is not starved).
    let probes = (started.elapsed().as_millis() / 200) as u32;
    let (ta, tb, tc) = counts();
    assert_eq!(tc, 10);
    assert!((1..=1 + probes).contains(&ta), "{:?}", counts());
    assert!((1..=1 + probes).contains(&tb), "{:?}", counts());

    // The quota returns: within one probe interval the first provider serves again.
    spent.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let answer = agent.clone().oneshot(ask()).await.unwrap();
    assert_eq!(answer.status(), 200);
    let (ta2, _, tc2) = counts();
    assert_eq!(
        (ta2, tc2),
        (ta + 1, tc),
        "the probe went to the first provider and it answered"
    );
}
