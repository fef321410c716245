//! [`Harness::run_in_processes`]: the same episodes, each crash a real SIGKILL of a child
//! process, the resume a new process over the same SQLite files or PostgreSQL database
//! (features `sqlite`, and `postgres` for PostgreSQL).

use super::agent::Ended;
use super::episodes::{episode_seed, Harness, Progress, Report};
use super::provider::{write_synced, EpisodeClock, Provider, CRASH_POINT};
#[cfg(doc)]
use super::script::Resume;
use crate::receipt::{Durability, InMemoryStore, SqliteStore};
use crate::tool::{SpecError, Stores, Tools};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in a child process: the episode's directory (its provider's books, its progress, its
/// SQLite receipt files).
const DIR: &str = "STORMGUARD_CHAOS_DIR";
const EPISODE: &str = "STORMGUARD_CHAOS_EPISODE";
const SEED: &str = "STORMGUARD_CHAOS_SEED";
/// The parent's run: the agent runs' ids begin with it, so a database kept between test runs
/// never answers an episode from an earlier run's receipt.
const RUN: &str = "STORMGUARD_CHAOS_RUN";
/// How far ahead of the system clock the child's receipt stores and provider read the time: as
/// long as the resumes drawn for the crashes before it wait (see [`Resume`]).
const AHEAD_MS: &str = "STORMGUARD_CHAOS_AHEAD_MS";
/// The call of `run_in_processes` that started the child (a fingerprint of the harness and its
/// arguments): a child that reaches another call first exits with [`OTHER_CALL`].
const CALL: &str = "STORMGUARD_CHAOS_CALL";
/// The exit code of a child that reached another `run_in_processes` call than its parent's.
const OTHER_CALL: i32 = 4;
/// What a child prints first: a child that exits without it ran no episode (no such test).
const STARTED: &str = "stormguard-chaos: child started";
/// What a child prints before the refusal that ended it (a store it could not open...), as JSON
/// `[tool, field, reason]`.
const REFUSED: &str = "stormguard-chaos: child refused: ";
/// The longest a child may run before it is killed and the run refused.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

fn refused(field: &str, reason: impl std::fmt::Display) -> SpecError {
    SpecError::new(None, field, &reason.to_string())
}

impl Harness {
    /// Runs `episodes` seeded episodes as [`run`](Self::run) does, but each one in child
    /// processes of this test binary: a crash is the child killed with SIGKILL right after the
    /// provider applied a call and before the receipt was written, and the resume is a new
    /// child over the same files, started as each crash's drawn [`Resume`] says (its receipt
    /// stores and provider read the time that far ahead: at once, the crashed call's lease is
    /// still held; after the key window, the provider has forgotten the key). A resume at once
    /// waits in real time for the killed process's lease (the receipt's `lease_secs`, 30 s by
    /// default): a test gives its tools a lease of a second or two. The toolbox's `sqlite`
    /// stores are SQLite files in each episode's directory under `dir`; its `memory` stores live
    /// and die with each process (a resume finds them empty, as it would); any other kind is a
    /// [`SpecError`]. The provider keeps its books in a file, flushed to disk before it
    /// answers, and its late commits with them (a resumed process lands those a killed one
    /// queued).
    ///
    /// `test` is the exact name of the `#[test]` that calls this (the child runs that test
    /// alone, `--exact`): in a child, this call runs the child's part and ends the process, so
    /// the lines after it run in the parent only, and a test calls it once (a second call is
    /// refused: its children would reach the first). A child that fails, or runs past two minutes,
    /// is a [`SpecError`] with what it printed. Unix only (SIGKILL).
    ///
    /// ```no_run
    /// # fn toolbox() -> stormguard::tool::Toolbox {
    /// #     stormguard::tool::Toolbox::from_json_str(r#"{
    /// #         "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
    /// #         "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
    /// #             "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
    /// #             "receipt": { "store": "receipts" } }] }"#).unwrap()
    /// # }
    /// # fn script() -> Vec<stormguard::chaos::Step> {
    /// #     vec![stormguard::chaos::Step::new("send_invoice", serde_json::json!({ "invoice_id": 4471 }))]
    /// # }
    /// #[test]
    /// fn the_invoice_tool_survives_sigkill() {
    ///     let dir = std::env::temp_dir().join("invoice-episodes");
    ///     let report = stormguard::chaos::Harness::new(toolbox(), script())
    ///         .crashes(0.5)
    ///         .run_in_processes(20, 7, "the_invoice_tool_survives_sigkill", &dir)
    ///         .unwrap();
    ///     assert_eq!(report.duplicate_effects, 0);
    /// }
    /// ```
    pub fn run_in_processes(
        &self,
        episodes: u32,
        seed: u64,
        test: &str,
        dir: &Path,
    ) -> Result<Report, SpecError> {
        let call = self.fingerprint(episodes, seed, test);
        if let Some(dir) = std::env::var_os(DIR) {
            if std::env::var(CALL).ok() != Some(call) {
                // The test calls run_in_processes more than once: this child was started by
                // a later call and reached an earlier one (a test's code runs from its start).
                std::process::exit(OTHER_CALL);
            }
            println!("{STARTED}");
            let code = match self.child(Path::new(&dir)) {
                Ok(()) => 0,
                Err(e) => {
                    // The parent reads this line and returns the child's own refusal.
                    let refusal = serde_json::json!([e.tool(), e.field(), e.reason()]);
                    println!("{REFUSED}{refusal}");
                    2
                }
            };
            let _ = std::io::stdout().flush();
            std::process::exit(code);
        }
        self.check(episodes)?;
        for (name, spec) in self.toolbox.stores() {
            match spec.kind.as_str() {
                "sqlite" | "memory" => {}
                "postgres" if cfg!(feature = "postgres") && self.postgres_url().is_some() => {}
                "postgres" => {
                    return Err(refused(
                        "stores",
                        format!("`{name}` is a postgres store: give the database with Harness::postgres(url)"),
                    ))
                }
                other => {
                    return Err(refused(
                        "stores",
                        format!("`{name}` is a {other} store: the real-process mode opens SQLite files, PostgreSQL and memory stores"),
                    ))
                }
            }
        }
        let exe = std::env::current_exe().map_err(|e| refused("test", e))?;
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let parent = format!("{}-{}", std::process::id(), since_epoch.as_millis());
        let mut report = Report::default();
        for n in 0..episodes {
            let ep = dir.join(format!("ep-{n}"));
            let _ = std::fs::remove_dir_all(&ep);
            std::fs::create_dir_all(&ep).map_err(|e| refused("dir", e))?;
            let mut crashes = 0u64;
            let mut ahead = Duration::ZERO;
            while spawn(&exe, test, &ep, (n, seed, &parent, &call), ahead)? {
                crashes += 1;
                if crashes > 1 {
                    return Err(refused("episodes", "a resumed child crashed again"));
                }
                // The resumed child starts as long after the crash as the drawn resume says:
                // its stores and provider read the time that far ahead.
                let resume = self.resume(episode_seed(seed, n), crashes, &mut report);
                ahead += self.resume_after(resume);
            }
            report.crashes += crashes;
            let progress: Progress = std::fs::read(ep.join("progress.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| refused("episodes", "a child ended without its progress"))?;
            let provider = Provider::new(
                self,
                episode_seed(seed, n),
                EpisodeClock::Ahead(0),
                Some(ep.join("provider.json")),
            );
            provider.tally(&self.script, &progress.outcomes, &mut report);
        }
        report.episodes = episodes;
        self.reached(&report)?;
        Ok(report)
    }

    /// The child's part: the episode from where its progress stands, over its files.
    fn child(&self, dir: &Path) -> Result<(), SpecError> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| refused("env", format!("{name} is not set")))
        };
        let (n, seed, ahead) = (var(EPISODE)?, var(SEED)?, var(AHEAD_MS)?);
        let n = u32::try_from(n).map_err(|e| refused("env", e))?;
        let parent = std::env::var(RUN).map_err(|_| refused("env", format!("{RUN} is not set")))?;
        let clock = EpisodeClock::Ahead(ahead);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| refused("runtime", e))?;
        let mut stores = Stores::new();
        for (name, spec) in self.toolbox.stores() {
            stores = match spec.kind.as_str() {
                "sqlite" => {
                    let file = dir.join(format!("{name}.db"));
                    let store = SqliteStore::open_with_clock(file, Durability::Process, clock)
                        .map_err(|e| refused("stores", e))?;
                    stores.with(name, store)
                }
                #[cfg(feature = "postgres")]
                "postgres" => {
                    let url = self.postgres_url().unwrap_or_default();
                    let store = runtime
                        .block_on(async {
                            let store = crate::receipt::PostgresOptions::builder(url)
                                .durability(Durability::Process)
                                .connections(1)
                                .clock(clock)
                                .build()?
                                .connect()
                                .await?;
                            store.migrate().await?;
                            Ok::<_, Box<dyn std::error::Error>>(store)
                        })
                        .map_err(|e| refused("stores", e))?;
                    stores.with(name, store)
                }
                _ => stores.with(name, InMemoryStore::with_clock(clock)),
            };
        }
        let tools: Tools = self
            .toolbox
            .build_seeded(stores, Some(episode_seed(seed, n)))?;
        let provider = Provider::new(
            self,
            episode_seed(seed, n),
            clock,
            Some(dir.join("provider.json")),
        );
        let progress_file = dir.join("progress.json");
        let mut progress: Progress = std::fs::read(&progress_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let run = format!("{parent}-ep-{n}");
        let save = |p: &Progress| write_synced(&progress_file, p);
        let mut report = Report::default();
        let eseed = episode_seed(seed, n);
        let ended = runtime.block_on(async {
            // The late commits the killed process queued land now, as the provider's would.
            provider.revive();
            let ended = self
                .steps(
                    &run,
                    eseed,
                    &provider,
                    tools,
                    &mut progress,
                    &mut report,
                    save,
                )
                .await;
            provider.settle().await;
            ended
        })?;
        if ended != Ended::Done {
            return Err(refused("episodes", "a child crashed without being killed"));
        }
        write_synced(&progress_file, &progress);
        Ok(())
    }
}

impl Harness {
    /// The call `run_in_processes(episodes, seed, test, _)` on this harness, as a child and its
    /// parent both compute it (a fixed hash: the same in every process of the binary; not the
    /// directory, which a test may name after its process).
    fn fingerprint(&self, episodes: u32, seed: u64, test: &str) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (format!("{self:?}"), episodes, seed, test).hash(&mut h);
        format!("{:016x}", h.finish())
    }
}

/// Runs one child of episode `n`; `true` if it reached its crash point and was killed.
fn spawn(
    exe: &Path,
    test: &str,
    ep: &Path,
    (n, seed, parent, call): (u32, u64, &str, &str),
    ahead: Duration,
) -> Result<bool, SpecError> {
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(DIR, ep)
        .env(EPISODE, n.to_string())
        .env(SEED, seed.to_string())
        .env(RUN, parent)
        .env(CALL, call)
        .env(AHEAD_MS, ahead.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| refused("test", e))?;
    // What the child writes to stderr is drained as it comes (a full pipe would stall it) and
    // shown if it fails.
    let errors = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
            text
        })
    });
    let (lines, seen) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let started = Instant::now();
    let mut printed = Vec::new();
    let mut ran = false;
    let mut refusal = None;
    let killed = loop {
        let left = CHILD_LIMIT.saturating_sub(started.elapsed());
        match seen.recv_timeout(left) {
            // libtest may have begun the line ("test name ... "): the marker ends it.
            Ok(line) if line.ends_with(CRASH_POINT) => {
                // SIGKILL: nothing after the provider's accept runs, the receipt included.
                child.kill().map_err(|e| refused("episodes", e))?;
                break true;
            }
            Ok(line) if line.ends_with(STARTED) => ran = true,
            Ok(line) if line.contains(REFUSED) => {
                let json = line.split(REFUSED).nth(1).unwrap_or_default();
                refusal = serde_json::from_str::<(Option<String>, String, String)>(json).ok();
            }
            Ok(line) => printed.push(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break false,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(refused("episodes", "a child ran past two minutes: killed"));
            }
        }
    };
    let status = child.wait().map_err(|e| refused("episodes", e))?;
    if status.code() == Some(OTHER_CALL) {
        return Err(refused(
            "test",
            format!("`{test}` calls run_in_processes more than once: its child reached another call first (a child runs the test from its start); give each call a #[test] of its own"),
        ));
    }
    if let (false, Some((tool, field, reason))) = (killed, refusal) {
        return Err(SpecError::new(
            tool.as_deref(),
            &field,
            &format!("{reason} (in the child of episode {n})"),
        ));
    }
    if !killed && (!status.success() || !ran) {
        let err = errors
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        return Err(refused(
            "test",
            format!(
                "the child (`{test} --exact`) {}: is `{test}` the exact name of the #[test] that calls run_in_processes? It printed: {}{}",
                if status.success() { String::from("ran no episode") } else { format!("failed ({status})") },
                printed.join("\n"),
                err
            ),
        ));
    }
    Ok(killed)
}
