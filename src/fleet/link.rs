//! The fleet's connection: bounded calls, the up/down state and the probe task that brings it
//! back (when, and what it logs: [`health`](super::health)).

use super::health::{Health, Say};
use crate::telemetry::{FLEET_TRANSITIONS, FLEET_UP};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

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
    /// Wakes the probe task when the fleet falls, so it probes on the down schedule at once.
    fell: Notify,
    health: Mutex<Health>,
    pub(crate) settings: Settings,
    /// Times the fleet went down, for tests and the demo.
    downs: AtomicU64,
    /// The budgets and breakers shared through this handle, for [`status`](super::Fleet::status).
    pub(crate) names: Mutex<Names>,
    /// What the next calls meet instead of Redis's answer (tests only).
    #[cfg(test)]
    pub(crate) faults: Mutex<std::collections::VecDeque<Fault>>,
}

/// The names shared through one fleet handle.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) budgets: BTreeSet<String>,
    pub(crate) breakers: BTreeSet<String>,
}

/// A fault a test puts in the way of one call.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The call goes through and its answer comes back.
    None,
    /// Redis runs the script, but its answer comes too late: a timeout.
    LateAnswer,
    /// The call never reaches Redis: a timeout.
    Lost,
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
            fell: Notify::new(),
            health: Mutex::new(Health::default()),
            settings,
            downs: AtomicU64::new(0),
            names: Mutex::new(Names::default()),
            #[cfg(test)]
            faults: Mutex::new(Default::default()),
        });
        metrics::gauge!(FLEET_UP, "fleet" => link.settings.prefix.clone()).set(0.0);
        handle.spawn(probe(Arc::downgrade(&link)));
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
        #[cfg(test)]
        let fault = self.faults.lock().unwrap().pop_front();
        #[cfg(test)]
        match fault.unwrap_or(Fault::None) {
            Fault::None => {}
            Fault::LateAnswer => {
                let _: Result<redis::Value, _> = invocation.invoke_async(&mut conn).await;
                self.went_down("no answer within the timeout (a test's fault)");
                return Err(Failed::Timeout);
            }
            Fault::Lost => {
                self.went_down("no answer within the timeout (a test's fault)");
                return Err(Failed::Timeout);
            }
        }
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

    /// Runs one read-only script, bounded by the timeout, whether the fleet is up or down; its
    /// outcome never moves the fleet up or down (an operator's read is not the fleet's health).
    pub(crate) async fn read<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Failed> {
        let mut conn = self.conn.clone();
        let answer =
            tokio::time::timeout(self.settings.timeout, invocation.invoke_async(&mut conn));
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(Failed::Redis(e)),
            Err(_) => Err(Failed::Timeout),
        }
    }

    pub(crate) fn went_down(&self, why: &str) {
        if !self.up.swap(false, Ordering::AcqRel) {
            return;
        }
        self.downs.fetch_add(1, Ordering::Relaxed);
        let say = self
            .health()
            .fell(Instant::now(), self.settings.sync_interval);
        let (fleet, worker) = (&self.settings.prefix, &self.settings.worker);
        match say {
            Say::Loud => tracing::warn!(
                fleet = %fleet,
                worker = %worker,
                why,
                "fleet: Redis unreachable or refusing writes; deciding locally until it takes one"
            ),
            Say::Quiet => tracing::debug!(
                fleet = %fleet,
                worker = %worker,
                why,
                "fleet: Redis failed again soon after it came back (the same outage)"
            ),
        }
        self.transition("down");
        self.fell.notify_waiters();
    }

    pub(crate) fn came_up(&self) {
        if self.up.swap(true, Ordering::AcqRel) {
            return;
        }
        let say = self.health().rose(Instant::now());
        let (fleet, worker) = (&self.settings.prefix, &self.settings.worker);
        match say {
            Say::Loud => tracing::info!(
                fleet = %fleet,
                worker = %worker,
                "fleet: Redis takes writes; deciding through it again"
            ),
            Say::Quiet => tracing::debug!(
                fleet = %fleet,
                worker = %worker,
                "fleet: Redis takes writes again (the same outage)"
            ),
        }
        self.transition("up");
        self.came_up.notify_waiters();
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn transition(&self, to: &'static str) {
        let fleet = self.settings.prefix.clone();
        metrics::gauge!(FLEET_UP, "fleet" => fleet.clone()).set(if to == "up" { 1.0 } else { 0.0 });
        metrics::counter!(FLEET_TRANSITIONS, "fleet" => fleet, "to" => to).increment(1);
    }

    /// One bounded write: `SET {prefix}:probe:{worker} 1` with a minute's expiry. A `PING` is not
    /// enough: a full Redis (`maxmemory`, `noeviction`) answers it and refuses every script.
    async fn probe_once(&self) -> bool {
        let mut conn = self.conn.clone();
        let mut set = redis::cmd("SET");
        set.arg(self.key("probe", &self.settings.worker))
            .arg(1)
            .arg("PX")
            .arg(60_000);
        matches!(
            tokio::time::timeout(self.settings.timeout, set.query_async::<()>(&mut conn)).await,
            Ok(Ok(()))
        )
    }
}

/// While the fleet lives: probe Redis with a write, move the fleet up or down, and wait as
/// [`Health::next_probe`] says (a fleet that falls between probes is probed on the down
/// schedule at once).
async fn probe(link: Weak<Link>) {
    let mut rng = random();
    loop {
        let Some(l) = link.upgrade() else { return };
        if l.probe_once().await {
            l.came_up();
        } else if l.is_up() {
            l.went_down("the probe (a write) failed");
        } else {
            l.health().probe_failed();
        }
        rng = crate::backoff::rng::mix(rng);
        // Made before `up` is read: a fall after that read wakes it (`notify_waiters`).
        let fell = l.fell.notified();
        let up = l.is_up();
        let wait = l.health().next_probe(up, l.settings.sync_interval, rng);
        if up {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = fell => {
                    let again = l.health().next_probe(false, l.settings.sync_interval, rng);
                    tokio::time::sleep(again).await;
                }
            }
        } else {
            tokio::time::sleep(wait).await;
        }
    }
}

pub(crate) use crate::budget::random_seed as random;
