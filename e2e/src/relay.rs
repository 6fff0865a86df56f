//! A TCP relay a test can cut: while cut, live connections are closed and new
//! ones are closed at once, so the far side is unreachable (not merely slow),
//! as when an edge site loses its uplink.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on a free loopback port and forwards every connection to `to`.
    pub fn start(to: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if flag.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(to) else { continue };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                for (from, into) in [(c2, s2), (server, client)] {
                    let flag = flag.clone();
                    std::thread::spawn(move || pump(from, into, &flag));
                }
            }
        });
        Ok(Relay { addr, cut })
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut into: TcpStream, cut: &AtomicBool) {
    // The timeout only lets the loop notice a cut on an idle connection.
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16384];
    while !cut.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if into.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = into.shutdown(Shutdown::Both);
}
