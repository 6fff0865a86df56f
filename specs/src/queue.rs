//! The queue as Slurm's `squeue` shows it: a job's state code (`PD`, `R`,
//! `CG`, `CD`, `F`, `TO`), the time it has run, its limit, its nodes, and
//! why a pending job waits in Slurm's words (`Resources`, `Priority`,
//! `Dependency`, `JobHeldUser`, `JobArrayTaskLimit`, `None`). Pure: the
//! caller passes the job, its member pods as listed, and the times it read
//! (Unix seconds), so `pinion queue` and the tests agree by construction.

use std::collections::BTreeSet;

use crate::job::{self, Job, JobPhase};
use crate::{Pod, PodPhase};

/// A job's state, Slurm's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Pending,
    Running,
    /// Ended, some member still stopping on its node.
    Completing,
    Completed,
    Failed,
    /// Ended at its time limit (`DeadlineExceeded`).
    Timeout,
}

impl State {
    pub const ALL: [State; 6] =
        [State::Pending, State::Running, State::Completing, State::Completed, State::Failed, State::Timeout];

    pub fn code(self) -> &'static str {
        match self {
            State::Pending => "PD",
            State::Running => "R",
            State::Completing => "CG",
            State::Completed => "CD",
            State::Failed => "F",
            State::Timeout => "TO",
        }
    }

    fn long(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Completing => "completing",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Timeout => "timeout",
        }
    }

    /// What `squeue` shows without `-t`: jobs not ended, and those still stopping.
    pub fn shown_by_default(self) -> bool {
        matches!(self, State::Pending | State::Running | State::Completing)
    }
}

/// `squeue -t`'s list: codes or names, any case, `,`-separated; `all`.
pub fn parse_states(list: &str) -> Result<BTreeSet<State>, String> {
    let mut out = BTreeSet::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word.eq_ignore_ascii_case("all") {
            out.extend(State::ALL);
            continue;
        }
        let s = State::ALL
            .into_iter()
            .find(|s| word.eq_ignore_ascii_case(s.code()) || word.eq_ignore_ascii_case(s.long()))
            .ok_or_else(|| {
                format!("unknown state {word:?}: want PD, R, CG, CD, F, TO (or pending, running, ...), or all")
            })?;
        out.insert(s);
    }
    if out.is_empty() {
        return Err("no state given".into());
    }
    Ok(out)
}

/// The times a row needs, in Unix seconds, as the caller read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Times {
    pub now: i64,
    /// `metadata.creationTimestamp` in Unix milliseconds: when it was submitted.
    pub submitted_ms: Option<i64>,
    /// `status.startTime`: when the gang was placed.
    pub started: Option<i64>,
    /// `status.completionTime`.
    pub ended: Option<i64>,
}

/// One line of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: String,
    /// `-` outside any partition.
    pub partition: String,
    /// The name given at submission (`-J`), else the id.
    pub name: String,
    pub user: String,
    pub state: State,
    /// Seconds run so far (to its end, once ended).
    pub time: u64,
    /// `None`: no limit (`UNLIMITED`).
    pub time_limit: Option<u64>,
    pub nodes: u32,
    /// Where it runs or ran (`n[1-3]`), else why it waits, in parentheses.
    pub nodelist_reason: String,
    /// Its priority now (`crate::fairshare::priority`, its age included),
    /// from its members; `None` while it has none (held, or waiting for
    /// its dependency).
    pub priority: Option<i64>,
    pub submitted_ms: Option<i64>,
}

/// Pod status reasons the controller writes on a waiting member, as Slurm
/// names why a job waits.
pub fn slurm_reason(pod_reason: Option<&str>) -> &'static str {
    match pod_reason {
        // Fits on no node now.
        Some("Unschedulable") => "Resources",
        // Behind the first job in line, which does not fit yet.
        Some("Queued") => "Priority",
        Some("ArrayThrottled") => "JobArrayTaskLimit",
        _ => "None",
    }
}

/// The job's members of its current attempt among `pods` (a list of pods
/// labelled with jobs); a Terminating one counts while it stops.
pub fn members_of<'a>(job: &Job, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let name = job.metadata.name.as_str();
    pods.iter().filter(|p| job::membership(p).is_some_and(|(j, _, _)| j == name)).collect()
}

fn stopping(p: &Pod) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.reason.as_deref() == Some(crate::status::TERMINATING) || matches!(s.phase, PodPhase::Running)
    })
}

/// The job's state from its phase, its reason and its members.
pub fn state(job: &Job, members: &[&Pod]) -> State {
    let status = job.status.clone().unwrap_or_default();
    let ended = match status.phase {
        JobPhase::Pending => return State::Pending,
        JobPhase::Running => return State::Running,
        JobPhase::Succeeded => State::Completed,
        JobPhase::Failed if status.reason.as_deref() == Some(job::DEADLINE_EXCEEDED) => State::Timeout,
        JobPhase::Failed => State::Failed,
    };
    if members.iter().any(|p| stopping(p)) {
        State::Completing
    } else {
        ended
    }
}

/// The queue's line for `job`.
pub fn row(job: &Job, members: &[&Pod], t: Times) -> Row {
    let status = job.status.clone().unwrap_or_default();
    let state = state(job, members);
    let mut nodes: Vec<String> = members.iter().filter_map(|p| p.spec.node_name.clone()).collect();
    if nodes.is_empty() {
        nodes = status.members.iter().filter_map(|m| m.node.clone()).collect();
    }
    nodes.sort();
    nodes.dedup();
    let time = match (state, t.started) {
        (State::Pending, _) | (_, None) => 0,
        (State::Running, Some(s)) => t.now.saturating_sub(s),
        (_, Some(s)) => t.ended.unwrap_or(t.now).saturating_sub(s),
    };
    let nodelist_reason = match state {
        State::Pending => format!("({})", pending_reason(job, members)),
        _ if nodes.is_empty() => format!("({})", status.reason.as_deref().unwrap_or("None")),
        _ => hostlist(&nodes),
    };
    let wanted = match (&job.spec.gang.nodes, job.spec.gang.placement) {
        (Some(n), _) => *n,
        (None, job::GangPlacement::Spread) => job.spec.parallelism,
        (None, job::GangPlacement::Pack) => 1,
    };
    Row {
        id: job.metadata.name.clone(),
        partition: job.spec.partition.clone().unwrap_or_else(|| "-".into()),
        name: job.metadata.labels.get(crate::batch::NAME_LABEL).cloned().unwrap_or_else(|| job.metadata.name.clone()),
        user: job.metadata.owner.clone().unwrap_or_else(|| "-".into()),
        state,
        time: u64::try_from(time).unwrap_or(0),
        time_limit: job.spec.active_deadline_seconds,
        nodes: if state == State::Pending || nodes.is_empty() { wanted } else { nodes.len() as u32 },
        nodelist_reason,
        priority: priority_now(members, t.now),
        submitted_ms: t.submitted_ms,
    }
}

/// The priority its members carry, aged to `now`.
fn priority_now(members: &[&Pod], now: i64) -> Option<i64> {
    let g = members.iter().find_map(|p| job::Gang::of(p))?;
    let age = g.eligible.map_or(0, |e| u64::try_from(now.saturating_sub(e)).unwrap_or(0));
    Some(crate::fairshare::priority(i64::from(g.priority), age, &crate::fairshare::DEFAULT_WEIGHTS))
}

/// Why a pending job waits: held, its dependency, else what its members
/// were told (the first member with a reason speaks for the gang).
pub fn pending_reason(job: &Job, members: &[&Pod]) -> &'static str {
    let reason = job.status.as_ref().and_then(|s| s.reason.as_deref());
    match reason {
        Some(job::HELD) => return job::HELD,
        Some(job::DEPENDENCY) => return job::DEPENDENCY,
        _ => {}
    }
    let said = members.iter().find_map(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()));
    slurm_reason(said)
}

/// Node names as Slurm's hostlist writes them: `n[1-3,5],gpu7,login`
/// (names ending in digits grouped by what comes before, keeping their
/// width), in order.
pub fn hostlist(names: &[String]) -> String {
    // (prefix, width) -> numbers; names without a number as they are.
    let mut groups: std::collections::BTreeMap<(&str, usize), BTreeSet<u64>> = Default::default();
    let mut plain = BTreeSet::new();
    for n in names {
        let digits = n.len() - n.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = n.split_at(n.len() - digits);
        match number.parse::<u64>() {
            Ok(v) if !number.is_empty() && digits <= 18 => {
                groups.entry((prefix, digits)).or_default().insert(v);
            }
            _ => {
                plain.insert(n.as_str());
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for ((prefix, width), numbers) in groups {
        let pad = |v: u64| format!("{v:0width$}");
        if numbers.len() == 1 {
            out.extend(numbers.iter().map(|v| format!("{prefix}{}", pad(*v))));
            continue;
        }
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for v in numbers {
            match ranges.last_mut() {
                Some((_, hi)) if *hi + 1 == v => *hi = v,
                _ => ranges.push((v, v)),
            }
        }
        let parts: Vec<String> = ranges
            .into_iter()
            .map(|(lo, hi)| if lo == hi { pad(lo) } else { format!("{}-{}", pad(lo), pad(hi)) })
            .collect();
        out.push(format!("{prefix}[{}]", parts.join(",")));
    }
    out.extend(plain.into_iter().map(str::to_string));
    out.join(",")
}

/// The queue's order: pending jobs first, as the controller takes them (by
/// priority, highest first, then the earliest submitted); then the others
/// by state, then as submitted.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        let pending = |r: &Row| r.state != State::Pending;
        pending(a)
            .cmp(&pending(b))
            .then_with(|| if a.state == State::Pending { b.priority.cmp(&a.priority) } else { a.state.cmp(&b.state) })
            .then_with(|| a.submitted_ms.cmp(&b.submitted_ms))
            .then_with(|| a.id.cmp(&b.id))
    });
}

#[cfg(test)]
mod tests;
