//! The agent's decisions as pure functions of what it knows: whether a container
//! that exited is restarted, what phase a finished pod ends in, whether a
//! rejected pod is tried again, whether a scheduler's plan can be adopted as is,
//! and what a container is given when it starts. No I/O here, so every decision
//! is table-tested.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use specs::pod::{RootfsSource, HUGEPAGES_PREFIX, RESOURCE_CPU, RESOURCE_MEMORY};
use specs::{Allocations, Container, ContainerPlacement, CpuPolicy, CpuSet, NodeTopology, Placement, Pod, PodPhase};
use specs::{Quantity, RestartPolicy};

use crate::checkpoint::spec_hash;
use crate::fsutil::fnv1a64;
use crate::runtime::{ContainerConfig, CpuQuota, RootfsConfig, RunAs};
use crate::source::BoundPlan;

/// Exit code recorded when a container could not be started at all (the
/// runtime's error is in the pod's message).
pub(crate) const START_ERROR_CODE: i32 = 128;
/// Exit code recorded when a container vanished while the agent was away and
/// no runtime recorded how it ended.
pub(crate) const LOST_CODE: i32 = 255;

/// Whether a container that exited with `code` is started again.
pub fn restarts(policy: RestartPolicy, code: i32) -> bool {
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != 0,
        RestartPolicy::Never => false,
    }
}

/// The phase of a pod none of whose containers will run again: Succeeded when
/// every container's last exit code is 0.
pub(crate) fn finished_phase(exit_codes: &[i32]) -> PodPhase {
    if exit_codes.iter().all(|&c| c == 0) {
        PodPhase::Succeeded
    } else {
        PodPhase::Failed
    }
}

/// The `reason` of an exited container, in the kubelet's words.
pub(crate) fn exit_reason(code: i32, oom_killed: bool) -> &'static str {
    if oom_killed {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else if code == START_ERROR_CODE {
        "StartError"
    } else {
        "Error"
    }
}

/// Whether a pod the engine rejected at `rejected_at` (an allocation epoch) is
/// tried again now: only once something was freed after it (`last_release`:
/// the epoch a release left the allocations at). Admissions only take
/// resources, and a pod that did not fit does not fit in less, so neither the
/// same state nor a fuller one is tried again: with a queue of jobs, every
/// admission would otherwise run the engine for every pod still waiting.
pub(crate) fn retry_admission(rejected_at: Option<u64>, last_release: u64) -> bool {
    rejected_at.is_none_or(|r| r < last_release)
}

/// Checks a scheduler's plan before adopting it without running the engine:
/// computed against the current epoch, one placement per container by name,
/// exclusive CPUs on this machine, not reserved, and free.
pub(crate) fn check_plan(
    topology: &NodeTopology,
    reserved: &CpuSet,
    alloc: &Allocations,
    pod: &Pod,
    plan: &BoundPlan,
) -> Result<(), String> {
    if plan.epoch != alloc.epoch {
        return Err(format!("plan computed at epoch {}, node is at {}", plan.epoch, alloc.epoch));
    }
    let names: Vec<&str> = pod.spec.containers.iter().map(|c| c.name.as_str()).collect();
    let planned: Vec<&str> = plan.placement.containers.iter().map(|c| c.name.as_str()).collect();
    if names != planned {
        return Err(format!("plan names containers {planned:?}, pod has {names:?}"));
    }
    let all = topology.all_cpus();
    let mut taken = alloc.exclusive_cpus();
    for c in &plan.placement.containers {
        if !matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable) {
            continue;
        }
        if !c.cpus.is_subset(&all) {
            return Err(format!("container {}: CPUs {} not on this machine", c.name, c.cpus.difference(&all)));
        }
        if c.cpu_policy == CpuPolicy::Exclusive {
            if !c.cpus.is_disjoint(reserved) {
                return Err(format!("container {}: CPUs {} are reserved", c.name, c.cpus.intersection(reserved)));
            }
            if !c.cpus.is_disjoint(&taken) {
                return Err(format!("container {}: CPUs {} are taken", c.name, c.cpus.intersection(&taken)));
            }
            taken.union_with(&c.cpus);
        }
    }
    Ok(())
}

/// Keeps `[A-Za-z0-9.-]`, turns everything else into `-`, at most `max` bytes.
pub(crate) fn sanitize(s: &str, max: usize) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '-' }).take(max).collect()
}

/// The runtime id of one incarnation of a container: readable, unique per node
/// (the hash keeps `static/a-b` and an orchestrator pod `static-a-b` apart, and a
/// replaced pod's containers from the old version's), a plain file name of at
/// most 128 bytes.
pub fn runtime_id(pod_key: &str, container: &str, spec_hash: &str, incarnation: u32) -> String {
    let hash = fnv1a64(format!("{pod_key}\0{container}\0{spec_hash}").as_bytes()) as u32;
    let key = sanitize(pod_key.trim_start_matches(['.', '-', '/']), 60);
    let key = if key.is_empty() { "pod".to_string() } else { key };
    format!("{key}_{}_{hash:08x}_{incarnation}", sanitize(container, 40))
}

/// The folder name of a pod key: `/` becomes `_` (which `sanitize` never
/// produces), so two keys never share a folder.
pub(crate) fn key_dir(pod_key: &str) -> String {
    pod_key.split('/').map(|part| sanitize(part, 120)).collect::<Vec<_>>().join("_")
}

/// What tells one pod of a key from another for its logs: `metadata.uid`, or
/// for a pod without one (static pods) `h` and its spec hash.
pub(crate) fn log_uid(pod: &Pod, spec_hash: &str) -> String {
    match pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => uid.to_string(),
        None => format!("h{spec_hash}"),
    }
}

/// The pod's network as `crate::cni` sets it up: `None` on a node without
/// a CNI network, and for a `hostNetwork` pod. Its network-function devices
/// (allocated devices with a host `netdev`) go in with the names the pod asks
/// for (`pinion.io/interfaces`), the others as `netN`, the first free from
/// `net1`. A name annotation that does not parse (a static pod skips the
/// API's validation) names nothing.
pub(crate) fn pod_network(
    cni: Option<&crate::cni::CniConfig>,
    topology: &NodeTopology,
    pod_key: &str,
    pod: &Pod,
    spec_hash: &str,
    placement: &Placement,
) -> Option<crate::cni::PodNetRequest> {
    cni?;
    if pod.spec.host_network {
        return None;
    }
    let names = pod
        .metadata
        .annotations
        .get(specs::pod::INTERFACES_ANNOTATION)
        .and_then(|v| specs::pod::interface_names(v).ok())
        .unwrap_or_default();
    let mut used: std::collections::BTreeSet<String> = names.iter().map(|(_, n)| n.clone()).collect();
    let mut netdevs = Vec::new();
    let mut devices: Vec<(&String, &String)> = placement
        .containers
        .iter()
        .flat_map(|c| c.devices.iter().flat_map(|(r, addrs)| addrs.iter().map(move |a| (r, a))))
        .collect();
    devices.dedup();
    let mut asked_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (resource, address) in devices {
        let Some(host) = topology.devices.iter().find(|d| &d.address == address).and_then(|d| d.netdev.clone()) else {
            continue;
        };
        let nth = asked_of.entry(resource.as_str()).or_default();
        let asked = names.iter().filter(|(r, _)| r == resource).nth(*nth).map(|(_, n)| n.clone());
        *nth += 1;
        let name = asked.unwrap_or_else(|| {
            let free = (1..).map(|i| format!("net{i}")).find(|n| !used.contains(n)).unwrap_or_default();
            used.insert(free.clone());
            free
        });
        netdevs.push((host, name));
    }
    Some(crate::cni::PodNetRequest {
        key: pod_key.to_string(),
        sandbox: crate::cni::sandbox_id(pod_key, &log_uid(pod, spec_hash)),
        netdevs,
        userns: None,
    })
}

/// A pod's log folder: `<data>/logs/<pod key, sanitized>_<uid, sanitized>/`.
/// Keyed by the uid, so a pod re-created under the same name starts with no
/// logs; the agent removes the folder when it forgets the pod.
pub(crate) fn pod_log_dir(data_dir: &Path, pod_key: &str, uid: &str) -> PathBuf {
    data_dir.join("logs").join(format!("{}_{}", key_dir(pod_key), sanitize(uid, 80)))
}

/// Where a container's log goes: `<pod log folder>/<container>.log` (see
/// [`pod_log_dir`]); the node's log endpoint finds a log with this.
pub(crate) fn container_log_path(data_dir: &Path, pod_key: &str, uid: &str, container: &str) -> PathBuf {
    pod_log_dir(data_dir, pod_key, uid).join(format!("{}.log", sanitize(container, 120)))
}

/// [`container_log_path`] of `pod` as the agent names it (its uid, or its
/// spec hash for a static pod): for a caller that holds the pod itself.
pub fn pod_container_log_path(data_dir: &Path, pod_key: &str, pod: &Pod, container: &str) -> PathBuf {
    container_log_path(data_dir, pod_key, &log_uid(pod, &spec_hash(pod)), container)
}

fn quantity_u64(q: Option<&Quantity>) -> Option<u64> {
    q.and_then(|q| u64::try_from(q.units_ceil()).ok()).filter(|&v| v > 0)
}

/// The container's environment, with `PINION_CPUS` (the CPUs it is pinned to,
/// a Linux CPU list) when it holds CPUs of its own: what a rank binds its
/// threads to (a shared container's pool changes as pods come and go, so it
/// gets none).
fn with_cpus_env(c: &Container, placement: &ContainerPlacement, cpus: &CpuSet) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        c.env.iter().filter(|e| e.name != CPUS_ENV).map(|e| (e.name.clone(), e.value.clone())).collect();
    if placement.cpu_policy != CpuPolicy::Shared && !cpus.is_empty() {
        env.push((CPUS_ENV.to_string(), cpus.to_string()));
    }
    env
}

/// The variable naming an exclusive container's CPUs.
pub(crate) const CPUS_ENV: &str = "PINION_CPUS";

/// Everything the runtime needs to start one container of an admitted pod.
/// `cpus` is the container's live cpuset (`Allocations::cpuset_for`);
/// `node_pids_limit` the node's `--pod-pids-limit`, for a pod that sets none.
#[allow(clippy::too_many_arguments)]
pub(crate) fn container_config(
    data_dir: &Path,
    device_nodes: &BTreeMap<String, Vec<PathBuf>>,
    pod_key: &str,
    pod: &Pod,
    c: &Container,
    placement: &ContainerPlacement,
    cpus: CpuSet,
    id: String,
    node_pids_limit: Option<u64>,
) -> ContainerConfig {
    let res = &c.resources;
    let shared = matches!(placement.cpu_policy, CpuPolicy::Shared | CpuPolicy::Numa);
    // Shared containers are held to their CPU limit by CFS; exclusive ones own
    // whole CPUs and get no quota (as the kubelet's static CPU manager).
    let cpu_quota = res.limits.get(RESOURCE_CPU).filter(|_| shared).and_then(|q| {
        let millis = i64::try_from(q.millis_ceil()).ok().filter(|&m| m > 0)?;
        Some(CpuQuota { quota_us: millis.saturating_mul(100), period_us: 100_000 })
    });
    // The kubelet's shares: 1024 per CPU requested, at least 2.
    let cpu_shares = Some(
        res.request(RESOURCE_CPU)
            .and_then(|q| u64::try_from(q.millis_ceil()).ok())
            .map_or(2, |m| (m.saturating_mul(1024) / 1000).max(2)),
    );
    let mut hugepage_limits = BTreeMap::new();
    for (name, q) in &res.limits {
        if let Some(size) = name.strip_prefix(HUGEPAGES_PREFIX) {
            if let (Ok(size), Some(limit)) = (Quantity::parse(size), quantity_u64(Some(q))) {
                if let Ok(size) = u64::try_from(size.units_ceil()) {
                    hugepage_limits.insert(size, limit);
                }
            }
        }
    }
    // Devices share nodes (every GPU brings /dev/nvidiactl): each once, as
    // a runtime creates each node once.
    let mut seen = std::collections::BTreeSet::new();
    let device_nodes = placement
        .devices
        .values()
        .flatten()
        .flat_map(|addr| device_nodes.get(addr).cloned().unwrap_or_default())
        .filter(|node| seen.insert(node.clone()))
        .collect();
    let rootfs = match (&c.image, c.rootfs) {
        (Some(image), _) => RootfsConfig::Image(image.clone()),
        (None, Some(RootfsSource::Host) | None) => RootfsConfig::Host,
    };
    let caps = c.security_context.as_ref().and_then(|s| s.capabilities.as_ref());
    ContainerConfig {
        id,
        pod: pod_key.to_string(),
        container: c.name.clone(),
        args: c.command.iter().chain(&c.args).cloned().collect(),
        env: with_cpus_env(c, placement, &cpus),
        cwd: c.working_dir.clone().unwrap_or_else(|| "/".into()),
        rootfs,
        cpus,
        mems: placement.mems.clone(),
        bind_memory: !placement.mems.is_empty(),
        memory_limit_bytes: quantity_u64(res.limits.get(RESOURCE_MEMORY)),
        cpu_quota,
        cpu_shares,
        hugepage_limits,
        device_nodes,
        host_network: pod.spec.host_network,
        netns: None,
        system_cpus: CpuSet::new(),
        cap_add: caps
            .map(|c| c.add.iter().filter_map(|n| specs::pod::capability_name(n)).collect())
            .unwrap_or_default(),
        cap_drop: caps
            .map(|c| {
                c.drop
                    .iter()
                    .filter_map(|n| {
                        if n.eq_ignore_ascii_case("ALL") {
                            Some("ALL".into())
                        } else {
                            specs::pod::capability_name(n)
                        }
                    })
                    .collect()
            })
            .unwrap_or_default(),
        log_path: pod_container_log_path(data_dir, pod_key, pod, &c.name),
        init: pod.spec.init,
        pids_limit: pod.spec.pids_limit.or(node_pids_limit),
        realtime_budget_us: None,
        mounts: c
            .volume_mounts
            .iter()
            .filter_map(|m| {
                // Validation made every mount name a volume of the pod.
                let v = pod.spec.volumes.iter().find(|v| v.name == m.name)?;
                Some(crate::runtime::BindMount {
                    source: PathBuf::from(&v.host_path.path),
                    destination: PathBuf::from(&m.mount_path),
                    read_only: m.read_only,
                })
            })
            .collect(),
        run_as: run_as(pod, c),
        // The agent claims the pod's ids at start (`plan::start_config` names the pod).
        userns: None,
        output: output_files(pod),
    }
}

/// A batch job's output files, from its member's annotations.
fn output_files(pod: &Pod) -> Option<crate::runtime::OutputFiles> {
    let a = &pod.metadata.annotations;
    let stdout = a.get(specs::batch::OUTPUT_ANNOTATION)?;
    Some(crate::runtime::OutputFiles {
        stdout: PathBuf::from(stdout),
        stderr: a.get(specs::batch::ERROR_ANNOTATION).filter(|e| *e != stdout).map(PathBuf::from),
    })
}

/// Who container `c`'s processes are: its own `runAsUser` and `runAsGroup`
/// over the pod's, the pod's `supplementalGroups`, and the pod's
/// `runAsUserName` only when no uid is given at either level (the runtime
/// looks the name up on the node; a uid needs no lookup).
pub(crate) fn run_as(pod: &Pod, c: &Container) -> RunAs {
    let pod_sc = pod.spec.security_context.as_ref();
    let c_sc = c.security_context.as_ref();
    let uid = c_sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user));
    RunAs {
        uid,
        gid: c_sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group)),
        supplemental_groups: pod_sc.map(|s| s.supplemental_groups.clone()).unwrap_or_default(),
        user_name: pod_sc.and_then(|s| s.run_as_user_name.clone()).filter(|_| uid.is_none()),
    }
}

/// The placement of container `name` (placements list containers by name).
pub(crate) fn placement_of<'a>(placement: &'a Placement, name: &str) -> Option<&'a ContainerPlacement> {
    placement.containers.iter().find(|c| c.name == name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use specs::testing::pod;
    use specs::topology::{Cpu, NumaNode};
    use specs::NumaSet;

    #[test]
    fn restart_decisions() {
        let check = |policy, code, expected| assert_eq!(restarts(policy, code), expected, "{policy:?} {code}");
        check(RestartPolicy::Always, 0, true);
        check(RestartPolicy::Always, 1, true);
        check(RestartPolicy::OnFailure, 0, false);
        check(RestartPolicy::OnFailure, 137, true);
        check(RestartPolicy::OnFailure, START_ERROR_CODE, true);
        check(RestartPolicy::Never, 0, false);
        check(RestartPolicy::Never, 1, false);
    }

    #[test]
    fn finished_phases_and_reasons() {
        assert_eq!(finished_phase(&[0, 0]), PodPhase::Succeeded);
        assert_eq!(finished_phase(&[0, 2]), PodPhase::Failed);
        assert_eq!(exit_reason(0, false), "Completed");
        assert_eq!(exit_reason(137, true), "OOMKilled");
        assert_eq!(exit_reason(1, false), "Error");
        assert_eq!(exit_reason(START_ERROR_CODE, false), "StartError");
    }

    #[test]
    fn rejections_retry_only_after_the_epoch_moves() {
        let check = |rejected_at, last_release, expected: bool, why: &str| {
            assert_eq!(retry_admission(rejected_at, last_release), expected, "{why}")
        };
        check(None, 0, true, "never tried");
        check(Some(4), 4, false, "same state");
        check(Some(4), 5, true, "something was freed since");
        check(Some(6), 5, false, "only admissions since: less room, not more");
    }

    #[test]
    fn log_folders_belong_to_one_pod() {
        let d = Path::new("/d");
        let mut p = pod("p").named("a").build();
        assert_eq!(log_uid(&p, "0123"), "h0123", "a static pod: its spec hash");
        p.metadata.uid = Some("7f3e-11".into());
        assert_eq!(log_uid(&p, "0123"), "7f3e-11");
        let check = |key: &str, uid: &str, want: &str| {
            assert_eq!(container_log_path(d, key, uid, "main"), PathBuf::from(want), "{key} {uid}")
        };
        check("static/web", "h1", "/d/logs/static_web_h1/main.log");
        check("web", "u/../x", "/d/logs/web_u-..-x/main.log");
        check("static/web/x", "u", "/d/logs/static_web_x_u/main.log");
        // Two pods of one key never share a folder, nor do two keys.
        assert_ne!(pod_log_dir(d, "web", "u1"), pod_log_dir(d, "web", "u2"));
        assert_ne!(pod_log_dir(d, "static/a", "u"), pod_log_dir(d, "static-a", "u"));
    }

    #[test]
    fn runtime_ids_are_plain_unique_file_names() {
        let a = runtime_id("static/web", "main", "h", 0);
        assert!(a.starts_with("static-web_main_"), "{a}");
        assert!(a.ends_with("_0"));
        assert_ne!(a, runtime_id("static-web", "main", "h", 0), "same sanitized key, different pods");
        assert_ne!(a, runtime_id("static/web", "main", "h", 1), "incarnations differ");
        assert_ne!(a, runtime_id("static/web", "main", "h2", 0), "spec versions differ");
        let long = runtime_id(&"x".repeat(300), &"y".repeat(300), "h", u32::MAX);
        assert!(long.len() <= 128, "{}", long.len());
        for id in [a, long, runtime_id("/../..", "a b", "h", 3)] {
            assert!(!id.starts_with(['.', '-']), "{id}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{id}");
        }
    }

    fn topo() -> NodeTopology {
        let cpus = (0..4)
            .map(|id| Cpu { id, core: id, socket: 0, die: None, numa: Some(id / 2), uncore_cache: None })
            .collect();
        let numa_nodes = (0..2)
            .map(|id| NumaNode {
                kind: Default::default(),
                id,
                cpus: CpuSet::range(id * 2, id * 2 + 1).expect("id within MAX_ID"),
                memory_bytes: 1 << 30,
                ..Default::default()
            })
            .collect();
        NodeTopology { cpus, numa_nodes, ..Default::default() }
    }

    fn cp(name: &str, policy: CpuPolicy, cpus: &str) -> ContainerPlacement {
        ContainerPlacement {
            name: name.into(),
            cpu_policy: policy,
            cpus: CpuSet::parse_list(cpus).unwrap(),
            mems: NumaSet::new(),
            memory: Default::default(),
            hugepages: Default::default(),
            devices: Default::default(),
        }
    }

    #[test]
    fn plans_are_checked_before_adoption() {
        let t = topo();
        let p = pod("p").named("a").build();
        let mut alloc = Allocations::default();
        alloc.apply(
            "other",
            Placement {
                numa_affinity: NumaSet::single(0).expect("id within MAX_ID"),
                containers: vec![cp("x", CpuPolicy::Exclusive, "1")],
                ..Default::default()
            },
        );
        let plan = |epoch, c: ContainerPlacement| BoundPlan {
            epoch,
            placement: Placement {
                numa_affinity: NumaSet::single(1).expect("id within MAX_ID"),
                containers: vec![c],
                ..Default::default()
            },
        };
        let check = |plan: BoundPlan, reserved: &str, expected: Result<(), &str>| {
            let got = check_plan(&t, &CpuSet::parse_list(reserved).unwrap(), &alloc, &p, &plan);
            match (got, expected) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(want)) => assert!(e.contains(want), "{e} lacks {want}"),
                (got, want) => panic!("{plan:?}: got {got:?}, want {want:?}"),
            }
        };
        check(plan(1, cp("a", CpuPolicy::Exclusive, "2-3")), "", Ok(()));
        check(plan(1, cp("a", CpuPolicy::Shared, "0,2-3")), "", Ok(()));
        check(plan(0, cp("a", CpuPolicy::Exclusive, "2-3")), "", Err("epoch 0, node is at 1"));
        check(plan(1, cp("b", CpuPolicy::Exclusive, "2-3")), "", Err("plan names containers"));
        check(plan(1, cp("a", CpuPolicy::Exclusive, "1-2")), "", Err("CPUs 1 are taken"));
        check(plan(1, cp("a", CpuPolicy::Exclusive, "3-4")), "", Err("CPUs 4 not on this machine"));
        check(plan(1, cp("a", CpuPolicy::Exclusive, "2-3")), "0,3", Err("CPUs 3 are reserved"));
    }

    #[test]
    fn pod_network_names_netdevs_as_asked() {
        let mut t = topo();
        let nic = |address: &str, netdev: Option<&str>| specs::topology::PciDevice {
            address: address.into(),
            class: "0x020000".into(),
            resource: Some("example.com/vf".into()),
            netdev: netdev.map(String::from),
            ..Default::default()
        };
        t.devices = vec![nic("0000:3b:00.1", Some("vf1")), nic("0000:3b:00.2", Some("vf2")), nic("0000:3b:00.3", None)];
        let cni = crate::cni::CniConfig::new(PathBuf::from("/c"), Vec::new());
        let check = |annotation: Option<&str>,
                     host_network: bool,
                     cni: Option<&crate::cni::CniConfig>,
                     want: Option<&[(&str, &str)]>| {
            let mut p = pod("p").named("a").build();
            p.spec.host_network = host_network;
            if let Some(a) = annotation {
                p.metadata.annotations.insert(specs::pod::INTERFACES_ANNOTATION.into(), a.into());
            }
            let mut c = cp("a", CpuPolicy::Shared, "0");
            let addrs = vec!["0000:3b:00.1".to_string(), "0000:3b:00.3".into(), "0000:3b:00.2".into()];
            c.devices.insert("example.com/vf".into(), addrs);
            let placement = Placement { containers: vec![c], ..Default::default() };
            let got = pod_network(cni, &t, "static/p", &p, "abc", &placement);
            let want = want.map(|w| w.iter().map(|(h, n)| (h.to_string(), n.to_string())).collect::<Vec<_>>());
            assert_eq!(got.as_ref().map(|n| n.netdevs.clone()), want, "{annotation:?}");
            if let Some(n) = got {
                assert_eq!(n.sandbox, crate::cni::sandbox_id("static/p", "habc"));
            }
        };
        check(None, false, Some(&cni), Some(&[("vf1", "net1"), ("vf2", "net2")]));
        check(Some("example.com/vf=fast0"), false, Some(&cni), Some(&[("vf1", "fast0"), ("vf2", "net1")]));
        check(Some("example.com/vf=a,example.com/vf=b"), false, Some(&cni), Some(&[("vf1", "a"), ("vf2", "b")]));
        check(Some("example.com/vf=net2"), false, Some(&cni), Some(&[("vf1", "net2"), ("vf2", "net1")]));
        check(Some("garbage"), false, Some(&cni), Some(&[("vf1", "net1"), ("vf2", "net2")]));
        check(None, true, Some(&cni), None);
        check(None, false, None, None);
    }

    #[test]
    fn container_config_from_pod_and_placement() {
        // Every field the config reads, as a manifest says it.
        let p = Pod::from_yaml(concat!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n",
            "  - name: a\n    command: [sleep]\n    args: [inf]\n    image: busybox:1\n",
            "    env: [{name: K, value: V}]\n    workingDir: /w\n",
            "    securityContext: {capabilities: {add: [sys_nice, CAP_IPC_LOCK], drop: [all, NET_RAW]}}\n",
            "    resources:\n      limits: {cpu: 1500m, memory: 64Mi, hugepages-2Mi: 4Mi}\n",
        ))
        .unwrap();
        let mut placement = cp("a", CpuPolicy::Shared, "0-3");
        placement.mems = NumaSet::single(1).expect("id within MAX_ID");
        placement.devices.insert("pinion.io/vf".into(), vec!["0000:3b:00.1".into()]);
        placement.devices.insert("nvidia.com/gpu".into(), vec!["0000:3c:00.0".into(), "0000:3d:00.0".into()]);
        let nodes: BTreeMap<String, Vec<PathBuf>> = [
            ("0000:3b:00.1".to_string(), vec![PathBuf::from("/dev/vfio/42")]),
            ("0000:3c:00.0".to_string(), vec![PathBuf::from("/dev/nvidia0"), PathBuf::from("/dev/nvidiactl")]),
            ("0000:3d:00.0".to_string(), vec![PathBuf::from("/dev/nvidia1"), PathBuf::from("/dev/nvidiactl")]),
        ]
        .into();
        let cfg = container_config(
            Path::new("/d"),
            &nodes,
            "static/p",
            &p,
            &p.spec.containers[0],
            &placement,
            CpuSet::parse_list("2-3").unwrap(),
            "id1".into(),
            Some(4096),
        );
        assert_eq!(cfg.args, vec!["sleep", "inf"]);
        assert_eq!(cfg.env, vec![("K".to_string(), "V".to_string())]);
        assert_eq!(cfg.cwd, "/w");
        assert_eq!(cfg.rootfs, RootfsConfig::Image("busybox:1".into()));
        assert_eq!(cfg.cpus.to_string(), "2-3");
        assert!(cfg.bind_memory);
        assert_eq!(cfg.memory_limit_bytes, Some(64 << 20));
        assert_eq!(cfg.cpu_quota, Some(CpuQuota { quota_us: 150_000, period_us: 100_000 }));
        assert_eq!(cfg.cpu_shares, Some(1536), "request defaults to the limit");
        assert_eq!(cfg.hugepage_limits, [(2 << 20, 4 << 20)].into());
        // By resource, then address; the shared control node once.
        let nodes: Vec<&str> = cfg.device_nodes.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(nodes, ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1", "/dev/vfio/42"]);
        let uid = log_uid(&p, &spec_hash(&p));
        assert_eq!(cfg.log_path, PathBuf::from(format!("/d/logs/static_p_{uid}/a.log")));
        assert!(!cfg.init);
        assert_eq!(cfg.pids_limit, Some(4096), "the node's default");
        assert_eq!(
            (cfg.cap_add.as_slice(), cfg.cap_drop.as_slice()),
            (
                &["CAP_SYS_NICE".to_string(), "CAP_IPC_LOCK".to_string()][..],
                &["ALL".to_string(), "CAP_NET_RAW".to_string()][..]
            )
        );

        // Exclusive: no quota; no image: host rootfs; no mems: no binding.
        let q = pod("p").named("a").limits("2", "1Gi").build();
        let cfg = container_config(
            Path::new("/d"),
            &BTreeMap::new(),
            "static/q",
            &q,
            &q.spec.containers[0],
            &cp("a", CpuPolicy::Exclusive, "2-3"),
            CpuSet::parse_list("2-3").unwrap(),
            "id2".into(),
            Some(4096),
        );
        assert_eq!((cfg.cpu_quota, cfg.cpu_shares, cfg.bind_memory), (None, Some(2048), false));
        let mut r = q.clone();
        r.spec.pids_limit = Some(64);
        let cfg = container_config(
            Path::new("/d"),
            &BTreeMap::new(),
            "static/r",
            &r,
            &r.spec.containers[0],
            &cp("a", CpuPolicy::Exclusive, "2-3"),
            CpuSet::parse_list("2-3").unwrap(),
            "id3".into(),
            Some(4096),
        );
        assert_eq!(cfg.pids_limit, Some(64), "the pod's own wins");
        assert_eq!(cfg.rootfs, RootfsConfig::Host);
        assert_eq!(cfg.cwd, "/");
        assert_eq!(cfg.run_as, RunAs::default(), "root, as before");
    }

    #[test]
    fn who_a_container_runs_as() {
        use specs::pod::{PodSecurityContext, SecurityContext};
        let check = |pod_sc: Option<PodSecurityContext>, c_ids: Option<(Option<u32>, Option<u32>)>, want: RunAs| {
            let mut p = pod("p").named("a").build();
            p.spec.security_context = pod_sc.clone();
            if let Some((uid, gid)) = c_ids {
                p.spec.containers[0].security_context =
                    Some(SecurityContext { run_as_user: uid, run_as_group: gid, ..Default::default() });
            }
            assert_eq!(run_as(&p, &p.spec.containers[0]), want, "{pod_sc:?} {c_ids:?}");
        };
        let sc = |uid: Option<u32>, gid: Option<u32>, groups: &[u32], name: Option<&str>| PodSecurityContext {
            run_as_user: uid,
            run_as_group: gid,
            supplemental_groups: groups.to_vec(),
            run_as_user_name: name.map(str::to_string),
        };
        let want = |uid: Option<u32>, gid: Option<u32>, groups: &[u32], name: Option<&str>| RunAs {
            uid,
            gid,
            supplemental_groups: groups.to_vec(),
            user_name: name.map(str::to_string),
        };
        check(None, None, RunAs::default());
        check(Some(sc(Some(1001), Some(1001), &[1002], None)), None, want(Some(1001), Some(1001), &[1002], None));
        // The container's ids over the pod's; the pod's groups stay.
        check(
            Some(sc(Some(1001), Some(1001), &[1002], None)),
            Some((Some(2002), None)),
            want(Some(2002), Some(1001), &[1002], None),
        );
        check(None, Some((Some(0), Some(0))), want(Some(0), Some(0), &[], None));
        // A name only when no uid is given anywhere.
        check(Some(sc(None, None, &[], Some("alice"))), None, want(None, None, &[], Some("alice")));
        check(Some(sc(Some(1001), None, &[], Some("alice"))), None, want(Some(1001), None, &[], None));
        check(Some(sc(None, None, &[7], Some("alice"))), Some((Some(3), None)), want(Some(3), None, &[7], None));
        check(Some(sc(None, None, &[], Some("alice"))), Some((None, Some(9))), want(None, Some(9), &[], Some("alice")));
    }
}
