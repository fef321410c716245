//! Helpers of the fleet tests (`tests/fleet.rs` on the shared Redis, `tests/fleet_outages.rs` on
//! a Redis of their own that they stop, freeze, slow or fill).

use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig};
use stormguard::fleet::{Fleet, SharedBreaker};
use tokio::time::Instant;
use tower::Service;

/// A `redis-server` of the test's own on a free port (the fleet demo's), so it can be stopped,
/// frozen and started again; see [`own_redis`].
#[path = "../../examples/fleet/redis.rs"]
#[allow(dead_code)]
pub mod own;

/// The shared Redis at `STORMGUARD_REDIS_URL`; `None`, said so, when it is unset.
pub fn redis_url() -> Option<String> {
    super::service_url("STORMGUARD_REDIS_URL")
}

/// A Redis of the test's own; `None`, with the reason, where there is no `redis-server`.
pub fn own_redis() -> Option<own::OwnRedis> {
    own::OwnRedis::start()
        .map_err(|e| eprintln!("skipped: {e} (apt-get install redis-server)"))
        .ok()
}

/// A prefix no other test (or run) uses.
pub fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("stormguard-test:{test}:{}:{nanos}", std::process::id())
}

/// A plain connection to `url`, for what the test does to Redis itself.
pub async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Puts Redis to sleep for `secs` (`DEBUG SLEEP`: every command waits behind it, as behind a
/// slow script) and returns once it sleeps.
pub async fn slow_down(url: &str, secs: f64) {
    // Both connections first: a connection's handshake waits behind the sleep too.
    let mut sleeper = connection(url).await;
    let mut probe = connection(url).await;
    tokio::spawn(async move {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(secs)
            .query_async(&mut sleeper)
            .await;
    });
    // Asleep once a PING from another connection goes unanswered.
    let ping = redis::cmd("PING");
    for _ in 0..1_000 {
        let ping = ping.query_async::<String>(&mut probe);
        if tokio::time::timeout(Duration::from_millis(20), ping)
            .await
            .is_err()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("Redis never went to sleep");
}

/// Waits, at most `limit`, until `done` holds; says whether it did.
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// One breaker named `name` per worker, each shared through its worker's fleet.
pub fn shared_breakers(
    fleets: &[Fleet],
    name: &'static str,
    config: impl Fn() -> BreakerConfig,
) -> (Vec<Breaker>, Vec<SharedBreaker>) {
    let breakers: Vec<Breaker> = fleets
        .iter()
        .map(|_| Breaker::new(name, config()))
        .collect();
    let shared = fleets
        .iter()
        .zip(&breakers)
        .map(|(f, b)| f.share_breaker(b).unwrap())
        .collect();
    (breakers, shared)
}

/// A dependency that refuses every call.
pub fn failing() -> impl Service<
    (),
    Response = (),
    Error = std::io::Error,
    Future = std::future::Ready<Result<(), std::io::Error>>,
> + Clone {
    tower::service_fn(|()| {
        std::future::ready(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    })
}

/// The fleet's floor windows are aligned on Redis's clock (`TIME`), so a test that counts one
/// window's floor exactly must not straddle a turn: wait, if need be, until the current window
/// has at least `needed` left on Redis's clock.
pub async fn clear_of_a_window_turn(url: &str, window: Duration, needed: Duration) {
    let mut conn = connection(url).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1_000 + micros / 1_000;
    let width = window.as_millis() as u64;
    let left = Duration::from_millis(width - now_ms % width);
    if left < needed {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}
