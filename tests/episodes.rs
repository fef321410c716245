//! The episode simulator (`examples/episodes`): deterministic, every fault path exercised, and
//! stormguard's policies never duplicate an effect, whatever the seed.

#[path = "../examples/episodes/provider.rs"]
#[allow(dead_code)]
mod provider;
#[path = "../examples/episodes/sim.rs"]
#[allow(dead_code)]
mod sim;

use proptest::prelude::*;
use provider::Faults;
use sim::{Policy, Stats};

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn run(policy: Policy, seed: u64, episodes: u32) -> Stats {
    paused().block_on(sim::run(policy, seed, episodes, Faults::default(), None))
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    for policy in Policy::ALL {
        let a = run(policy, 11, 400);
        let b = run(policy, 11, 400);
        assert_eq!(a, b, "{}", policy.name());
    }
    // And another seed, other numbers.
    assert_ne!(run(Policy::Naive, 11, 400), run(Policy::Naive, 12, 400));
}

#[test]
fn every_fault_path_is_exercised_in_a_short_run() {
    let episodes = 2_000;
    let naive = run(Policy::Naive, 7, episodes);
    for fault in [
        "Throttle",
        "Refuse503",
        "Done503",
        "TimeoutCommitted",
        "TimeoutLost",
        "LateCommit",
        "Crash",
        "crash",
        "parallel_duplicate",
        "reworded_reissue",
        "resume_after_key_window",
        "resume_on_other_worker",
    ] {
        assert!(
            naive.faults.get(fault).copied().unwrap_or(0) > 0,
            "{fault} never fired: {:?}",
            naive.faults
        );
    }
    // Crashes in at least 5 % of the episodes with the default rates.
    assert!(naive.faults["crash"] as f64 >= 0.05 * f64::from(episodes));
    // The stormguard run is scheduled the same crashes (a run that escalates before its crash
    // step never reaches it), and says why it escalates.
    let guarded = run(Policy::Stormguard, 7, episodes);
    assert_eq!(guarded.faults["crash"], naive.faults["crash"]);
    assert!(guarded.faults["Crash"] > 0 && guarded.faults["Crash"] <= guarded.faults["crash"]);
    assert!(guarded.escalated > 0);
    for (why, (n, hint)) in &guarded.escalations {
        assert!(*n > 0 && !hint.is_empty(), "{why}");
        assert!(
            why.contains(": ") && why.contains(", "),
            "{why} names the code, the tool and when"
        );
    }
}

#[test]
fn the_unguarded_policies_duplicate_and_report_success() {
    let episodes = 2_000;
    for policy in [Policy::Naive, Policy::RandomKey] {
        let s = run(policy, 7, episodes);
        assert!(
            s.rate(s.episodes_duplicated) > 0.10,
            "{}: {}",
            policy.name(),
            s.rate(s.episodes_duplicated)
        );
        assert!(s.silent_duplicates > 0);
    }
    let s = run(Policy::ReadbackOnly, 7, episodes);
    assert!(s.duplicate_effects > 0);
}

#[test]
fn stormguard_on_sqlite_files_duplicates_nothing() {
    // Reopened after every crash, on the simulated clock (read from the writer thread inside
    // the runtime). Not bit-for-bit deterministic (the runtime's paused clock may advance while
    // it waits for the writer thread), but never a duplicate; and resumes do take over.

    let dir = std::env::temp_dir().join(format!("stormguard-episodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for policy in [Policy::Stormguard, Policy::StormguardReadback] {
        let s = paused().block_on(sim::run(policy, 5, 300, Faults::default(), Some(&dir)));
        assert_eq!(s.episodes, 300);
        assert_eq!(s.duplicate_effects, 0, "{}", policy.name());
        assert!(s.faults.get("crash").copied().unwrap_or(0) > 0);
        // Leases pass on this clock: no resume is left `in_progress` for ever.
        assert!(
            !s.escalations
                .keys()
                .any(|why| why.starts_with("in_progress")),
            "{:?}",
            s.escalations
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the seed: no duplicate effect under either stormguard policy.
    #[test]
    fn stormguard_never_duplicates_an_effect(seed in any::<u64>()) {
        for policy in [Policy::Stormguard, Policy::StormguardReadback] {
            let s = run(policy, seed, 300);
            prop_assert_eq!(s.duplicate_effects, 0, "{} seed {}", policy.name(), seed);
        }
    }
}
