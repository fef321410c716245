//! The episodes example's five tool tables through `chaos::Harness`: deterministic, every fault
//! path met, the stormguard tables never duplicate whatever the seed, and each defective table
//! duplicates where its defect is.
#![cfg(feature = "chaos")]

#[path = "../examples/episodes/tables.rs"]
mod tables;

use proptest::prelude::*;
use stormguard::chaos::Report;

fn run(policy: &str, seed: u64, episodes: u32) -> Report {
    tables::harness(policy)
        .unwrap()
        .run(episodes, seed)
        .unwrap()
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    for (policy, _) in tables::POLICIES {
        assert_eq!(run(policy, 11, 300), run(policy, 11, 300), "{policy}");
    }
    // And another seed, other numbers.
    assert_ne!(run("naive", 11, 300), run("naive", 12, 300));
}

#[test]
fn every_fault_path_is_met_in_a_short_run() {
    let report = run("stormguard", 3, 2_000);
    for fault in [
        "refused",
        "rate_limited",
        "reset_after_work",
        "late_commit",
        "crash",
        "crash_in_flight",
        "reworded",
        "parallel",
        "resume_at_once",
        "resume_after_lease",
        "resume_after_key_window",
    ] {
        assert!(
            report.faults.get(fault).copied().unwrap_or(0) > 0,
            "{fault} never met: {report:?}"
        );
    }
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert_eq!(report.lost_work, 0, "{report:?}");
}

#[test]
fn each_defective_table_duplicates_where_its_defect_is() {
    let naive = run("naive", 7, 1_000);
    // Retried on any failure with no key: every write is sent again somewhere.
    for tool in [
        "send_invoice",
        "charge_card",
        "post_ticket",
        "book_shipment",
    ] {
        assert!(
            naive.duplicates_by_tool.contains_key(tool),
            "{tool}: {naive:?}"
        );
    }
    assert!(naive.silent_duplicates > 0, "{naive:?}");
    let random = run("random-key", 7, 1_000);
    assert!(
        random.duplicates_by_tool.contains_key("send_invoice"),
        "{random:?}"
    );
    // One read of a log 3 s behind, a second after the commit, finds nothing: the ticket (which
    // no key protects) is posted again; the keyed writes are protected by the provider's key.
    let readback = run("readback-only", 7, 1_000);
    assert!(
        readback.duplicates_by_tool.contains_key("post_ticket"),
        "{readback:?}"
    );
    assert!(
        !readback.duplicates_by_tool.contains_key("send_invoice"),
        "{readback:?}"
    );
    // The sound tables: nothing twice, and what could not be decided escalated.
    for policy in ["stormguard", "stormguard-readback"] {
        let sound = run(policy, 7, 1_000);
        assert_eq!(sound.duplicate_effects, 0, "{policy}: {sound:?}");
        assert!(
            sound.escalations.contains_key("outcome_unknown"),
            "{policy}: {sound:?}"
        );
    }
}

#[test]
fn reading_back_settles_some_of_what_the_plain_table_escalates() {
    let plain = run("stormguard", 7, 2_000);
    let read_back = run("stormguard-readback", 7, 2_000);
    let unknown = |r: &Report| r.escalations.get("outcome_unknown").copied().unwrap_or(0);
    assert!(
        unknown(&read_back) < unknown(&plain),
        "{plain:?}\n{read_back:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn the_stormguard_tables_never_duplicate_whatever_the_seed(seed in any::<u64>()) {
        for policy in ["stormguard", "stormguard-readback"] {
            let report = run(policy, seed, 300);
            prop_assert_eq!(report.duplicate_effects, 0, "{} seed {}: {:?}", policy, seed, report);
            prop_assert_eq!(report.lost_work, 0, "{} seed {}: {:?}", policy, seed, report);
        }
    }
}
