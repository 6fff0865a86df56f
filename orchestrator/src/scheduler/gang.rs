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
    /// Nodes already holding members of this gang placed earlier (a gang whose
    /// minimum started it, now placing the rest): spread avoids them, pack
    /// prefers them.
    pub nodes_held: Vec<String>,
}

/// The nodes holding members so far, by node index.
pub(super) struct Members {
    placement: GangPlacement,
    used: Vec<bool>,
}

impl Members {
    pub(super) fn rules_out(&self, i: usize) -> bool {
        self.placement == GangPlacement::Spread && self.used.get(i).copied().unwrap_or(false)
    }

    pub(super) fn bonus(&self, i: usize) -> f64 {
        match self.placement {
            GangPlacement::Pack if self.used.get(i).copied().unwrap_or(false) => PACK_BONUS,
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
        let mut members = Members { placement: gang.placement, used: vec![false; self.nodes.len()] };
        for n in &gang.nodes_held {
            if let Some(&i) = self.index.get(n) {
                members.used[i] = true;
            }
        }
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
                        members.used[i] = true;
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
    ) -> Option<String> {
        if let Some(reasons) = self.never_fits(pod_key, pod) {
            let per: Vec<String> = reasons.iter().map(|(n, m)| format!("node {n}: {m}")).collect();
            return Some(format!("no node can ever run a member: {}", per.join("; ")));
        }
        if self.nodes.is_empty() || !self.config.topology_aware {
            return None;
        }
        let demand = super::demand::Demand::of(pod);
        let mut total = 0usize;
        for node in &self.nodes {
            let fits_empty = filter::node_selector(pod, &node.info.labels)
                .and_then(|()| filter::totals(&node.empty, &demand))
                .and_then(|()| filter::numa(&node.empty, &demand, &node.info.settings))
                .is_ok();
            if !fits_empty {
                continue;
            }
            let cap = match placement {
                GangPlacement::Spread => 1,
                GangPlacement::Pack => min_members - total,
            };
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
            total += copies;
            if total >= min_members {
                return None;
            }
        }
        let how = match placement {
            GangPlacement::Spread => "one per node",
            GangPlacement::Pack => "packed",
        };
        Some(format!(
            "the cluster can never hold {min_members} members at once: with every node empty, {total} fit ({how})"
        ))
    }
}

#[cfg(test)]
mod tests;
