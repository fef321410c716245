//! The fleet demo: N worker processes (8 by default) on this machine sharing one Redis, each
//! scenario run twice: `local` (each process its own budget, quota and breaker) and `fleet`
//! (shared through Redis).
//!
//! `cargo run --release --features redis --example fleet -- --json` prints one JSON line per
//! mode and scenario. It starts a `redis-server` of its own on a free port of 127.0.0.1 (so the
//! `redis-down` scenario can stop it), and the workers as child processes of this binary.
//! `--workers N`, `--scenario NAME` (outage, quota, breaker, redis-down). It exits with 1 when a
//! fleet line misses its goal (`met` false or not judged), so CI fails on it.

mod redis;
mod worker;

use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;
use worker::*;

const SCENARIOS: [&str; 4] = ["outage", "quota", "breaker", "redis-down"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if args.iter().any(|a| a == "--worker") {
        return as_worker(&flag);
    }
    let json = args.iter().any(|a| a == "--json");
    let workers: usize = flag("--workers").and_then(|n| n.parse().ok()).unwrap_or(8);
    let only = flag("--scenario");
    let mut redis = match redis::OwnRedis::start() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fleet demo: {e}");
            std::process::exit(1);
        }
    };
    let mut failed = false;
    for scenario in SCENARIOS
        .iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == **s))
    {
        let local = run_mode(scenario, false, workers, &mut redis);
        let fleet = run_mode(scenario, true, workers, &mut redis);
        for mut line in [local.clone(), fleet.clone()] {
            if line["mode"] == "fleet" {
                let met = judge(scenario, &local, &line, workers);
                // A line that cannot be judged (a worker without a report) fails too.
                failed |= met != Some(true);
                line["met"] = json!(met);
            }
            print_line(&line, json);
        }
    }
    if failed {
        // CI runs the demo: a goal missed fails it.
        eprintln!("fleet demo: a goal was not met (see the `met` fields)");
        std::process::exit(1);
    }
}

fn as_worker(flag: &dyn Fn(&str) -> Option<String>) {
    let job = Job {
        scenario: flag("--scenario").unwrap_or_default(),
        fleet: flag("--mode").as_deref() == Some("fleet"),
        redis: flag("--redis").unwrap_or_default(),
        index: flag("--index").and_then(|n| n.parse().ok()).unwrap_or(0),
        workers: flag("--workers").and_then(|n| n.parse().ok()).unwrap_or(8),
        start_at: flag("--start-at").and_then(|n| n.parse().ok()).unwrap_or(0),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let line = runtime.block_on(worker::run(job));
    println!("{line}");
}

/// Starts the workers for one scenario in one mode, stops and restarts Redis for `redis-down`,
/// and sums what the workers report.
fn run_mode(scenario: &str, fleet: bool, workers: usize, redis: &mut redis::OwnRedis) -> Value {
    let start_at = unix_ms() + 500;
    let exe = std::env::current_exe().expect("this binary's path");
    let children: Vec<_> = (0..workers)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--worker",
                    "--scenario",
                    scenario,
                    "--mode",
                    if fleet { "fleet" } else { "local" },
                ])
                .args([
                    "--redis",
                    &redis.url(),
                    "--index",
                    &i.to_string(),
                    "--workers",
                    &workers.to_string(),
                ])
                .args(["--start-at", &start_at.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker process")
        })
        .collect();
    let mut stopped_at = None;
    let mut restarted_at = None;
    if scenario == "redis-down" {
        sleep_until(start_at + DOWN_AT_MS);
        redis.stop();
        stopped_at = Some(unix_ms() - start_at);
        sleep_until(start_at + UP_AT_MS);
        if let Err(e) = redis.restart() {
            eprintln!("fleet demo: {e}");
        }
        restarted_at = Some(unix_ms() - start_at);
    }
    let reports: Vec<Value> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("the worker's output");
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| json!({ "error": "no report" }))
        })
        .collect();
    let mode = if fleet { "fleet" } else { "local" };
    let mut line = json!({ "mode": mode, "scenario": scenario, "workers": workers });
    summarise(scenario, &reports, &mut line, stopped_at, restarted_at);
    line
}

fn sum(reports: &[Value], field: &str) -> u64 {
    reports.iter().map(|r| r[field].as_u64().unwrap_or(0)).sum()
}

fn summarise(
    scenario: &str,
    reports: &[Value],
    line: &mut Value,
    stopped: Option<u64>,
    restarted: Option<u64>,
) {
    match scenario {
        "outage" => {
            let (ops, calls) = (sum(reports, "ops"), sum(reports, "calls"));
            line["ops"] = json!(ops);
            line["calls"] = json!(calls);
            line["amplification"] = json!(round3(calls as f64 / ops.max(1) as f64));
            line["retries_per_op"] =
                json!(round3((calls - ops.min(calls)) as f64 / ops.max(1) as f64));
        }
        "quota" => {
            let window = reports
                .first()
                .and_then(|r| r["window_s"].as_f64())
                .unwrap_or(1.0);
            let rps = sum(reports, "calls") as f64 / window;
            line["quota_per_s"] = json!(QUOTA_PER_S);
            line["requests_per_s"] = json!(round3(rps));
            line["ratio_to_quota"] = json!(round3(rps / f64::from(QUOTA_PER_S)));
        }
        "breaker" => {
            line["trip_threshold"] = json!(TRIP_THRESHOLD);
            line["calls_before_all_open"] = json!(sum(reports, "calls_before_open"));
            let all_open = reports
                .iter()
                .map(|r| r["opened_ms"].as_u64())
                .collect::<Option<Vec<_>>>();
            line["all_open_ms"] = json!(all_open.and_then(|v| v.into_iter().max()));
            line["calls_total"] = json!(sum(reports, "calls"));
        }
        "redis-down" => redis_down_summary(reports, line, stopped, restarted),
        _ => {}
    }
    let errors: Vec<_> = reports
        .iter()
        .filter(|r| r.get("error").is_some())
        .collect();
    if !errors.is_empty() {
        line["errors"] = json!(errors);
    }
    if line["mode"] == "fleet" {
        line["times_down"] = json!(sum(reports, "times_down"));
    } else if let Some(obj) = line.as_object_mut() {
        // Local workers never ask Redis: whether it was up says nothing about them.
        obj.remove("rejoin_ms");
    }
}

/// Fleet-wide calls per second before, while and after Redis is down; how soon every worker
/// served again after the stop; how soon every worker was back through Redis after the restart.
fn redis_down_summary(
    reports: &[Value],
    line: &mut Value,
    stopped: Option<u64>,
    restarted: Option<u64>,
) {
    let n = (DOWN_SECS * 10) as usize;
    let mut total = vec![0u64; n];
    for r in reports {
        for (i, b) in r["buckets"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .take(n)
        {
            total[i] += b.as_u64().unwrap_or(0);
        }
    }
    let rate = |from_ms: u64, to_ms: u64| {
        let (a, b) = ((from_ms / 100) as usize, (to_ms / 100) as usize);
        round3(total[a..b].iter().sum::<u64>() as f64 / ((to_ms - from_ms) as f64 / 1000.0))
    };
    line["quota_per_s"] = json!(QUOTA_PER_S);
    line["requests_per_s_before"] = json!(rate(500, DOWN_AT_MS));
    line["requests_per_s_down"] = json!(rate(DOWN_AT_MS + 500, UP_AT_MS));
    line["requests_per_s_after"] = json!(rate(UP_AT_MS + 500, DOWN_SECS * 1_000));
    // The longest stretch with no call served by a worker, from the stop to the end.
    let from = (stopped.unwrap_or(DOWN_AT_MS) / 100) as usize;
    let longest_gap = reports
        .iter()
        .map(|r| {
            let b: Vec<u64> = r["buckets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_u64().unwrap_or(0))
                .collect();
            let mut gap = 0;
            let mut run = 0;
            for v in b.iter().skip(from) {
                run = if *v == 0 { run + 100 } else { 0 };
                gap = gap.max(run);
            }
            gap
        })
        .max();
    line["longest_gap_ms"] = json!(longest_gap);
    line["stopped_ms"] = json!(stopped);
    line["restarted_ms"] = json!(restarted);
    let rejoined = reports
        .iter()
        .map(|r| r["up_ms"].as_u64())
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().max());
    line["rejoin_ms"] = json!(rejoined
        .zip(restarted)
        .map(|(up, at)| up.saturating_sub(at)));
}

/// Whether the fleet line meets the goal, against the local line.
fn judge(scenario: &str, local: &Value, fleet: &Value, workers: usize) -> Option<bool> {
    let f = |v: &Value, k: &str| v[k].as_f64();
    match scenario {
        // Goal: fleet amplification <= 1.2, and at most half of local's (read on the retries
        // per operation, amplification - 1: a ratio of calls per operation cannot fall below 1).
        "outage" => Some(
            f(fleet, "amplification")? <= 1.2
                && f(fleet, "retries_per_op")? <= f(local, "retries_per_op")? / 2.0,
        ),
        // Goal: the fleet within 5 % of the quota; local is about N x the quota.
        "quota" => Some(
            (f(fleet, "ratio_to_quota")? - 1.0).abs() <= 0.05
                && f(local, "ratio_to_quota")? > workers as f64 * 0.8,
        ),
        // Goal: calls into a dead dependency before every worker fails fast <= 2 x one worker's
        // trip threshold.
        "breaker" => Some(f(fleet, "calls_before_all_open")? <= 2.0 * f64::from(TRIP_THRESHOLD)),
        // Goal: every worker serves within 1 s of the stop (no gap of a second), and rejoins.
        "redis-down" => Some(
            f(fleet, "longest_gap_ms")? < 1_000.0
                && fleet["rejoin_ms"].as_u64().is_some_and(|ms| ms <= 1_000)
                && f(fleet, "requests_per_s_down")? > 0.0,
        ),
        _ => None,
    }
}

fn print_line(line: &Value, json: bool) {
    if json {
        println!("{line}");
        return;
    }
    let mut text = format!(
        "{:>10} {:>6}",
        line["scenario"].as_str().unwrap_or(""),
        line["mode"].as_str().unwrap_or("")
    );
    if let Some(obj) = line.as_object() {
        for (k, v) in obj {
            if !["scenario", "mode", "workers", "errors"].contains(&k.as_str()) {
                text.push_str(&format!("  {k}={v}"));
            }
        }
    }
    println!("{text}");
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn sleep_until(unix: u64) {
    let now = unix_ms();
    if unix > now {
        std::thread::sleep(Duration::from_millis(unix - now));
    }
}
