//! The pod builder tests share (feature `testing`): a pod named `name` with
//! one container `main` and nothing else set, then what a test needs said
//! by name, so a test reads as the pod it wants rather than as YAML.

use std::collections::BTreeMap;

use crate::pod::{RootfsSource, TopologySpec};
use crate::{Container, Pod, PodSpec, Quantity, RestartPolicy, TopologyPolicy};

/// A pod `name` of one container `main`: no image, no command, no resources.
pub fn pod(name: &str) -> PodBuilder {
    let main = Container { name: "main".into(), ..Container::default() };
    PodBuilder(Pod::new(name, PodSpec { containers: vec![main], ..PodSpec::default() }))
}

#[derive(Debug, Clone)]
pub struct PodBuilder(Pod);

impl PodBuilder {
    /// The last container, the one the container calls below set.
    fn last(&mut self) -> &mut Container {
        self.0.spec.containers.last_mut().expect("a builder's pod has a container")
    }

    /// Renames the last container.
    pub fn named(mut self, container: &str) -> Self {
        self.last().name = container.into();
        self
    }

    /// Adds a container `name`; the container calls that follow set it.
    pub fn container(mut self, name: &str) -> Self {
        self.0.spec.containers.push(Container { name: name.into(), ..Container::default() });
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.last().image = Some(image.into());
        self
    }

    /// Runs host binaries (`rootfs: host`).
    pub fn host_rootfs(mut self) -> Self {
        self.last().rootfs = Some(RootfsSource::Host);
        self
    }

    pub fn command(mut self, argv: &[&str]) -> Self {
        self.last().command = argv.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Limits only (a request defaults to its limit where the engine reads it).
    pub fn limits(mut self, cpu: &str, memory: &str) -> Self {
        self.last().resources.limits = quantities(cpu, memory);
        self
    }

    /// The same requests and limits: a Guaranteed container.
    pub fn guaranteed(mut self, cpu: &str, memory: &str) -> Self {
        let r = &mut self.last().resources;
        r.requests = quantities(cpu, memory);
        r.limits = r.requests.clone();
        self
    }

    pub fn restart(mut self, policy: RestartPolicy) -> Self {
        self.0.spec.restart_policy = policy;
        self
    }

    pub fn grace_seconds(mut self, seconds: u64) -> Self {
        self.0.spec.termination_grace_period_seconds = Some(seconds);
        self
    }

    /// The pod's containers are these, in place of `main` (table-driven
    /// engine tests build their containers row by row).
    pub fn containers(mut self, containers: Vec<Container>) -> Self {
        self.0.spec.containers = containers;
        self
    }

    /// The whole of `spec.topology`.
    pub fn topology(mut self, topology: TopologySpec) -> Self {
        self.0.spec.topology = Some(topology);
        self
    }

    /// The pod's own topology policy (`spec.topology.policy`).
    pub fn policy(mut self, policy: TopologyPolicy) -> Self {
        self.0.spec.topology.get_or_insert_with(TopologySpec::default).policy = Some(policy);
        self
    }

    pub fn build(self) -> Pod {
        self.0
    }
}

impl From<PodBuilder> for Pod {
    fn from(b: PodBuilder) -> Pod {
        b.0
    }
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    let parse = |q: &str| Quantity::parse(q).unwrap_or_else(|e| panic!("test quantity {q:?}: {e}"));
    BTreeMap::from([("cpu".to_string(), parse(cpu)), ("memory".to_string(), parse(memory))])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's pod is the one the manifest describes.
    #[test]
    fn builds_what_the_manifest_says() {
        let check = |built: PodBuilder, yaml: &str| {
            let text = format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: p}}\n{yaml}");
            let parsed = Pod::from_yaml(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(built.build(), parsed, "{yaml}");
        };
        check(pod("p"), "spec:\n  containers: [{name: main}]\n");
        check(pod("p").named("c").image("busybox"), "spec:\n  containers: [{name: c, image: busybox}]\n");
        check(
            pod("p").restart(RestartPolicy::Never).grace_seconds(0).host_rootfs().command(&["sleep", "inf"]).limits(
                "500m", "64Mi",
            ),
            "spec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {cpu: 500m, memory: 64Mi}\n",
        );
        check(
            pod("p").guaranteed("2", "1Gi").policy(TopologyPolicy::SingleNumaNode).container("side"),
            "spec:\n  topology: {policy: single-numa-node}\n  containers:\n  - name: main\n    resources:\n      requests: {cpu: 2, memory: 1Gi}\n      limits: {cpu: 2, memory: 1Gi}\n  - name: side\n",
        );
        let side = Container { name: "side".into(), ..Container::default() };
        check(
            pod("p")
                .containers(vec![side])
                .topology(TopologySpec { relaxed: vec!["memory".into()], ..TopologySpec::default() }),
            "spec:\n  topology: {relaxed: [memory]}\n  containers: [{name: side}]\n",
        );
    }
}
