//! Restart backoff, as the kubelet does it: a container that exited is
//! restarted at once the first time (a liveness failure of a service must
//! not cost it `base` of downtime), then after `base` (10 s), doubling with
//! every further consecutive crash, capped (5 min); a container that ran for
//! `reset_after` (10 min, twice the cap) before it exited starts again from
//! an immediate restart.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: Duration::from_secs(10), cap: Duration::from_secs(300), reset_after: Duration::from_secs(600) }
    }
}

impl Backoff {
    /// The delay before the restart that follows `streak` consecutive crashes
    /// (streak 0: the first crash, restarted at once).
    pub(crate) fn delay(&self, streak: u32) -> Duration {
        match streak {
            0 => Duration::ZERO,
            n => pinion_wire::backoff::Doubling::new(self.base, self.cap).delay(n - 1),
        }
    }

    /// Whether a run this long resets the streak.
    pub(crate) fn resets_after(&self, ran: Duration) -> bool {
        ran >= self.reset_after
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_base_to_cap() {
        let b = Backoff::default();
        let check = |streak: u32, secs: u64| assert_eq!(b.delay(streak), Duration::from_secs(secs), "streak {streak}");
        check(0, 0);
        check(1, 10);
        check(2, 20);
        check(3, 40);
        check(4, 80);
        check(5, 160);
        check(6, 300);
        check(7, 300);
        check(u32::MAX, 300);
    }

    #[test]
    fn configurable_base_for_tests() {
        let b = Backoff { base: Duration::from_millis(5), cap: Duration::from_millis(40), reset_after: Duration::MAX };
        let got: Vec<u128> = (0..6).map(|s| b.delay(s).as_millis()).collect();
        assert_eq!(got, vec![0, 5, 10, 20, 40, 40]);
    }

    #[test]
    fn long_runs_reset_the_streak() {
        let b = Backoff::default();
        assert!(!b.resets_after(Duration::from_secs(599)));
        assert!(b.resets_after(Duration::from_secs(600)));
    }
}
