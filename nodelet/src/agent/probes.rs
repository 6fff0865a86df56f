//! A running container's probes as the planner sees them: which run is due
//! when, what each result means (`specs::probe::ProbeTracker`), and whether
//! the container is ready. Pure: times are `Instant`s the loop passes in, and
//! running a probe is the executor's (`super::prober`).
//!
//! As the kubelet: a startup probe runs first; liveness and readiness begin
//! only once it succeeded (their initial delays count from then). Without a
//! readiness probe a started container is ready.

use std::time::Duration;

use specs::probe::{Probe, ProbeKind, ProbeResult, ProbeTracker, ProbeVerdict};
use specs::Container;
use tokio::time::Instant;

/// One probe's tracker and whether a run of it is in flight.
#[derive(Debug, Clone)]
struct Slot {
    probe: Probe,
    tracker: ProbeTracker,
    in_flight: bool,
}

impl Slot {
    fn new(kind: ProbeKind, probe: &Probe) -> Slot {
        Slot { probe: probe.clone(), tracker: ProbeTracker::new(kind, probe), in_flight: false }
    }
}

/// The probes of one incarnation of a container.
#[derive(Debug, Clone)]
pub(crate) struct Probes {
    /// When the incarnation started running: the startup probe's origin.
    since: Instant,
    /// When the startup probe succeeded (`since` without one): liveness's
    /// and readiness's origin. `None` while starting.
    started: Option<Instant>,
    startup: Option<Slot>,
    liveness: Option<Slot>,
    readiness: Option<Slot>,
}

/// What a result did to the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing to do beyond the bookkeeping (readiness may have changed).
    Recorded,
    /// Liveness or startup reached its failure threshold: restart it.
    Restart,
}

impl Probes {
    pub(crate) fn new(container: &Container, since: Instant) -> Probes {
        let slot = |kind: ProbeKind, p: &Option<Probe>| p.as_ref().map(|p| Slot::new(kind, p));
        let startup = slot(ProbeKind::Startup, &container.startup_probe);
        let liveness = slot(ProbeKind::Liveness, &container.liveness_probe);
        let readiness = slot(ProbeKind::Readiness, &container.readiness_probe);
        Probes { since, started: if startup.is_some() { None } else { Some(since) }, startup, liveness, readiness }
    }

    fn slot(&self, kind: ProbeKind) -> Option<&Slot> {
        match kind {
            ProbeKind::Startup => self.startup.as_ref(),
            ProbeKind::Liveness => self.liveness.as_ref(),
            ProbeKind::Readiness => self.readiness.as_ref(),
        }
    }

    fn slot_mut(&mut self, kind: ProbeKind) -> Option<&mut Slot> {
        match kind {
            ProbeKind::Startup => self.startup.as_mut(),
            ProbeKind::Liveness => self.liveness.as_mut(),
            ProbeKind::Readiness => self.readiness.as_mut(),
        }
    }

    /// The origin of `kind`'s times, once it may run.
    fn origin(&self, kind: ProbeKind) -> Option<Instant> {
        match kind {
            ProbeKind::Startup => Some(self.since),
            ProbeKind::Liveness | ProbeKind::Readiness => self.started,
        }
    }

    /// When `kind` runs next (`None`: not yet, never again, or in flight).
    fn due_at(&self, kind: ProbeKind) -> Option<Instant> {
        let slot = self.slot(kind)?;
        if slot.in_flight {
            return None;
        }
        Some(self.origin(kind)? + slot.tracker.next_due()?)
    }

    /// The probes due at `now`, each marked in flight, with the time its run
    /// begins (what `record` takes back) and its definition.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<(ProbeKind, Instant, Probe)> {
        let mut due = Vec::new();
        for kind in [ProbeKind::Startup, ProbeKind::Liveness, ProbeKind::Readiness] {
            if self.due_at(kind).is_some_and(|t| t <= now) {
                if let Some(slot) = self.slot_mut(kind) {
                    slot.in_flight = true;
                    due.push((kind, now, slot.probe.clone()));
                }
            }
        }
        due
    }

    /// The earliest time a probe is due, for the loop's timer.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        [ProbeKind::Startup, ProbeKind::Liveness, ProbeKind::Readiness].into_iter().filter_map(|k| self.due_at(k)).min()
    }

    /// Takes the result of `kind`'s run that began at `at`.
    pub(crate) fn record(&mut self, kind: ProbeKind, at: Instant, result: ProbeResult) -> Outcome {
        let Some(origin) = self.origin(kind) else { return Outcome::Recorded };
        let Some(slot) = self.slot_mut(kind) else { return Outcome::Recorded };
        slot.in_flight = false;
        let verdict = slot.tracker.record(at.saturating_duration_since(origin), result);
        match verdict {
            ProbeVerdict::Restart => Outcome::Restart,
            ProbeVerdict::Started => {
                // Liveness and readiness count from here; a result a moment
                // later than `at` changes nothing that matters.
                self.started.get_or_insert(at);
                Outcome::Recorded
            }
            _ => Outcome::Recorded,
        }
    }

    /// Ready: started, and its readiness probe (if any) says so.
    pub(crate) fn ready(&self) -> bool {
        self.started.is_some() && self.readiness.as_ref().is_none_or(|r| r.tracker.verdict() == ProbeVerdict::Ready)
    }

    /// Whether it has any probe at all.
    pub(crate) fn any(&self) -> bool {
        self.startup.is_some() || self.liveness.is_some() || self.readiness.is_some()
    }
}

/// A probe's run may take its timeout and a margin for starting it (an exec
/// helper, a thread) before the executor gives up on it.
pub(crate) fn limit(probe: &Probe) -> Duration {
    probe.timeout() + Duration::from_secs(2)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use specs::probe::{ExecAction, ProbeResult::*};

    fn probe(period: u32, failures: u32, delay: u32) -> Probe {
        Probe {
            exec: Some(ExecAction { command: vec!["true".into()] }),
            period_seconds: Some(period),
            failure_threshold: Some(failures),
            initial_delay_seconds: Some(delay),
            ..Default::default()
        }
    }

    fn container(startup: Option<Probe>, liveness: Option<Probe>, readiness: Option<Probe>) -> Container {
        Container {
            name: "c".into(),
            startup_probe: startup,
            liveness_probe: liveness,
            readiness_probe: readiness,
            ..Default::default()
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Runs every due probe at each second of `seconds`, answering with
    /// `answer(kind, second)`, and returns (second, kind, outcome, ready) for
    /// each run.
    fn drive(
        p: &mut Probes,
        t0: Instant,
        seconds: u64,
        answer: impl Fn(ProbeKind, u64) -> ProbeResult,
    ) -> Vec<(u64, ProbeKind, Outcome, bool)> {
        let mut seen = Vec::new();
        for sec in 0..=seconds {
            let now = t0 + s(sec);
            for (kind, at, _) in p.take_due(now) {
                let out = p.record(kind, at, answer(kind, sec));
                seen.push((sec, kind, out, p.ready()));
            }
        }
        seen
    }

    #[test]
    fn without_probes_a_running_container_is_ready_and_nothing_is_due() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(None, None, None), t0);
        assert!(p.ready());
        assert!(!p.any());
        assert_eq!(p.next_wake(), None);
        assert!(p.take_due(t0 + s(100)).is_empty());
    }

    #[test]
    fn readiness_fails_until_it_succeeds_then_the_container_is_ready() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(None, None, Some(probe(1, 3, 2))), t0);
        assert!(!p.ready(), "not ready before the first success");
        assert_eq!(p.next_wake(), Some(t0 + s(2)), "initialDelaySeconds");
        let seen = drive(&mut p, t0, 6, |_, sec| if sec >= 4 { Success } else { Failure });
        let ready: Vec<(u64, bool)> = seen.iter().map(|r| (r.0, r.3)).collect();
        assert_eq!(ready, vec![(2, false), (3, false), (4, true), (5, true), (6, true)]);
        assert!(seen.iter().all(|r| r.2 == Outcome::Recorded), "readiness never restarts");
    }

    #[test]
    fn liveness_restarts_at_its_failure_threshold_and_then_stops() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(None, Some(probe(2, 3, 0)), None), t0);
        let seen = drive(&mut p, t0, 10, |_, _| Failure);
        let runs: Vec<(u64, Outcome)> = seen.iter().map(|r| (r.0, r.2.clone())).collect();
        assert_eq!(runs, vec![(0, Outcome::Recorded), (2, Outcome::Recorded), (4, Outcome::Restart)]);
        assert_eq!(p.next_wake(), None, "a restarted container's tracker is done");
    }

    #[test]
    fn liveness_and_readiness_wait_for_the_startup_probe() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(Some(probe(1, 10, 0)), Some(probe(1, 1, 0)), Some(probe(1, 1, 0))), t0);
        // Startup fails twice, then succeeds at 2 s; liveness would restart
        // at its first failure, so it must not have run before.
        let seen = drive(&mut p, t0, 4, |kind, sec| match kind {
            ProbeKind::Startup if sec < 2 => Failure,
            _ => Success,
        });
        let kinds: Vec<(u64, ProbeKind)> = seen.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, ProbeKind::Startup),
                (1, ProbeKind::Startup),
                (2, ProbeKind::Startup),
                (3, ProbeKind::Liveness),
                (3, ProbeKind::Readiness),
                (4, ProbeKind::Liveness),
                (4, ProbeKind::Readiness),
            ]
        );
        assert!(p.ready());
    }

    #[test]
    fn a_startup_probe_that_never_succeeds_restarts() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(Some(probe(1, 2, 0)), None, None), t0);
        assert!(!p.ready(), "not ready while starting, even without a readiness probe");
        let seen = drive(&mut p, t0, 3, |_, _| Timeout);
        assert_eq!(seen.last().map(|r| r.2.clone()), Some(Outcome::Restart));
    }

    #[test]
    fn a_run_in_flight_is_not_started_twice() {
        let t0 = Instant::now();
        let mut p = Probes::new(&container(None, Some(probe(1, 3, 0)), None), t0);
        assert_eq!(p.take_due(t0).len(), 1);
        assert!(p.take_due(t0 + s(5)).is_empty(), "still in flight");
        assert_eq!(p.next_wake(), None);
        p.record(ProbeKind::Liveness, t0, Success);
        assert_eq!(p.next_wake(), Some(t0 + s(1)));
    }
}
