//! Sagas: forward, compensation in reverse, a crash at every point followed by resumes, an
//! unknown outcome settled by an operator, a compensation that fails for good.
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::classify::OkIsSuccess;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::receipt::{InMemoryStore, ManualClock, ReceiptStore, Resolution};
use stormguard::saga::{Halt, Saga, SagaSpec};
use stormguard::tool::{Call, Stores, Toolbox};

/// A provider that honours idempotency keys: a repeated key answers what the first call did,
/// with no new effect. It counts effects per action, fails the actions it is told to, and can
/// "crash" at its `crash_at`-th call: the effect is done, the answer never comes.
#[derive(Clone, Default)]
struct Provider {
    effects: Arc<Mutex<BTreeMap<String, u32>>>,
    by_key: Arc<Mutex<HashMap<String, Value>>>,
    calls: Arc<AtomicU32>,
    crash_at: Arc<AtomicU32>,
    fail_for_good: Arc<Mutex<Vec<&'static str>>>,
    reset_after_work: Arc<Mutex<Vec<&'static str>>>,
    /// Calls (by number) refused before any work: a transient failure, retried by the step.
    refused_at: Arc<Mutex<Vec<u32>>>,
}

impl Provider {
    fn effects(&self) -> BTreeMap<String, u32> {
        self.effects.lock().unwrap().clone()
    }

    fn serve(&self, call: Call) -> Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>> {
        let tool = call.tool().unwrap_or_default().to_owned();
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.refused_at.lock().unwrap().contains(&n) {
            let refused: BoxError =
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
            return Box::pin(async move { Err(refused) });
        }
        if self.fail_for_good.lock().unwrap().contains(&tool.as_str()) {
            let err = ToolError::new(ErrorCode::InvalidArgument).with_retryable(false);
            return Box::pin(async move { Err(err.into()) });
        }
        let key = call.key().map(|k| k.to_string()).unwrap_or_default();
        let answer = {
            let mut by_key = self.by_key.lock().unwrap();
            by_key
                .entry(key)
                .or_insert_with(|| {
                    *self
                        .effects
                        .lock()
                        .unwrap()
                        .entry(tool.clone())
                        .or_default() += 1;
                    json!({ "done": tool })
                })
                .clone()
        };
        if n == self.crash_at.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        if self
            .reset_after_work
            .lock()
            .unwrap()
            .contains(&tool.as_str())
        {
            let reset: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
            return Box::pin(async move { Err(reset) });
        }
        Box::pin(async move { Ok(answer) })
    }
}

const TRIP: &[(&str, Option<&str>)] = &[
    ("reserve", Some("release")),
    ("charge", Some("refund")),
    ("issue", None),
];

fn toolbox(charge_class: &str) -> Toolbox {
    toolbox_with(&[("charge", charge_class, json!(["run", "tool"]))])
}

/// The trip's tools, keyed writes on `["run", "tool"]` but for the `(tool, class, key)` given.
fn toolbox_with(tools_given: &[(&str, &str, Value)]) -> Toolbox {
    let tool = |name: &str| {
        let (class, key) = tools_given
            .iter()
            .find(|(t, _, _)| *t == name)
            .map_or(("keyed_write", json!(["run", "tool"])), |(_, c, k)| {
                (*c, k.clone())
            });
        json!({
            "name": name, "class": class, "retry": ["layer"], "key": key,
            "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400 }
        })
    };
    let mut tools = vec![];
    for (step, undo) in TRIP {
        tools.push(tool(step));
        if let Some(undo) = undo {
            tools.push(tool(undo));
        }
    }
    Toolbox::from_json_str(
        &json!({
            "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
            "tools": tools
        })
        .to_string(),
    )
    .unwrap()
    .with_saga("trip", spec())
    .unwrap()
}

fn spec() -> SagaSpec {
    TRIP.iter()
        .fold(SagaSpec::new(), |s, (step, undo)| s.step(step, *undo))
}

/// The saga over `provider`, on the receipt store `stores` gives (a new process: new stacks,
/// the same store).
fn saga(toolbox: &Toolbox, stores: Stores, provider: &Provider) -> Saga {
    let tools = toolbox.build(stores).unwrap();
    let p = provider.clone();
    let body = tower::service_fn(move |call: Call| p.serve(call));
    tools
        .saga("trip", body, OkIsSuccess)
        .unwrap()
        .lease(Duration::from_secs(10))
}

fn effects(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_clean_run_does_each_step_once_and_a_second_run_repeats_nothing() {
    let provider = Provider::default();
    let trip = saga(&toolbox("keyed_write"), Stores::new(), &provider);
    let answers = trip.run("run-1", json!({ "seat": "12A" })).await.unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[1], json!({ "done": "charge" }));
    trip.run("run-1", json!({ "seat": "12A" })).await.unwrap();
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        3,
        "the second run sent nothing"
    );
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("issue", 1), ("reserve", 1)])
    );
    // The same run id with other arguments is refused, not run as another trip.
    let err = trip
        .run("run-1", json!({ "seat": "14C" }))
        .await
        .unwrap_err();
    assert!(matches!(err.halt(), Halt::Refused { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_step_that_fails_for_good_undoes_the_ones_before_in_reverse_once_each() {
    let provider = Provider::default();
    provider.fail_for_good.lock().unwrap().push("issue");
    let trip = saga(&toolbox("keyed_write"), Stores::new(), &provider);
    let err = trip.run("run-2", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::Compensated {
            step: "issue".into()
        }
    );
    assert_eq!(err.cause().unwrap().code(), ErrorCode::InvalidArgument);
    let model = err.to_tool_error();
    assert!(!model.retryable());
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("refund", 1), ("release", 1), ("reserve", 1)])
    );
    // Reverse order: refund before release.
    let by_key = provider.by_key.lock().unwrap().len();
    assert_eq!(by_key, 4);
    // Run again: the decision stands, nothing is sent.
    let calls = provider.calls.load(Ordering::SeqCst);
    let again = trip.run("run-2", json!({})).await.unwrap_err();
    assert!(matches!(again.halt(), Halt::Compensated { .. }));
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        calls,
        "the done steps and compensations answered from their receipts"
    );
    assert_eq!(provider.effects()["refund"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_compensation_that_fails_for_good_halts_with_what_is_left_to_undo() {
    let provider = Provider::default();
    provider
        .fail_for_good
        .lock()
        .unwrap()
        .extend(["issue", "refund"]);
    let trip = saga(&toolbox("keyed_write"), Stores::new(), &provider);
    let err = trip.run("run-3", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::CompensationFailed {
            step: "refund".into(),
            left: vec!["refund".into(), "release".into()]
        }
    );
    assert_eq!(err.to_tool_error().code(), ErrorCode::OutcomeUnknown);
    assert_eq!(
        provider.effects().get("release"),
        None,
        "nothing undone out of order"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_halts_until_an_operator_settles_it_then_the_saga_resumes() {
    let provider = Provider::default();
    // The charge is an unkeyed write at this provider: a reset after the work is an unknown
    // outcome, never retried.
    provider.reset_after_work.lock().unwrap().push("charge");
    let toolbox = toolbox("unkeyed_write");
    let tools = toolbox.build(Stores::new()).unwrap();
    let p = provider.clone();
    let body = tower::service_fn(move |call: Call| p.serve(call));
    let trip = tools.saga("trip", body, OkIsSuccess).unwrap();
    let err = trip.run("run-4", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::OutcomeUnknown {
            step: "charge".into()
        }
    );
    assert_eq!(provider.effects()["charge"], 1);

    // Still halted: nothing is sent again on its own.
    let err = trip.run("run-4", json!({})).await.unwrap_err();
    assert!(
        matches!(
            err.halt(),
            Halt::OutcomeUnknown { .. } | Halt::Paused { .. }
        ),
        "{err:?}"
    );
    assert_eq!(provider.effects()["charge"], 1);

    // The operator checks with the provider: it was charged.
    let store = tools.store("receipts").unwrap();
    let pending = store.pending(10).await.unwrap();
    let charge = pending
        .iter()
        .find(|p| p.key.contains(":charge:"))
        .expect("the charge is pending");
    store
        .resolve(
            &charge.key,
            Resolution::Done(br#"{"done":"charge"}"#.to_vec()),
        )
        .await
        .unwrap();
    provider.reset_after_work.lock().unwrap().clear();
    let answers = trip.run("run-4", json!({})).await.unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("issue", 1), ("reserve", 1)])
    );
}

/// Runs the saga until it completes or is compensated, as a supervisor would after a crash:
/// a paused or in-progress run is tried again a minute later.
async fn run_to_the_end(trip: &Saga, run: &str, clock: &ManualClock) -> Result<Vec<Value>, Halt> {
    for _ in 0..20 {
        // A crash may come in a resumed run too (the provider's crash point not reached before).
        let Ok(ran) =
            tokio::time::timeout(Duration::from_secs(600), trip.run(run, json!({}))).await
        else {
            clock.advance_ms(600_000);
            continue;
        };
        match ran {
            Ok(answers) => return Ok(answers),
            Err(e) if matches!(e.halt(), Halt::Paused { .. } | Halt::InProgress) => {
                tokio::time::sleep(Duration::from_secs(60)).await;
                clock.advance_ms(60_000);
            }
            Err(e) => return Err(e.halt().clone()),
        }
    }
    panic!("the saga never ended");
}

/// The first run in one process, crashed or not; `between` changes the world while it is down;
/// then a new process over the same store runs the saga to its end.
async fn crash_and_resume(
    provider: &Provider,
    run: &str,
    between: impl FnOnce(),
) -> Result<Vec<Value>, Halt> {
    let toolbox = toolbox("keyed_write");
    // The store's clock moves with tokio's paused one (leases pass as the test sleeps).
    let clock = ManualClock::new(0);
    let store = InMemoryStore::with_clock(clock.clone());
    let first = saga(
        &toolbox,
        Stores::new().with("receipts", store.clone()),
        provider,
    );
    let crashed = tokio::time::timeout(Duration::from_secs(600), first.run(run, json!({}))).await;
    drop(first);
    between();
    let resumed = saga(&toolbox, Stores::new().with("receipts", store), provider);
    match crashed {
        Ok(Ok(answers)) => Ok(answers),
        Ok(Err(e)) if !matches!(e.halt(), Halt::Paused { .. } | Halt::InProgress) => {
            Err(e.halt().clone())
        }
        _ => run_to_the_end(&resumed, run, &clock).await,
    }
}

/// How the last step behaves in a crash case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Issue {
    Succeeds,
    FailsForGood,
    /// Fails for good in the first process only (the provider fixed it before the resume): once
    /// the saga decided to compensate, the resume must compensate, not issue.
    FailsOnlyBeforeTheCrash,
}

#[tokio::test(start_paused = true)]
async fn a_crash_at_any_call_then_resumes_repeats_no_action() {
    // Crash at the k-th call to the provider (the effect done, the answer lost), for every k;
    // then a new process over the same store resumes until the saga ends.
    for issue in [
        Issue::Succeeds,
        Issue::FailsForGood,
        Issue::FailsOnlyBeforeTheCrash,
    ] {
        for crash_at in 1..=6 {
            let provider = Provider::default();
            provider.crash_at.store(crash_at, Ordering::SeqCst);
            if issue != Issue::Succeeds {
                provider.fail_for_good.lock().unwrap().push("issue");
            }
            let end = crash_and_resume(&provider, "run-5", || {
                if issue == Issue::FailsOnlyBeforeTheCrash {
                    provider.fail_for_good.lock().unwrap().clear();
                }
            })
            .await;
            let got = provider.effects();
            let case = format!("crash at call {crash_at}, {issue:?}");
            assert!(got.values().all(|n| *n == 1), "{case}: {got:?}");
            // The issue call is the third: from there on, the first process decided to undo.
            let compensated = match issue {
                Issue::Succeeds => false,
                Issue::FailsForGood => true,
                Issue::FailsOnlyBeforeTheCrash => crash_at >= 3,
            };
            if compensated {
                assert_eq!(
                    end,
                    Err(Halt::Compensated {
                        step: "issue".into()
                    }),
                    "{case}"
                );
                let undone = [("charge", 1), ("refund", 1), ("release", 1), ("reserve", 1)];
                assert_eq!(got, effects(&undone), "{case}");
            } else {
                assert!(end.is_ok(), "{case}: {end:?}");
                let done = [("charge", 1), ("issue", 1), ("reserve", 1)];
                assert_eq!(got, effects(&done), "{case}");
            }
        }
    }
}

#[test]
fn a_saga_step_without_receipts_or_outside_the_toolbox_is_refused() {
    let toolbox = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "reserve", "class": "keyed_write", "retry": ["layer"], "key": ["run"] }]}"#,
    )
    .unwrap();
    let body = tower::service_fn(|_: Call| async { Ok::<Value, BoxError>(json!({})) });
    // A step without receipts is refused when the saga is built.
    let with_saga = toolbox
        .clone()
        .with_saga("s", SagaSpec::new().step("reserve", None))
        .unwrap();
    let tools = with_saga.build(Stores::new()).unwrap();
    let err = tools.saga("s", body, OkIsSuccess).unwrap_err();
    assert!(err.reason().contains("receipts"), "{err}");
    // A saga the toolbox does not declare, a step outside it, a saga without steps.
    assert_eq!(
        tools.saga("t", body, OkIsSuccess).unwrap_err().field(),
        "sagas"
    );
    let err = toolbox
        .clone()
        .with_saga("s", SagaSpec::new().step("nope", None))
        .unwrap_err();
    assert!(err.reason().contains("not a tool"), "{err}");
    let err = toolbox.with_saga("s", SagaSpec::new()).unwrap_err();
    assert_eq!(err.field(), "sagas");
}

/// The TOML of docs/sagas.md, as a tool file declares it.
#[cfg(feature = "audit")]
#[test]
fn the_saga_of_the_guide_reads_from_a_tool_file() {
    let guide = include_str!("../docs/sagas.md");
    let start = guide.find("```toml\n").unwrap() + "```toml\n".len();
    let sagas = &guide[start..start + guide[start..].find("```").unwrap()];
    let mut file = String::from("[stores.receipts]\nkind = \"memory\"\nretention_secs = 604800\n");
    for (step, undo) in TRIP {
        for tool in std::iter::once(step).chain(undo.iter()) {
            file += &format!(
                "[[tools]]\nname = \"{tool}\"\nclass = \"keyed_write\"\nretry = [\"layer\"]\nkey = [\"run\", \"tool\"]\nunknown_outcome = \"escalate\"\nreceipt = {{ store = \"receipts\", provider_key_window_secs = 86400 }}\n"
            );
        }
    }
    file += sagas;
    let toolbox = Toolbox::from_toml_str(&file).unwrap();
    assert_eq!(toolbox.sagas()["trip"], spec());
    // In memory, the saga's decision would not survive a crash: the audit says so.
    let codes: Vec<_> = toolbox.audit().findings.iter().map(|f| f.code).collect();
    assert_eq!(codes, ["saga-decision-in-memory"]);
    let durable = file.replace("kind = \"memory\"", "kind = \"sqlite\"");
    assert!(Toolbox::from_toml_str(&durable)
        .unwrap()
        .audit()
        .findings
        .is_empty());
}

/// One seeded episode: refusals before any work at some calls, maybe a crash at one call, maybe
/// a last step that fails for good; the run resumed in a new process until it ends.
async fn episode(refused: Vec<u32>, crash_at: Option<u32>, issue_fails: bool) {
    let provider = Provider::default();
    *provider.refused_at.lock().unwrap() = refused.clone();
    provider
        .crash_at
        .store(crash_at.unwrap_or(0), Ordering::SeqCst);
    if issue_fails {
        provider.fail_for_good.lock().unwrap().push("issue");
    }
    let end = crash_and_resume(&provider, "ep", || {}).await;
    let got = provider.effects();
    let case = format!("refused {refused:?}, crash {crash_at:?}, issue fails {issue_fails}");
    assert!(
        got.values().all(|n| *n == 1),
        "{case}: an action twice: {got:?}"
    );
    match end {
        Ok(_) => assert_eq!(
            got,
            effects(&[("charge", 1), ("issue", 1), ("reserve", 1)]),
            "{case}"
        ),
        Err(Halt::Compensated { step }) => {
            // Every step done before the failed one is undone; nothing after it was done.
            assert!(!got.contains_key("issue"), "{case}: {got:?}");
            let undone = |done: &str, undo: &str| got.get(done) == got.get(undo);
            assert!(
                undone("reserve", "release") && undone("charge", "refund"),
                "{case}: {got:?} ({step})"
            );
        }
        Err(other) => panic!("{case}: ended {other:?}"),
    }
}

/// 200 episodes by default; `SAGA_EPISODES=10000` for the long run.
fn episodes() -> u32 {
    std::env::var("SAGA_EPISODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(episodes()))]

    /// Seeded episodes with crashes and failures: no action is ever done twice, and every run
    /// ends complete or undone.
    #[test]
    fn seeded_episodes_with_crashes_do_no_action_twice(
        refused in prop::collection::vec(1u32..12, 0..4),
        crash_at in prop::option::of(1u32..10),
        issue_fails in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(episode(refused, crash_at, issue_fails));
    }
}

#[tokio::test(start_paused = true)]
async fn an_outage_of_a_step_pauses_the_saga_and_undoes_nothing() {
    let provider = Provider::default();
    // The issue's provider refuses connections (nothing done) for its 3 attempts.
    *provider.refused_at.lock().unwrap() = vec![3, 4, 5];
    let trip = saga(&toolbox("keyed_write"), Stores::new(), &provider);
    let err = trip.run("run-6", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::Paused {
            step: "issue".into()
        }
    );
    assert!(err.to_tool_error().retryable());
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("reserve", 1)])
    );
    // Back up: the saga completes, nothing repeated.
    trip.run("run-6", json!({})).await.unwrap();
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("issue", 1), ("reserve", 1)])
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_step_that_may_have_landed_pauses_and_is_sent_again_under_its_key() {
    // The charge is taken, then a proxy loses every answer (a reset after the work).
    let provider = Provider::default();
    provider.reset_after_work.lock().unwrap().push("charge");
    let clock = ManualClock::new(0);
    let store = InMemoryStore::with_clock(clock.clone());
    let trip = saga(
        &toolbox("keyed_write"),
        Stores::new().with("receipts", store),
        &provider,
    );
    let err = trip.run("run-7", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::Paused {
            step: "charge".into()
        },
        "not undone: it may have landed"
    );
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("reserve", 1)])
    );
    // The proxy recovers; once the intent's lease has passed, the charge goes again under its
    // key (the provider answers what it did) and the trip completes.
    provider.reset_after_work.lock().unwrap().clear();
    clock.advance_ms(120_000);
    trip.run("run-7", json!({})).await.unwrap();
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("issue", 1), ("reserve", 1)])
    );
}

#[tokio::test(start_paused = true)]
async fn an_undo_of_unknown_outcome_halts_for_the_operator_and_is_not_left_to_undo_twice() {
    // The refund goes to a provider without keys and is reset after it was made.
    let provider = Provider::default();
    provider.fail_for_good.lock().unwrap().push("issue");
    provider.reset_after_work.lock().unwrap().push("refund");
    let tb = toolbox_with(&[("refund", "unkeyed_write", json!(["run", "tool"]))]);
    let tools = tb.build(Stores::new()).unwrap();
    let p = provider.clone();
    let trip = tools
        .saga(
            "trip",
            tower::service_fn(move |call: Call| p.serve(call)),
            OkIsSuccess,
        )
        .unwrap();
    let err = trip.run("run-8", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::OutcomeUnknown {
            step: "refund".into()
        }
    );
    assert_eq!(provider.effects()["refund"], 1);
    assert_eq!(provider.effects().get("release"), None);
    // The operator finds the refund made and settles it; the undo goes on with the release.
    let store = tools.store("receipts").unwrap();
    let refund = store
        .pending(10)
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.key.contains(":refund:"))
        .unwrap();
    store
        .resolve(
            &refund.key,
            Resolution::Done(br#"{"done":"refund"}"#.to_vec()),
        )
        .await
        .unwrap();
    let err = trip.run("run-8", json!({})).await.unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::Compensated {
            step: "issue".into()
        }
    );
    assert_eq!(
        provider.effects(),
        effects(&[("charge", 1), ("refund", 1), ("release", 1), ("reserve", 1)])
    );
}

#[tokio::test(start_paused = true)]
async fn a_compensation_keyed_on_an_argument_field_finds_it() {
    let provider = Provider::default();
    provider.fail_for_good.lock().unwrap().push("issue");
    let seat_keyed = json!(["run", "tool", "id:seat"]);
    let tb = toolbox_with(&[("release", "keyed_write", seat_keyed)]);
    let trip = saga(&tb, Stores::new(), &provider);
    let err = trip
        .run("run-9", json!({ "seat": "12A" }))
        .await
        .unwrap_err();
    assert_eq!(
        err.halt(),
        &Halt::Compensated {
            step: "issue".into()
        }
    );
    assert_eq!(provider.effects()["release"], 1);
    // What the model sees is the failed step's own error, now and on a run again.
    assert_eq!(err.to_tool_error().code(), ErrorCode::InvalidArgument);
    let again = trip
        .run("run-9", json!({ "seat": "12A" }))
        .await
        .unwrap_err();
    assert_eq!(again.to_tool_error().code(), ErrorCode::InvalidArgument);
}
