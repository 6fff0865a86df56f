//! Backfill, Slurm's rule in its simplest honest form: the first waiting
//! job that does not fit holds a reservation, the earliest time its CPUs
//! are free if every running job ends at its time limit; a job behind it
//! may start ahead only if, by its own time limit, it ends by then, so the
//! first is never delayed. Counted in CPUs over the whole cluster (the
//! scheduler still places each job on nodes as it fits); a running job
//! without a time limit never frees its CPUs here. Pure: times are seconds
//! from now.

use crate::pod::RESOURCE_CPU;
use crate::PodSpec;

/// A running job as the reservation counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub millicpus: i128,
    /// Seconds until its time limit; `None`: it has none.
    pub ends_in: Option<u64>,
}

/// In how many seconds the first waiting job's `need` is free: now (0)
/// when `free` holds it, else when enough running jobs have reached their
/// time limits; `None` when that never happens (jobs without a limit).
pub fn reservation(need: i128, free: i128, running: &[Running]) -> Option<u64> {
    if free >= need {
        return Some(0);
    }
    let mut ending: Vec<(u64, i128)> = running.iter().filter_map(|r| r.ends_in.map(|e| (e, r.millicpus))).collect();
    ending.sort_unstable();
    let mut free = free;
    for (at, cpus) in ending {
        free += cpus;
        if free >= need {
            return Some(at);
        }
    }
    None
}

/// Whether a job of `time_limit` may start ahead of the first waiting job
/// whose reservation is `reservation` seconds away: only with a time limit
/// that ends it by then (so never without a limit, nor without a
/// reservation).
pub fn may_start_ahead(time_limit: Option<u64>, reservation: Option<u64>) -> bool {
    matches!((time_limit, reservation), (Some(limit), Some(at)) if limit <= at)
}

/// The CPUs a pod asks for, in millicores (its containers' requests, else limits).
pub fn pod_millicpus(spec: &PodSpec) -> i128 {
    spec.containers.iter().filter_map(|c| c.resources.request(RESOURCE_CPU)).map(crate::Quantity::millis_ceil).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cpus: i128, ends_in: Option<u64>) -> Running {
        Running { millicpus: cpus * 1000, ends_in }
    }

    #[test]
    fn the_reservation_is_when_enough_running_jobs_reach_their_limits() {
        let running = [run(4, Some(600)), run(2, Some(60)), run(8, None), run(2, Some(300))];
        // (need, free now) -> seconds until the first may start.
        for (need, free, expected) in [
            (2, 2, Some(0)),
            (3, 2, Some(60)),
            (4, 2, Some(60)),
            (5, 2, Some(300)),
            (6, 2, Some(300)),
            (7, 2, Some(600)),
            (10, 2, Some(600)),
            // Only a job without a limit could free the rest: never.
            (11, 2, None),
        ] {
            assert_eq!(reservation(need * 1000, free * 1000, &running), expected, "need {need}, free {free}");
        }
        assert_eq!(reservation(1000, 0, &[]), None);
    }

    #[test]
    fn a_job_goes_ahead_only_if_it_ends_by_the_reservation() {
        for (limit, at, expected) in [
            (Some(60), Some(300), true),
            (Some(300), Some(300), true),
            (Some(301), Some(300), false),
            // No limit: it could run past any reservation.
            (None, Some(300), false),
            // No reservation known: the first could be delayed.
            (Some(1), None, false),
            // The first fits now (its nodes' shape holds it back): nothing ends by now.
            (Some(1), Some(0), false),
        ] {
            assert_eq!(may_start_ahead(limit, at), expected, "limit {limit:?}, reservation {at:?}");
        }
    }

    #[test]
    fn the_first_is_never_delayed_by_what_goes_ahead() {
        // Whatever goes ahead ends by the reservation, so at that time the
        // CPUs it took are back and the first still starts then.
        let running = [run(4, Some(600)), run(2, Some(60))];
        let (need, free) = (6_000, 1_000);
        let at = reservation(need, free, &running).expect("a reservation");
        for (cpus, limit) in [(1, 60), (1, 600), (1, 601), (1, 10_000)] {
            if !may_start_ahead(Some(limit), Some(at)) {
                continue;
            }
            let mut with = running.to_vec();
            with.push(run(cpus, Some(limit)));
            let still = reservation(need, free - cpus * 1000, &with).expect("a reservation");
            assert!(still <= at, "a {cpus}-CPU job of {limit} s moved the first from {at} to {still}");
        }
    }
}
