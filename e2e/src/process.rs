//! A child process the test owns: killed (SIGKILL) and reaped when dropped,
//! so a failing test leaves no server, agent or client behind.

use std::process::Child;

pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
