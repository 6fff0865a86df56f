//! What every listener (the server's API and local listener, a node's
//! endpoint) does with a connection before and while it serves it: seats in
//! bounded pools, and a watchdog over the connection's bytes.
//!
//! Pools: a connection takes a seat in the handshake pool until its TLS
//! handshake ends, then one in the pool of the identity it proved (the
//! kube-apiserver's max-in-flight idea, per class). A pool of unknown callers
//! is full of whoever came last: a new caller evicts the oldest one, so
//! someone who opens connections and sends nothing holds at most the pool,
//! and never for longer than it takes others to arrive. A pool of known
//! callers refuses when full instead. The accept loop itself never waits, so
//! one class can never keep another out of `accept`.
//!
//! The watchdog (`Activity`, `Bounds`, `watch`): the first request byte must
//! come within `first_byte`; a write the peer does not read for
//! `write_stall` ends the connection (the slow reader that held a large
//! reply in memory); a connection where no byte moved either way for `idle`
//! ends; a connection of an unknown caller ends at `lifetime` whatever it
//! does. At the idle and lifetime bounds a request already under way is
//! answered first (`LAST_REPLY_GRACE`). Reads inside a request are bounded by
//! the HTTP layer's own timeouts.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What a full pool does with a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Seat it and evict the oldest seat (unknown callers).
    EvictOldest,
    /// Refuse it (known callers: they are counted, not evicted by each other).
    Refuse,
}

/// A bounded set of connections of one class.
pub struct Pool {
    name: &'static str,
    capacity: usize,
    when_full: WhenFull,
    seats: Mutex<Seats>,
}

#[derive(Default)]
struct Seats {
    next: u64,
    /// Oldest first; the sender tells that seat's connection to end.
    held: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Pool {
    pub fn new(name: &'static str, capacity: usize, when_full: WhenFull) -> Arc<Pool> {
        Arc::new(Pool { name, capacity: capacity.max(1), when_full, seats: Mutex::new(Seats::default()) })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A seat for a new connection, or `None` when the pool is full and refuses.
    pub fn enter(self: &Arc<Self>) -> Option<Seat> {
        let mut seats = self.seats.lock().unwrap_or_else(|p| p.into_inner());
        if seats.held.len() >= self.capacity {
            match self.when_full {
                WhenFull::Refuse => return None,
                WhenFull::EvictOldest => {
                    if let Some((_, tell)) = seats.held.pop_first() {
                        let _ = tell.send(());
                    }
                }
            }
        }
        let id = seats.next;
        seats.next += 1;
        let (tell, evicted) = oneshot::channel();
        seats.held.insert(id, tell);
        Some(Seat { pool: self.clone(), id, evicted })
    }
}

/// A connection's place in a pool; dropping it frees the place.
pub struct Seat {
    pool: Arc<Pool>,
    id: u64,
    evicted: oneshot::Receiver<()>,
}

impl Seat {
    /// Resolves when a newer connection took this seat's place.
    pub async fn evicted(&mut self) {
        // A dropped sender is a seat given back by `Drop`, never while held.
        let _ = (&mut self.evicted).await;
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut seats = self.pool.seats.lock().unwrap_or_else(|p| p.into_inner());
        seats.held.remove(&self.id);
    }
}

/// The time bounds of one connection after its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// From the end of the handshake to the first request byte.
    pub first_byte: Duration,
    /// No byte read or written for this long.
    pub idle: Duration,
    /// A write that the peer does not take for this long.
    pub write_stall: Duration,
    /// The connection's whole life (unknown callers only).
    pub lifetime: Option<Duration>,
}

/// Why the watchdog ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    NoFirstByte,
    Idle,
    WriteStalled,
    Lifetime,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ended::NoFirstByte => "no request arrived in time",
            Ended::Idle => "idle for too long",
            Ended::WriteStalled => "the peer stopped reading",
            Ended::Lifetime => "reached its lifetime",
        })
    }
}

impl Ended {
    /// Whether a request under way is answered before the connection ends.
    /// At a time bound (idle, lifetime) the caller did nothing wrong right
    /// now: cutting a request it just sent looks to it like a network fault
    /// it cannot tell from a lost reply (a POST it may not repeat). It gets
    /// its answer with `connection: close`, within [`LAST_REPLY_GRACE`].
    /// A peer that sends nothing or stops reading gets nothing more.
    pub fn lets_the_reply_finish(self) -> bool {
        matches!(self, Ended::Idle | Ended::Lifetime)
    }
}

/// How long a connection past its time bound has to finish the request it is in.
pub const LAST_REPLY_GRACE: Duration = Duration::from_secs(5);

const NEVER: u64 = u64::MAX;

/// When a connection's bytes last moved, in milliseconds from its start.
pub struct Activity {
    start: Instant,
    read_any: AtomicBool,
    last_moved: AtomicU64,
    /// Since when a write has been waiting for the peer (`NEVER`: none is).
    write_waiting: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            read_any: AtomicBool::new(false),
            last_moved: AtomicU64::new(0),
            write_waiting: AtomicU64::new(NEVER),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NEVER - 1)
    }

    fn read(&self) {
        self.read_any.store(true, Ordering::Relaxed);
        self.last_moved.store(self.now(), Ordering::Relaxed);
    }

    fn wrote(&self) {
        self.write_waiting.store(NEVER, Ordering::Relaxed);
        self.last_moved.store(self.now(), Ordering::Relaxed);
    }

    fn write_blocked(&self) {
        let now = self.now();
        let _ = self.write_waiting.compare_exchange(NEVER, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The bound passed at `now_ms`, else the next moment one could pass.
    fn check(&self, bounds: &Bounds, now_ms: u64) -> Result<u64, Ended> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NEVER / 2);
        let mut deadlines = Vec::with_capacity(4);
        if !self.read_any.load(Ordering::Relaxed) {
            deadlines.push((ms(bounds.first_byte), Ended::NoFirstByte));
        }
        let waiting = self.write_waiting.load(Ordering::Relaxed);
        if waiting != NEVER {
            deadlines.push((waiting.saturating_add(ms(bounds.write_stall)), Ended::WriteStalled));
        }
        deadlines.push((self.last_moved.load(Ordering::Relaxed).saturating_add(ms(bounds.idle)), Ended::Idle));
        if let Some(l) = bounds.lifetime {
            deadlines.push((ms(l), Ended::Lifetime));
        }
        let mut next = NEVER;
        for (at, why) in deadlines {
            if now_ms >= at {
                return Err(why);
            }
            next = next.min(at);
        }
        Ok(next)
    }
}

/// Resolves when one of `bounds` passes on `activity`.
pub async fn watch(activity: Arc<Activity>, bounds: Bounds) -> Ended {
    loop {
        match activity.check(&bounds, activity.now()) {
            Err(why) => return why,
            // Wake at the nearest deadline; bytes that moved since push it on,
            // which the next check sees. A little slack keeps a wake-up just
            // before a deadline from spinning.
            Ok(at) => tokio::time::sleep_until(activity.start + Duration::from_millis(at.saturating_add(5))).await,
        }
    }
}

/// An I/O stream that records its progress in an `Activity`.
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        match &r {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.write_blocked(),
            _ => {}
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        match &r {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.write_blocked(),
            _ => {}
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_pending() {
            self.activity.write_blocked();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        first_byte: Duration::from_secs(5),
        idle: Duration::from_secs(60),
        write_stall: Duration::from_secs(10),
        lifetime: None,
    };

    /// (what happened, as (ms, event) pairs; when checked; the result).
    fn check(events: &[(u64, &str)], at: u64, bounds: Bounds, expected: Result<u64, Ended>) {
        let a = Activity::new();
        for &(t, what) in events {
            match what {
                "read" => {
                    a.read_any.store(true, Ordering::Relaxed);
                    a.last_moved.store(t, Ordering::Relaxed);
                }
                "wrote" => {
                    a.write_waiting.store(NEVER, Ordering::Relaxed);
                    a.last_moved.store(t, Ordering::Relaxed);
                }
                "blocked" => {
                    let _ = a.write_waiting.compare_exchange(NEVER, t, Ordering::Relaxed, Ordering::Relaxed);
                }
                other => panic!("unknown event {other}"),
            }
        }
        assert_eq!(a.check(&bounds, at), expected, "{events:?} at {at}");
    }

    #[test]
    fn bounds() {
        check(&[], 0, B, Ok(5_000));
        check(&[], 5_000, B, Err(Ended::NoFirstByte));
        check(&[(100, "read")], 5_000, B, Ok(60_100));
        check(&[(100, "read")], 60_100, B, Err(Ended::Idle));
        check(&[(100, "read"), (200, "wrote"), (300, "blocked")], 5_000, B, Ok(10_300));
        check(&[(100, "read"), (300, "blocked"), (400, "blocked")], 10_300, B, Err(Ended::WriteStalled));
        // A write that went through clears the stall.
        check(&[(100, "read"), (300, "blocked"), (9_000, "wrote")], 10_300, B, Ok(69_000));
        let anon = Bounds { lifetime: Some(Duration::from_secs(30)), ..B };
        check(&[(100, "read"), (29_000, "wrote")], 30_000, anon, Err(Ended::Lifetime));
    }

    #[test]
    fn a_full_pool_evicts_its_oldest_or_refuses() {
        let evicting = Pool::new("anonymous", 2, WhenFull::EvictOldest);
        let mut first = evicting.enter().expect("seat");
        let _second = evicting.enter().expect("seat");
        let _third = evicting.enter().expect("seat");
        assert_eq!(evicting.seats.lock().expect("lock").held.len(), 2);
        assert!(first.evicted.try_recv().is_ok(), "the oldest was told to go");
        let refusing = Pool::new("admin", 1, WhenFull::Refuse);
        let seat = refusing.enter().expect("seat");
        assert!(refusing.enter().is_none());
        drop(seat);
        assert!(refusing.enter().is_some(), "a seat given back is free again");
    }
}
