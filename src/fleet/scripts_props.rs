//! The budget script against a ledger kept outside it: random syncs from three workers (each
//! spending part of its lease locally, giving part back, depositing and asking), run on the real
//! Redis at `STORMGUARD_REDIS_URL` (skipped, and said so, when it is unset).
//!
//! The ledger does not copy the script's arithmetic; it checks what the fleet promises:
//! - nothing is created: the balance, every lease and everything spent never exceed what was
//!   deposited;
//! - the cap holds fleet-wide: the balance plus every lease stays at most `max_balance`;
//! - a refusal means the balance could not pay (never a retry kept back while it could);
//! - an exact ask gets all it asked for or nothing;
//! - the floor gives at most its uses per window, and refuses only when they are gone;
//! - a sync sent again with its id (its answer lost) is answered as the first time, and changes
//!   nothing (the ledger counts it once).

use super::scripts;
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

const WORKERS: usize = 3;
/// One hour (the longest window): a turn inside a case is rare, and seen when it happens.
const WINDOW_MS: u64 = 3_600_000;
/// Long enough that no worker is taken for dead inside a case.
const TTL_MS: u64 = 3_600_000;

#[derive(Clone, Debug)]
struct Sync {
    worker: usize,
    /// Percent of its lease the worker spent since its last sync.
    spend_pct: i64,
    /// Percent of what is left that it gives back.
    give_back_pct: i64,
    deposit: i64,
    want: i64,
    want_floor: u32,
    exact: bool,
    /// Its answer is lost: the worker sends it again, with the same id.
    again: bool,
}

fn sync() -> impl Strategy<Value = Sync> {
    (
        0..WORKERS,
        0i64..=100,
        prop_oneof![3 => Just(0i64), 1 => 0i64..=100],
        0i64..=3_000,
        0i64..=3_000,
        0u32..=2,
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(worker, spend_pct, give_back_pct, deposit, want, want_floor, exact, again)| Sync {
                worker,
                spend_pct,
                give_back_pct,
                deposit,
                want,
                want_floor,
                exact,
                again,
            },
        )
}

fn keys() -> [String; 3] {
    let [a, b, c, _] = keys4();
    [a, b, c]
}

/// Three keys, and a fourth: the prefix of each sender's memory of its last sync.
fn keys4() -> [String; 4] {
    static CASE: AtomicU64 = AtomicU64::new(0);
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let base = format!(
        "stormguard-test:script-props:{}:{nanos}:{case}",
        std::process::id()
    );
    [
        format!("{base}:budget"),
        format!("{base}:leases"),
        format!("{base}:seen"),
        format!("{base}:sync"),
    ]
}

/// The Redis at `STORMGUARD_REDIS_URL`: `None`, said so, when it is unset, and a failure under
/// `CI=true`, where `.ci/run` sets it (a CI run never passes by skipping).
pub(super) fn redis_url() -> Option<String> {
    match std::env::var("STORMGUARD_REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("STORMGUARD_REDIS_URL is not set under CI=true: .ci/run sets it")
        }
        Err(_) => {
            eprintln!("skipped: STORMGUARD_REDIS_URL is not set (CI sets it and starts Redis)");
            None
        }
    }
}

fn connection() -> Option<redis::Connection> {
    let url = redis_url()?;
    let client = redis::Client::open(url.as_str()).expect("a valid STORMGUARD_REDIS_URL");
    Some(client.get_connection().expect("Redis answers"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_budget_script_keeps_the_fleets_ledger(
        cap in 1_000i64..=10_000,
        floor in 0u32..=5,
        syncs in prop::collection::vec(sync(), 1..40),
    ) {
        let Some(mut conn) = connection() else { return Ok(()) };
        let keys = keys4();
        let mut held = [0i64; WORKERS];
        let mut next_id = 0u64;
        let (mut deposited, mut spent) = (0i64, 0i64);
        let (mut floor_used, mut last_left) = (0u32, u64::MAX);
        for s in &syncs {
            // The worker spends part of its lease on its own, then gives part of the rest back.
            let spend = held[s.worker] * s.spend_pct / 100;
            held[s.worker] -= spend;
            spent += spend;
            let give_back = held[s.worker] * s.give_back_pct / 100;
            held[s.worker] -= give_back;
            // The exact path sends no id (it is never sent twice); a sync sends its own.
            next_id += 1;
            let id = if s.exact { String::new() } else { next_id.to_string() };
            let run = |conn: &mut redis::Connection| -> (i64, u32, i64, u64) {
                scripts::BUDGET
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .key(format!("{}:w{}", keys[3], s.worker))
                    .arg(s.deposit)
                    .arg(give_back)
                    .arg(s.want)
                    .arg(s.want_floor)
                    .arg(cap)
                    .arg(floor)
                    .arg(WINDOW_MS)
                    .arg(u8::from(s.exact))
                    .arg(format!("w{}", s.worker))
                    .arg(held[s.worker])
                    .arg(TTL_MS)
                    .arg(&id)
                    .arg(0u8)
                    .invoke(conn)
                    .expect("the script runs")
            };
            let (grant, floor_grant, balance, left) = run(&mut conn);
            if s.again && !s.exact {
                // The answer was lost; the same sync again is answered as before, applied once.
                let (g, f, b, l) = run(&mut conn);
                prop_assert_eq!((g, f, b), (grant, floor_grant, balance), "a repeated sync answered anew");
                prop_assert!(l <= left, "{l} ms left after {left}");
            }
            deposited += s.deposit;
            prop_assert!((0..=s.want).contains(&grant), "{grant} of {}", s.want);
            if s.exact {
                prop_assert!(grant == 0 || grant == s.want, "exact: {grant} of {}", s.want);
                if s.want > 0 && grant == 0 {
                    prop_assert!(balance < s.want, "exact refused with {balance} for {}", s.want);
                }
                spent += grant;
            } else {
                if grant < s.want {
                    prop_assert_eq!(balance, 0, "refused {} of {} with money left", s.want - grant, s.want);
                }
                held[s.worker] += grant;
            }
            let leases: i64 = held.iter().sum();
            prop_assert!(balance >= 0);
            prop_assert!(balance + leases <= cap, "{balance} + leases {leases} > cap {cap}");
            prop_assert!(
                balance + leases + spent <= deposited,
                "created: {balance} + {leases} + spent {spent} > deposited {deposited}"
            );
            // The floor, per window (a turn shows as more time left than the last sync saw).
            if left > last_left {
                floor_used = 0;
            }
            last_left = left;
            floor_used += floor_grant;
            prop_assert!(floor_used <= floor, "{floor_used} floor uses of {floor}");
            if s.exact && grant > 0 {
                prop_assert_eq!(floor_grant, 0, "the floor taken though the balance paid");
            } else if floor_grant < s.want_floor {
                prop_assert_eq!(floor_used, floor, "the floor refused with uses left");
            }
        }
        let mut all: Vec<String> = keys[..3].to_vec();
        all.extend((0..WORKERS).map(|w| format!("{}:w{w}", keys[3])));
        let _: () = redis::cmd("DEL").arg(&all).query(&mut conn).expect("clean up");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// GCRA in Redis, weighted: reservations made back to back on a fresh key. With `C` the
    /// units reserved so far (this one included), `b` the burst and `I` the interval, the wait
    /// is at most `(C - b) × I` (no unit waits longer than the rate asks) and at least that less
    /// the time the calls took (no unit goes sooner than the rate allows), clipped at 0.
    #[test]
    fn the_quota_script_waits_as_the_rate_says(
        interval_us in 1_000u64..=100_000,
        burst in 1u64..=20,
        costs in prop::collection::vec(1u64..=10, 1..30),
    ) {
        let Some(mut conn) = connection() else { return Ok(()) };
        let key = format!("{}:quota", keys()[0]);
        let start = std::time::Instant::now();
        let mut units = 0u64;
        for cost in costs {
            let wait: u64 = scripts::QUOTA
                .key(&key)
                .arg(interval_us)
                .arg(interval_us * (burst - 1))
                .arg(cost)
                .invoke(&mut conn)
                .expect("the script runs");
            units += cost;
            let took = start.elapsed().as_micros() as u64;
            let most = units.saturating_sub(burst) * interval_us;
            prop_assert!(wait <= most, "waits {wait} µs for {units} units; the rate asks {most}");
            prop_assert!(
                wait >= most.saturating_sub(took),
                "waits {wait} µs for {units} units after {took} µs; the rate asks {most}"
            );
        }
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).expect("clean up");
    }
}

#[derive(Clone, Debug)]
struct BreakerSync {
    worker: usize,
    successes: u32,
    failures: u32,
    /// Failures in a row at the batch's end (at most `failures` when the batch had a success).
    tail: u32,
    tripped: bool,
    trial_ok: bool,
    demand: bool,
    half_open: bool,
    /// Its answer is lost: the worker sends it again, with the same id.
    again: bool,
}

fn breaker_sync() -> impl Strategy<Value = BreakerSync> {
    (
        0..WORKERS,
        0u32..=2,
        0u32..=3,
        0u32..=3,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(worker, successes, failures, tail, tripped, trial_ok, demand, half_open, again)| {
                BreakerSync {
                    worker,
                    successes,
                    failures,
                    tail: tail.min(failures),
                    tripped,
                    trial_ok,
                    demand,
                    half_open,
                    again,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The breaker's sync against its rules, read from the docs: closed, the fleet counts one
    /// run of failures in a row (a batch with a success restarts it at the batch's tail) and
    /// opens when it reaches the threshold or a worker tripped by itself; open, only the trial
    /// lease's holder's success closes it; the lease goes only to a worker with calls to probe
    /// with (or one whose trial is under way), one at a time, and never outlives the open state.
    /// The open time is 0, so a trial may go as soon as the breaker is open.
    #[test]
    fn the_breaker_script_follows_the_breakers_rules(
        threshold in 1u32..=6,
        syncs in prop::collection::vec(breaker_sync(), 1..40),
    ) {
        let Some(mut conn) = connection() else { return Ok(()) };
        let [state, trial, _, memory] = keys4();
        let (mut open, mut run) = (false, 0u32);
        let mut holder: Option<String> = None;
        for (id, s) in syncs.iter().enumerate() {
            let me = format!("w{}", s.worker);
            let sync = |conn: &mut redis::Connection| -> (u8, u64, u8, u64) {
                scripts::BREAKER
                .key(&state)
                .key(&trial)
                .key(format!("{memory}:{me}"))
                .arg(s.successes)
                .arg(s.failures)
                .arg(s.tail)
                .arg(u8::from(s.tripped))
                .arg(u8::from(s.trial_ok))
                .arg(threshold)
                .arg(0u64)
                .arg(60_000u64)
                .arg(&me)
                .arg(u8::from(s.demand))
                .arg(u8::from(s.half_open))
                .arg(id)
                .invoke(conn)
                .expect("the script runs")
            };
            let (is_open, until, mine, gen) = sync(&mut conn);
            if s.again {
                // The answer was lost: the same sync again is answered as before, counted once.
                let (o, u, m, g) = sync(&mut conn);
                prop_assert_eq!((o, m, g), (is_open, mine, gen), "a repeated sync answered anew");
                prop_assert!(u <= until);
            }
            // The reference: what the breaker's docs say this sync does.
            if !open {
                run = if s.successes > 0 { s.tail } else { run + s.failures };
                if run >= threshold || s.tripped {
                    open = true;
                    run = 0;
                }
            } else if s.trial_ok && holder.as_deref() == Some(me.as_str()) {
                // `trial_ok` is the worker's breaker closed now after its trial: it wins over a
                // trip earlier in the same batch.
                open = false;
                run = 0;
            }
            prop_assert_eq!(is_open == 1, open, "open");
            let now_held: Option<String> = redis::cmd("GET").arg(&trial).query(&mut conn).expect("GET");
            if mine == 1 {
                prop_assert!(open, "a trial lease on a closed breaker");
                prop_assert!(s.demand || s.half_open, "the lease went to a worker with nothing to probe");
                prop_assert_eq!(now_held.as_deref(), Some(me.as_str()));
            } else {
                prop_assert_ne!(now_held.as_deref(), Some(me.as_str()), "kept a lease it was told it lacks");
            }
            if !open {
                prop_assert_eq!(now_held.as_deref(), None, "a lease outlived the open state");
            }
            holder = now_held;
        }
        let memories: Vec<String> = (0..WORKERS).map(|w| format!("{memory}:w{w}")).collect();
        let _: () = redis::cmd("DEL").arg(&state).arg(&trial).arg(&memories).query(&mut conn).expect("clean up");
    }
}
