//! The ledger: lending and taking back, nested installs, joins.
use super::*;
use std::time::Duration;

fn read_op() -> Option<Ledger> {
    Some(Ledger::inline(
        OpState::new(3, ToolClass::Read, false, None).with_caller(1),
    ))
}

#[test]
fn an_installed_ledger_comes_back_with_every_change_made_while_it_was_lent() {
    for class in ToolClass::ALL {
        for closed in ErrorCode::ALL {
            let mut slot = Some(Ledger::inline(OpState::new(100, class, false, None)));
            in_scope(&mut slot, || {
                with_current(|op| {
                    op.grant_retry();
                    op.note_key(7);
                    op.close(closed);
                    op.set_caller(BUDGET_ID_MASK);
                    op.answered_locally();
                })
            });
            let state = slot.as_mut().unwrap().with(|op| *op);
            assert_eq!(
                (state.class, state.closed, state.keyed),
                (class, Some(closed), true)
            );
            assert_eq!(
                (state.retries, state.key, state.caller),
                (1, 7, BUDGET_ID_MASK)
            );
            assert_eq!((state.local, state.sent_attempts()), (1, 1));
            assert!(with_current(|_| ()).is_none(), "nothing is left installed");
        }
    }
}

#[test]
fn nested_installs_restore_the_outer_operation() {
    let mut outer = read_op();
    let mut inner = Some(Ledger::inline(OpState::new(
        5,
        ToolClass::UnkeyedWrite,
        false,
        Some(Instant::now()),
    )));
    in_scope(&mut outer, || {
        with_current(|op| {
            op.grant_retry();
            op.note_key(42);
            op.set_caller(7);
        });
        in_scope(&mut inner, || {
            assert_eq!(with_current(|op| op.max_attempts), Some(5));
            let shared = share_current().unwrap();
            lock(&shared).retries = 2;
            // The inner operation's state never leaks into the outer one.
            lock(&shared).set_caller(9);
            lock(&shared).note_key(43);
        });
        assert_eq!(
            with_current(|op| (op.max_attempts, op.retries, op.key, op.caller)),
            Some((3, 1, 42, 7))
        );
    });
    assert!(with_current(|_| ()).is_none());
    let Some(Ledger::Shared(shared)) = inner.take() else {
        unreachable!("shared above")
    };
    let state = *lock(&shared);
    assert_eq!((state.retries, state.caller, state.key), (2, 9, 43));
    let outer = outer
        .as_mut()
        .unwrap()
        .with(|op| (op.retries, op.key, op.caller));
    assert_eq!(outer, (1, 42, 7));
}

#[test]
fn a_joined_deadline_is_the_earliest_and_stays_in_its_operation() {
    let now = Instant::now();
    let outer_deadline = now + Duration::from_secs(10);
    let mut outer = Some(Ledger::inline(OpState::new(
        3,
        ToolClass::Read,
        false,
        Some(outer_deadline),
    )));
    let mut inner = read_op();
    in_scope(&mut outer, || {
        // A later deadline does not loosen it; an earlier one tightens it.
        join_current(
            ToolClass::Read,
            false,
            Some(now + Duration::from_secs(20)),
            1,
            None,
        );
        assert_eq!(with_current(|op| op.deadline), Some(Some(outer_deadline)));
        in_scope(&mut inner, || {
            // Inside an operation of its own (no deadline), a layer sets one.
            let soon = Some(now + Duration::from_secs(1));
            let (joined, ..) = join_current(ToolClass::UnkeyedWrite, true, soon, 1, None);
            let was = ToolClass::Read;
            assert_eq!(joined, Joined::Tightened { was });
            assert_eq!(with_current(|op| op.deadline), Some(soon));
        });
        // The outer operation keeps its own deadline and class.
        assert_eq!(
            with_current(|op| (op.deadline, op.class, op.keyed)),
            Some((Some(outer_deadline), ToolClass::Read, false))
        );
    });
    let inner = inner
        .as_mut()
        .unwrap()
        .with(|op| (op.deadline, op.class, op.keyed));
    let soon = Some(now + Duration::from_secs(1));
    assert_eq!(inner, (soon, ToolClass::UnkeyedWrite, true));
}

#[test]
fn the_hot_path_join_reports_a_tightened_class() {
    let mut op = read_op();
    in_scope(&mut op, || {
        assert_eq!(
            join_current(ToolClass::Read, false, None, 1, None).0,
            Joined::Yes
        );
        let (joined, ..) = join_current(ToolClass::KeyedWrite, true, None, 1, None);
        assert_eq!(
            joined,
            Joined::Tightened {
                was: ToolClass::Read
            }
        );
        assert_eq!(
            join_current(ToolClass::Read, false, None, 1, None).0,
            Joined::Yes
        );
    });
    let op = op.as_mut().unwrap().with(|op| (op.class, op.keyed));
    assert_eq!(op, (ToolClass::KeyedWrite, true));
    assert_eq!(
        join_current(ToolClass::Read, false, None, 1, None).0,
        Joined::No
    );
}

#[test]
fn a_layer_credits_its_budget_only_when_it_differs_from_its_callers() {
    // Opened on budget 1; layers join on 1, 2, 2, then a layer on 1 below them.
    let mut op = read_op();
    in_scope(&mut op, || {
        assert!(!join_current(ToolClass::Read, false, None, 1, None).1);
        assert!(join_current(ToolClass::Read, false, None, 2, None).1);
        assert!(!join_current(ToolClass::Read, false, None, 2, None).1);
        assert!(join_current(ToolClass::Read, false, None, 1, None).1);
        // The slow path (a deadline) decides the same.
        let soon = Some(Instant::now() + Duration::from_secs(1));
        assert!(!join_current(ToolClass::Read, false, soon, 1, None).1);
        assert!(join_current(ToolClass::Read, false, soon, 3, None).1);
    });
    // With nothing installed, a layer opens its own operation and credits its budget.
    assert_eq!(
        join_current(ToolClass::Read, false, None, 1, None),
        (Joined::No, true, None)
    );
}

#[test]
fn attempts_answered_locally_are_not_reported_as_sent() {
    let mut state = OpState::new(3, ToolClass::KeyedWrite, true, None);
    state.grant_retry();
    state.grant_retry();
    state.answered_locally();
    assert_eq!((state.attempts(), state.sent_attempts()), (3, 2));
    let mut slot = Some(Ledger::inline(state));
    in_scope(&mut slot, || with_current(|op| op.grant_retry()));
    let back = slot.as_mut().unwrap().with(|op| *op);
    assert_eq!((back.attempts(), back.sent_attempts()), (4, 3));
    // Never more local answers than attempts.
    for _ in 0..10 {
        state.answered_locally();
    }
    assert_eq!(state.sent_attempts(), 0);
}

#[test]
fn an_inline_state_lent_under_a_shared_one_does_not_overwrite_the_outer_inline_state() {
    // inline (outer) -> shared (a carried operation) -> inline (an own operation inside it).
    let mut outer = read_op();
    let shared = Arc::new(Mutex::new(OpState::new(7, ToolClass::Read, false, None)));
    let mut middle = Some(Ledger::Shared(shared.clone()));
    let mut inner = Some(Ledger::inline(OpState::new(
        9,
        ToolClass::UnkeyedWrite,
        false,
        None,
    )));
    in_scope(&mut outer, || {
        in_scope(&mut middle, || {
            assert_eq!(with_current(|op| op.max_attempts), Some(7));
            in_scope(&mut inner, || {
                with_current(|op| op.grant_retry());
                assert_eq!(with_current(|op| op.max_attempts), Some(9));
            });
            assert_eq!(with_current(|op| op.max_attempts), Some(7));
        });
        // The outer state, as it was lent, with none of the inner one's changes.
        assert_eq!(
            with_current(|op| (op.max_attempts, op.retries)),
            Some((3, 0))
        );
    });
    assert_eq!(inner.unwrap().with(|op| op.retries), 1);
    assert!(with_current(|_| ()).is_none(), "nothing is left installed");
    // And a later lend starts clean.
    let mut again = read_op();
    in_scope(&mut again, || {
        assert_eq!(with_current(|op| op.max_attempts), Some(3));
    });
}
