//! The parts a declaration names beyond class, key and receipts: a hedge, a bounded read-back,
//! the attempts and backoff, a breaker left at `{}`; and what each refuses.
mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::breaker::BreakerConfig;
use stormguard::classify::{FailureClass, OkIsSuccess};
use stormguard::error::ErrorCode;
use stormguard::receipt::{Clock, InMemoryStore, ReadBack, ReadBackResult};
use stormguard::tool::{Call, Stores, ToolService, Toolbox};
use support::{classifier, Dependency, Outcome};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};

/// A receipt clock that follows tokio's (paused) clock.
#[derive(Clone)]
struct Paused(Instant);

impl Clock for Paused {
    fn now_ms(&self) -> u64 {
        1_800_000_000_000 + self.0.elapsed().as_millis() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn a_declared_hedge_sends_a_copy_of_a_slow_read_and_the_copy_wins() {
    let tools = Toolbox::from_json_str(
        r#"{
            "hedges": { "fast": { "delay_ms": 20 } },
            "tools": [{ "name": "search", "class": "read", "retry": ["layer"], "hedge": "fast" }]
        }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    // The first attempt hangs for a second; any other answers in 10 ms.
    let body = service_fn(move |_: Call| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let wait = if n == 0 { 1_000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, std::io::Error>(json!({ "attempt": n }))
        }
    });
    let search = tools
        .layer("search")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let start = Instant::now();
    let answer = search
        .oneshot(Call::new("r", "s", json!({ "q": "x" })))
        .await
        .unwrap();
    assert_eq!(answer, json!({ "attempt": 1 }), "the copy's answer");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(30));
}

#[test]
fn a_hedge_is_declared_on_a_read_only_and_its_settings_are_checked() {
    let with = |hedges: &str, class: &str| {
        Toolbox::from_json_str(&format!(
            r#"{{ "hedges": {hedges}, "tools": [{{ "name": "t", "class": "{class}", "retry": ["layer"], "hedge": "h" }}] }}"#
        ))
    };
    // On a write it would do nothing (a write is never sent twice): refused, not ignored.
    assert_eq!(
        with(r#"{"h": {}}"#, "keyed_write").unwrap_err().field(),
        "hedge"
    );
    assert_eq!(
        with(r#"{"h": {"delay_ms": 5, "percentile": 0.9}}"#, "read")
            .unwrap_err()
            .field(),
        "hedges"
    );
    assert_eq!(
        with(r#"{"h": {"percentile": 1.0}}"#, "read")
            .unwrap_err()
            .field(),
        "hedges.percentile"
    );
    assert_eq!(
        with(r#"{"h": {"delay_ms": 0}}"#, "read")
            .unwrap_err()
            .field(),
        "hedges.delay_ms"
    );
    // The older list of names still reads, each hedge at the defaults (p95 after 20 answers).
    let tb = with(r#"["h"]"#, "read").unwrap();
    assert_eq!(tb.hedges()["h"], stormguard::tool::HedgeSpec::default());
    let tools = tb.build(Stores::new()).unwrap();
    assert!(format!("{:?}", tools.layer("t").unwrap()).contains("hedge: true"));
}

#[tokio::test(start_paused = true)]
async fn declared_attempts_and_backoff_are_the_retrys() {
    let tools = Toolbox::from_json_str(
        r#"{ "tools": [{
            "name": "lookup", "class": "read", "retry": ["layer"],
            "max_attempts": 5, "backoff": { "base_ms": 4, "cap_ms": 8 }
        }] }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let lookup = tools
        .layer("lookup")
        .unwrap()
        .classifier(classifier as fn(&_) -> _)
        .layer(dep.clone());
    let start = Instant::now();
    let err = lookup
        .oneshot(Call::new("r", "s", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err:?}");
    assert_eq!(dep.calls(), 5, "the declared attempts");
    // Four backoffs, each at most its ceiling (4, 8, 8, 8 ms; full jitter draws below).
    assert!(
        start.elapsed() <= Duration::from_millis(28),
        "{:?}",
        start.elapsed()
    );
    for bad in [
        r#""max_attempts": 0"#,
        r#""backoff": { "base_ms": 0 }"#,
        r#""backoff": { "base_ms": 10, "cap_ms": 5 }"#,
    ] {
        let file = format!(
            r#"{{ "tools": [{{ "name": "t", "class": "read", "retry": ["layer"], {bad} }}] }}"#
        );
        let err = Toolbox::from_json_str(&file).unwrap_err();
        assert_eq!(err.tool(), Some("t"), "{bad}: {err}");
    }
}

#[test]
fn a_breaker_left_at_its_defaults_is_the_default_breaker() {
    let tools = Toolbox::from_json_str(
        r#"{ "breakers": { "dep": {} }, "tools": [{ "name": "t", "class": "read", "retry": ["layer"], "breaker": "dep" }] }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let built = format!("{:?}", tools.breaker("dep").unwrap().config());
    assert_eq!(built, format!("{:?}", BreakerConfig::default()));
}

/// The provider's sent log (consistent) as a read-back that counts its reads; `answer` says
/// what every read finds.
#[derive(Clone)]
struct SentLog {
    reads: Arc<AtomicU32>,
    answer: Arc<Mutex<Option<Option<Value>>>>,
}

impl ReadBack<Call, Value> for SentLog {
    async fn read_back(&self, _: &Call) -> ReadBackResult<Value> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        match self.answer.lock().unwrap().clone() {
            Some(Some(found)) => ReadBackResult::Found(found),
            Some(None) => ReadBackResult::Absent,
            None => ReadBackResult::Unknown,
        }
    }
}

const POST_TICKET: &str = r#"{
    "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
    "tools": [{
        "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
        "key": ["run", "tool", "id:ticket"],
        "receipt": { "store": "receipts", "lease_secs": 1 },
        "unknown_outcome": { "read_back": { "attempts": 3, "within_secs": 10 } }
    }]
}"#;

/// `post_ticket` over a provider that applies the post and then never answers the first call
/// (the process dies there); later calls answer at once. Returns the stack and the effects.
fn post_ticket(log: &SentLog) -> (ToolService<Value>, Arc<AtomicU32>) {
    let store = InMemoryStore::with_clock(Paused(Instant::now()));
    let tools = Toolbox::from_json_str(POST_TICKET)
        .unwrap()
        .build(Stores::new().with("receipts", store))
        .unwrap();
    assert_eq!(
        tools.layer("post_ticket").unwrap_err().field(),
        "unknown_outcome",
        "a read-back tool needs its read-back"
    );
    let effects = Arc::new(AtomicU32::new(0));
    let applied = effects.clone();
    let provider = service_fn(move |_: Call| {
        let n = applied.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>(json!({ "posted": n }))
        }
    });
    let stack = tools
        .layer_reading_back("post_ticket", log.clone())
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(provider);
    (stack, effects)
}

/// Crashes a first call after the provider applied it, waits out its lease, and resumes.
async fn crash_and_resume(log: &SentLog) -> (Result<Value, stormguard::error::ToolError>, u32) {
    let (stack, effects) = post_ticket(log);
    let call = || Call::new("run-1", "step-3", json!({ "ticket": 7 }));
    let crashed = tokio::time::timeout(Duration::from_millis(50), stack.clone().oneshot(call()));
    assert!(crashed.await.is_err(), "the first call never answers");
    tokio::time::sleep(Duration::from_secs(120)).await;
    let resumed = stack.oneshot(call()).await;
    (resumed, effects.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_declared_read_back_that_finds_the_effect_answers_the_resume_without_a_send() {
    let log = SentLog {
        reads: Arc::default(),
        answer: Arc::new(Mutex::new(Some(Some(json!({ "posted": 0 }))))),
    };
    let (resumed, effects) = crash_and_resume(&log).await;
    assert_eq!(resumed.unwrap(), json!({ "posted": 0 }));
    assert_eq!(effects, 1, "the resume sent nothing");
    assert_eq!(log.reads.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_declared_read_back_that_finds_nothing_lets_the_resume_send() {
    let log = SentLog {
        reads: Arc::default(),
        answer: Arc::new(Mutex::new(Some(None))),
    };
    let (resumed, effects) = crash_and_resume(&log).await;
    assert_eq!(resumed.unwrap(), json!({ "posted": 1 }));
    assert_eq!(effects, 2);
}

#[tokio::test(start_paused = true)]
async fn a_read_back_that_cannot_tell_is_made_its_declared_times_then_escalated() {
    let log = SentLog {
        reads: Arc::default(),
        answer: Arc::new(Mutex::new(None)),
    };
    let (resumed, effects) = crash_and_resume(&log).await;
    let err = resumed.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err:?}");
    assert_eq!(effects, 1, "nothing sent while the outcome is unknown");
    assert_eq!(log.reads.load(Ordering::SeqCst), 3, "the declared attempts");
}

#[test]
fn a_read_back_is_declared_with_receipts_and_given_only_where_declared() {
    let no_receipts = r#"{ "tools": [{
        "name": "t", "class": "unkeyed_write", "retry": ["none"],
        "unknown_outcome": { "read_back": { "attempts": 1, "within_secs": 1 } }
    }] }"#;
    let tools = Toolbox::from_json_str(no_receipts)
        .unwrap()
        .build(Stores::new())
        .unwrap();
    let log = SentLog {
        reads: Arc::default(),
        answer: Arc::default(),
    };
    let err = tools.layer_reading_back("t", log.clone()).unwrap_err();
    assert!(err.reason().contains("receipts"), "{err}");
    let plain = Toolbox::from_json_str(
        r#"{ "tools": [{ "name": "t", "class": "unkeyed_write", "retry": ["none"], "unknown_outcome": "escalate" }] }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    assert_eq!(
        plain.layer_reading_back("t", log).unwrap_err().field(),
        "unknown_outcome"
    );
}

#[cfg(feature = "audit")]
#[test]
fn the_new_parts_survive_a_toml_round_trip() {
    let tb = Toolbox::from_json_str(
        r#"{
            "hedges": { "h": { "percentile": 0.9, "min_samples": 50 } },
            "breakers": { "b": {} },
            "tools": [{ "name": "t", "class": "read", "retry": ["layer"], "hedge": "h", "breaker": "b",
                        "max_attempts": 4, "backoff": { "base_ms": 50, "cap_ms": 2000 } }]
        }"#,
    )
    .unwrap();
    assert_eq!(Toolbox::from_toml_str(&tb.to_toml_string()).unwrap(), tb);
    assert_eq!(Toolbox::from_json_str(&tb.to_json_string()).unwrap(), tb);
}

#[test]
fn a_hedge_goes_only_where_the_layer_owns_the_retries() {
    // A hedge is a second attempt: under `none`, `model` or `client` the one attempt the layer
    // makes would become two.
    for owner in ["none", "model", "client"] {
        let file = format!(
            r#"{{ "hedges": {{ "h": {{ "delay_ms": 50 }} }},
                "tools": [{{ "name": "search", "class": "read", "retry": ["{owner}"], "hedge": "h" }}] }}"#
        );
        let err = Toolbox::from_json_str(&file).unwrap_err();
        assert_eq!(err.field(), "hedge", "{owner}: {err}");
    }
}

#[test]
fn a_table_that_validates_builds_every_stack() {
    // Limits the layers would refuse are refused when the table is read, not when a stack is
    // built (a table that audits clean could not be built before).
    for (bad, field) in [
        (r#""max_attempts": 101"#, "max_attempts"),
        (r#""deadline_secs": 86401"#, "deadline_secs"),
        (
            r#""backoff": { "base_ms": 1, "cap_ms": 3600001 }"#,
            "backoff",
        ),
    ] {
        let file = format!(
            r#"{{ "tools": [{{ "name": "t", "class": "read", "retry": ["layer"], {bad} }}] }}"#
        );
        let err = Toolbox::from_json_str(&file).unwrap_err();
        assert_eq!(err.field(), field, "{bad}: {err}");
    }
    for (hedge, field) in [
        (r#"{ "delay_ms": 3600001 }"#, "hedges.delay_ms"),
        (
            r#"{ "percentile": 0.9, "min_samples": 0 }"#,
            "hedges.min_samples",
        ),
        (
            r#"{ "delay_ms": 10, "min_samples": 5 }"#,
            "hedges.min_samples",
        ),
    ] {
        let file = format!(r#"{{ "hedges": {{ "h": {hedge} }}, "tools": [] }}"#);
        let err = Toolbox::from_json_str(&file).unwrap_err();
        assert_eq!(err.field(), field, "{hedge}: {err}");
    }
    let read_back = r#"{ "tools": [{ "name": "t", "class": "unkeyed_write", "retry": ["none"],
        "unknown_outcome": { "read_back": { "attempts": 2, "within_secs": 86401 } } }] }"#;
    assert!(Toolbox::from_json_str(read_back).is_err());
    let breaker = r#"{ "breakers": { "b": { "failure_ratio": 0.05 } }, "tools": [] }"#;
    assert_eq!(
        Toolbox::from_json_str(breaker).unwrap_err().field(),
        "breakers.failure_ratio"
    );
    // At the edges, every stack builds.
    let edges = r#"{ "hedges": { "h": { "delay_ms": 3600000 } },
        "tools": [{ "name": "t", "class": "read", "retry": ["layer"], "max_attempts": 100,
                    "deadline_secs": 86400, "backoff": { "base_ms": 1, "cap_ms": 3600000 },
                    "hedge": "h" },
                  { "name": "slow", "class": "read", "retry": ["layer"],
                    "backoff": { "base_ms": 20000 } }] }"#;
    let tools = Toolbox::from_json_str(edges)
        .unwrap()
        .build(Stores::new())
        .unwrap();
    assert!(tools.layer("t").is_ok());
    // A base above the default cap with no cap of its own: the base is the cap.
    assert!(tools.layer("slow").is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_field_its_key_covers_is_refused_naming_the_field() {
    let tools = Toolbox::from_json_str(
        r#"{ "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
            "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate" }] }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let sent = Arc::new(AtomicU32::new(0));
    let counter = sent.clone();
    let body = service_fn(move |_: Call| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::io::Error>(json!({})) }
    });
    let send = tools
        .layer("send_invoice")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let err = send
        .oneshot(Call::new("r", "s", json!({ "id": 4471 })))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.hint().contains("invoice_id"), "{}", err.hint());
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}
