//! Test-only fault injection: `PINION_FAULT=<point>` in the agent's
//! environment makes the agent die by SIGKILL (as `kill -9` would) exactly at
//! that point of a pod's start or stop, so a whole-system test can check what a
//! restarted agent makes of it. Read once; unset (always, outside tests) a hit
//! costs one load of a `OnceLock` and a compare.
//!
//! Points: `after-checkpoint` (a checkpoint holding a runtime id is durable,
//! its start not yet planned), `after-create` (the shim created the
//! container and has not started it: the shim kills the agent, waits for it to
//! be gone, then goes on as a shim outliving its agent does), `after-start`
//! (the runtime's start returned, the agent has not recorded it) and
//! `during-stop` (a stopped container's process is gone, it is not removed and
//! the checkpoint still holds it).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The variable the points are read from.
pub const ENV: &str = "PINION_FAULT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    AfterCheckpoint,
    AfterCreate,
    AfterStart,
    DuringStop,
}

impl Fault {
    const ALL: [Fault; 4] = [Fault::AfterCheckpoint, Fault::AfterCreate, Fault::AfterStart, Fault::DuringStop];

    fn name(self) -> &'static str {
        match self {
            Fault::AfterCheckpoint => "after-checkpoint",
            Fault::AfterCreate => "after-create",
            Fault::AfterStart => "after-start",
            Fault::DuringStop => "during-stop",
        }
    }

    pub fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s)
    }
}

fn armed() -> Option<Fault> {
    static ARMED: OnceLock<Option<Fault>> = OnceLock::new();
    *ARMED.get_or_init(|| {
        let value = std::env::var(ENV).ok()?;
        let fault = Fault::parse(&value);
        if fault.is_none() {
            tracing::warn!(value, "{ENV} names no fault point; ignored");
        }
        fault
    })
}

/// Whether `point` is the armed fault.
pub(crate) fn is(point: Fault) -> bool {
    armed() == Some(point)
}

/// Dies by SIGKILL when `point` is the armed fault.
pub(crate) fn hit(point: Fault) {
    if is(point) {
        die(point);
    }
}

fn die(point: Fault) {
    tracing::warn!(point = point.name(), "{ENV}: killing this process with SIGKILL");
    let _ = kill(Pid::this(), Signal::SIGKILL);
    // SIGKILL cannot be caught; this only waits for it to land.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// From a shim: SIGKILLs the agent `agent` when `point` is armed and waits
/// (at most 10 s) until it is dead, so what follows happens without an agent.
pub(crate) fn kill_agent_at(point: Fault, agent: i32) {
    if !is(point) || agent <= 1 {
        return;
    }
    tracing::warn!(point = point.name(), agent, "{ENV}: killing the agent with SIGKILL");
    let _ = kill(Pid::from_raw(agent), Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && alive(agent) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A zombie (killed, not yet reaped by its parent) counts as dead.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_parses_from_its_name() {
        for f in Fault::ALL {
            assert_eq!(Fault::parse(f.name()), Some(f));
        }
        assert_eq!(Fault::parse("after-lunch"), None);
        assert_eq!(Fault::parse(""), None);
    }

    #[test]
    fn a_live_process_is_alive_and_a_missing_one_is_not() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(i32::MAX));
    }
}
