//! Crash on purpose: agent episodes through five retry policies, counting duplicate effects.
//!
//! ```text
//! cargo run --release --all-features --example episodes                     # a table
//! cargo run --release --all-features --example episodes -- --json --episodes 10000 --seed 7
//! cargo run --release --all-features --example episodes -- --svg docs/img    # the pictures
//! ```
//!
//! Each episode is one agent run of six tool calls (a read, a natural idempotent write, two keyed
//! writes, an unkeyed write and a multi-step booking) against a simulated provider that applies
//! effects, remembers idempotency keys for 24 h and keeps a sent log that lags 3 s behind. Each
//! attempt may meet a fault, drawn from the seed, the episode, the step and the attempt number
//! (so every policy meets the same faults): 429, 503 before or after the work, timeouts with and
//! without a commit, late commits within a 2 s in-flight bound; and per episode or step: a crash
//! between the provider's accept and the receipt (then a resume on the other worker, whose clock
//! is 5 s ahead, sometimes after the key window), reworded reissues of a call that succeeded,
//! and parallel duplicates from two branches. Everything runs on tokio's paused clock.
//!
//! `stormguard` and `stormguard-readback` run the real layers: `Retry` on a shared budget (one
//! run handle per episode), `ReceiptGuardLayer` on an `InMemoryStore` whose clock is the simulated
//! one (or SQLite files with `--sqlite DIR`), a `CircuitBreaker` per tool.

#[path = "../common/pictures.rs"]
mod pictures;
#[path = "provider.rs"]
mod provider;
#[path = "sim.rs"]
mod sim;

use provider::Faults;
use sim::{Policy, Stats};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut json = false;
    let (mut episodes, mut seed) = (10_000u32, 7u64);
    let (mut svg_dir, mut sqlite_dir) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next().cloned().unwrap_or_else(|| {
                eprintln!("episodes: {name} needs a value");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--json" => json = true,
            "--episodes" => episodes = parse(&value("--episodes"), "--episodes"),
            "--seed" => seed = parse(&value("--seed"), "--seed"),
            "--svg" => svg_dir = Some(std::path::PathBuf::from(value("--svg"))),
            "--sqlite" => sqlite_dir = Some(std::path::PathBuf::from(value("--sqlite"))),
            other => {
                eprintln!(
                    "episodes: unknown argument {other:?} (--json, --episodes N, --seed S, --svg DIR, --sqlite DIR)"
                );
                std::process::exit(2);
            }
        }
    }
    if episodes == 0 {
        eprintln!("episodes: --episodes must be at least 1");
        std::process::exit(2);
    }
    if let Some(dir) = &sqlite_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("episodes: cannot create {}: {e}", dir.display());
            std::process::exit(2);
        }
    }
    let wall = std::time::Instant::now();
    let rows: Vec<(Policy, Stats)> = Policy::ALL
        .iter()
        .map(|&policy| {
            let stats = paused().block_on(sim::run(
                policy,
                seed,
                episodes,
                Faults::default(),
                sqlite_dir
                    .as_deref()
                    .filter(|_| matches!(policy, Policy::Stormguard | Policy::StormguardReadback)),
            ));
            (policy, stats)
        })
        .collect();
    for (policy, s) in &rows {
        if json {
            println!("{}", line(*policy, seed, s));
        }
    }
    if !json {
        table(&rows, seed, wall.elapsed());
    }
    if let Some(dir) = svg_dir {
        let rates: Vec<pictures::Rates> = rows
            .iter()
            .map(|(p, s)| pictures::Rates {
                policy: p.name(),
                episodes: s.episodes,
                duplicated: s.rate(s.episodes_duplicated),
                silent: s.rate(s.silent_duplicates),
                escalated: s.rate(s.escalated),
            })
            .collect();
        if let Err(e) = pictures::rates(&dir, &rates) {
            eprintln!("episodes: writing the pictures failed: {e}");
            std::process::exit(1);
        }
    }
}

fn parse<T: std::str::FromStr>(v: &str, name: &str) -> T {
    v.parse().unwrap_or_else(|_| {
        eprintln!("episodes: {name} takes a number, got {v:?}");
        std::process::exit(2)
    })
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

fn line(policy: Policy, seed: u64, s: &Stats) -> String {
    let escalations: serde_json::Map<String, serde_json::Value> = s
        .escalations
        .iter()
        .map(|(code, (n, hint))| {
            (
                code.to_string(),
                serde_json::json!({ "count": n, "hint": hint }),
            )
        })
        .collect();
    serde_json::json!({
        "policy": policy.name(),
        "seed": seed,
        "episodes": s.episodes,
        "effects_intended": s.effects_intended,
        "duplicate_effects": s.duplicate_effects,
        "duplicate_rate": s.rate(s.episodes_duplicated),
        "silent_duplicate_rate": s.rate(s.silent_duplicates),
        "escalated_rate": s.rate(s.escalated),
        "failed_rate": s.rate(s.failed),
        "calls_per_episode": s.provider_calls as f64 / f64::from(s.episodes),
        "retries_per_episode": s.repeats as f64 / f64::from(s.episodes),
        "escalations": escalations,
        "faults": s.faults,
    })
    .to_string()
}

fn table(rows: &[(Policy, Stats)], seed: u64, wall: std::time::Duration) {
    println!(
        "{:<20} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "policy",
        "episodes",
        "effects",
        "dup. eff.",
        "dup. rate",
        "silent",
        "escalated",
        "failed",
        "calls/ep",
        "retries"
    );
    for (policy, s) in rows {
        println!(
            "{:<20} {:>8} {:>9} {:>10} {:>9.2}% {:>9.2}% {:>9.2}% {:>7.2}% {:>8.2} {:>8.2}",
            policy.name(),
            s.episodes,
            s.effects_intended,
            s.duplicate_effects,
            100.0 * s.rate(s.episodes_duplicated),
            100.0 * s.rate(s.silent_duplicates),
            100.0 * s.rate(s.escalated),
            100.0 * s.rate(s.failed),
            s.provider_calls as f64 / f64::from(s.episodes),
            s.repeats as f64 / f64::from(s.episodes),
        );
    }
    println!("\nseed {seed}, {:.1} s", wall.as_secs_f64());
    for (policy, s) in rows {
        for (code, (n, hint)) in &s.escalations {
            println!("{:<20} escalated {n:>5} x {code}: {hint}", policy.name());
        }
    }
    if let Some((_, s)) = rows.first() {
        let faults: Vec<String> = s.faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("faults met (naive run): {}", faults.join(", "));
    }
}
