//! A restart under other settings: every pod the checkpoint holds is
//! re-checked against the settings and the online CPUs the agent starts with
//! (`specs::engine::recheck`), instead of refusing to start as the kubelet
//! does when its CPU-manager state disagrees with its flags
//! (kubernetes#79603).
//!
//! A pod that still fits keeps running untouched: same containers, same
//! CPUs. A pod that misfits is reported (status reason
//! `SettingsMisfit` with the reason and the message, which the server turns
//! into an event) and, with `OnSettingsChange::Restart`, stopped and admitted
//! again by the engine like a new pod; if it fits nowhere on this node any
//! more the engine's rejection hands it back to the scheduler. Pure: no
//! runtime, no file.

use serde::{Deserialize, Serialize};
pub use specs::engine::SETTINGS_MISFIT;
use specs::engine::{recheck, Misfit};
use specs::{Allocations, NodeSettings};

use super::plan::{Desired, Stage, State};

/// What the agent does with a running pod whose placement the node's new
/// settings no longer allow (`--on-settings-change`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnSettingsChange {
    /// Report it and keep it running where it is.
    #[default]
    Keep,
    /// Report it, stop it, and admit it again under the new settings.
    Restart,
}

/// Re-checks every admitted pod, in key order (each against the ones before
/// it, as `admit` saw them come), and marks the misfits. `previous`: the
/// settings the checkpoint was written under (`None` from an agent that did
/// not record them). Returns the misfits, for the log.
pub(crate) fn resettle(st: &mut State, previous: Option<&NodeSettings>) -> Vec<(String, Misfit)> {
    match previous {
        Some(old) if *old != st.cfg.settings => {
            tracing::info!(
                changes = changes(old, &st.cfg.settings).join("; "),
                "node settings changed since the checkpoint; re-checking its pods"
            );
        }
        Some(_) => {}
        None => tracing::info!("the checkpoint does not say which settings it was made under; re-checking its pods"),
    }
    let restart = st.cfg.on_settings_change == OnSettingsChange::Restart;
    let mut seen = Allocations::default();
    let mut misfits = Vec::new();
    for (key, e) in st.pods.iter_mut() {
        let Some(placement) = st.alloc.pods.get(key) else { continue };
        if !matches!(e.stage, Stage::Admitted) {
            continue;
        }
        match recheck(&st.cfg.topology, &st.cfg.settings, &seen, &e.pod, placement) {
            Ok(()) => seen.apply(key, placement.clone()),
            Err(m) => {
                tracing::warn!(key, reason = %m.reason, message = m.message, restart, "the pod's placement does not fit the node's settings");
                if restart {
                    let d = Desired { pod: (*e.pod).clone(), plan: None };
                    e.stage = Stage::Terminating { then: Some(Box::new(d)), stopping: false, not_before: None };
                } else {
                    seen.apply(key, placement.clone());
                }
                e.misfit = Some(m.clone());
                misfits.push((key.clone(), m));
            }
        }
    }
    misfits
}

/// What differs between two settings, one phrase each, for the log.
fn changes(old: &NodeSettings, new: &NodeSettings) -> Vec<String> {
    let mut out = Vec::new();
    if old.reserved_cpus != new.reserved_cpus {
        out.push(format!("reserved CPUs {} -> {}", show(&old.reserved_cpus), show(&new.reserved_cpus)));
    }
    if old.topology_policy != new.topology_policy {
        out.push(format!("topology policy {:?} -> {:?}", old.topology_policy, new.topology_policy));
    }
    if old.topology_scope != new.topology_scope {
        out.push(format!("topology scope {:?} -> {:?}", old.topology_scope, new.topology_scope));
    }
    if old.cpu_manager != new.cpu_manager {
        out.push(format!("CPU-manager options {:?} -> {:?}", old.cpu_manager, new.cpu_manager));
    }
    if old.prefer_closest_numa_nodes != new.prefer_closest_numa_nodes {
        out.push(format!(
            "prefer-closest-numa-nodes {} -> {}",
            old.prefer_closest_numa_nodes, new.prefer_closest_numa_nodes
        ));
    }
    if old.devices != new.devices {
        out.push(format!("devices {:?} -> {:?}", old.devices, new.devices));
    }
    out
}

fn show(cpus: &specs::CpuSet) -> String {
    if cpus.is_empty() {
        "none".into()
    } else {
        cpus.to_string()
    }
}

/// The status text of a misfit pod: what is wrong and what the agent does.
pub(crate) fn status_message(m: &Misfit, on_change: OnSettingsChange) -> String {
    let then = match on_change {
        OnSettingsChange::Keep => "it keeps running where it is (--on-settings-change keep)",
        OnSettingsChange::Restart => "it is restarted under the new settings (--on-settings-change restart)",
    };
    format!("{}: {}; {then}", m.reason, m.message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use specs::engine::MisfitReason;
    use specs::{CpuSet, TopologyPolicy};

    #[test]
    fn changes_name_each_setting_that_moved() {
        let old = NodeSettings { reserved_cpus: CpuSet::parse_list("0").unwrap(), ..Default::default() };
        assert!(changes(&old, &old).is_empty());
        let mut new = old.clone();
        new.reserved_cpus = CpuSet::parse_list("0-1").unwrap();
        new.topology_policy = TopologyPolicy::SingleNumaNode;
        new.devices.insert("pinion.io/nic".into(), vec!["0000:3b:00.0".into()]);
        let got = changes(&old, &new);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], "reserved CPUs 0 -> 0-1");
        assert_eq!(got[1], "topology policy None -> SingleNumaNode");
        assert!(got[2].starts_with("devices {} -> "), "{got:?}");
        assert_eq!(changes(&NodeSettings::default(), &old), vec!["reserved CPUs none -> 0".to_string()]);
    }

    #[test]
    fn the_status_says_what_the_agent_does() {
        let m = Misfit { reason: MisfitReason::ReservedCpus, message: "container main holds CPUs 1".into() };
        assert_eq!(
            status_message(&m, OnSettingsChange::Keep),
            "ReservedCpus: container main holds CPUs 1; it keeps running where it is (--on-settings-change keep)"
        );
        assert!(status_message(&m, OnSettingsChange::Restart).ends_with("(--on-settings-change restart)"));
    }
}
