//! The contract test: `openapi.yaml` lists exactly the routes the server
//! answers (paths and methods), its version is the crate's, and its schemas
//! are the wire types: a representative value of each type, written out in
//! full, reads into the Rust type and serializes back to the same JSON (so it
//! is the serde shape), and validates against the schema with every object
//! closed (so a field renamed, added or dropped on either side fails here).

use std::collections::BTreeSet;

use orchestrator::api::routes::routes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use specs::api::{
    ApiError, AttachFrame, Event, ExecFrame, ExecRequest, JoinRequest, JoinResponse, List, Node, NodeStatus,
};
use specs::api::{NodeStatusReport, PodRejection, WatchEvent};
use specs::job::Job;
use specs::{Pod, PodStatus};

fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let text = std::fs::read_to_string(path).expect("openapi.yaml");
    serde_yaml_ng::from_str(&text).expect("openapi.yaml parses")
}

#[test]
fn openapi_matches_the_route_table() {
    let doc = document();
    assert_eq!(doc["info"]["version"].as_str(), Some(env!("CARGO_PKG_VERSION")), "info.version");
    let methods = ["get", "put", "post", "delete", "patch", "head", "options"];
    let mut documented = BTreeSet::new();
    for (p, item) in doc["paths"].as_object().expect("paths") {
        for (m, _) in item.as_object().expect("path item") {
            if methods.contains(&m.as_str()) {
                documented.insert((m.to_uppercase(), p.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> =
        routes().iter().map(|r| (r.method.as_str().to_string(), r.path.to_string())).collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "undocumented routes: {missing:?}; documented but not served: {stale:?}"
    );
}

/// Every object schema that lists its properties and says nothing about
/// others gets `additionalProperties: false` (types that ignore unknown
/// fields on input leave it open in the document; their output must still
/// be only the listed fields).
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.contains_key("properties") && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            m.values_mut().for_each(close_objects);
        }
        Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

struct Schemas(Value);

impl Schemas {
    fn load() -> Schemas {
        let mut components = document()["components"].take();
        close_objects(&mut components);
        Schemas(components)
    }

    fn validator(&self, name: &str) -> jsonschema::Validator {
        let root = json!({"$ref": format!("#/components/schemas/{name}"), "components": self.0});
        jsonschema::draft202012::new(&root).unwrap_or_else(|e| panic!("schema {name}: {e}"))
    }

    /// `value` is exactly what `T` writes, and the schema `name` accepts it.
    fn check<T: Serialize + DeserializeOwned>(&self, name: &str, value: Value) {
        let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: {e}\n{value:#}"));
        let written = serde_json::to_value(&typed).expect("serialize");
        assert_eq!(written, value, "{name}: the example is not what the Rust type writes");
        let problems: Vec<String> =
            self.validator(name).iter_errors(&value).map(|e| format!("{}: {e}", e.instance_path)).collect();
        assert!(problems.is_empty(), "{name} does not match openapi.yaml:\n{}", problems.join("\n"));
    }
}

fn placement() -> Value {
    json!({
        "numaAffinity": [0],
        "containers": [{
            "name": "main",
            "cpuPolicy": "exclusive",
            "cpus": [2, 3],
            "mems": [0],
            "memory": {"0": 1073741824u64},
            "hugepages": {"2097152": {"0": 4}},
            "devices": {"pinion.io/sriov-vf": ["0000:3b:00.1"]}
        }],
        "requested": {"cpuMillis": 2000, "memory": 1073741824u64, "hugepages": {"2097152": 8388608}},
        "remote": [{
            "container": "main",
            "resource": "pinion.io/sriov-vf",
            "numaNodes": [1],
            "reason": "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 0"
        }]
    })
}

fn pod_status() -> Value {
    json!({
        "phase": "Running",
        "nodeName": "n1",
        "reason": "Started",
        "message": "all containers started",
        "placement": {
            "numaAffinity": [0],
            "containers": [{"name": "main", "cpuPolicy": "exclusive", "cpus": [2, 3], "mems": [0], "devices": ["0000:3b:00.1"]}],
            "remote": [{"container": "main", "resource": "pinion.io/sriov-vf", "numaNodes": [1],
                        "reason": "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 0"}]
        },
        "containerStatuses": [{"name": "main", "state": "Running", "restartCount": 1, "lastExitCode": 137, "reason": "OOMKilled",
                               "usage": {"cpuNanos": 1_500_000_000u64, "maxRssBytes": 1_048_576, "missing": "memory.peak: absent"}}],
        "startTime": "2026-11-29T13:00:00.000Z",
        "attempts": 1,
        "plan": {"epoch": 7, "placement": placement()},
        "podUid": "0123456789abcdef"
    })
}

fn metadata(name: &str) -> Value {
    json!({
        "name": name,
        "labels": {"app": "web"},
        "annotations": {"pinion.io/wait-for-nodes": "true"},
        "uid": "0123456789abcdef",
        "resourceVersion": 42,
        "creationTimestamp": "2026-01-02T03:04:05Z"
    })
}

fn pod() -> Value {
    json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Pod",
        "metadata": metadata("web"),
        "spec": {
            "containers": [{
                "name": "main",
                "image": "registry.example:5000/team/busybox:1.36",
                "command": ["sleep"],
                "args": ["10"],
                "env": [{"name": "A", "value": "b"}],
                "workingDir": "/tmp",
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "8Mi"}},
                "cpuPolicy": "exclusive",
                "securityContext": {"capabilities": {"add": ["SYS_NICE"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch", "readOnly": true}]
            }, {
                "name": "side",
                "rootfs": "host",
                "resources": {"requests": {"cpu": "500m", "pinion.io/sriov-vf": "1"}}
            }],
            "restartPolicy": "OnFailure",
            "nodeSelector": {"zone": "a"},
            "topology": {"policy": "single-numa-node", "scope": "pod", "memory": "nearest-memory-only", "relaxed": ["pinion.io/sriov-vf"]},
            "schedulingStrategy": "least-numa-nodes",
            "hostNetwork": true,
            "nodeName": "n1",
            "terminationGracePeriodSeconds": 30,
            "init": true,
            "ttlSecondsAfterFinished": 600,
            "volumes": [{"name": "scratch", "hostPath": {"path": "/srv/scratch"}}],
            "pidsLimit": 256,
            "tuning": {
                "irqLoadBalancing": "housekeeping",
                "cpuQuota": "disabled",
                "cpuLoadBalancing": "disabled",
                "cpuCStates": "max-latency-us:10",
                "cpuFreqGovernor": "performance"
            }
        },
        "status": pod_status()
    })
}

fn node_status() -> Value {
    json!({
        "condition": "Ready",
        "lastReport": "2026-01-02T03:04:05Z",
        "allocations": {"epoch": 7, "pods": {"web": placement()}},
        "numa": [{
            "id": 0,
            "cpus": [0, 1, 2, 3],
            "freeCpus": [1],
            "memoryBytes": 68719476736u64,
            "freeMemoryBytes": 67645734912u64,
            "hugepages": [{"pageSizeBytes": 2097152, "total": 16, "free": 12}],
            "devices": {"pinion.io/sriov-vf": {"total": 2, "free": 1}}
        }],
        "offlineCpus": [3],
        "conditions": [condition()]
    })
}

fn condition() -> Value {
    json!({
        "type": "PodNetwork",
        "status": "False",
        "reason": "CNIPluginMissing",
        "message": "CNI plugin \"bridge\" not found in /usr/lib/cni:/opt/cni/bin",
        "fix": "apt-get install containernetworking-plugins"
    })
}

fn node() -> Value {
    json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Node",
        "metadata": metadata("n1"),
        "spec": {
            "topology": {
                "cpus": [
                    {"id": 0, "core": 0, "socket": 0, "die": 0, "numa": 0, "uncoreCache": 0},
                    {"id": 1, "core": 1, "socket": 0, "numa": 0, "uncoreCache": 0}
                ],
                "numaNodes": [{
                    "id": 0,
                    "cpus": [0, 1],
                    "memoryBytes": 68719476736u64,
                    "distances": [10, 12],
                    "hugepages": [{"pageSizeBytes": 2097152, "total": 16}]
                }, {
                    "id": 1,
                    "kind": "memory-only",
                    "cpus": [],
                    "memoryBytes": 17179869184u64,
                    "distances": [12, 10]
                }],
                "devices": [
                    {"address": "0000:3b:00.1", "class": "0x020000", "numa": 0, "resource": "pinion.io/sriov-vf",
                     "deviceNodes": ["/dev/vfio/42", "/dev/vfio/vfio"], "numaNode": [0]},
                    {"address": "0000:00:02.0", "class": "0x030000", "numa": null}
                ],
                "reservedCpus": [0],
                "kernel": {
                    "isolatedCpus": [2, 3],
                    "nohzFull": [2, 3],
                    "rcuNocbs": [2, 3],
                    "realtime": true,
                    "governors": ["performance", "powersave"],
                    "idleStates": ["POLL", "C1"]
                }
            },
            "settings": {
                "reservedCpus": [0],
                "topologyPolicy": "restricted",
                "topologyScope": "container",
                "cpuManager": {
                    "fullPcpusOnly": true,
                    "distributeCpusAcrossNuma": false,
                    "alignBySocket": false,
                    "distributeCpusAcrossCores": false,
                    "preferAlignCpusByUncoreCache": false,
                    "strictCpuReservation": true
                },
                "preferClosestNumaNodes": true,
                "devices": {"pinion.io/sriov-vf": ["0000:3b:00.1"]}
            },
            "endpoint": "10.0.0.1:7444",
            "podCIDR": "10.213.3.0/24",
            "address": "10.0.0.1"
        },
        "status": node_status()
    })
}

fn api_error() -> Value {
    json!({
        "code": 422,
        "reason": "Invalid",
        "message": "pod \"web\" is invalid (1 problem)",
        "details": [{"field": "spec.containers[0].resources.limits.cpu", "message": "must be >= requests.cpu"}]
    })
}

fn event() -> Value {
    json!({
        "metadata": {"name": "web.17", "resourceVersion": 17},
        "involvedObject": {"kind": "Pod", "name": "web"},
        "type": "Warning",
        "reason": "Rejected",
        "message": "node n1 rejected the binding",
        "timestamp": "2026-01-02T03:04:05Z"
    })
}

fn job() -> Value {
    let template = pod();
    json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Job",
        "metadata": metadata("solver"),
        "spec": {
            "template": {"metadata": {"labels": {"app": "cfd"}, "annotations": {"team": "a"}}, "spec": template["spec"]},
            "parallelism": 4,
            "completions": 4,
            "completionMode": "Indexed",
            "backoffLimit": 1,
            "gang": {"minMembers": 2, "placement": "spread", "nodes": 4, "perNode": 1},
            "priority": -3,
            "failurePolicy": "keep-running",
            "ttlSecondsAfterFinished": 60,
            "activeDeadlineSeconds": 3600,
            "dependency": "afterok:prep",
            "partition": "batch"
        },
        "status": {
            "phase": "Failed",
            "attempt": 1,
            "firstFailure": "rank 1 (solver-1) on n2 failed: exit code 3 (Error)",
            "members": [{"rank": 1, "pod": "solver-1", "phase": "Failed", "node": "n2", "exitCode": 3, "reason": "Error"}],
            "completionTime": "2026-01-02T03:04:05Z"
        }
    })
}

#[test]
fn the_wire_types_match_their_schemas() {
    let s = Schemas::load();
    s.check::<Pod>("Pod", pod());
    s.check::<PodStatus>("PodStatus", pod_status());
    s.check::<specs::acct::Record>(
        "AcctRecord",
        json!({
            "apiVersion": "pinion.io/v1", "kind": "AcctRecord", "metadata": metadata("job.0123456789abcdef"),
            "jobId": "sim.1", "jobName": "sim", "member": 1, "user": "ada", "account": "physics", "partition": "batch",
            "submit": 1_795_910_400, "start": 1_795_910_401, "end": 1_795_910_411, "state": "OUT_OF_MEMORY",
            "exitCode": 0, "signal": 9, "cpuNanos": 5_000_000_000u64, "maxRssBytes": 1_048_576,
            "missing": ["memory.peak: absent"], "ncpus": 2, "memRequestBytes": 67_108_864, "nodes": ["n1"]
        }),
    );
    s.check::<Node>("Node", node());
    s.check::<NodeStatus>("NodeStatus", node_status());
    s.check::<NodeStatusReport>(
        "NodeStatusReport",
        json!({
            "nodeName": "n1",
            "allocations": {"epoch": 7, "pods": {"web": placement()}},
            "pods": {"web": pod_status()},
            "offlineCpus": [3],
            "conditions": [condition()]
        }),
    );
    s.check::<PodRejection>("PodRejection", json!({"reason": "InsufficientCpu", "message": "no CPUs left"}));
    s.check::<JoinRequest>("JoinRequest", json!({"nodeName": "n1"}));
    s.check::<JoinRequest>("JoinRequest", json!({"nodeName": "n1", "attempt": "3f1c0ffee0ddba11"}));
    s.check::<JoinResponse>(
        "JoinResponse",
        json!({"nodeName": "n1", "caCert": "PEM", "clientCert": "PEM", "clientKey": "PEM"}),
    );
    s.check::<ApiError>("ApiError", api_error());
    s.check::<ApiError>("ApiError", json!({"code": 404, "reason": "NotFound", "message": "pod \"x\" not found"}));
    s.check::<Event>("Event", event());
    s.check::<List<Pod>>("PodList", json!({"resourceVersion": 42, "items": [pod()], "unreadable": 1}));
    s.check::<List<Node>>("NodeList", json!({"resourceVersion": 42, "items": [node()], "unreadable": 1}));
    s.check::<Job>("Job", job());
    s.check::<List<Job>>("JobList", json!({"resourceVersion": 42, "items": [job()]}));
    let partition = json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Partition",
        "metadata": metadata("batch"),
        "spec": {
            "nodeSelector": {"pool": "cpu"},
            "defaultTimeSeconds": 3600,
            "maxTimeSeconds": 86400,
            "maxCpusPerJob": 64,
            "allowedUsers": ["alice"],
            "default": true
        }
    });
    s.check::<specs::partition::Partition>("Partition", partition.clone());
    s.check::<List<specs::partition::Partition>>("PartitionList", json!({"resourceVersion": 42, "items": [partition]}));
    s.check::<List<specs::fairshare::Share>>(
        "ShareList",
        json!({"resourceVersion": 42, "items": [{"kind": "user", "name": "alice", "usage": 3600.5, "usageShare": 0.75, "fairShare": 0.35}]}),
    );
    s.check::<List<Event>>("EventList", json!({"resourceVersion": 42, "items": [event()]}));
    s.check::<WatchEvent<Pod>>("WatchEvent", json!({"type": "MODIFIED", "object": pod()}));
    s.check::<WatchEvent<Node>>("WatchEvent", json!({"type": "MODIFIED", "object": node()}));
    s.check::<WatchEvent<ApiError>>("WatchEvent", json!({"type": "ERROR", "object": api_error()}));
    // What `apply::bookmark_line` writes, read as the clients read it.
    for kind in [orchestrator::store::Kind::Pod, orchestrator::store::Kind::Node] {
        let line = orchestrator::api::bookmark_line(kind, 42);
        let bookmark: Value = serde_json::from_str(line.trim()).expect("a JSON line");
        s.check::<WatchEvent<Value>>("WatchEvent", bookmark);
    }
    for frame in [
        json!({"type": "status", "resourceVersion": 42, "status": pod_status()}),
        json!({"type": "output", "offset": 6, "data": "hello\n"}),
        json!({"type": "heartbeat"}),
        json!({"type": "notice", "message": "the node's log cannot be read"}),
        json!({"type": "exit", "phase": "Failed", "exitCode": 1, "reason": "Error", "message": "exit code 1"}),
        json!({"type": "exit", "phase": "Succeeded"}),
        json!({"type": "deleted"}),
        json!({"type": "error", "error": api_error()}),
    ] {
        s.check::<AttachFrame>("AttachFrame", frame);
    }
    s.check::<ExecRequest>("ExecRequest", json!({"command": ["sh", "-c", "echo hi"]}));
    s.check::<ExecRequest>("ExecRequest", json!({"container": "main", "command": ["true"]}));
    for frame in [
        json!({"type": "stdout", "data": "out\n"}),
        json!({"type": "stderr", "data": "err\n"}),
        json!({"type": "heartbeat"}),
        json!({"type": "exit", "exitCode": 3}),
        json!({"type": "exit", "exitCode": 127, "message": "command \"x\" not found in $PATH"}),
        json!({"type": "error", "error": api_error()}),
    ] {
        s.check::<ExecFrame>("ExecFrame", frame);
    }
}

#[test]
fn every_schema_compiles_and_every_reference_resolves() {
    let s = Schemas::load();
    let names: Vec<String> = s.0["schemas"].as_object().expect("schemas").keys().cloned().collect();
    for name in &names {
        let _ = s.validator(name);
    }
    // References outside the schemas (responses, parameters, request bodies).
    let doc = document();
    let mut refs = BTreeSet::new();
    collect_refs(&doc, &mut refs);
    for r in refs {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r}: only local references"));
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
}

fn collect_refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.insert(r.clone());
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}
