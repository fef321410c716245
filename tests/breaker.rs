//! The circuit breaker on a paused clock: trip rules, what counts, half-open, growth, rejections.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::breaker::{
    Breaker, BreakerConfig, CircuitBreaker, CircuitBreakerLayer, State, Transition, Window,
};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::retry::RetryLayer;
use support::{call, classifier, Dependency, Outcome};
use tower::{Layer, ServiceBuilder};

type Svc =
    CircuitBreaker<Dependency, fn(&Result<u32, BoxError>) -> stormguard::classify::Classification>;

fn guarded(dep: &Dependency, breaker: &Breaker) -> Svc {
    CircuitBreakerLayer::new(breaker.clone())
        .classifier(classifier as fn(&_) -> _)
        .layer(dep.clone())
}

async fn run(svc: &mut Svc, n: usize) -> Vec<Result<u32, BoxError>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(call(svc, 1u32).await);
    }
    out
}

/// The defaults, with the classic time-only open state of 5 s (no turned-away-calls rule, no
/// share of the outage): the tests of the other rules read more simply on one clock. The probe
/// rules have tests of their own.
fn config() -> stormguard::breaker::BreakerConfigBuilder {
    BreakerConfig::builder()
        .probe_after(0)
        .open_share(0.0)
        .open_duration(Duration::from_secs(5), Duration::from_secs(60))
}

fn rejection(err: BoxError) -> ToolError {
    *err.downcast::<ToolError>().expect("a ToolError")
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_trip_it_and_a_success_resets_the_count() {
    let breaker = Breaker::new(
        "dep",
        config()
            .consecutive_failures(3)
            .no_failure_rate()
            .build()
            .unwrap(),
    );
    let transient = Outcome::Fail(FailureClass::Transient);
    let dep = Dependency::script(
        [transient, transient, Outcome::Ok, transient, transient],
        transient,
    );
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 5).await;
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the success in between reset the count"
    );
    run(&mut svc, 1).await;
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.opens(), 1);
    assert_eq!(dep.calls(), 6);
    // Open: rejected without touching the dependency.
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(dep.calls(), 6);
}

#[tokio::test(start_paused = true)]
async fn the_count_window_is_a_ring_of_the_last_n_outcomes() {
    // 30 % of the last 20, at least 10 calls: after 1,000 successes, 6 failures trip it.
    let breaker = Breaker::new(
        "dep",
        config()
            .no_consecutive_failures()
            .failure_rate(0.3, Window::Count(20), 10)
            .build()
            .unwrap(),
    );
    let mut outcomes = vec![Outcome::Ok; 1000];
    outcomes.extend([Outcome::Fail(FailureClass::Ambiguous); 10]);
    let dep = Dependency::script(outcomes, Outcome::Ok);
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 1005).await;
    assert_eq!(breaker.state(), State::Closed, "5 of the last 20 is 25 %");
    run(&mut svc, 1).await;
    assert_eq!(breaker.state(), State::Open, "6 of the last 20 is 30 %");
    assert!(
        breaker
            .reason()
            .contains("6 of the last 20 calls to dep failed"),
        "{}",
        breaker.reason()
    );
}

#[tokio::test(start_paused = true)]
async fn the_minimum_number_of_calls_holds_a_new_window() {
    let breaker = Breaker::new(
        "dep",
        config()
            .no_consecutive_failures()
            .failure_rate(0.5, Window::Count(20), 10)
            .build()
            .unwrap(),
    );
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 9).await;
    assert_eq!(
        breaker.state(),
        State::Closed,
        "9 of 9 failed, but fewer than 10 calls"
    );
    run(&mut svc, 1).await;
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn the_time_window_forgets_old_failures() {
    let breaker = Breaker::new(
        "dep",
        config()
            .no_consecutive_failures()
            .failure_rate(0.5, Window::Time(Duration::from_secs(10)), 4)
            .build()
            .unwrap(),
    );
    let fail = Outcome::Fail(FailureClass::Transient);
    let dep = Dependency::script(
        [fail, fail, fail, Outcome::Ok, Outcome::Ok, fail],
        Outcome::Ok,
    );
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 3).await; // 3 failures at t = 0
    tokio::time::advance(Duration::from_secs(11)).await;
    run(&mut svc, 3).await; // 2 successes and 1 failure at t = 11: 1 of 3, too few calls
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_successes_count_as_failures() {
    let breaker = Breaker::new(
        "dep",
        config()
            .consecutive_failures(2)
            .slow_call(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let slow = tower::service_fn(|_: u32| async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok::<u32, BoxError>(1)
    });
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(slow);
    call(&mut svc, 1).await.unwrap();
    call(&mut svc, 1).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
}

/// Fails its first call; then, each time, is not ready for `wait` before answering at once.
#[derive(Clone)]
struct SlowToBeReady {
    wait: Duration,
    calls: Arc<Mutex<u32>>,
    until: Option<tokio::time::Instant>,
}

impl tower::Service<u32> for SlowToBeReady {
    type Response = u32;
    type Error = BoxError;
    type Future = std::future::Ready<Result<u32, BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        let until = *self
            .until
            .get_or_insert_with(|| tokio::time::Instant::now() + self.wait);
        if tokio::time::Instant::now() >= until {
            return std::task::Poll::Ready(Ok(()));
        }
        let waker = cx.waker().clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            waker.wake();
        });
        std::task::Poll::Pending
    }

    fn call(&mut self, _: u32) -> Self::Future {
        self.until = None;
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        std::future::ready(if *calls == 1 {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
        } else {
            Ok(1)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_trial_waiting_for_readiness_is_not_a_slow_call() {
    let breaker = Breaker::new(
        "pool",
        config()
            .consecutive_failures(1)
            .slow_call(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let dep = SlowToBeReady {
        wait: Duration::from_millis(500),
        calls: Arc::default(),
        until: None,
    };
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
    assert!(call(&mut svc, 1).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(6)).await;
    // The trial is admitted in poll_ready, waits 500 ms there for the pool, then answers at
    // once: the dependency was fast, so the breaker closes.
    call(&mut svc, 1).await.unwrap();
    assert_eq!(breaker.state(), State::Closed, "{}", breaker.reason());
}

#[tokio::test(start_paused = true)]
async fn empty_answers_and_caller_errors_never_trip_it() {
    let breaker = Breaker::new("lookup", BreakerConfig::default());
    let mut script = Vec::new();
    for _ in 0..250 {
        script.extend([
            Outcome::Empty,
            Outcome::Fail(FailureClass::ModelRecoverable),
            Outcome::Fail(FailureClass::Permanent),
            Outcome::Fail(FailureClass::Policy),
        ]);
    }
    let dep = Dependency::script(script, Outcome::Ok);
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 1000).await;
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.opens(), 0);
}

#[tokio::test(start_paused = true)]
async fn ignored_outcomes_do_not_dilute_the_failure_rate() {
    // Half the answers are "no such record", 60 % of the rest fail: it must open.
    let breaker = Breaker::new(
        "lookup",
        config()
            .no_consecutive_failures()
            .failure_rate(0.5, Window::Count(20), 10)
            .build()
            .unwrap(),
    );
    let fail = Outcome::Fail(FailureClass::Transient);
    let pattern = [
        Outcome::Empty,
        fail,
        Outcome::Empty,
        fail,
        Outcome::Empty,
        Outcome::Ok,
        Outcome::Empty,
        fail,
        Outcome::Empty,
        Outcome::Ok,
    ];
    let dep = Dependency::script(pattern.into_iter().cycle().take(100), Outcome::Ok);
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 40).await;
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_its_trials_then_closes_on_success() {
    let breaker = Breaker::new(
        "dep",
        config()
            .consecutive_failures(1)
            .open_duration(Duration::from_secs(5), Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 1).await;
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_millis(4999)).await;
    assert!(call(&mut svc, 1u32).await.is_err());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(call(&mut svc, 1u32).await.unwrap(), 2);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_probes_after_enough_turned_away_calls_or_its_longest_open_time() {
    let log: Arc<Mutex<Vec<Transition>>> = Arc::default();
    let sink = log.clone();
    let breaker = Breaker::new(
        "dep",
        config()
            .consecutive_failures(1)
            .open_duration(Duration::from_secs(1), Duration::from_secs(12))
            .probe_after(3)
            .on_transition(move |t| sink.lock().unwrap().push(t.clone()))
            .build()
            .unwrap(),
    );
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 1).await;
    // Busy traffic: the shortest open time passes, 3 calls are turned away, the 4th probes.
    tokio::time::advance(Duration::from_secs(1)).await;
    for _ in 0..3 {
        assert_eq!(
            rejection(call(&mut svc, 1u32).await.unwrap_err()).code(),
            ErrorCode::CircuitOpen
        );
    }
    run(&mut svc, 1).await; // the probe fails: open again, for no longer than before
    assert_eq!(dep.calls(), 2);
    // Quiet traffic: one call, then nothing for the longest open time; the next call probes.
    // It is told the time a probe is sure to go: the longest open time, not a doubled one.
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(12)));
    tokio::time::advance(Duration::from_secs(12)).await;
    run(&mut svc, 1).await;
    assert_eq!(dep.calls(), 3);
    assert_eq!(breaker.opens(), 3);
    let log = log.lock().unwrap();
    assert_eq!((log[0].from, log[0].to), (State::Closed, State::Open));
    assert_eq!((log[1].from, log[1].to), (State::Open, State::HalfOpen));
    assert_eq!((log[2].from, log[2].to), (State::HalfOpen, State::Open));
    assert!(
        log[0].reason.contains("1 calls in a row to dep failed"),
        "{}",
        log[0].reason
    );
    assert!(
        log[0].reason.contains("3 turned-away calls"),
        "{}",
        log[0].reason
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejection_says_what_to_do_in_json() {
    let breaker = Breaker::new(
        "billing-api",
        config().consecutive_failures(2).build().unwrap(),
    );
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 2).await;
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    let json = err.to_json();
    assert_eq!(json["code"], "circuit_open");
    assert_eq!(json["retryable"], true);
    assert_eq!(json["retry_after_ms"], 5000);
    let hint = json["hint"].as_str().unwrap();
    assert!(
        hint.contains("2 calls in a row to billing-api failed"),
        "{hint}"
    );
    assert!(hint.contains("retry after 5000 ms"), "{hint}");
}

#[tokio::test(start_paused = true)]
async fn retry_does_not_retry_a_rejection_nor_spend_budget_on_it() {
    let breaker = Breaker::new("dep", config().consecutive_failures(3).build().unwrap());
    let budget = RetryBudget::builder()
        .floor(100, Duration::from_secs(60))
        .build()
        .unwrap();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(CircuitBreakerLayer::new(breaker.clone()))
        .service(dep.clone());
    // 3 attempts (2 retries), the third failure opens the breaker.
    let first = call(&mut svc, 1u32).await.unwrap_err();
    assert_eq!(first.code(), ErrorCode::Unavailable);
    assert_eq!(breaker.state(), State::Open);
    // Now every call is rejected once, not retried: no dependency call, no budget spent.
    for _ in 0..10 {
        let err = call(&mut svc, 1u32).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::CircuitOpen);
        assert!(err.retry_after().is_some());
    }
    assert_eq!(dep.calls(), 3);
    // Only the first operation's 2 retries came out of the floor (100 per minute).
    for _ in 0..98 {
        assert!(budget.try_withdraw(Duration::ZERO).is_ok());
    }
    assert!(budget.try_withdraw(Duration::ZERO).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_trial_gives_its_permit_back() {
    let breaker = Breaker::new("dep", config().consecutive_failures(1).build().unwrap());
    let hang = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = hang.clone();
    let dep = tower::service_fn(move |n: u32| {
        let hang = flag.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                return Err::<u32, BoxError>(support::error_for(FailureClass::Transient));
            }
            if hang {
                std::future::pending::<()>().await;
            }
            Ok(n)
        }
    });
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
    let _ = call(&mut svc, 0).await;
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(5)).await;

    // The trial hangs; the caller gives up on it (a timeout drops the future).
    let trial = tokio::time::timeout(Duration::from_secs(1), call(&mut svc, 1)).await;
    assert!(trial.is_err());
    assert_eq!(breaker.state(), State::HalfOpen);
    // Its permit came back: the next call is the trial, and closes the breaker.
    hang.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(call(&mut svc, 2).await.unwrap(), 2);
    assert_eq!(breaker.state(), State::Closed);
}

#[test]
fn invalid_configs_are_rejected() {
    let cases = [
        (
            config().consecutive_failures(0).build(),
            "consecutive_failures",
        ),
        (
            config().failure_rate(0.0, Window::Count(10), 5).build(),
            "failure_rate",
        ),
        (
            config().failure_rate(1.5, Window::Count(10), 5).build(),
            "failure_rate",
        ),
        (
            config().failure_rate(0.5, Window::Count(0), 5).build(),
            "window",
        ),
        (
            config()
                .failure_rate(0.5, Window::Time(Duration::from_millis(10)), 5)
                .build(),
            "window",
        ),
        (
            config().failure_rate(0.5, Window::Count(10), 0).build(),
            "min_calls",
        ),
        (
            config().no_consecutive_failures().no_failure_rate().build(),
            "rules",
        ),
        (
            config()
                .open_duration(Duration::ZERO, Duration::from_secs(1))
                .build(),
            "open_duration",
        ),
        (
            config()
                .open_duration(Duration::from_secs(9), Duration::from_secs(1))
                .build(),
            "open_duration",
        ),
        (config().trials(0).build(), "trials"),
        (config().probe_after(1_000_001).build(), "probe_after"),
        (
            config().trial_timeout(Duration::ZERO).build(),
            "trial_timeout",
        ),
        (
            config().failure_rate(0.5, Window::Count(10), 20).build(),
            "min_calls",
        ),
        (
            config().failure_rate(0.01, Window::Count(50), 20).build(),
            "failure_rate",
        ),
        (config().slow_call(Duration::ZERO).build(), "slow_call"),
    ];
    for (result, field) in cases {
        assert_eq!(result.unwrap_err().field(), field);
    }
}

#[tokio::test(start_paused = true)]
async fn the_open_time_never_grows() {
    let breaker = Breaker::new("dep", config().consecutive_failures(1).build().unwrap());
    let fail = Outcome::Fail(FailureClass::Transient);
    // fail (open 5 s), trial fails (open 5 s), trial succeeds (closed), fail: open 5 s again.
    let dep = Dependency::script([fail, fail, Outcome::Ok, fail], Outcome::Ok);
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    run(&mut svc, 1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    run(&mut svc, 1).await;
    assert_eq!(breaker.state(), State::Closed);
    run(&mut svc, 1).await;
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));
}

#[test]
fn half_open_admits_exactly_its_trials_under_concurrent_callers() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::sync::Notify;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let test = async {
        let trials = 3;
        let breaker = Breaker::new(
            "dep",
            config()
                .consecutive_failures(1)
                .open_duration(Duration::from_millis(20), Duration::from_millis(20))
                .trials(trials)
                .build()
                .unwrap(),
        );
        let reached = Arc::new(AtomicU32::new(0));
        let release = Arc::new(Notify::new());
        let (r, n) = (reached.clone(), release.clone());
        let dep = tower::service_fn(move |fail: bool| {
            let (r, n) = (r.clone(), n.clone());
            async move {
                if fail {
                    return Err::<u32, std::io::Error>(
                        std::io::ErrorKind::ConnectionRefused.into(),
                    );
                }
                r.fetch_add(1, Ordering::SeqCst);
                n.notified().await;
                Ok(1)
            }
        });
        let svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
        let _ = call(&mut svc.clone(), true).await;
        assert_eq!(breaker.state(), State::Open);
        tokio::time::sleep(Duration::from_millis(40)).await;

        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let mut svc = svc.clone();
            callers.spawn(async move { call(&mut svc, false).await.is_ok() });
        }
        // Wait until every caller has been admitted or rejected.
        let mut rejected = 0;
        while rejected + reached.load(Ordering::SeqCst) < 64 {
            if let Some(Ok(false)) =
                tokio::time::timeout(Duration::from_millis(5), callers.join_next())
                    .await
                    .ok()
                    .flatten()
            {
                rejected += 1;
            }
        }
        assert_eq!(reached.load(Ordering::SeqCst), trials);
        assert_eq!(rejected, 64 - trials);
        assert_eq!(breaker.state(), State::HalfOpen);
        release.notify_waiters();
        while let Some(done) = callers.join_next().await {
            assert!(done.unwrap());
        }
        assert_eq!(breaker.state(), State::Closed);
    };
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), test)
            .await
            .expect("the test finishes")
    });
}

mod model {
    //! The breaker against a reference model of its state machine, on random call sequences.
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug)]
    enum Step {
        Call(bool),
        Wait(u64),
    }

    #[derive(Debug, PartialEq, Clone, Copy)]
    enum Model {
        Closed {
            in_a_row: u32,
        },
        Open {
            until: u64,
            max: u64,
            rejected: u32,
            since: u64,
        },
        HalfOpen {
            successes: u32,
            since: u64,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => any::<bool>().prop_map(Step::Call),
            1 => (0u64..12_000).prop_map(Step::Wait),
        ]
    }

    proptest! {
        #[test]
        fn matches_the_model(steps in proptest::collection::vec(step(), 1..80), trials in 1u32..4, probe_after in 0u32..4, share in prop_oneof![Just(0.0), Just(0.2), Just(0.5)]) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let (threshold, open_ms, max_ms) = (3u32, 1_000u64, 4_000u64);
                let breaker = Breaker::new("dep", config()
                    .consecutive_failures(threshold)
                    .no_failure_rate()
                    .open_duration(Duration::from_millis(open_ms), Duration::from_millis(max_ms))
                    .probe_after(probe_after)
                    .open_share(share)
                    .trials(trials)
                    .build()
                    .unwrap());
                let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(tower::service_fn(
                    |ok: bool| async move {
                        if ok { Ok::<u32, BoxError>(1) } else { Err(support::error_for(FailureClass::Transient)) }
                    },
                ));
                let start = tokio::time::Instant::now();
                let mut model = Model::Closed { in_a_row: 0 };
                for s in steps {
                    match s {
                        Step::Wait(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                        Step::Call(ok) => {
                            let now = start.elapsed().as_millis() as u64;
                            if let Model::Open { until, max, rejected, since } = model {
                                if now >= max || (now >= until && rejected >= probe_after) {
                                    model = Model::HalfOpen { successes: 0, since };
                                }
                            }
                            let result = call(&mut svc, ok).await;
                            // Open for the longest time, or a share of the outage so far.
                            let opened = |since: u64| {
                                let longest = if share == 0.0 {
                                    max_ms
                                } else {
                                    (((now - since) as f64 * share) as u64).clamp(open_ms, max_ms)
                                };
                                Model::Open { until: now + open_ms, max: now + longest, rejected: 0, since }
                            };
                            model = match model {
                                Model::Open { until, max, rejected, since } => {
                                    prop_assert!(result.is_err());
                                    let err = result.unwrap_err().downcast::<ToolError>().unwrap();
                                    prop_assert_eq!(err.code(), ErrorCode::CircuitOpen);
                                    Model::Open { until, max, rejected: rejected + 1, since }
                                }
                                Model::Closed { in_a_row } if !ok && in_a_row + 1 >= threshold => opened(now),
                                Model::Closed { in_a_row } if !ok => Model::Closed { in_a_row: in_a_row + 1 },
                                Model::Closed { .. } => Model::Closed { in_a_row: 0 },
                                Model::HalfOpen { since, .. } if !ok => opened(since),
                                Model::HalfOpen { successes, .. } if successes + 1 >= trials => {
                                    Model::Closed { in_a_row: 0 }
                                }
                                Model::HalfOpen { successes, since } => Model::HalfOpen { successes: successes + 1, since },
                            };
                            let expected = match model {
                                Model::Closed { .. } => State::Closed,
                                Model::Open { .. } => State::Open,
                                Model::HalfOpen { .. } => State::HalfOpen,
                            };
                            prop_assert_eq!(breaker.state(), expected, "after {:?} at {} ms", s, now);
                        }
                    }
                }
                Ok(())
            })?;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn outcomes_from_an_earlier_generation_do_not_count() {
    use tokio::sync::Notify;
    let breaker = Breaker::new("dep", config().consecutive_failures(2).build().unwrap());
    let release = Arc::new(Notify::new());
    let r = release.clone();
    // 0: a slow call that fails once released; 1: a fast failure; 2: a success.
    let dep = tower::service_fn(move |kind: u8| {
        let r = r.clone();
        async move {
            match kind {
                0 => {
                    r.notified().await;
                    Err::<u32, std::io::Error>(std::io::ErrorKind::ConnectionRefused.into())
                }
                1 => Err(std::io::ErrorKind::ConnectionRefused.into()),
                _ => Ok(1),
            }
        }
    });
    let svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
    // Two slow calls admitted while closed, in the first generation.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut s = svc.clone();
        slow.push(tokio::spawn(async move { call(&mut s, 0).await }));
    }
    tokio::task::yield_now().await;
    let mut s = svc.clone();
    let _ = call(&mut s, 1).await;
    let _ = call(&mut s, 1).await;
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(5)).await;
    call(&mut s, 2).await.unwrap(); // the trial succeeds: closed, a new generation
    assert_eq!(breaker.state(), State::Closed);
    // The old calls now fail; they were admitted before the trip and must not count.
    release.notify_waiters();
    for h in slow {
        assert!(h.await.unwrap().is_err());
    }
    // So one real failure is one failure in a row, not three.
    let _ = call(&mut s, 1).await;
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.opens(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hung_trial_counts_as_failed_after_the_trial_timeout() {
    let breaker = Breaker::new(
        "dep",
        config()
            .consecutive_failures(1)
            .trial_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    // 0 fails, 1 hangs for ever (nothing below the breaker times it out), 2 succeeds.
    let dep = tower::service_fn(|n: u32| async move {
        match n {
            0 => Err::<u32, BoxError>(support::error_for(FailureClass::Transient)),
            1 => std::future::pending().await,
            _ => Ok(n),
        }
    });
    let svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
    let _ = call(&mut svc.clone(), 0).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    // The trial is admitted and stays in flight (its future is kept, never finished).
    let mut trial_svc = svc.clone();
    let hung = call(&mut trial_svc, 1);
    tokio::pin!(hung);
    assert!(tokio::time::timeout(Duration::ZERO, &mut hung)
        .await
        .is_err());
    assert_eq!(breaker.state(), State::HalfOpen);
    // Within the trial timeout the permit is taken: calls are turned away.
    tokio::time::advance(Duration::from_millis(500)).await;
    let err = rejection(call(&mut svc.clone(), 2).await.unwrap_err());
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    // After it, the hung trial counts as failed: open again, and the next probe closes it.
    tokio::time::advance(Duration::from_millis(500)).await;
    let err = rejection(call(&mut svc.clone(), 2).await.unwrap_err());
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(breaker.state(), State::Open);
    assert!(
        breaker.reason().contains("did not answer within 1000 ms"),
        "{}",
        breaker.reason()
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(call(&mut svc.clone(), 2).await.unwrap(), 2);
    assert_eq!(breaker.state(), State::Closed);
}

/// Found by an outside review: a rule whose threshold times minimum is exactly one failure
/// would trip on one failure, and a rejection's `retry_after` must be a time after which a
/// call may really go.
#[test]
fn a_rate_rule_that_one_failure_fires_is_refused() {
    let one = config()
        .no_consecutive_failures()
        .failure_rate(0.05, Window::Count(50), 20)
        .build();
    assert_eq!(one.unwrap_err().field(), "failure_rate");
    // An explicit single-failure rule is allowed: it says what it means.
    assert!(config().consecutive_failures(1).build().is_ok());
}

#[tokio::test(start_paused = true)]
async fn waiting_out_a_rejections_retry_after_lets_a_probe_through() {
    let breaker = Breaker::new("dep", BreakerConfig::default());
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = guarded(&dep, &breaker);
    run(&mut svc, 20).await;
    assert_eq!(breaker.state(), State::Open);
    // Ten seconds into the outage a quiet caller's call is a probe (the breaker opened for the
    // shortest time: the outage was young); it fails, and the breaker opens for a fifth of the
    // outage so far.
    tokio::time::advance(Duration::from_secs(10)).await;
    run(&mut svc, 1).await;
    assert_eq!(dep.calls(), 21);
    assert_eq!(breaker.state(), State::Open);
    // A quiet caller is told the time after which a probe is sure to go (nobody else is turning
    // calls away), and waiting it out lets its call through.
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    let wait = err.retry_after().unwrap();
    assert_eq!(wait, Duration::from_secs(2));
    assert!(err.hint().contains("retry after 2000 ms"), "{}", err.hint());
    tokio::time::advance(wait).await;
    let calls = dep.calls();
    let _ = call(&mut svc, 1u32).await;
    assert_eq!(
        dep.calls(),
        calls + 1,
        "the call after the wait was the probe"
    );
    // An hour in, the longest open time (30 s) bounds the wait.
    tokio::time::advance(Duration::from_secs(3600)).await;
    run(&mut svc, 1).await;
    let err = rejection(call(&mut svc, 1u32).await.unwrap_err());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn a_keyed_breaker_opens_per_key_and_a_retry_above_does_not_retry_its_rejection() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use stormguard::breaker::{BreakerRegistry, KeyedBreakerLayer};
    use tower::{Service, ServiceExt};
    let registry = BreakerRegistry::new(
        config()
            .consecutive_failures(3)
            .no_failure_rate()
            .build()
            .unwrap(),
    );
    let calls = Arc::new(Mutex::new(
        std::collections::HashMap::<&'static str, u32>::new(),
    ));
    let seen = calls.clone();
    // "gpt" is down; "claude" answers.
    let api = tower::service_fn(move |model: &'static str| {
        *seen.lock().unwrap().entry(model).or_default() += 1;
        async move {
            if model == "gpt" {
                Err::<&str, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            } else {
                Ok(model)
            }
        }
    });
    let attempts = Arc::new(AtomicU32::new(0));
    let counted = attempts.clone();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .map_request(move |m: &'static str| {
            counted.fetch_add(1, Ordering::SeqCst);
            m
        })
        .layer(KeyedBreakerLayer::new(
            registry.clone(),
            |m: &&'static str| *m,
        ))
        .service(api);
    // Three failures of "gpt" (one operation's three attempts) open its breaker.
    let err = svc.ready().await.unwrap().call("gpt").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert_eq!(registry.get("gpt").state(), State::Open);
    // The next "gpt" call is rejected once, not retried, and reaches nothing.
    attempts.store(0, Ordering::SeqCst);
    let err = svc.ready().await.unwrap().call("gpt").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(calls.lock().unwrap()["gpt"], 3);
    // "claude" has a breaker of its own.
    assert_eq!(
        svc.ready().await.unwrap().call("claude").await.unwrap(),
        "claude"
    );
    assert_eq!(registry.get("claude").state(), State::Closed);
    assert_eq!(registry.names().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_per_tenant_keeps_its_registry_bounded_and_its_open_breakers() {
    use stormguard::breaker::{BreakerRegistry, KeyedBreakerLayer, State};
    use tower::{Service, ServiceExt};
    let config = BreakerConfig::builder()
        .consecutive_failures(2)
        .no_failure_rate()
        .build()
        .unwrap();
    let registry = BreakerRegistry::with_capacity(config, 100).unwrap();
    let api = tower::service_fn(|tenant: String| async move {
        if tenant == "down" {
            Err::<String, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        } else {
            Ok(tenant)
        }
    });
    let mut svc = KeyedBreakerLayer::new(registry.clone(), |t: &String| t.clone()).layer(api);
    for _ in 0..2 {
        let _ = svc.ready().await.unwrap().call("down".to_string()).await;
    }
    assert_eq!(registry.get("down").state(), State::Open);
    // Ten thousand one-off tenants: the registry holds about its capacity, not ten thousand.
    for i in 0..10_000 {
        svc.ready()
            .await
            .unwrap()
            .call(format!("tenant-{i}"))
            .await
            .unwrap();
    }
    assert!(registry.names().len() <= 100, "{}", registry.names().len());
    // The open breaker was kept: the tenant whose dependency is down still fails fast.
    assert_eq!(registry.get("down").state(), State::Open);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call("down".to_string())
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<ToolError>().unwrap().code(),
        ErrorCode::CircuitOpen
    );
}
