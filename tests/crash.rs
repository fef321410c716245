//! The worked example as a test: a run killed with SIGKILL after the provider accepted the send
//! and before the receipt was written, then resumed. Naive: two emails. Receipts: one.
#![cfg(feature = "sqlite")]

#[path = "../examples/invoice/run.rs"]
mod run;

use run::Path_;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The test binary runs itself as the child process: this entry point is ignored unless asked
/// for by name.
#[test]
#[ignore = "the child process of crash_and_resume; not a test of its own"]
fn crash_child_entry() {
    let get = |k: &str| std::env::var(k).expect(k);
    let path = Path_::parse(&get("SG_PATH")).unwrap();
    let provider: SocketAddr = get("SG_PROVIDER").parse().unwrap();
    let window = if get("SG_WINDOW") == "1" {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run::child(path, provider, get("SG_DIR").into(), window))
        .unwrap();
}

fn child_command(path: Path_, provider: SocketAddr, dir: &Path, crash_window: bool) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "crash_child_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("SG_PATH", path.name())
    .env("SG_PROVIDER", provider.to_string())
    .env("SG_DIR", dir)
    .env("SG_WINDOW", if crash_window { "1" } else { "0" });
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_resume() {
    let started = Instant::now();
    let mut provider = run::start_provider(started).await;

    let naive = run::run_path(Path_::Naive, &mut provider, started, &child_command).await;
    assert!(
        naive.killed_after_send,
        "the run was killed after the provider accepted the send"
    );
    assert_eq!(naive.emails_delivered, 2, "{naive:#?}");
    assert!(
        naive.run_reported_success,
        "and the naive run does not notice"
    );

    let receipts = run::run_path(Path_::Receipts, &mut provider, started, &child_command).await;
    assert!(receipts.killed_after_send);
    assert_eq!(receipts.emails_delivered, 1, "{receipts:#?}");
    assert!(receipts.run_reported_success);
    let crash = receipts
        .moments
        .iter()
        .find(|m| m.moment == "crash")
        .unwrap();
    assert!(
        crash.state.ends_with("intent pending, no receipt"),
        "{}",
        crash.state
    );
    let after = receipts
        .moments
        .iter()
        .find(|m| m.moment == "after")
        .unwrap();
    assert!(after.state.contains("receipt recorded"), "{}", after.state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_after_the_send_is_two_emails_naive_and_never_two_with_receipts() {
    let started = Instant::now();
    let mut provider = run::start_provider(started).await;
    let naive = run::run_503_path(Path_::Naive503, &mut provider, started).await;
    assert_eq!(naive.emails_delivered, 2, "{naive:#?}");
    assert!(
        naive.run_reported_success,
        "and the naive run reports success"
    );

    let guarded = run::run_503_path(Path_::Receipts503, &mut provider, started).await;
    assert_eq!(guarded.emails_delivered, 1, "{guarded:#?}");
    assert!(
        !guarded.run_reported_success,
        "escalated, not reported as success"
    );
    let after = guarded
        .moments
        .iter()
        .find(|m| m.moment == "after")
        .unwrap();
    assert!(
        after.what.contains("outcome_unknown") || after.what.contains("may have taken effect"),
        "{}",
        after.what
    );
    assert!(after.state.contains("intent pending"), "{}", after.state);
}
