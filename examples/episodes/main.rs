//! Crash on purpose: agent episodes of five tool tables through `chaos::Harness`, counting
//! duplicate effects.
//!
//! ```text
//! cargo run --release --all-features --example episodes                     # a table
//! cargo run --release --all-features --example episodes -- --json --episodes 10000 --seed 7
//! cargo run --release --all-features --example episodes -- --svg docs/img    # the picture
//! ```
//!
//! Each episode is one agent run of six tool calls (a read, a natural idempotent write, two keyed
//! writes, an unkeyed write and a multi-step booking) against the harness's simulated provider,
//! which is the same for every table: it honours an idempotency key on the keyed writes and the
//! booking (for 24 h), applies a status once per arguments, and posts a ticket on every call
//! (no key support). The five tables declare the same six tools five ways, from "retry
//! everything, no key" to stormguard's defaults; the harness draws the same faults for each
//! (`Harness`'s docs list them): a seed gives the same run.
//!
//! This file is only a user of the library: the tables, the script and the rates are here,
//! everything else is `stormguard::chaos::Harness`.

#[path = "tables.rs"]
mod tables;

use serde_json::json;
use stormguard::chaos::Report;
use tables::{harness, POLICIES};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut json = false;
    let (mut episodes, mut seed) = (10_000u32, 7u64);
    let mut svg_dir = None;
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
            other => {
                eprintln!(
                    "episodes: unknown argument {other:?} (--json, --episodes N, --seed S, --svg DIR)"
                );
                std::process::exit(2);
            }
        }
    }
    if episodes == 0 {
        eprintln!("episodes: --episodes must be at least 1");
        std::process::exit(2);
    }
    let wall = std::time::Instant::now();
    let mut rows = Vec::new();
    for (policy, _) in POLICIES {
        match harness(policy).and_then(|h| h.run(episodes, seed)) {
            Ok(report) => rows.push((policy, report)),
            Err(e) => {
                eprintln!("episodes: the {policy} table: {e}");
                std::process::exit(1);
            }
        }
    }
    if json {
        for (policy, report) in &rows {
            println!("{}", line(policy, seed, report));
        }
    } else {
        table(&rows, seed, wall.elapsed());
    }
    if let Some(dir) = svg_dir {
        let runs: Vec<(&str, &Report)> = rows.iter().map(|(p, r)| (*p, r)).collect();
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("episodes.svg"), Report::svg(&runs)));
        if let Err(e) = written {
            eprintln!("episodes: writing the picture failed: {e}");
            std::process::exit(1);
        }
    }
    // What the example is for: the sound tables never duplicate; the others do.
    let dup = |name: &str| rows.iter().find(|(p, _)| *p == name).map(|(_, r)| r);
    let rate = |r: &Report| r.episodes_duplicated as f64 / f64::from(r.episodes);
    let sound = ["stormguard", "stormguard-readback"]
        .iter()
        .all(|p| dup(p).is_some_and(|r| r.duplicate_effects == 0));
    if !sound {
        eprintln!("episodes: a stormguard table duplicated an effect");
        std::process::exit(1);
    }
    if episodes >= 1_000 {
        let shown = ["naive", "random-key"]
            .iter()
            .all(|p| dup(p).is_some_and(|r| rate(r) > 0.10))
            && dup("readback-only").is_some_and(|r| r.duplicate_effects > 0);
        if !shown {
            eprintln!("episodes: a defective table duplicated less than it should: is the harness counting?");
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

fn per_episode(n: u64, r: &Report) -> f64 {
    n as f64 / f64::from(r.episodes.max(1))
}

fn line(policy: &str, seed: u64, r: &Report) -> String {
    json!({
        "policy": policy,
        "seed": seed,
        "episodes": r.episodes,
        "effects": r.effects,
        "duplicate_effects": r.duplicate_effects,
        "duplicate_rate": per_episode(r.episodes_duplicated, r),
        "silent_duplicates": r.silent_duplicates,
        "escalations_per_episode": per_episode(r.escalations.values().sum(), r),
        "escalations": r.escalations,
        "lost_work": r.lost_work,
        "calls_per_episode": per_episode(r.calls, r),
        "duplicates_by_tool": r.duplicates_by_tool,
        "faults": r.faults,
    })
    .to_string()
}

fn table(rows: &[(&str, Report)], seed: u64, wall: std::time::Duration) {
    println!(
        "{:<20} {:>8} {:>8} {:>10} {:>10} {:>8} {:>11} {:>5} {:>9}",
        "policy",
        "episodes",
        "effects",
        "dup. eff.",
        "dup. rate",
        "silent",
        "escal./ep",
        "lost",
        "calls/ep"
    );
    for (policy, r) in rows {
        println!(
            "{:<20} {:>8} {:>8} {:>10} {:>9.2}% {:>8} {:>11.3} {:>5} {:>9.2}",
            policy,
            r.episodes,
            r.effects,
            r.duplicate_effects,
            100.0 * per_episode(r.episodes_duplicated, r),
            r.silent_duplicates,
            per_episode(r.escalations.values().sum(), r),
            r.lost_work,
            per_episode(r.calls, r),
        );
    }
    println!("\nseed {seed}, {:.1} s", wall.as_secs_f64());
    for ((policy, what), (_, r)) in POLICIES.iter().zip(rows) {
        println!("{policy:<20} {what}");
        for (code, n) in &r.escalations {
            println!("{:<20}   escalated {n:>5} x {code}", "");
        }
        for (tool, n) in &r.duplicates_by_tool {
            println!("{:<20}   duplicated {n:>4} x {tool}", "");
        }
    }
    if let Some((_, r)) = rows.first() {
        let faults: Vec<String> = r.faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("faults met (naive): {}", faults.join(", "));
    }
}
