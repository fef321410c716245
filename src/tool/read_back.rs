//! [`Bounded`]: the read-back a tool declares (`unknown_outcome = { read_back = { attempts,
//! within_secs } }`), the user's [`ReadBack`] made at most `attempts` times within `within`.

use super::call::Call;
use crate::receipt::{ReadBack, ReadBackResult};
use std::time::Duration;

/// The user's read-back, bounded: a read that cannot tell (`Unknown`) is made again after an
/// even share of `within`, at most `attempts` times in all; past `within` (a read that hangs),
/// the outcome stays unknown and the call is escalated.
#[derive(Clone, Debug)]
pub(super) struct Bounded<RB> {
    pub(super) inner: RB,
    pub(super) attempts: u32,
    pub(super) within: Duration,
}

impl<RB, Res> ReadBack<Call, Res> for Bounded<RB>
where
    RB: ReadBack<Call, Res>,
    Res: Send,
{
    async fn read_back(&self, call: &Call) -> ReadBackResult<Res> {
        let attempts = self.attempts.max(1);
        let pause = self.within / attempts;
        let reads = async {
            for n in 1..=attempts {
                match self.inner.read_back(call).await {
                    ReadBackResult::Unknown if n < attempts => tokio::time::sleep(pause).await,
                    found_or_absent_or_last => return found_or_absent_or_last,
                }
            }
            ReadBackResult::Unknown
        };
        tokio::time::timeout(self.within, reads)
            .await
            .unwrap_or(ReadBackResult::Unknown)
    }
}
