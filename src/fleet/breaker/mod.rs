//! A breaker shared by the fleet: failures counted fleet-wide, the open state published, the
//! half-open trial leased to one worker.
//!
//! Each worker keeps its own [`Breaker`] (so a call is admitted with one atomic, as ever) and a
//! sync task that, every `sync_interval` and at once after a failure, runs one script with the
//! outcomes counted since the last sync:
//!
//! - **Counting.** The fleet keeps one run of failures in a row: a batch with no success adds its
//!   failures, a batch with a success sets the run to the failures in a row at the batch's end.
//!   The run reaching the breaker's `consecutive_failures` opens the fleet's breaker, so a dead
//!   dependency opens every worker's after about that many failures in all, not that many each
//!   (a breaker built without that rule leaves the fleet's count idle: only its local trips open
//!   the fleet's).
//!   A local breaker that trips by its own rules (the failure rate, say) opens the fleet's too.
//! - **Open.** A worker that learns the fleet's breaker is open opens its own (the reason says
//!   so): every worker fails fast within one sync of the first.
//! - **Trials.** Once the open time has passed, one worker at a time holds the trial lease
//!   (`SET NX` with the trial timeout), and only a worker that has calls to probe with (a call
//!   came to its open breaker since its last sync) takes it: its breaker probes at its next call,
//!   the others' stay open. A holder that made no call by its next sync gives the lease up, so a
//!   quiet worker never keeps the others shut. The trial's success closes the fleet's breaker, and every worker's at its next sync;
//!   its failure keeps the fleet open for another open time and frees the lease.
//!
//! A sync that times out is sent again first, with the same id, and the script answers a
//! repeated id from memory (see [`outbox`](super::outbox)): a batch of failures is counted once,
//! however late Redis answers. While the fleet is down each breaker follows its own rules alone. Each shared breaker runs one
//! script per `sync_interval` in each worker (20 a second at the default 50 ms), busy or not:
//! that is how a quiet worker learns the fleet's breaker opened.

use super::link::{Failed, Link};
use super::outbox::Outbox;
use super::scripts;
use super::Fleet;
mod relay;

use crate::breaker::control::WeakBreaker;
use crate::breaker::share::ShareTerms;
use crate::breaker::Breaker;
use crate::error::ConfigError;
use crate::telemetry::FLEET_LOCAL;
use relay::{Relay, GATED, LOCAL, PROBE};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A breaker shared with a fleet ([`Fleet::share_breaker`]); dropping this handle does not stop
/// the sharing, dropping the breaker does.
///
/// ```
/// use stormguard::breaker::{Breaker, BreakerConfig};
/// use stormguard::fleet::Fleet;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap();
/// let breaker = Breaker::new("payments", BreakerConfig::default());
/// let shared = fleet.share_breaker(&breaker).unwrap();
/// assert!(!shared.fleet_open());
/// // A breaker is shared with one fleet at most.
/// assert_eq!(fleet.share_breaker(&breaker).unwrap_err().field(), "breaker");
/// # }
/// ```
#[derive(Clone)]
pub struct SharedBreaker {
    name: String,
    tap: Arc<Relay>,
    view: Arc<View>,
    link: Arc<Link>,
}

#[derive(Debug, Default)]
struct View {
    open: AtomicBool,
    holds_trial: AtomicBool,
}

impl SharedBreaker {
    /// The breaker's name (its Redis key is `{prefix}:breaker:{name}`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the fleet's breaker was open at the last sync.
    pub fn fleet_open(&self) -> bool {
        self.view.open.load(Ordering::Acquire)
    }

    /// Whether this worker held the fleet's trial lease at the last sync.
    pub fn holds_trial(&self) -> bool {
        self.view.holds_trial.load(Ordering::Acquire)
    }

    /// Whether this worker's open breaker is held shut by the fleet (another worker probes).
    pub fn gated(&self) -> bool {
        self.tap.gate_now() == GATED
    }

    /// What Redis holds for the fleet's breaker now (one read-only script, bounded by the
    /// fleet's timeout); see [`status`](super::status).
    ///
    /// ```no_run
    /// use stormguard::breaker::{Breaker, BreakerConfig, State};
    /// use stormguard::fleet::Fleet;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = Fleet::builder("redis://127.0.0.1:6379/").build()?;
    /// let shared = fleet.share_breaker(&Breaker::new("payments", BreakerConfig::default()))?;
    /// let status = shared.status().await?;
    /// assert_eq!(status.name, "payments");
    /// println!("{:?} with {} failures in a row", status.state, status.failures_in_a_row);
    /// # Ok(()) }
    /// ```
    pub async fn status(&self) -> Result<super::BreakerStatus, super::StatusError> {
        super::status::breaker(&self.link, &self.name).await
    }
}

impl fmt::Debug for SharedBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBreaker")
            .field("name", &self.name)
            .field("fleet_open", &self.fleet_open())
            .field("holds_trial", &self.holds_trial())
            .finish()
    }
}

pub(super) fn share(fleet: &Fleet, breaker: &Breaker) -> Result<SharedBreaker, ConfigError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| {
        ConfigError::new(
            "runtime",
            "sharing a breaker starts a task: do it inside a tokio runtime",
        )
    })?;
    let tap = Arc::new(Relay::default());
    let watched = breaker.share(tap.clone()).ok_or(ConfigError::new(
        "breaker",
        "is shared with a fleet already",
    ))?;
    let view = Arc::new(View::default());
    let link = &fleet.link;
    link.names
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .breakers
        .insert(breaker.name().to_string());
    let sync = Sync {
        link: link.clone(),
        key: link.key("breaker", breaker.name()),
        trial_key: link.key("breaker-trial", breaker.name()),
        sync_key: format!(
            "{}:{}:{:016x}",
            link.key("breaker-sync", breaker.name()),
            link.worker(),
            super::link::random()
        ),
        outbox: Outbox::new(),
        terms: breaker.share_terms(),
        tap: tap.clone(),
        view: view.clone(),
        last_opens: breaker.opens(),
        holds_trial: false,
        was_open: false,
    };
    handle.spawn(sync.run(watched));
    Ok(SharedBreaker {
        name: breaker.name().to_string(),
        tap,
        view,
        link: fleet.link.clone(),
    })
}

struct Sync {
    link: Arc<Link>,
    key: String,
    trial_key: String,
    /// This breaker's last sync, as the script remembers it (to answer a sync sent again).
    sync_key: String,
    outbox: Outbox<Batch>,
    terms: ShareTerms,
    tap: Arc<Relay>,
    view: Arc<View>,
    /// The local breaker's opens at the last sync, so a trip of its own is told from ours.
    last_opens: u64,
    holds_trial: bool,
    was_open: bool,
}

/// What one sync reports: the outcomes counted since the last, and the breaker's news.
#[derive(Clone, Copy, Debug)]
struct Batch {
    successes: u64,
    failures: u64,
    tail: u32,
    tripped: bool,
    trial_ok: bool,
    demand: bool,
    half_open: bool,
}

/// What the script answers.
struct Answer {
    open: bool,
    until_trial: Duration,
    mine: bool,
}

impl Sync {
    async fn run(mut self, watched: WeakBreaker) {
        let every = self.link.settings.sync_interval;
        loop {
            tokio::select! {
                _ = self.tap.wake.notified() => {}
                _ = tokio::time::sleep(every) => {}
            }
            let Some(breaker) = watched.get() else { return };
            if !self.link.is_up() {
                if self.tap.gate_now() != LOCAL {
                    metrics::counter!(FLEET_LOCAL, "part" => "breaker").increment(1);
                    self.tap.set_gate(LOCAL, Duration::ZERO);
                }
                continue;
            }
            self.once(&breaker).await;
        }
    }

    async fn once(&mut self, breaker: &Breaker) {
        // The last sync first, if it got no answer: Redis counts it once, or answers from memory.
        // Its answer is old news; the new batch's answer is what the breaker follows.
        if let Some((id, batch)) = self.outbox.unanswered() {
            match self.send(id, batch).await {
                Ok(_) => self.outbox.answered(),
                Err(e) => return self.failed(breaker, &e),
            }
        }
        let opens = breaker.opens();
        let tripped = opens > self.last_opens;
        // The trip travels with this batch, which is delivered once, sooner or later.
        self.last_opens = opens;
        let closed = breaker.is_closed();
        let trial_ok = self.holds_trial && closed;
        let (successes, failures) = self.tap.take_counts();
        let batch = Batch {
            successes,
            failures,
            tail: breaker.consecutive(),
            tripped,
            trial_ok,
            demand: self.tap.take_demand(),
            half_open: breaker.is_half_open(),
        };
        let id = self.outbox.send(batch);
        let answer = match self.send(id, batch).await {
            Ok(answer) => answer,
            // The batch stays in the outbox, to go again first: never put back, never lost.
            Err(e) => return self.failed(breaker, &e),
        };
        self.outbox.answered();
        if answer.open {
            if breaker.is_closed() && !trial_ok {
                let reason = format!(
                    "the fleet's breaker for {} is open (another worker saw the failures)",
                    breaker.name()
                );
                breaker.force_open(reason);
                // Our own doing: not a trip to report.
                self.last_opens = breaker.opens();
            }
            let gate = if answer.mine { PROBE } else { GATED };
            let wait = answer.until_trial.max(self.link.settings.sync_interval);
            self.tap.set_gate(gate, wait);
        } else {
            self.tap.set_gate(LOCAL, Duration::ZERO);
            if self.was_open && !breaker.is_closed() && !tripped {
                breaker.force_close(format!(
                    "the fleet's trial call to {} succeeded",
                    breaker.name()
                ));
                self.last_opens = breaker.opens();
            }
        }
        self.holds_trial = answer.mine;
        self.was_open = answer.open;
        self.view.open.store(answer.open, Ordering::Release);
        self.view.holds_trial.store(answer.mine, Ordering::Release);
    }

    async fn send(&self, id: u64, b: Batch) -> Result<Answer, Failed> {
        let mut invocation = scripts::BREAKER.key(&self.key);
        invocation
            .key(&self.trial_key)
            .key(&self.sync_key)
            .arg(b.successes)
            .arg(b.failures)
            .arg(b.tail)
            .arg(u8::from(b.tripped))
            .arg(u8::from(b.trial_ok))
            .arg(self.terms.consecutive)
            .arg(self.terms.open.as_millis() as u64)
            .arg(self.terms.trial_timeout.as_millis() as u64)
            .arg(self.link.worker())
            .arg(u8::from(b.demand))
            .arg(u8::from(b.half_open))
            .arg(id);
        let (open, until, mine, _gen) = self.link.eval::<(u8, u64, u8, u64)>(&invocation).await?;
        Ok(Answer {
            open: open == 1,
            until_trial: Duration::from_millis(until),
            mine: mine == 1,
        })
    }

    fn failed(&self, breaker: &Breaker, e: &Failed) {
        self.tap.set_gate(LOCAL, Duration::ZERO);
        tracing::debug!(breaker = %breaker.name(), error = %e, "fleet breaker: sync failed");
    }
}
