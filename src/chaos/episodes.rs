//! [`Harness`]: seeded episodes of a user's own toolbox, with faults after the work, crashes and
//! resumes, and the count of duplicate effects.

use super::agent::Ended;
use super::provider::{EpisodeClock, Provider};
use super::script::{Applies, Resume, Step};
use crate::backoff::rng::mix;
use crate::receipt::InMemoryStore;
use crate::tool::{SpecError, Stores, Toolbox};
use std::collections::BTreeMap;
use std::time::Duration;

/// What seeded episodes of a toolbox came to: the figure a test asserts is
/// [`duplicate_effects`](Self::duplicate_effects) `== 0`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Episodes run.
    pub episodes: u32,
    /// Effects the provider applied (a write done once counts once).
    pub effects: u64,
    /// Actions (one step of one episode) whose effect was applied more than once, counted once
    /// per extra effect.
    pub duplicate_effects: u64,
    /// Episodes with at least one duplicate effect.
    pub episodes_duplicated: u64,
    /// Duplicates in an action the agent saw succeed: nobody would have noticed.
    pub silent_duplicates: u64,
    /// Actions the agent saw succeed whose write was never applied (a tool whose provider
    /// [`Applies::Nothing`], a read, never loses work).
    pub lost_work: u64,
    /// Steps that ended in an error, by its code: escalations (not retryable, such as
    /// `outcome_unknown`) and failures the model's reissues did not get past.
    pub escalations: BTreeMap<String, u64>,
    /// Crashes injected.
    pub crashes: u64,
    /// The duplicate effects by tool.
    pub duplicates_by_tool: BTreeMap<String, u64>,
    /// Calls that reached the provider.
    pub calls: u64,
    /// The calls that reached the provider, by tool.
    pub calls_by_tool: BTreeMap<String, u64>,
    /// The faults met, by name: `refused`, `rate_limited`, `reset_after_work`, `late_commit`,
    /// `crash`, `crash_in_flight`, `defied` (an escalation the model reissued anyway), (the crashes among `crash` whose work was still in flight and
    /// landed after the process died: counted in both), `reworded`, `parallel`, and the resumes
    /// `resume_at_once`, `resume_after_lease`, `resume_after_key_window` (one per crash).
    pub faults: BTreeMap<String, u64>,
}

/// How far an episode's agent has come: each step's outcome (`Err` holds the code it ended
/// with) and the model's turn.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Progress {
    pub(super) outcomes: Vec<Result<(), String>>,
    pub(super) turn: u32,
}

/// Seeded episodes of a user's toolbox, as the reference text's habit has it: kill the process
/// after the provider accepted a send and before the receipt is written, resume, and count what
/// happened twice.
///
/// Each episode runs the agent's script through the stacks the toolbox declares
/// ([`Tools::layer`](crate::tool::Tools::layer), or
/// [`layer_reading_back`](crate::tool::Tools::layer_reading_back) over the provider's sent log
/// for a tool that reads back) over a simulated provider that applies each call as
/// [`Applies`] says, and that, drawn from the seed per call: refuses it before the work (a
/// refused connection), rate-limits it (429, `Retry-After: 1`), does the work and resets the
/// connection, or times out at once and commits a second later. A crash falls on one call of
/// the episode after the provider accepted it (the work done at once, or still in flight and
/// landing later): every future of the run is dropped without running a destructor, as SIGKILL
/// leaves them, and a new "process" (new stacks over the same receipt stores) resumes the step
/// whose completion it never saw, at once, after the receipts' lease or after the provider's key
/// window ([`Resume`]). The model reissues a failure it may retry at its next step; it asks
/// again for a step that succeeded (a transcript that lost the answer), in other words if the
/// step says how ([`Step::reworded`]); and two branches of the agent sometimes make the same call
/// at once. Every store the toolbox declares is replaced by one in memory on the episode's
/// clock (tokio's, paused), which the provider's key windows and its log's lag read too.
///
/// `run` builds its own runtime on tokio's paused clock: call it from a plain `#[test]`.
///
/// ```
/// use serde_json::json;
/// use stormguard::chaos::{Harness, Step};
/// use stormguard::tool::Toolbox;
///
/// let toolbox = Toolbox::from_json_str(r#"{
///     "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
///     "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
///                 "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
///                 "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } }]
/// }"#)?;
/// let script = vec![Step::new("send_invoice", json!({ "invoice_id": 4471 }))];
/// let report = Harness::new(toolbox, script).run(500, 7)?;
/// assert_eq!(report.duplicate_effects, 0);
/// assert!(report.crashes > 0);
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Harness {
    pub(super) toolbox: Toolbox,
    pub(super) script: Vec<Step>,
    pub(super) before_work: f64,
    pub(super) rate_limited: f64,
    pub(super) after_work: f64,
    pub(super) late: f64,
    pub(super) crash: f64,
    pub(super) reissues: u32,
    pub(super) rewords: f64,
    pub(super) parallel: f64,
    pub(super) defiant: f64,
    pub(super) resumes: Vec<Resume>,
    pub(super) log_lag: Duration,
    pub(super) applies: BTreeMap<String, Applies>,
    #[cfg(all(feature = "postgres", feature = "sqlite", unix))]
    postgres: Option<Secret>,
}

/// A connection string, never printed.
#[cfg(all(feature = "postgres", feature = "sqlite", unix))]
#[derive(Clone)]
struct Secret(String);

#[cfg(all(feature = "postgres", feature = "sqlite", unix))]
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Harness {
    /// Episodes of `script` over `toolbox`'s tools. By default, of the calls that reach the
    /// provider: 10 % refused before the work, 3 % rate-limited, 10 % reset after it, 3 % late
    /// commits; a crash in 20 % of episodes, resumed at once, after the lease or after the key
    /// window (a third each); up to 2 reissues of a call the agent may retry (and of half the
    /// escalations it may not, as models do); 5 % of the steps
    /// that succeeded asked for again, 2 % made by two branches at once; a sent log 3 s behind.
    pub fn new(toolbox: Toolbox, script: Vec<Step>) -> Self {
        Harness {
            toolbox,
            script,
            before_work: 0.1,
            rate_limited: 0.03,
            after_work: 0.1,
            late: 0.03,
            crash: 0.2,
            reissues: 2,
            rewords: 0.05,
            parallel: 0.02,
            defiant: 0.5,
            resumes: vec![Resume::AtOnce, Resume::AfterLease, Resume::AfterKeyWindow],
            log_lag: Duration::from_secs(3),
            applies: BTreeMap::new(),
            #[cfg(all(feature = "postgres", feature = "sqlite", unix))]
            postgres: None,
        }
    }

    /// The share of provider calls refused before any work (0.0 to 1.0).
    pub fn before_work(mut self, p: f64) -> Self {
        self.before_work = p;
        self
    }

    /// The share of provider calls answered 429 with `Retry-After: 1`, no work done.
    pub fn rate_limited(mut self, p: f64) -> Self {
        self.rate_limited = p;
        self
    }

    /// The share of provider calls that do the work and then lose the answer (a reset).
    pub fn after_work(mut self, p: f64) -> Self {
        self.after_work = p;
        self
    }

    /// The share of provider calls that time out at once and do the work a second later.
    pub fn late_commits(mut self, p: f64) -> Self {
        self.late = p;
        self
    }

    /// The share of episodes with a crash (0.0 to 1.0). The crash falls on the first call the
    /// provider accepts and answers at once (not one it refuses or queues as a late commit),
    /// from one of the episode's first calls on (as many as the script has steps); an episode
    /// with no such call from there on has none, so `crashes(1.0)` crashes nearly every
    /// episode, not every one, and fewer the more calls are late. In [`run`](Self::run), half
    /// the crashes come with that call's work still in flight (`crash_in_flight`); in
    /// `run_in_processes` the work is applied before the kill.
    pub fn crashes(mut self, p: f64) -> Self {
        self.crash = p;
        self
    }

    /// When a crashed run resumes: each crash draws one of `resumes` (an empty list is refused
    /// by [`run`](Self::run)).
    pub fn resumes(mut self, resumes: &[Resume]) -> Self {
        self.resumes = resumes.to_vec();
        self
    }

    /// How many times the model reissues a call that failed in a way it may retry (at most 100;
    /// more is refused by [`run`](Self::run)).
    pub fn reissues(mut self, n: u32) -> Self {
        self.reissues = n;
        self
    }

    /// The share of steps that succeeded which the model asks for again at its next step, in
    /// the step's [`reworded`](Step::reworded) arguments if it has them.
    pub fn rewords(mut self, p: f64) -> Self {
        self.rewords = p;
        self
    }

    /// The share of failures the model may *not* retry (`retryable: false`, such as
    /// `outcome_unknown`) that it reissues anyway, as models do (0.5 by default; each counts
    /// against [`reissues`](Self::reissues), and is counted as the fault `defied`).
    pub fn reissues_escalations(mut self, p: f64) -> Self {
        self.defiant = p;
        self
    }

    /// The share of steps two branches of the agent make at once.
    pub fn parallel(mut self, p: f64) -> Self {
        self.parallel = p;
        self
    }

    /// How far the provider's sent log (what a read-back reads) lags behind its commits.
    pub fn log_lag(mut self, lag: Duration) -> Self {
        self.log_lag = lag;
        self
    }

    /// What the provider behind `tool` really does (by default, what its class says).
    pub fn applies(mut self, tool: &str, applies: Applies) -> Self {
        self.applies.insert(tool.to_owned(), applies);
        self
    }

    /// The PostgreSQL database (a `tokio-postgres` connection string) where the toolbox's
    /// `postgres` stores live in the real-process mode
    /// ([`run_in_processes`](Self::run_in_processes)); [`run`](Self::run) keeps every store in
    /// memory and does not use it. Each run's agent-run ids are new, so a database kept between
    /// runs never answers an episode from an earlier run's receipts. Features `postgres` and `sqlite`,
    /// Unix.
    ///
    /// ```
    /// # let toolbox = stormguard::tool::Toolbox::default();
    /// let harness = stormguard::chaos::Harness::new(toolbox, vec![])
    ///     .postgres("host=127.0.0.1 user=postgres password=hunter2 dbname=test");
    /// assert!(!format!("{harness:?}").contains("hunter2"));
    /// ```
    #[cfg(all(feature = "postgres", feature = "sqlite", unix))]
    pub fn postgres(mut self, url: &str) -> Self {
        self.postgres = Some(Secret(url.to_owned()));
        self
    }

    /// The database [`postgres`](Self::postgres) named, if any.
    #[cfg(all(feature = "sqlite", unix))]
    pub(super) fn postgres_url(&self) -> Option<&str> {
        #[cfg(feature = "postgres")]
        return self.postgres.as_ref().map(|p| p.0.as_str());
        #[cfg(not(feature = "postgres"))]
        None
    }

    /// What the provider behind `tool` does.
    pub(super) fn applies_to(&self, tool: &str) -> Applies {
        self.applies.get(tool).copied().unwrap_or_else(|| {
            self.toolbox
                .tools()
                .iter()
                .find(|t| t.name == tool)
                .map_or(Applies::Nothing, |t| Applies::of(t.class))
        })
    }

    /// Runs `episodes` seeded episodes (the same seed, the same run). A script naming a tool the
    /// toolbox does not hold, a rate outside 0.0 to 1.0, fault rates adding up to more than 1,
    /// no resume, a stack that cannot be built, no episode or an empty script (a report that
    /// could not fail) is a [`SpecError`].
    pub fn run(&self, episodes: u32, seed: u64) -> Result<Report, SpecError> {
        self.check(episodes)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| SpecError::new(None, "runtime", &e.to_string()))?;
        let mut report = Report::default();
        for n in 0..episodes {
            runtime.block_on(self.episode(seed, n, &mut report))?;
        }
        report.episodes = episodes;
        self.reached(&report)?;
        Ok(report)
    }

    async fn episode(&self, seed: u64, n: u32, report: &mut Report) -> Result<(), SpecError> {
        let clock = EpisodeClock::Tokio(tokio::time::Instant::now());
        let toolbox = self.toolbox.with_stores_in_memory();
        let stores: Vec<(String, InMemoryStore)> = toolbox
            .stores()
            .keys()
            .map(|name| (name.clone(), InMemoryStore::with_clock(clock)))
            .collect();
        let eseed = episode_seed(seed, n);
        let provider = Provider::new(self, eseed, clock, None);
        let mut progress = Progress::default();
        let run = format!("ep-{n}");
        let mut crashes = 0;
        loop {
            let given = stores.iter().fold(Stores::new(), |s, (name, store)| {
                s.with(name, store.clone())
            });
            // Each process's budgets draw from the episode's seed: the backoff's jitter orders
            // parallel branches' retries, and it must repeat with the seed.
            let tools = toolbox.build_seeded(given, Some(mix(eseed ^ crashes)))?;
            match self
                .steps(&run, eseed, &provider, tools, &mut progress, report, |_| ())
                .await?
            {
                Ended::Done => break,
                Ended::Crashed => {
                    // A new process resumes the step it never saw complete.
                    crashes += 1;
                    report.crashes += 1;
                    let resume = self.resume(eseed, crashes, report);
                    tokio::time::sleep(self.resume_after(resume)).await;
                }
            }
        }
        provider.settle().await;
        provider.tally(&self.script, &progress.outcomes, report);
        Ok(())
    }
}

/// The provider's seed for episode `n` of a run seeded `seed`.
pub(super) fn episode_seed(seed: u64, n: u32) -> u64 {
    seed ^ mix(u64::from(n) + 1)
}
