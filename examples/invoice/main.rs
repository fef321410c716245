//! The worked example, crash included: an invoice email, a SIGKILL, and a resume.
//!
//! ```text
//! cargo run --release --features sqlite --example invoice            # the table of moments
//! cargo run --release --features sqlite --example invoice -- --json  # one JSON line per path
//! ```
//!
//! See `run.rs` for what happens. Expected: the naive path delivers 2 emails and reports
//! success; the receipts path delivers 1. Then the same email against a provider that takes no
//! key, behind a proxy that answers 503 after forwarding: `naive-503` retries it (2 emails,
//! success reported); `receipts-503` delivers 1 and escalates `outcome_unknown`.

mod run;

use run::{Path_, Report};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn child_command(path: Path_, provider: SocketAddr, dir: &Path, crash_window: bool) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args(["--child", path.name(), &provider.to_string()])
        .arg(dir)
        .arg(if crash_window {
            "crash-window"
        } else {
            "no-window"
        });
    cmd
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if args.get(1).map(String::as_str) == Some("--child") {
        let path = Path_::parse(&args[2]).expect("path");
        let provider: SocketAddr = args[3].parse().expect("provider address");
        let dir = std::path::PathBuf::from(&args[4]);
        let window = if args[5] == "crash-window" {
            Duration::from_secs(30)
        } else {
            Duration::ZERO
        };
        if let Err(e) = rt.block_on(run::child(path, provider, dir, window)) {
            run::emit(&serde_json::json!({"event": "run_failed", "error": e.to_string()}));
            std::process::exit(1);
        }
        return;
    }

    let json = args.iter().any(|a| a == "--json");
    let reports: Vec<Report> = rt.block_on(async {
        let started = Instant::now();
        let mut provider = run::start_provider(started).await;
        let mut reports = Vec::new();
        for path in [Path_::Naive, Path_::Receipts] {
            reports.push(run::run_path(path, &mut provider, started, &child_command).await);
        }
        for path in [Path_::Naive503, Path_::Receipts503] {
            reports.push(run::run_503_path(path, &mut provider, started).await);
        }
        reports
    });
    for r in &reports {
        if json {
            println!("{}", serde_json::to_string(r).expect("json"));
            continue;
        }
        println!(
            "\n== {} path: {} email(s) delivered, run reported {}",
            r.path,
            r.emails_delivered,
            if r.run_reported_success {
                "success"
            } else {
                "failure"
            }
        );
        println!(
            "{:>8}  {:<16} {:<100} state it leaves",
            "t (ms)", "moment", "what happened"
        );
        for m in &r.moments {
            println!(
                "{:>8}  {:<16} {:<100} {}",
                m.t_ms, m.moment, m.what, m.state
            );
        }
    }
}
