//! Sync ids: a write that got no answer is sent again, as it was, before anything new.
//!
//! A sync that times out has not failed: Redis may still run it (a slow script, a `DEBUG SLEEP`,
//! a stalled server behind a partition). So its batch is neither dropped nor put back to be
//! merged into the next sync: it stays here, with its id, and goes again first; the script
//! remembers the last id it applied for this sender and answers a repeated one from memory. Each
//! batch is applied once, whether its first answer came, came late or never came.

/// The sender's side: the next id and the write that has no answer yet.
#[derive(Debug)]
pub(super) struct Outbox<A> {
    next: u64,
    unanswered: Option<(u64, A)>,
}

impl<A: Clone> Outbox<A> {
    pub(super) fn new() -> Self {
        Outbox {
            next: 1,
            unanswered: None,
        }
    }

    /// The write sent last that got no answer, with its id: send it again before anything new.
    pub(super) fn unanswered(&self) -> Option<(u64, A)> {
        self.unanswered.clone()
    }

    /// A new write, unanswered until [`answered`](Self::answered): its id (never 0).
    pub(super) fn send(&mut self, write: A) -> u64 {
        debug_assert!(
            self.unanswered.is_none(),
            "a new write before the last was answered"
        );
        let id = self.next;
        self.next += 1;
        self.unanswered = Some((id, write));
        id
    }

    /// The last write's answer came.
    pub(super) fn answered(&mut self) {
        self.unanswered = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_without_an_answer_goes_again_with_its_id_and_then_the_next() {
        let mut out = Outbox::new();
        assert_eq!(out.unanswered(), None);
        let id = out.send("deposit 10");
        assert_eq!(out.unanswered(), Some((id, "deposit 10")));
        // No answer: the same write, the same id, however often it is asked for.
        assert_eq!(out.unanswered(), Some((id, "deposit 10")));
        out.answered();
        assert_eq!(out.unanswered(), None);
        let next = out.send("deposit 3");
        assert!(next > id);
    }
}
