//! The queue's decider: for the pods due now, whether each binds (alone, or
//! with its gang), waits for its array, or waits for capacity, and what its
//! status says. It changes only the in-memory `State` and returns the
//! effects for the executor to write; no I/O.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use specs::api::Node;
use specs::Pod;
use tokio::time::Instant;

use super::effect::{Effect, GangBind};
use super::state::{array_limit, gang_key, NodeState, QueueEntry, State, Wait};
use crate::cluster::pods::{GangPlace, Waiting};
use crate::metrics::Outcome;
use crate::scheduler::GangRequest;

/// Why a pod (or a gang) fits nowhere, as its status says it: the summary,
/// then each node's reason.
fn unschedulable_words(u: crate::scheduler::Unschedulable, nodes: &HashMap<String, NodeState>) -> Arc<str> {
    if u.per_node.is_empty() {
        return u.message.into();
    }
    let per: Vec<String> = u.per_node.iter().map(|(n, m)| format!("{n}: {m}")).collect();
    let mut words = format!("{}: {}", u.message, per.join("; "));
    // A deleted pod still stopping holds what this one lacks: named, so that
    // the wait has a culprit and an end.
    let stopping: Vec<String> = u
        .short_of_resources
        .iter()
        .filter_map(|n| Some((n, nodes.get(n)?)))
        .flat_map(|(n, s)| s.node.status.terminating.iter().map(move |t| format!("{} on {n}", t.name)))
        .collect();
    if !stopping.is_empty() {
        words.push_str(&format!("; waiting for terminating pods to free their resources: {}", stopping.join(", ")));
    }
    words.into()
}

/// A node's address as members see it: its endpoint's host (`HOST:PORT`),
/// else its name.
fn node_address(node: &Node) -> String {
    node.spec
        .endpoint
        .as_deref()
        .and_then(|e| e.rsplit_once(':'))
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .filter(|h| !h.is_empty())
        .map_or_else(|| node.metadata.name.clone(), str::to_string)
}

impl State {
    /// The timers' decider: bindings no node confirmed in time (their
    /// capacity already back in the scheduler's mirror), finished pods past
    /// their time to live, and jobs whose members changed.
    pub(super) fn timers(&mut self, now: Instant) -> Vec<Effect> {
        let expired = self.sched.expire_assumed(now.into_std());
        let mut out: Vec<Effect> = expired.into_iter().map(|(pod, node)| Effect::ExpireBinding { pod, node }).collect();
        out.extend(self.expiry.due(now));
        let due: Vec<String> =
            self.job_deadlines.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
        for name in due {
            self.job_deadlines.remove(&name);
            self.jobs_past_deadline.insert(name.clone());
            self.dirty_jobs.insert(name);
        }
        out.extend(std::mem::take(&mut self.dirty_jobs).into_iter().map(Effect::ReconcileJob));
        let due: Vec<String> =
            self.deployment_timers.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
        for name in due {
            self.deployment_timers.remove(&name);
            self.dirty_deployments.insert(name);
        }
        // One reconcile per Deployment at a time: one in flight stays dirty.
        let (busy, ready): (BTreeSet<String>, BTreeSet<String>) =
            std::mem::take(&mut self.dirty_deployments).into_iter().partition(|n| self.reconciling.contains(n));
        self.dirty_deployments = busy;
        for name in ready {
            self.reconciling.insert(name.clone());
            out.push(Effect::ReconcileDeployment(name));
        }
        let due: Vec<String> =
            self.daemonset_timers.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
        for name in due {
            self.daemonset_timers.remove(&name);
            self.dirty_daemonsets.insert(name);
        }
        let (busy, ready): (BTreeSet<String>, BTreeSet<String>) = std::mem::take(&mut self.dirty_daemonsets)
            .into_iter()
            .partition(|n| self.reconciling_daemonsets.contains(n));
        self.dirty_daemonsets = busy;
        for name in ready {
            self.reconciling_daemonsets.insert(name.clone());
            out.push(Effect::ReconcileDaemonSet(name));
        }
        out
    }

    /// What a job's change means for the timers: a running job with a time
    /// limit gets its deadline (`left` seconds from `now`, read once from its
    /// `startTime` when the controller learns of it; measured on the
    /// monotonic clock from then on), an ended one none; a job waiting for
    /// its dependency is judged again at every job's change.
    pub(super) fn learn_job(&mut self, job: &specs::job::Job, left: Option<u64>, now: Instant) {
        let name = &job.metadata.name;
        let status = job.status.clone().unwrap_or_default();
        if status.phase == specs::job::JobPhase::Running {
            self.running_jobs.insert(name.clone(), specs::partition::job_millicpus(job));
        } else {
            self.running_jobs.remove(name);
        }
        if status.phase.is_terminal() {
            self.job_deadlines.remove(name);
            self.jobs_past_deadline.remove(name);
            self.jobs_waiting_on_others.remove(name);
        } else {
            if let Some(left) = left {
                self.job_deadlines.entry(name.clone()).or_insert(now + std::time::Duration::from_secs(left));
            }
            if status.reason.as_deref() == Some(specs::job::DEPENDENCY) {
                self.jobs_waiting_on_others.insert(name.clone());
            } else {
                self.jobs_waiting_on_others.remove(name);
            }
        }
        // A job's change (it started, ended, or is gone) may meet another's
        // dependency, or make it never met.
        let waiting: Vec<String> = self.jobs_waiting_on_others.iter().filter(|w| *w != name).cloned().collect();
        self.dirty_jobs.extend(waiting);
    }

    /// Up to `most` queued pods due at `now`, in queue order.
    pub(super) fn due_pods(&self, now: Instant, most: usize) -> Vec<String> {
        self.order
            .values()
            .filter(|name| self.queue.get(*name).is_some_and(|e| e.due(now)))
            .take(most)
            .cloned()
            .collect()
    }

    /// When the next timer is due: a backoff, a binding's expiry, a TTL.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        let backoff = self.queue.values().filter_map(|e| match e.wait {
            Wait::Backoff(at) => Some(at),
            _ => None,
        });
        let expiry = self.sched.next_expiry().map(Instant::from_std);
        let deployments = self.deployment_timers.values().copied();
        let daemonsets = self.daemonset_timers.values().copied();
        let jobs = self.job_deadlines.values().copied();
        backoff.chain(expiry).chain(self.expiry.next()).chain(deployments).chain(daemonsets).chain(jobs).min()
    }

    /// `decide` for any queued pod: one queued behind a gang that did not fit
    /// waits; a gang's member brings its whole gang.
    pub(super) fn decide_any(&mut self, name: &str, now: Instant, failed: &mut HashMap<u64, Arc<str>>) -> Vec<Effect> {
        let Some(e) = self.queue.get(name).filter(|e| e.due(now)) else { return Vec::new() };
        let pod = e.pod.clone();
        let gang = specs::job::Gang::of(&pod);
        if let Some((first, key)) = &self.blocked_by {
            let same = gang.as_ref().is_some_and(|g| gang_key(g) == *key);
            let limit = gang.as_ref().and_then(|g| g.time_limit);
            // Backfill: behind the first, only a job that ends by its reservation.
            let behind = !same && e.order > *first;
            let reservation = if behind { self.reservation(key, now) } else { None };
            if behind && !specs::backfill::may_start_ahead(limit, reservation) {
                let job = key.split('#').next().unwrap_or_default();
                // No figures: the words stay the same from pass to pass, so
                // the status is written once.
                let why = match (limit, reservation) {
                    (_, None) => "its start cannot be foreseen (a running job has no time limit)",
                    (None, Some(_)) => "only a job with a time limit that ends before its start may go ahead",
                    (Some(_), Some(_)) => "this job's time limit ends after its expected start",
                };
                let message: Arc<str> =
                    format!("queued behind job {job}, which is first in line and does not fit yet: {why}").into();
                let Some(e) = self.queue.get_mut(name) else { return Vec::new() };
                e.wait = Wait::Unschedulable;
                return Self::say(name, e, "Queued", "Normal", "Queued", message).into_iter().collect();
            }
        }
        match gang {
            Some(g) => self.decide_gang(g, now),
            None => self.decide(name, now, failed).into_iter().collect(),
        }
    }

    /// In how many seconds the first waiting gang (`key`) has its CPUs, if
    /// every running job ends at its time limit (`specs::backfill`).
    fn reservation(&self, key: &str, now: Instant) -> Option<u64> {
        let st = self.gangs.get(key)?;
        let member = st.queued.values().find_map(|n| self.queue.get(n))?;
        let size = specs::job::Gang::of(&member.pod).map_or(1, |g| g.size);
        let need = specs::backfill::pod_millicpus(&member.pod.spec) * i128::from(size);
        let free: i128 =
            self.sched.capacity().iter().flat_map(|n| &n.numa).map(|z| i128::from(z.free_cpus) * 1000).sum();
        let running: Vec<specs::backfill::Running> = self
            .running_jobs
            .iter()
            .map(|(job, cpus)| specs::backfill::Running {
                millicpus: *cpus,
                ends_in: self.job_deadlines.get(job).map(|d| d.saturating_duration_since(now).as_secs()),
            })
            .collect();
        specs::backfill::reservation(need, free, &running)
    }

    /// Places the gang's queued members together (see `Scheduler::schedule_gang`).
    fn decide_gang(&mut self, g: specs::job::Gang, now: Instant) -> Vec<Effect> {
        let key = gang_key(&g);
        let Some(st) = self.gangs.get(&key) else { return Vec::new() };
        let members: Vec<(u32, String, Arc<Pod>)> = st
            .queued
            .iter()
            .filter_map(|(rank, n)| self.queue.get(n).map(|e| (*rank, n.clone(), e.pod.clone())))
            .collect();
        let Some(first) = members.first().and_then(|(_, n, _)| self.queue.get(n)).map(|e| e.order) else {
            return Vec::new();
        };
        let size = g.size as usize;
        let mut nodes_by_rank = vec![String::new(); size];
        let mut held = Vec::new();
        for rank in 0..g.size {
            if st.queued.contains_key(&rank) {
                continue;
            }
            if let Some(b) = self.sched.binding(&specs::job::member_name(&g.job, rank)) {
                held.push(b.node.clone());
                nodes_by_rank[rank as usize] = b.node;
            }
        }
        let started = st.started || !held.is_empty();
        let min = g.min_members as usize;
        if !started && members.len() < min {
            // Members arrive one store change at a time on a shared store (the
            // leader follows etcd's watch): a part of a gang is never placed as
            // if it were the whole. The next member's arrival tries again; no
            // status is written meanwhile (the rest are a moment away, and a
            // write per arrival would cost a gang of n about n*n/2 writes).
            for (_, n, _) in &members {
                if let Some(e) = self.queue.get_mut(n) {
                    e.wait = Wait::Unschedulable;
                }
            }
            return Vec::new();
        }
        // A gang already started (its minimum placed) places the rest as they fit.
        let min = if started { 1 } else { min };
        let request = GangRequest {
            members: members.iter().map(|(_, n, p)| (n.clone(), p.clone())).collect(),
            placement: g.placement,
            min_members: min,
            max_nodes: g.max_nodes.map(|n| n as usize),
            per_node: g.per_node.map(|n| n as usize),
            nodes_held: held,
        };
        let started_at = std::time::Instant::now();
        let decided = self.sched.schedule_gang(&request, now.into_std());
        let outcome = if decided.is_ok() { Outcome::Bound } else { Outcome::Unschedulable };
        self.metrics.attempt(outcome, started_at.elapsed().as_secs_f64());
        match decided {
            Ok(bound) => {
                if self.blocked_by.as_ref().is_some_and(|(_, k)| *k == key) {
                    self.blocked_by = None;
                }
                if let Some(st) = self.gangs.get_mut(&key) {
                    st.started = true;
                }
                let ranks: HashMap<&str, u32> = members.iter().map(|(r, n, _)| (n.as_str(), *r)).collect();
                for (n, b) in &bound {
                    if let Some(r) = ranks.get(n.as_str()) {
                        nodes_by_rank[*r as usize] = b.node.clone();
                    }
                }
                let addresses: Vec<String> = nodes_by_rank
                    .iter()
                    .map(|n| match self.nodes.get(n) {
                        Some(s) => node_address(&s.node),
                        None => n.clone(),
                    })
                    .collect();
                let nodes = addresses.join(",");
                let mut binds = Vec::with_capacity(bound.len());
                for (n, binding) in bound {
                    let Some(e) = self.dequeue(&n) else { continue };
                    let rank = ranks.get(n.as_str()).copied().unwrap_or(0) as usize;
                    let local_rank = nodes_by_rank[..rank].iter().filter(|x| **x == binding.node).count() as u32;
                    binds.push(GangBind { pod: e.pod, binding, place: GangPlace { local_rank, nodes: nodes.clone() } });
                }
                if binds.is_empty() {
                    return Vec::new();
                }
                vec![Effect::BindGang(binds)]
            }
            Err(u) => {
                self.metrics.rejected(&u.counts);
                let message = unschedulable_words(u, &self.nodes);
                if self.blocked_by.as_ref().is_none_or(|(o, _)| first < *o) {
                    self.blocked_by = Some((first, key));
                }
                let mut out = Vec::new();
                for (_, n, _) in members {
                    let Some(e) = self.queue.get_mut(&n) else { continue };
                    e.wait = Wait::Unschedulable;
                    out.extend(Self::say(&n, e, "Unschedulable", "Warning", "FailedScheduling", message.clone()));
                }
                out
            }
        }
    }

    /// Throttle, then schedule (or reuse a twin's failure in this pass).
    fn decide(&mut self, name: &str, now: Instant, failed: &mut HashMap<u64, Arc<str>>) -> Option<Effect> {
        let e = self.queue.get(name).filter(|e| e.due(now))?;
        let pod = e.pod.clone();
        if let Some((array, limit)) = &e.array {
            let bound = self.arrays.get(array).map_or(0, |a| a.bound.len());
            if bound >= *limit {
                let message: Arc<str> =
                    format!("array {array} has {bound} unfinished tasks bound, its parallelism is {limit}").into();
                let e = self.queue.get_mut(name)?;
                e.wait = Wait::Throttled;
                return Self::say(name, e, "ArrayThrottled", "Normal", "ArrayThrottled", message);
            }
        }
        let (twin, rejected) = (e.twin, e.rejected);
        if let Some(message) = failed.get(&twin).filter(|_| !rejected).cloned() {
            let e = self.queue.get_mut(name)?;
            e.wait = Wait::Unschedulable;
            return Self::say(name, e, "Unschedulable", "Warning", "FailedScheduling", message);
        }
        let started_at = std::time::Instant::now();
        let decided = self.sched.schedule(name, &pod, now.into_std());
        let outcome = if decided.is_ok() { Outcome::Bound } else { Outcome::Unschedulable };
        self.metrics.attempt(outcome, started_at.elapsed().as_secs_f64());
        match decided {
            Ok(binding) => {
                self.dequeue(name);
                if let Some((array, _)) = array_limit(&pod) {
                    self.arrays.entry(array).or_default().bound.insert(name.to_string());
                }
                Some(Effect::Bind { pod, binding })
            }
            Err(u) => {
                self.metrics.rejected(&u.counts);
                let message = unschedulable_words(u, &self.nodes);
                if !rejected {
                    failed.insert(twin, message.clone());
                }
                let e = self.queue.get_mut(name)?;
                e.wait = Wait::Unschedulable;
                Self::say(name, e, "Unschedulable", "Warning", "FailedScheduling", message)
            }
        }
    }

    /// A status write only when the reason changed since the last one.
    fn say(
        name: &str,
        e: &mut QueueEntry,
        reason: &'static str,
        event_type: &'static str,
        event_reason: &'static str,
        message: Arc<str>,
    ) -> Option<Effect> {
        if e.said.as_deref() == Some(&*message) {
            return None;
        }
        let text = message.to_string();
        e.said = Some(message);
        let why = Waiting { reason, event_type, event_reason, message: text };
        Some(Effect::SayWaiting { pod: name.to_string(), why })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Unschedulable;

    /// A node that is stopping the named pods.
    fn stopping(name: &str, pods: &[&str]) -> NodeState {
        let mut node = crate::cluster::nodes::joined_only(name);
        node.status.terminating =
            pods.iter().map(|p| specs::api::TerminatingPod { name: p.to_string(), ..Default::default() }).collect();
        NodeState::new(node, Instant::now(), 0)
    }

    #[test]
    fn a_pod_short_of_resources_names_the_pods_still_stopping_where_they_would_free_them() {
        let nodes: HashMap<String, NodeState> =
            [("a", stopping("a", &["old"])), ("b", stopping("b", &["other"])), ("c", stopping("c", &[]))]
                .into_iter()
                .map(|(n, s)| (n.to_string(), s))
                .collect();
        let unschedulable = |short: &[&str]| Unschedulable {
            message: "0/3 nodes fit: 2 insufficient cpu, 1 node selector mismatch".into(),
            per_node: [("a", "needs 1"), ("b", "selector"), ("c", "needs 1")]
                .into_iter()
                .map(|(n, m)| (n.to_string(), m.to_string()))
                .collect(),
            short_of_resources: short.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        let table: &[(&[&str], Option<&str>)] = &[
            // b is ruled out by its labels: what it stops frees nothing for this pod.
            (&["a", "c"], Some("; waiting for terminating pods to free their resources: old on a")),
            (&["c"], None),
            (&[], None),
        ];
        for (short, tail) in table {
            let words = unschedulable_words(unschedulable(short), &nodes);
            let base =
                "0/3 nodes fit: 2 insufficient cpu, 1 node selector mismatch: a: needs 1; b: selector; c: needs 1";
            assert_eq!(&*words, format!("{base}{}", tail.unwrap_or("")), "short of resources on {short:?}");
        }
    }
}
