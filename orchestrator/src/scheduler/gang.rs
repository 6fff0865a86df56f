//! Gangs: a job's members placed together or not at all.
//!
//! A gang is placed in one call, member by member on the mirrors as any pod
//! is (so every member's plan is the engine's, NUMA-exact), and if fewer than
//! its minimum fit, every member placed in that call is unbound before the
//! call returns: the scheduler never holds part of a gang, so two gangs that
//! together do not fit cannot each hold what the other waits for.

use std::sync::Arc;
use std::time::Instant;

use specs::job::GangPlacement;
use specs::{Allocations, Pod};

use super::{filter, Binding, Scheduler, Unschedulable};

/// Pack's preference for a node that already holds a member: above any score
/// a strategy gives (those are at most a few hundred).
const PACK_BONUS: f64 = 1e9;

/// A gang's members to place now, in rank order.
#[derive(Debug, Clone)]
pub struct GangRequest {
    pub members: Vec<(String, Arc<Pod>)>,
    pub placement: GangPlacement,
    /// The call succeeds only when at least this many are placed.
    pub min_members: usize,
    /// At most this many nodes hold the gang (Slurm's `-N`).
    pub max_nodes: Option<usize>,
    /// At most this many members on one node (`--ntasks-per-node`).
    pub per_node: Option<usize>,
    /// Nodes already holding members of this gang placed earlier (a gang whose
    /// minimum started it, now placing the rest): spread avoids them, pack
    /// prefers them.
    pub nodes_held: Vec<String>,
}

/// How many members each node holds so far, by node index.
pub(super) struct Members {
    placement: GangPlacement,
    held: Vec<usize>,
    nodes: usize,
    max_nodes: usize,
    per_node: usize,
}

impl Members {
    fn new(s: &Scheduler, gang: &GangRequest) -> Members {
        let per_node = match gang.placement {
            GangPlacement::Spread => 1,
            GangPlacement::Pack => gang.per_node.unwrap_or(usize::MAX).max(1),
        };
        let mut m = Members {
            placement: gang.placement,
            held: vec![0; s.nodes.len()],
            nodes: 0,
            max_nodes: gang.max_nodes.unwrap_or(usize::MAX).max(1),
            per_node,
        };
        for n in &gang.nodes_held {
            if let Some(&i) = s.index.get(n) {
                m.add(i);
            }
        }
        m
    }

    fn add(&mut self, i: usize) {
        if self.held[i] == 0 {
            self.nodes += 1;
        }
        self.held[i] += 1;
    }

    /// A node full of members, or a new node beyond the gang's node count.
    pub(super) fn rules_out(&self, i: usize) -> bool {
        let held = self.held.get(i).copied().unwrap_or(0);
        held >= self.per_node || (held == 0 && self.nodes >= self.max_nodes)
    }

    pub(super) fn bonus(&self, i: usize) -> f64 {
        match self.placement {
            GangPlacement::Pack if self.held.get(i).is_some_and(|h| *h > 0) => PACK_BONUS,
            _ => 0.0,
        }
    }
}

impl Scheduler {
    /// Places the gang's members together: all of them (at least
    /// `min_members`) with their bindings, in rank order, or none and why (the
    /// first member that fit nowhere, per node). Under `pack` a member goes to
    /// a node already holding one when it fits there, else to the node the
    /// pod's strategy likes best (least allocated, the most room, by
    /// default); under `spread` never to a node holding one.
    pub fn schedule_gang(&mut self, gang: &GangRequest, now: Instant) -> Result<Vec<(String, Binding)>, Unschedulable> {
        let mut members = Members::new(self, gang);
        let size = gang.members.len();
        let min = gang.min_members.clamp(1, size.max(1));
        let mut placed: Vec<(String, Binding)> = Vec::with_capacity(size);
        let mut first_failure: Option<(&str, Unschedulable)> = None;
        for (k, (key, pod)) in gang.members.iter().enumerate() {
            if placed.len() + (size - k) < min {
                break;
            }
            match self.place(key, pod, now, Some(&members)) {
                Ok(b) => {
                    if let Some(&i) = self.index.get(&b.node) {
                        members.add(i);
                    }
                    placed.push((key.clone(), b));
                }
                Err(u) => {
                    if first_failure.is_none() {
                        first_failure = Some((key, u));
                    }
                    // Members are alike: when one fits nowhere, a gang that
                    // needs every member cannot complete.
                    if min == size {
                        break;
                    }
                }
            }
        }
        if placed.len() >= min && size > 0 {
            return Ok(placed);
        }
        let count = placed.len();
        for (key, _) in &placed {
            self.unbind(key);
        }
        let (key, u) = match first_failure {
            Some(f) => f,
            None => ("", Unschedulable { message: "an empty gang".into(), ..Default::default() }),
        };
        let at_once =
            if min == size { format!("all {size} at once") } else { format!("at least {min} of {size} at once") };
        Err(Unschedulable {
            message: format!(
                "gang needs {at_once} ({}); {count} fit before {key}: {}",
                gang.placement.as_str(),
                u.message
            ),
            per_node: u.per_node,
            counts: u.counts,
            short_of_resources: u.short_of_resources,
        })
    }

    /// Why the cluster could never hold `min_members` copies of the member
    /// `pod` at once under `placement`, even with every node empty; `None`
    /// when it could (or no node is registered yet). The members are alike, so
    /// each node is asked how many copies fit on it empty, until enough do.
    pub fn gang_never_fits(
        &mut self,
        pod_key: &str,
        pod: &Pod,
        min_members: usize,
        placement: GangPlacement,
        max_nodes: Option<usize>,
        per_node: Option<usize>,
    ) -> Option<String> {
        if let Some(reasons) = self.never_fits(pod_key, pod) {
            let per: Vec<String> = reasons.iter().map(|(n, m)| format!("node {n}: {m}")).collect();
            return Some(format!("no node can ever run a member: {}", per.join("; ")));
        }
        if self.nodes.is_empty() || !self.config.topology_aware {
            return None;
        }
        let demand = super::demand::Demand::of(pod);
        let per_node = match placement {
            GangPlacement::Spread => 1,
            GangPlacement::Pack => per_node.unwrap_or(usize::MAX).max(1),
        };
        // The nodes that hold the most count when the gang may use only a few.
        let mut copies_per_node: Vec<usize> = Vec::new();
        let mut total = 0usize;
        for node in &self.nodes {
            let fits_empty = filter::node_selector(pod, &node.info.labels)
                .and_then(|()| filter::totals(&node.empty, &demand))
                .and_then(|()| filter::numa(&node.empty, &demand, &node.info.settings))
                .is_ok();
            if !fits_empty {
                continue;
            }
            let cap = per_node.min(min_members);
            let mut alloc = Allocations::default();
            let mut copies = 0;
            while copies < cap {
                let key = format!("{pod_key}#{copies}");
                match (self.admit)(&node.info.topology, &node.info.settings, &alloc, &key, pod) {
                    Ok(p) => {
                        alloc.apply(&key, p);
                        copies += 1;
                    }
                    Err(_) => break,
                }
            }
            copies_per_node.push(copies);
            copies_per_node.sort_unstable_by(|a, b| b.cmp(a));
            copies_per_node.truncate(max_nodes.unwrap_or(usize::MAX).max(1));
            total = copies_per_node.iter().sum();
            if total >= min_members {
                return None;
            }
        }
        let how = match (placement, max_nodes) {
            (GangPlacement::Spread, _) => "one per node".to_string(),
            (GangPlacement::Pack, Some(n)) => format!("packed on at most {n} nodes"),
            (GangPlacement::Pack, None) => "packed".to_string(),
        };
        Some(format!(
            "the cluster can never hold {min_members} members at once: with every node empty, {total} fit ({how})"
        ))
    }
}

#[cfg(test)]
mod tests;
