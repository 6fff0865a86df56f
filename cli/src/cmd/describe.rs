//! `pinion describe pod|node|job NAME`: everything a person asks first: where it
//! runs, on which CPUs and NUMA nodes, and why (events).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::ExitCode;

use specs::engine::Allocations;
use specs::{NodeSettings, NodeTopology};

use crate::cmd::get::{age, pod_restarts, pod_status, table};
use crate::common::GlobalArgs;

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum Kind {
    #[value(alias = "pods", alias = "po")]
    Pod,
    #[value(alias = "nodes", alias = "no")]
    Node,
    #[value(alias = "jobs")]
    Job,
    #[value(alias = "deployments", alias = "deploy")]
    Deployment,
    #[value(name = "daemonset", alias = "daemonsets", alias = "ds")]
    DaemonSet,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    pub kind: Kind,
    pub name: String,
}

fn events_section(out: &mut String, events: &[specs::api::Event]) {
    out.push_str("Events:\n");
    if events.is_empty() {
        out.push_str("  <none>\n");
        return;
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| vec![age(Some(&e.timestamp)), e.event_type.clone(), e.reason.clone(), e.message.clone()])
        .collect();
    for line in table(&["AGE", "TYPE", "REASON", "MESSAGE"], &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// The devices a node offers (its settings' resources, as the scheduler
/// counts them): NUMA node, DRA locality (the topology's, else computed from
/// its distances) and the pod holding each.
/// What the node says is not fine, each with its reason and its fix.
fn conditions_section(out: &mut String, conditions: &[specs::api::Condition]) {
    if conditions.is_empty() {
        return;
    }
    out.push_str("Conditions:\n");
    for c in conditions {
        let _ = writeln!(out, "  {} ({}): {}", c.short(), c.reason, c.message);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "    fix: {fix}");
        }
    }
}

/// The node's boot profile (discovery's `KernelProfile`), one line per
/// thing it has; nothing for a kernel booted with none of it.
fn kernel_section(out: &mut String, k: &specs::topology::KernelProfile) {
    let cpus = |s: &specs::CpuSet| if s.is_empty() { "-".to_string() } else { s.to_string() };
    let _ = writeln!(
        out,
        "Kernel:      realtime={} isolcpus={} nohz_full={} rcu_nocbs={}",
        k.realtime,
        cpus(&k.isolated_cpus),
        cpus(&k.nohz_full),
        cpus(&k.rcu_nocbs)
    );
    let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(" ") };
    let _ = writeln!(out, "             governors={} idle-states={}", list(&k.governors), list(&k.idle_states));
}

fn devices_section(out: &mut String, t: &NodeTopology, s: &NodeSettings, allocations: &Allocations) {
    if s.devices.is_empty() {
        return;
    }
    let mut holders = BTreeMap::new();
    for (pod, p) in &allocations.pods {
        for addr in p.containers.iter().flat_map(|c| c.devices.values().flatten()) {
            holders.insert(addr.as_str(), pod.as_str());
        }
    }
    let mut rows = Vec::new();
    for (resource, addrs) in &s.devices {
        for addr in addrs {
            let d = t.devices.iter().find(|d| &d.address == addr);
            let numa = d.and_then(|d| d.numa);
            let locality = match d {
                Some(d) if !d.numa_node.is_empty() => d.numa_node.clone(),
                _ => numa.map(|n| t.dra_numa_nodes(n)).unwrap_or_default(),
            };
            rows.push(vec![
                resource.clone(),
                addr.clone(),
                numa.map_or_else(|| "-".into(), |n| n.to_string()),
                format!("[{}]", locality.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
                holders.get(addr.as_str()).map_or_else(|| "-".into(), |p| p.to_string()),
            ]);
        }
    }
    out.push_str("Devices:\n");
    for line in table(&["RESOURCE", "ADDRESS", "NUMA", "NUMANODE", "POD"], &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// The pod's placement: its NUMA affinity, a row per container, and each
/// relaxed resource placed elsewhere with the reason.
fn placement_section(out: &mut String, placement: Option<&specs::status::PlacementSummary>) {
    match placement {
        Some(pl) => {
            let _ = writeln!(out, "Placement:\n  NUMA affinity: {}", pl.numa_affinity);
            let rows: Vec<Vec<String>> = pl
                .containers
                .iter()
                .map(|c| {
                    vec![
                        c.name.clone(),
                        format!("{:?}", c.cpu_policy).to_lowercase(),
                        c.cpus.to_string(),
                        c.mems.to_string(),
                        if c.devices.is_empty() { "-".into() } else { c.devices.join(",") },
                    ]
                })
                .collect();
            for line in table(&["CONTAINER", "POLICY", "CPUS", "MEMS", "DEVICES"], &rows).lines() {
                let _ = writeln!(out, "  {line}");
            }
            for r in &pl.remote {
                let _ = writeln!(out, "  Remote: {r}");
            }
        }
        None => out.push_str("Placement:   <none>\n"),
    }
}

fn member_row(m: &specs::job::MemberStatus, status: &str, cpus: &str) -> Vec<String> {
    vec![
        m.rank.to_string(),
        m.pod.clone(),
        status.to_string(),
        m.node.clone().unwrap_or_else(|| "-".into()),
        cpus.to_string(),
        m.exit_code.map_or("-".into(), |c| c.to_string()),
    ]
}

/// A Deployment: its spec's figures, its status and conditions, the
/// revisions it keeps, and its pods.
pub fn describe_deployment(out: &mut String, d: &specs::deployment::Deployment, pods: &[specs::Pod]) {
    let s = d.status.clone().unwrap_or_default();
    let _ = writeln!(out, "Name:          {}", d.metadata.name);
    if let Some(owner) = &d.metadata.owner {
        let _ = writeln!(out, "Owner:         {owner}");
    }
    let _ = writeln!(out, "Created:       {}", d.metadata.creation_timestamp.as_deref().unwrap_or("-"));
    let sel: Vec<String> = d.spec.selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "Selector:      {}", sel.join(","));
    let _ = writeln!(out, "Generation:    {} (observed {})", d.metadata.generation.unwrap_or(0), s.observed_generation);
    let _ = writeln!(
        out,
        "Replicas:      {} desired | {} updated | {} total | {} ready | {} available | {} unavailable",
        d.spec.replicas, s.updated_replicas, s.replicas, s.ready_replicas, s.available_replicas, s.unavailable_replicas
    );
    let (surge, unavailable) = specs::rollout::budget(d);
    let _ = writeln!(out, "Strategy:      {:?} (maxSurge {surge}, maxUnavailable {unavailable})", d.spec.strategy.kind);
    let _ = writeln!(out, "MinReady:      {} s", d.spec.min_ready_seconds);
    let _ = writeln!(out, "Deadline:      {} s", d.spec.progress_deadline_seconds());
    let _ = writeln!(
        out,
        "Revision:      {} ({})",
        s.revision,
        if s.template_hash.is_empty() { "-" } else { &s.template_hash }
    );
    if d.spec.paused {
        let _ = writeln!(out, "Paused:        true");
    }
    if !s.conditions.is_empty() {
        out.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = s
            .conditions
            .iter()
            .map(|c| vec![format!("{:?}", c.kind), format!("{:?}", c.status), c.reason.clone(), c.message.clone()])
            .collect();
        for line in table(&["TYPE", "STATUS", "REASON", "MESSAGE"], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if !s.history.is_empty() {
        out.push_str("Revisions:\n");
        let rows: Vec<Vec<String>> = s
            .history
            .iter()
            .map(|r| {
                vec![
                    r.number.to_string(),
                    r.template_hash.clone(),
                    if r.number == s.revision { "current".into() } else { "-".into() },
                ]
            })
            .collect();
        for line in table(&["REVISION", "HASH", ""], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out.push_str("Pods:\n");
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.metadata.name.clone(),
                pod_status(p),
                p.metadata.labels.get(specs::deployment::REVISION_LABEL).cloned().unwrap_or_else(|| "-".into()),
                p.spec.node_name.clone().unwrap_or_else(|| "-".into()),
                age(p.metadata.creation_timestamp.as_deref()),
            ]
        })
        .collect();
    for line in table(&["NAME", "STATUS", "REVISION", "NODE", "AGE"], &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// A DaemonSet: its selector and strategy, its status's counts, the nodes
/// where its pod does not fit, and its pods.
pub fn describe_daemonset(out: &mut String, d: &specs::daemonset::DaemonSet, pods: &[specs::Pod]) {
    let s = d.status.clone().unwrap_or_default();
    let _ = writeln!(out, "Name:           {}", d.metadata.name);
    if let Some(owner) = &d.metadata.owner {
        let _ = writeln!(out, "Owner:          {owner}");
    }
    let _ = writeln!(out, "Created:        {}", d.metadata.creation_timestamp.as_deref().unwrap_or("-"));
    let sel: Vec<String> = d.spec.selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "Selector:       {}", sel.join(","));
    let nodes: Vec<String> = d.spec.template.spec.node_selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "Node-Selector:  {}", if nodes.is_empty() { "<none>".into() } else { nodes.join(",") });
    let _ =
        writeln!(out, "Generation:     {} (observed {})", d.metadata.generation.unwrap_or(0), s.observed_generation);
    let strategy = &d.spec.update_strategy;
    match strategy.rolling_update.as_ref().and_then(|r| r.max_unavailable) {
        Some(m) => {
            let _ = writeln!(out, "Strategy:       {:?} (maxUnavailable {m:?})", strategy.kind);
        }
        None => {
            let _ = writeln!(out, "Strategy:       {:?}", strategy.kind);
        }
    }
    let _ = writeln!(out, "MinReady:       {} s", d.spec.min_ready_seconds);
    let _ = writeln!(
        out,
        "Nodes:          {} desired | {} current | {} updated | {} ready | {} available | {} misscheduled",
        s.desired_number_scheduled,
        s.current_number_scheduled,
        s.updated_number_scheduled,
        s.number_ready,
        s.number_available,
        s.number_misscheduled
    );
    let _ = writeln!(out, "Template-Hash:  {}", if s.template_hash.is_empty() { "-" } else { &s.template_hash });
    if s.number_unfit > 0 {
        let _ = writeln!(out, "Unfit:          {} node(s) where the pod does not fit now", s.number_unfit);
        let rows: Vec<Vec<String>> = s.unfit.iter().map(|u| vec![u.node.clone(), u.message.clone()]).collect();
        for line in table(&["NODE", "WHY"], &rows).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out.push_str("Pods:\n");
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.metadata.name.clone(),
                pod_status(p),
                p.spec.node_name.clone().unwrap_or_else(|| "-".into()),
                p.metadata.labels.get(specs::deployment::TEMPLATE_HASH_LABEL).cloned().unwrap_or_else(|| "-".into()),
                age(p.metadata.creation_timestamp.as_deref()),
            ]
        })
        .collect();
    for line in table(&["NAME", "STATUS", "NODE", "HASH", "AGE"], &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let mut out = String::new();
    match args.kind {
        Kind::Pod => {
            let p = client.get_pod(&args.name).await?;
            let s = p.status.clone().unwrap_or_default();
            let labels: Vec<String> = p.metadata.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "Name:        {}", p.metadata.name);
            if let Some(owner) = &p.metadata.owner {
                let _ = writeln!(out, "Owner:       {owner}");
            }
            let _ =
                writeln!(out, "Labels:      {}", if labels.is_empty() { "<none>".into() } else { labels.join(",") });
            let _ = writeln!(out, "Created:     {}", p.metadata.creation_timestamp.as_deref().unwrap_or("-"));
            let _ = writeln!(out, "Node:        {}", p.spec.node_name.as_deref().unwrap_or("<none>"));
            let ips = if s.pod_ips.is_empty() { s.pod_ip.clone().into_iter().collect() } else { s.pod_ips.clone() };
            let _ = writeln!(out, "IP:          {}", if ips.is_empty() { "<none>".into() } else { ips.join(",") });
            let _ = writeln!(out, "Phase:       {:?}", s.phase);
            let _ = writeln!(out, "Status:      {}", pod_status(&p));
            let _ = writeln!(out, "Restarts:    {}", pod_restarts(&p));
            let _ = writeln!(out, "Reason:      {}", s.reason.as_deref().unwrap_or("-"));
            let _ = writeln!(out, "Message:     {}", s.message.as_deref().unwrap_or("-"));
            let _ = writeln!(out, "Attempts:    {}", s.attempts);
            if let Some(plan) = &s.plan {
                let _ = writeln!(out, "Plan epoch:  {}", plan.epoch);
            }
            placement_section(&mut out, s.placement.as_ref());
            out.push_str("Containers:\n");
            for c in &p.spec.containers {
                let q = |m: &std::collections::BTreeMap<String, specs::Quantity>| {
                    m.iter().map(|(k, v)| format!("{k}={}", v.as_str())).collect::<Vec<_>>().join(",")
                };
                let _ = writeln!(
                    out,
                    "  {}: image={} requests={} limits={}",
                    c.name,
                    c.image.as_deref().unwrap_or(if c.rootfs.is_some() { "<host>" } else { "-" }),
                    q(&c.resources.requests),
                    q(&c.resources.limits)
                );
                if let Some(cs) = s.container_statuses.iter().find(|cs| cs.name == c.name) {
                    let mut state = format!("{:?}", cs.state);
                    if let Some(r) = &cs.reason {
                        state.push_str(&format!(" ({r})"));
                    }
                    if let Some(code) = cs.last_exit_code {
                        state.push_str(&format!(", last exit code {code}"));
                    }
                    let _ = writeln!(out, "    state: {state}, restarts: {}", cs.restart_count);
                }
                if let Some(caps) = c.security_context.as_ref().and_then(|s| s.capabilities.as_ref()) {
                    let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(",") };
                    let _ = writeln!(out, "    capabilities: add={} drop={}", list(&caps.add), list(&caps.drop));
                }
            }
            if let Some(t) = &p.spec.topology {
                let _ = writeln!(out, "Topology:    policy={:?} scope={:?}", t.policy, t.scope);
            }
            let events = client.events("Pod", &p.metadata.name).await?;
            events_section(&mut out, &events.items);
        }
        Kind::Job => {
            let j = client.get_job(&args.name).await?;
            let s = j.status.clone().unwrap_or_default();
            let g = &j.spec.gang;
            let _ = writeln!(out, "Name:        {}", j.metadata.name);
            if let Some(owner) = &j.metadata.owner {
                let _ = writeln!(out, "Owner:       {owner}");
            }
            let _ = writeln!(out, "Created:     {}", j.metadata.creation_timestamp.as_deref().unwrap_or("-"));
            let _ = writeln!(out, "Phase:       {:?}", s.phase);
            if let Some(r) = &s.reason {
                let _ = writeln!(out, "Reason:      {r}: {}", s.message.as_deref().unwrap_or("-"));
            }
            if let Some(t) = &s.start_time {
                let _ = writeln!(out, "Started:     {t}");
            }
            if let Some(limit) = j.spec.active_deadline_seconds {
                let _ = writeln!(out, "Time limit:  {limit} s");
            }
            if let Some(d) = &j.spec.dependency {
                let _ = writeln!(out, "Dependency:  {d}");
            }
            let _ = writeln!(out, "Attempt:     {} (backoffLimit {})", s.attempt, j.spec.backoff_limit);
            let _ = writeln!(out, "Members:     {}", j.spec.parallelism);
            let _ = writeln!(
                out,
                "Gang:        placement={} nodes={} per-node={} min-members={}",
                g.placement.as_str(),
                g.nodes.map_or("-".into(), |n| n.to_string()),
                g.per_node.map_or("-".into(), |n| n.to_string()),
                g.min_members.map_or("all".into(), |n| n.to_string())
            );
            let _ = writeln!(out, "Priority:    {}", j.spec.priority);
            let _ = writeln!(out, "On failure:  {:?}", j.spec.failure_policy);
            let _ = writeln!(out, "First failure: {}", s.first_failure.as_deref().unwrap_or("-"));
            if let Some(t) = &s.completion_time {
                let _ = writeln!(out, "Ended:       {t}");
            }
            let selector = format!("{}={}", specs::job::JOB_LABEL, j.metadata.name);
            let pods = client.list_pods(Some(&selector)).await?.items;
            let mut rows: Vec<(u32, Vec<String>)> = pods
                .iter()
                .filter_map(|p| specs::job::membership(p).map(|(_, rank, _)| (rank, p)))
                .map(|(rank, p)| {
                    let m = specs::job::member_status(&j.metadata.name, rank, Some(p));
                    let cpus = p
                        .status
                        .as_ref()
                        .and_then(|st| st.placement.as_ref())
                        .map(|pl| pl.containers.iter().map(|c| c.cpus.to_string()).collect::<Vec<_>>().join(" "))
                        .unwrap_or_else(|| "-".into());
                    (rank, member_row(&m, &pod_status(p), &cpus))
                })
                .collect();
            if rows.is_empty() {
                // Ended and gone: the job's own record of them.
                rows = s.members.iter().map(|m| (m.rank, member_row(m, &format!("{:?}", m.phase), "-"))).collect();
            }
            rows.sort_by_key(|(r, _)| *r);
            out.push_str("Members:\n");
            let rows: Vec<Vec<String>> = rows.into_iter().map(|(_, r)| r).collect();
            for line in table(&["RANK", "POD", "STATUS", "NODE", "CPUS", "EXIT"], &rows).lines() {
                let _ = writeln!(out, "  {line}");
            }
            let events = client.events("Job", &j.metadata.name).await?;
            events_section(&mut out, &events.items);
        }
        Kind::DaemonSet => {
            let d = client.get_daemonset(&args.name).await?;
            let selector = format!("{}={}", specs::daemonset::DAEMONSET_LABEL, d.metadata.name);
            let pods = client.list_pods(Some(&selector)).await?.items;
            describe_daemonset(&mut out, &d, &pods);
        }
        Kind::Deployment => {
            let d = client.get_deployment(&args.name).await?;
            let selector = format!("{}={}", specs::deployment::DEPLOYMENT_LABEL, d.metadata.name);
            let pods = client.list_pods(Some(&selector)).await?.items;
            describe_deployment(&mut out, &d, &pods);
        }
        Kind::Node => {
            let n = client.get_node(&args.name).await?;
            let t = &n.spec.topology;
            let _ = writeln!(out, "Name:        {}", n.metadata.name);
            let _ = writeln!(out, "Condition:   {:?}", n.status.condition);
            let _ = writeln!(out, "Last report: {}", n.status.last_report.as_deref().unwrap_or("-"));
            if !n.status.offline_cpus.is_empty() {
                let _ = writeln!(out, "Offline:     CPUs {} (not handed out until back online)", n.status.offline_cpus);
            }
            conditions_section(&mut out, &n.status.conditions);
            let _ = writeln!(
                out,
                "Topology:    {} sockets, {} NUMA nodes, {} cores, {} CPUs",
                t.sockets(),
                t.numa_nodes.len(),
                t.cores(),
                t.cpus.len()
            );
            let s = &n.spec.settings;
            let _ = writeln!(
                out,
                "Settings:    topology-policy={:?} scope={:?} reserved-cpus={}",
                s.topology_policy, s.topology_scope, s.reserved_cpus
            );
            kernel_section(&mut out, &t.kernel);
            let _ = writeln!(out, "Allocation epoch: {}", n.status.allocations.epoch);
            // The engine's allocatable check, in numbers: what a new pod's requests must fit in.
            let offered = specs::engine::allocatable(t, s);
            let used = n.status.allocations.requested(&s.reserved(t));
            let cpu = |m: u64| specs::Quantity::from_millis(i64::try_from(m).unwrap_or(i64::MAX)).as_str().to_string();
            let mut line = format!(
                "Requested:   cpu {} of {} allocatable, memory {}Mi of {}Mi",
                cpu(used.cpu_millis),
                cpu(offered.cpu_millis),
                used.memory >> 20,
                offered.memory >> 20
            );
            for (size, total) in offered.hugepages.iter().filter(|(_, t)| **t > 0) {
                let taken = used.hugepages.get(size).copied().unwrap_or(0);
                line.push_str(&format!(", hugepages-{}Ki {}Mi of {}Mi", size >> 10, taken >> 20, total >> 20));
            }
            let _ = writeln!(out, "{line}");
            out.push_str("NUMA nodes:\n");
            let rows: Vec<Vec<String>> = n
                .status
                .numa
                .iter()
                .map(|z| {
                    vec![
                        z.id.to_string(),
                        z.cpus.to_string(),
                        z.free_cpus.to_string(),
                        format!("{}Mi/{}Mi", z.free_memory_bytes >> 20, z.memory_bytes >> 20),
                        z.hugepages
                            .iter()
                            .map(|h| format!("{}Ki:{}/{}", h.page_size_bytes >> 10, h.free, h.total))
                            .collect::<Vec<_>>()
                            .join(" "),
                        z.devices
                            .iter()
                            .map(|(k, d)| format!("{k}:{}/{}", d.free, d.total))
                            .collect::<Vec<_>>()
                            .join(" "),
                    ]
                })
                .collect();
            for line in table(&["NUMA", "CPUS", "FREE", "MEMORY(FREE/TOTAL)", "HUGEPAGES", "DEVICES"], &rows).lines() {
                let _ = writeln!(out, "  {line}");
            }
            devices_section(&mut out, t, s, &n.status.allocations);
            out.push_str("Pods:\n");
            if n.status.allocations.pods.is_empty() {
                out.push_str("  <none>\n");
            }
            for (pod, p) in &n.status.allocations.pods {
                let cpus: Vec<String> = p.containers.iter().map(|c| format!("{}:{}", c.name, c.cpus)).collect();
                let _ = writeln!(out, "  {pod}: NUMA {} cpus {}", p.numa_affinity, cpus.join(" "));
            }
            let events = client.events("Node", &n.metadata.name).await?;
            events_section(&mut out, &events.items);
        }
    }
    out!("{out}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn conditions_say_their_reason_and_fix() {
        let mut out = String::new();
        conditions_section(&mut out, &[]);
        assert_eq!(out, "");
        let c = specs::api::Condition {
            kind: specs::api::POD_NETWORK.into(),
            status: specs::api::ConditionStatus::False,
            reason: "CNIPluginMissing".into(),
            message: "pods get only lo: CNI plugin \"bridge\" not found in /usr/lib/cni".into(),
            fix: Some("apt-get install containernetworking-plugins".into()),
        };
        conditions_section(&mut out, &[c]);
        assert_eq!(
            out,
            "Conditions:\n  PodNetwork=False (CNIPluginMissing): pods get only lo: CNI plugin \"bridge\" not found in \
             /usr/lib/cni\n    fix: apt-get install containernetworking-plugins\n"
        );
    }

    #[test]
    fn placement_names_what_was_placed_remotely() {
        let mut out = String::new();
        placement_section(&mut out, None);
        assert_eq!(out, "Placement:   <none>\n");
        let pl = specs::status::PlacementSummary {
            numa_affinity: specs::NumaSet::parse_list("1").unwrap(),
            containers: vec![specs::status::ContainerPlacementSummary {
                name: "upf".into(),
                cpu_policy: specs::CpuPolicy::Exclusive,
                cpus: specs::CpuSet::parse_list("4-5").unwrap(),
                mems: specs::NumaSet::parse_list("1").unwrap(),
                devices: vec!["0000:3b:00.1".into()],
            }],
            remote: vec![specs::engine::RemotePlacement {
                container: "upf".into(),
                resource: "pinion.io/sriov-vf".into(),
                numa_nodes: specs::NumaSet::parse_list("0").unwrap(),
                reason: "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 1".into(),
            }],
        };
        let mut out = String::new();
        placement_section(&mut out, Some(&pl));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Placement:");
        assert_eq!(lines[1], "  NUMA affinity: 1");
        assert_eq!(
            lines.last().copied(),
            Some("  Remote: container upf: pinion.io/sriov-vf on NUMA node 0 (relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 1)")
        );
    }

    #[test]
    fn the_kernel_profile_shows_in_two_lines() {
        let mut out = String::new();
        kernel_section(&mut out, &Default::default());
        assert_eq!(
            out,
            "Kernel:      realtime=false isolcpus=- nohz_full=- rcu_nocbs=-\n             governors=- idle-states=-\n"
        );
        let k = specs::topology::KernelProfile {
            isolated_cpus: "2-3".parse().unwrap(),
            nohz_full: "2-3".parse().unwrap(),
            rcu_nocbs: "1-3".parse().unwrap(),
            realtime: true,
            governors: vec!["performance".into(), "powersave".into()],
            idle_states: vec!["POLL".into(), "C1".into()],
        };
        let mut out = String::new();
        kernel_section(&mut out, &k);
        assert_eq!(
            out,
            "Kernel:      realtime=true isolcpus=2-3 nohz_full=2-3 rcu_nocbs=1-3\n             governors=performance powersave idle-states=POLL C1\n"
        );
    }

    #[test]
    fn devices_show_their_locality_and_holder() {
        let mut t = specs::topology::synthetic::parse("pack:2 numa:1 core:1 pu:1").unwrap();
        let gpu = |address: &str, numa: u32| specs::topology::PciDevice {
            address: address.into(),
            class: "0x030200".into(),
            numa: Some(numa),
            resource: Some("nvidia.com/gpu".into()),
            ..Default::default()
        };
        t.devices = vec![gpu("0000:3b:00.0", 0), gpu("0000:86:00.0", 1)];
        t.set_device_locality();
        t.devices[1].numa_node.clear(); // a node that registered before DRA lists: computed
        let s = NodeSettings { devices: t.device_resources(), ..Default::default() };
        let mut allocations = Allocations::default();
        let pod: specs::engine::Placement = serde_json::from_value(serde_json::json!({
            "numaAffinity": [1],
            "containers": [{"name": "main", "cpuPolicy": "exclusive", "cpus": [1], "mems": [1],
                            "devices": {"nvidia.com/gpu": ["0000:86:00.0"]}}]
        }))
        .unwrap();
        allocations.pods.insert("default/train".into(), pod);
        let mut out = String::new();
        devices_section(&mut out, &t, &s, &allocations);
        assert_eq!(
            out,
            "\
Devices:
  RESOURCE         ADDRESS        NUMA   NUMANODE   POD
  nvidia.com/gpu   0000:3b:00.0   0      [0]        -
  nvidia.com/gpu   0000:86:00.0   1      [1]        default/train
"
        );
    }
}
