//! The fleet's connection: bounded calls, the up/down state and the ping task that brings it
//! back.

use crate::telemetry::{FLEET_TRANSITIONS, FLEET_UP};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) sync_interval: Duration,
    pub(crate) worker: String,
}

/// Why a Redis call gave no answer; the caller decides locally.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The fleet is down: no call was made.
    Down,
    /// No answer within the timeout.
    Timeout,
    /// Redis or the connection answered with an error.
    Redis(redis::RedisError),
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::Down => f.write_str("the fleet is down"),
            Failed::Timeout => f.write_str("redis did not answer in time"),
            Failed::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

pub(crate) struct Link {
    conn: ConnectionManager,
    up: AtomicBool,
    came_up: Notify,
    pub(crate) settings: Settings,
    /// Times the fleet went down, for tests and the demo.
    downs: AtomicU64,
}

impl Link {
    pub(crate) fn start(
        client: redis::Client,
        settings: Settings,
        handle: &tokio::runtime::Handle,
    ) -> redis::RedisResult<Arc<Link>> {
        let _entered = handle.enter();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(settings.sync_interval.max(Duration::from_millis(10)));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        let link = Arc::new(Link {
            conn,
            up: AtomicBool::new(false),
            came_up: Notify::new(),
            settings,
            downs: AtomicU64::new(0),
        });
        metrics::gauge!(FLEET_UP, "fleet" => link.settings.prefix.clone()).set(0.0);
        handle.spawn(ping(Arc::downgrade(&link)));
        Ok(link)
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub(crate) fn worker(&self) -> &str {
        &self.settings.worker
    }

    /// The Redis key of the `kind` named `name`: `{prefix}:{kind}:{bytes in name}:{name}`, so no
    /// name can end where another begins (a quota `a` keyed `b:c` and a quota `a:b` keyed `c`).
    pub(crate) fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{}:{name}", self.settings.prefix, name.len())
    }

    pub(crate) fn downs(&self) -> u64 {
        self.downs.load(Ordering::Relaxed)
    }

    pub(crate) async fn wait_up(&self, limit: Duration) -> bool {
        let came_up = self.came_up.notified();
        if self.is_up() {
            return true;
        }
        let _ = tokio::time::timeout(limit, came_up).await;
        self.is_up()
    }

    /// Runs one script, bounded by the timeout; only while the fleet is up.
    pub(crate) async fn eval<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Failed> {
        if !self.is_up() {
            return Err(Failed::Down);
        }
        let mut conn = self.conn.clone();
        let answer =
            tokio::time::timeout(self.settings.timeout, invocation.invoke_async(&mut conn));
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                self.went_down(&e.to_string());
                Err(Failed::Redis(e))
            }
            Err(_) => {
                self.went_down("no answer within the timeout");
                Err(Failed::Timeout)
            }
        }
    }

    fn went_down(&self, why: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            self.downs.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                fleet = %self.settings.prefix,
                worker = %self.settings.worker,
                why,
                "fleet: Redis unreachable; deciding locally until it answers"
            );
            self.transition("down");
        }
    }

    fn came_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!(
                fleet = %self.settings.prefix,
                worker = %self.settings.worker,
                "fleet: Redis answers; deciding through it again"
            );
            self.transition("up");
            self.came_up.notify_waiters();
        }
    }

    fn transition(&self, to: &'static str) {
        let fleet = self.settings.prefix.clone();
        metrics::gauge!(FLEET_UP, "fleet" => fleet.clone()).set(if to == "up" { 1.0 } else { 0.0 });
        metrics::counter!(FLEET_TRANSITIONS, "fleet" => fleet, "to" => to).increment(1);
    }

    /// One bounded PING.
    async fn ping_once(&self) -> bool {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        matches!(
            tokio::time::timeout(self.settings.timeout, ping.query_async::<String>(&mut conn))
                .await,
            Ok(Ok(_))
        )
    }
}

/// While the fleet lives: a fleet that is down pings Redis every `sync_interval` (jittered by up
/// to half of it, so workers do not reconnect in step) and comes up when it answers; a fleet
/// that is up pings every ten intervals, so a partition is noticed even where no part is busy.
async fn ping(link: Weak<Link>) {
    let mut rng = random();
    loop {
        let Some(l) = link.upgrade() else { return };
        let up = l.ping_once().await;
        if up {
            l.came_up();
        } else {
            l.went_down("ping failed");
        }
        let base = l.settings.sync_interval;
        let every = if up { base * 10 } else { base };
        drop(l);
        rng = crate::backoff::rng::mix(rng);
        let jitter = Duration::from_nanos(rng % (every.as_nanos() as u64 / 2 + 1));
        tokio::time::sleep(every + jitter).await;
    }
}

pub(crate) use crate::budget::random_seed as random;
