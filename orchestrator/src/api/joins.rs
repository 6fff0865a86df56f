//! Failed joins, counted per source address: each is logged with where it
//! came from, and a source that failed `PER_SOURCE` times within a `WINDOW`
//! is answered 429 without its token being looked at until the window ends.
//! All sources together get `TOTAL` failures a window, so a guesser spread
//! over many addresses is slowed too. Successful joins cost nothing.
//!
//! The token is 128 random bits, so this is not what keeps it secret: it
//! keeps a guesser from costing the server a store read and a log line per
//! guess, and makes the guessing visible.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(60);
const PER_SOURCE: u32 = 10;
const TOTAL: u32 = 200;
/// Sources remembered at once; beyond, only the total counts a new one.
const SOURCES: usize = 4096;

#[derive(Default)]
pub struct Joins {
    inner: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    sources: HashMap<IpAddr, Window>,
    total: Option<Window>,
}

#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    failures: u32,
    /// The refusal was logged once for this window.
    told: bool,
}

impl Window {
    fn current(w: Option<Window>, now: Instant) -> Window {
        match w {
            Some(w) if now.duration_since(w.start) < WINDOW => w,
            _ => Window { start: now, failures: 0, told: false },
        }
    }
}

/// How long a refused source should wait.
#[derive(Debug, PartialEq, Eq)]
pub struct Limited {
    pub retry_after: Duration,
}

impl Joins {
    /// Whether a join from `source` may be looked at now.
    pub fn admit(&self, source: IpAddr) -> Result<(), Limited> {
        let now = Instant::now();
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let total = Window::current(c.total, now);
        c.total = Some(total);
        let mine = Window::current(c.sources.get(&source).copied(), now);
        let over = if mine.failures >= PER_SOURCE {
            Some(mine)
        } else if total.failures >= TOTAL {
            Some(total)
        } else {
            None
        };
        let Some(w) = over else { return Ok(()) };
        if !mine.told {
            tracing::warn!(%source, failures = mine.failures, "joins from this address are refused for the rest of the minute (too many failures)");
            if c.sources.len() < SOURCES || c.sources.contains_key(&source) {
                c.sources.insert(source, Window { told: true, ..mine });
            }
        }
        Err(Limited { retry_after: WINDOW.saturating_sub(now.duration_since(w.start)) })
    }

    /// A join from `source` failed (its token was wrong or missing).
    pub fn failed(&self, source: IpAddr, why: &str) {
        tracing::warn!(%source, reason = why, "join refused");
        let now = Instant::now();
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = Window::current(c.total, now);
        total.failures = total.failures.saturating_add(1);
        c.total = Some(total);
        if c.sources.len() >= SOURCES && !c.sources.contains_key(&source) {
            c.sources.retain(|_, w| now.duration_since(w.start) < WINDOW);
        }
        if c.sources.len() < SOURCES || c.sources.contains_key(&source) {
            let mut mine = Window::current(c.sources.get(&source).copied(), now);
            mine.failures = mine.failures.saturating_add(1);
            c.sources.insert(source, mine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_source_that_keeps_failing_waits_out_the_window() {
        let joins = Joins::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().expect("ip"), "192.0.2.2".parse().expect("ip"));
        for _ in 0..PER_SOURCE {
            assert_eq!(joins.admit(a), Ok(()));
            joins.failed(a, "the join token is not valid");
        }
        let refused = joins.admit(a).expect_err("limited");
        assert_eq!(refused.retry_after, WINDOW);
        assert_eq!(joins.admit(b), Ok(()), "another source is not held back by a's failures");
        tokio::time::advance(WINDOW).await;
        assert_eq!(joins.admit(a), Ok(()), "a new window");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_from_many_sources_are_bounded_together() {
        let joins = Joins::default();
        for i in 0..TOTAL {
            let source = IpAddr::from([203, 0, 113, u8::try_from(i).expect("under 256")]);
            joins.failed(source, "the join token is not valid");
        }
        let fresh: IpAddr = "198.51.100.7".parse().expect("ip");
        assert!(joins.admit(fresh).is_err(), "the total is spent");
        tokio::time::advance(WINDOW).await;
        assert_eq!(joins.admit(fresh), Ok(()));
    }
}
