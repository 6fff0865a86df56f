//! The one doubling backoff: a wait that starts at `base`, doubles with each
//! consecutive failure and stops growing at `cap`. The node's link (joins,
//! watches, reports), the store's etcd watch, the scheduler's rejected
//! bindings and the node's container restarts all wait this way; each owns
//! its own base and cap.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubling {
    pub base: Duration,
    pub cap: Duration,
}

impl Doubling {
    pub const fn new(base: Duration, cap: Duration) -> Doubling {
        Doubling { base, cap }
    }

    /// The wait after `streak` consecutive failures before this one (0: the
    /// first failure waits `base`). Never more than `cap`, never overflows.
    pub fn delay(&self, streak: u32) -> Duration {
        // 2^31 * base is past any cap; the multiplication saturates beyond.
        let factor = 1u32 << streak.min(31);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait that follows `wait`: twice it, at most `cap`.
    pub fn after(&self, wait: Duration) -> Duration {
        wait.saturating_mul(2).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_base_to_cap() {
        let d = Doubling::new(Duration::from_millis(100), Duration::from_millis(500));
        let got: Vec<u128> = [0, 1, 2, 3, 4, 31, u32::MAX].iter().map(|&s| d.delay(s).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 500, 500, 500, 500]);
    }

    #[test]
    fn after_walks_the_same_steps() {
        let d = Doubling::new(Duration::from_millis(100), Duration::from_millis(500));
        let mut wait = d.base;
        for streak in 0..8 {
            assert_eq!(wait, d.delay(streak), "streak {streak}");
            wait = d.after(wait);
        }
        assert_eq!(d.after(Duration::MAX), d.cap, "no overflow");
    }

    #[test]
    fn a_huge_base_saturates_at_the_cap() {
        let d = Doubling::new(Duration::from_secs(u64::MAX / 2), Duration::from_secs(60));
        assert_eq!(d.delay(40), Duration::from_secs(60));
    }
}
