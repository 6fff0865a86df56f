//! A TCP relay a test can cut: while cut, live connections are closed and new
//! ones are closed at once, so the far side is unreachable (not merely slow),
//! as when an edge site loses its uplink.
//!
//! Or silence: `silence_established` makes every connection open at that
//! moment stop forwarding, in both directions, while staying open (what it
//! reads is dropped, nothing is closed), and new connections are forwarded
//! as before, as when a NAT or firewall forgets an idle flow. Only a bound on
//! silence at either end notices.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    lines: Arc<Lines>,
}

/// Which connections still forward: those numbered at or above
/// `silent_below` (numbers count up from 0 in accept order).
#[derive(Default)]
struct Lines {
    next: AtomicU64,
    silent_below: AtomicU64,
}

impl Relay {
    /// Listens on a free loopback port and forwards every connection to `to`.
    pub fn start(to: SocketAddr) -> std::io::Result<Relay> {
        Relay::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?, to)
    }

    /// Listens on `at` (another loopback address, say, with the port of the
    /// service it stands in front of) and forwards every connection to `to`.
    pub fn start_on(at: SocketAddr, to: SocketAddr) -> std::io::Result<Relay> {
        Relay::serve(TcpListener::bind(at)?, to)
    }

    /// Forwards every connection `listener` accepts to `to` (a test that
    /// needs the relay's port before it knows where to forward binds first).
    pub fn serve(listener: TcpListener, to: SocketAddr) -> std::io::Result<Relay> {
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let lines = Arc::new(Lines::default());
        let (flag, numbers) = (cut.clone(), lines.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if flag.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(to) else { continue };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                let number = numbers.next.fetch_add(1, Ordering::SeqCst);
                for (from, into) in [(c2, s2), (server, client)] {
                    let (flag, numbers) = (flag.clone(), numbers.clone());
                    std::thread::spawn(move || pump(from, into, &flag, &numbers, number));
                }
            }
        });
        Ok(Relay { addr, cut, lines })
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Every connection open now stops forwarding for good but stays open;
    /// later ones are forwarded. Returns how many connections went silent.
    pub fn silence_established(&self) -> u64 {
        let now = self.lines.next.load(Ordering::SeqCst);
        self.lines.silent_below.store(now, Ordering::SeqCst);
        now
    }

    /// Connections accepted (and forwarded) so far.
    pub fn connections(&self) -> u64 {
        self.lines.next.load(Ordering::SeqCst)
    }
}

fn pump(mut from: TcpStream, mut into: TcpStream, cut: &AtomicBool, lines: &Lines, number: u64) {
    // The timeout only lets the loop notice a cut on an idle connection.
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16384];
    while !cut.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => {
                if number < lines.silent_below.load(Ordering::SeqCst) {
                    // A silent path carries no FIN either: the far side
                    // learns nothing, and this end stays open.
                    return;
                }
                break;
            }
            Ok(n) => {
                if number < lines.silent_below.load(Ordering::SeqCst) {
                    continue; // swallowed
                }
                if into.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // A silent path sends no FIN for a read error either.
            Err(_) if number < lines.silent_below.load(Ordering::SeqCst) => return,
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = into.shutdown(Shutdown::Both);
}
