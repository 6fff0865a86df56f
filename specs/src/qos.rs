//! QoS class, derived as Kubernetes does, and the default CPU policy that follows.

use serde::{Deserialize, Serialize};

use crate::pod::{Container, CpuPolicy, Pod, RESOURCE_CPU, RESOURCE_MEMORY};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Kubernetes' rule: Guaranteed when every container sets cpu and memory limits
/// equal to their requests; BestEffort when no container sets any cpu or memory
/// request or limit; otherwise Burstable.
pub fn qos_class(pod: &Pod) -> QosClass {
    let mut any = false;
    let mut all_guaranteed = true;
    for c in &pod.spec.containers {
        for r in [RESOURCE_CPU, RESOURCE_MEMORY] {
            let req = c.resources.requests.get(r);
            let lim = c.resources.limits.get(r);
            if req.is_some_and(|q| !q.is_zero()) || lim.is_some_and(|q| !q.is_zero()) {
                any = true;
            }
            match (req, lim) {
                (_, None) => all_guaranteed = false,
                (Some(req), Some(lim)) if req != lim => all_guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        QosClass::BestEffort
    } else if all_guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The CPU policy a container gets: its own `cpuPolicy` if set, else exclusive
/// for a Guaranteed pod's container with an integer CPU request (the kubelet's
/// static policy), else shared.
pub fn effective_cpu_policy(qos: QosClass, c: &Container) -> CpuPolicy {
    if let Some(p) = c.cpu_policy {
        return p;
    }
    let integer_cpu = c.resources.request(RESOURCE_CPU).is_some_and(|q| q.is_whole() && !q.is_zero());
    if qos == QosClass::Guaranteed && integer_cpu {
        CpuPolicy::Exclusive
    } else {
        CpuPolicy::Shared
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;
    use crate::quantity::Quantity;

    /// A container from `(requests, limits)` as `name=qty` lists, and an optional policy.
    fn container(name: &str, req: &[(&str, &str)], lim: &[(&str, &str)], policy: Option<CpuPolicy>) -> Container {
        let mut c = Container { name: name.into(), cpu_policy: policy, ..Default::default() };
        for (k, v) in req {
            c.resources.requests.insert(k.to_string(), Quantity::parse(v).unwrap());
        }
        for (k, v) in lim {
            c.resources.limits.insert(k.to_string(), Quantity::parse(v).unwrap());
        }
        c
    }

    fn check(containers: Vec<Container>, qos: QosClass, policies: &[CpuPolicy]) {
        let pod = Pod::new("", crate::pod::PodSpec { containers, ..Default::default() });
        let got = qos_class(&pod);
        assert_eq!(got, qos, "{:?}", pod.spec.containers);
        let got: Vec<CpuPolicy> = pod.spec.containers.iter().map(|c| effective_cpu_policy(got, c)).collect();
        assert_eq!(got, policies, "{:?}", pod.spec.containers);
    }

    #[test]
    fn classes_and_default_policies() {
        use CpuPolicy::*;
        use QosClass::*;
        let g2 = [("cpu", "2"), ("memory", "1Gi")];
        let g15 = [("cpu", "1.5"), ("memory", "1Gi")];
        let cases: Vec<(Vec<Container>, QosClass, Vec<CpuPolicy>)> = vec![
            // Guaranteed with integer cpu: exclusive.
            (vec![container("a", &g2, &g2, None)], Guaranteed, vec![Exclusive]),
            // Limits only: requests default to limits, still Guaranteed.
            (vec![container("a", &[], &g2, None)], Guaranteed, vec![Exclusive]),
            // Guaranteed with fractional cpu: shared.
            (vec![container("a", &g15, &g15, None)], Guaranteed, vec![Shared]),
            // Explicit policy wins over the default.
            (vec![container("a", &g2, &g2, Some(Shared))], Guaranteed, vec![Shared]),
            (vec![container("a", &g2, &g2, Some(Numa))], Guaranteed, vec![Numa]),
            (vec![container("a", &[("cpu", "1")], &[], Some(Immovable))], Burstable, vec![Immovable]),
            // Request below limit: Burstable, shared even with integer cpu.
            (vec![container("a", &[("cpu", "1"), ("memory", "1Gi")], &g2, None)], Burstable, vec![Shared]),
            // Memory limit missing: Burstable.
            (vec![container("a", &[("cpu", "2")], &[("cpu", "2")], None)], Burstable, vec![Shared]),
            // One Guaranteed container, one without resources: Burstable for all.
            (vec![container("a", &g2, &g2, None), container("b", &[], &[], None)], Burstable, vec![Shared, Shared]),
            // No cpu/memory anywhere: BestEffort (devices do not count).
            (vec![container("a", &[], &[], None)], BestEffort, vec![Shared]),
            (vec![container("a", &[("pinion.io/vf", "1")], &[("pinion.io/vf", "1")], None)], BestEffort, vec![Shared]),
            // Two Guaranteed containers: each gets its own default.
            (
                vec![container("a", &g2, &g2, None), container("b", &g15, &g15, None)],
                Guaranteed,
                vec![Exclusive, Shared],
            ),
        ];
        for (cs, qos, pol) in cases {
            check(cs, qos, &pol);
        }
    }
}
