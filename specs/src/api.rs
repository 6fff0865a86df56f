//! The orchestrator's wire objects besides `Pod`: nodes (registration, status with
//! per-NUMA capacity), events, watch events, errors, the join exchange, node
//! status reports, and label selectors. Serde types and pure helpers only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::{Allocations, NodeSettings, Placement};
use crate::idset::CpuSet;
use crate::pod::ObjectMeta;
use crate::status::PodStatus;
use crate::topology::NodeTopology;

/// A machine known to the orchestrator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    pub topology: NodeTopology,
    #[serde(default)]
    pub settings: NodeSettings,
    /// `HOST:PORT` of the nodelet's own HTTPS endpoint (container logs), which
    /// the server calls with the node name as the TLS name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The node's pod range (Kubernetes' `spec.podCIDR`), `A.B.C.D/N`: the
    /// server's choice from its cluster range at the node's first
    /// registration, kept while the node is; what a client sends is ignored.
    #[serde(default, rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// The node's IP address that the other nodes reach it on (their routes
    /// to its pod range go there), as the node says at registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeCondition {
    /// Heartbeats arrive.
    Ready,
    /// Registered, or heartbeats stopped for longer than the grace period.
    #[default]
    NotReady,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeStatus {
    #[serde(default)]
    pub condition: NodeCondition,
    /// RFC 3339 time of the last status report the server stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_report: Option<String>,
    /// The node's own allocation state (its epoch advances on every change).
    #[serde(default)]
    pub allocations: Allocations,
    /// Capacity and free resources per NUMA node, computed from the allocations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa: Vec<NumaStatus>,
    /// CPUs of the registered topology that the node reports offline now
    /// (taken offline while its agent runs); it hands none of them out until
    /// they are back, and they do not count as free.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub offline_cpus: CpuSet,
    /// What the node reports as not fine (none listed: nothing to say), as
    /// its last report had it. Absent when empty, so a client that predates
    /// the field still reads a healthy node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pods the node is still stopping, as its last report had them: deleted
    /// or replaced, they hold their CPUs and memory until their last process
    /// exits. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminating: Vec<TerminatingPod>,
    /// Unix seconds (rounded up) since the server has had it NotReady, set
    /// in the write that marks it so and cleared when it is Ready again:
    /// where a workload's node-lost timer starts, kept in the store so that
    /// a restarted server or a new leader does not start the timer over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_since: Option<u64>,
}

/// A pod its node is stopping: SIGTERM sent, its containers not all gone.
/// Named here because a deleted pod has left the store while its resources
/// are not free yet: `get pods` shows it `Terminating`, and a pod that
/// waits for those resources names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminatingPod {
    pub name: String,
    /// Its `metadata.owner`: who may see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// RFC 3339: when the node kills what is left (the end of its grace);
    /// absent before the stop began, and once the grace has run out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ends: Option<String>,
}

/// One aspect of a node that is not as it should be, in the shape of a
/// Kubernetes node condition (`type`, `status`, `reason`, `message`), with
/// the command that fixes it. Unknown fields are ignored: a newer node may
/// say more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// What it is about: `PodNetwork` (see `POD_NETWORK`).
    #[serde(rename = "type")]
    pub kind: String,
    pub status: ConditionStatus,
    /// CamelCase: why, in one word (`CNIPluginMissing`, `KernelUnsupported`).
    pub reason: String,
    pub message: String,
    /// The one command that fixes it on the node, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The condition of a node's pod network: `False` when pods get only `lo`
/// because the host cannot run the configured network.
pub const POD_NETWORK: &str = "PodNetwork";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl Condition {
    /// `PodNetwork=False` as `get nodes` shows it.
    pub fn short(&self) -> String {
        format!("{}={:?}", self.kind, self.status)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NumaStatus {
    pub id: u32,
    pub cpus: CpuSet,
    /// CPUs not held exclusively and not reserved.
    pub free_cpus: CpuSet,
    pub memory_bytes: u64,
    pub free_memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepages: Vec<HugePagesStatus>,
    /// Device resource name -> (total, free) on this NUMA node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, DeviceCount>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HugePagesStatus {
    pub page_size_bytes: u64,
    pub total: u64,
    pub free: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceCount {
    pub total: u64,
    pub free: u64,
}

impl NodeStatus {
    /// Per-NUMA capacity and free resources from a topology, settings,
    /// allocations and the CPUs offline now (none of them is free).
    pub fn numa_summary(
        topology: &NodeTopology,
        settings: &NodeSettings,
        allocations: &Allocations,
        offline: &CpuSet,
    ) -> Vec<NumaStatus> {
        let mut held = allocations.exclusive_cpus();
        held.union_with(&topology.reserved_cpus);
        held.union_with(&settings.reserved_cpus);
        held.union_with(offline);
        let mut out = Vec::new();
        for n in &topology.numa_nodes {
            let mut used_mem = 0u64;
            let mut used_pages: BTreeMap<u64, u64> = BTreeMap::new();
            let mut used_devs: BTreeMap<String, u64> = BTreeMap::new();
            for p in allocations.pods.values() {
                for c in &p.containers {
                    used_mem = used_mem.saturating_add(c.memory.get(&n.id).copied().unwrap_or(0));
                    for (size, per) in &c.hugepages {
                        *used_pages.entry(*size).or_default() += per.get(&n.id).copied().unwrap_or(0);
                    }
                    for (res, addrs) in &c.devices {
                        let here = addrs.iter().filter(|a| device_numa(topology, a) == Some(n.id)).count() as u64;
                        *used_devs.entry(res.clone()).or_default() += here;
                    }
                }
            }
            let mut devices = BTreeMap::new();
            for (res, addrs) in &settings.devices {
                let total = addrs.iter().filter(|a| device_numa(topology, a) == Some(n.id)).count() as u64;
                if total > 0 {
                    let used = used_devs.get(res).copied().unwrap_or(0);
                    devices.insert(res.clone(), DeviceCount { total, free: total.saturating_sub(used) });
                }
            }
            out.push(NumaStatus {
                id: n.id,
                cpus: n.cpus.clone(),
                free_cpus: n.cpus.difference(&held),
                memory_bytes: n.memory_bytes,
                free_memory_bytes: n.memory_bytes.saturating_sub(used_mem),
                hugepages: n
                    .hugepages
                    .iter()
                    .map(|h| HugePagesStatus {
                        page_size_bytes: h.page_size_bytes,
                        total: h.total,
                        free: h.total.saturating_sub(used_pages.get(&h.page_size_bytes).copied().unwrap_or(0)),
                    })
                    .collect(),
                devices,
            });
        }
        out
    }
}

fn device_numa(topology: &NodeTopology, address: &str) -> Option<u32> {
    topology.devices.iter().find(|d| d.address == address).and_then(|d| d.numa)
}

/// What a nodelet reports about itself: its allocations and its pods' statuses
/// (the same JSON as the nodelet's `NodeReport`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatusReport {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub allocations: Allocations,
    /// Pod name -> status. Pods of other sources (static pods) are ignored.
    #[serde(default)]
    pub pods: BTreeMap<String, PodStatus>,
    /// CPUs offline now (see `NodeStatus::offline_cpus`).
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub offline_cpus: CpuSet,
    /// The node's conditions now (see `NodeStatus::conditions`); every
    /// report carries them whole, none listed clears them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The pods it is stopping now (see `NodeStatus::terminating`), whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminating: Vec<TerminatingPod>,
}

/// A nodelet's refusal of a binding (its truth moved on since the plan).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodRejection {
    /// A `RejectReason` name or another short CamelCase word.
    pub reason: String,
    pub message: String,
}

/// The plan a pod is bound with: the placement and the node allocation epoch it
/// was computed against (same JSON as the nodelet's `BoundPlan`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPlan {
    pub epoch: u64,
    pub placement: Placement,
}

/// Why something happened to an object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    pub metadata: ObjectMeta,
    pub involved_object: ObjectRef,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// CamelCase: `Scheduled`, `FailedScheduling`, `Rejected`, `NodeNotReady`, ...
    pub reason: String,
    pub message: String,
    /// RFC 3339.
    pub timestamp: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectRef {
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
    /// The stream cannot go on (e.g. the requested version was compacted); the
    /// object is a `Status` error.
    Error,
    /// Nothing changed for the watcher: the object carries only
    /// `metadata.resourceVersion`, the version the watch has reached (resume
    /// from it). Sent only to a watcher that asked (`allowWatchBookmarks=true`),
    /// every `Liveness::heartbeat` while nothing else is sent, so that a
    /// silent stream can be told from a quiet cluster.
    Bookmark,
}

/// One line of a watch stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchEvent<T> {
    #[serde(rename = "type")]
    pub event_type: WatchEventType,
    pub object: T,
}

/// One line of `GET /api/v1/pods/{name}/attach`: everything `pinion run`
/// follows about one pod, in order, on one stream. The stream ends after
/// `exit`, `deleted` or `error`; while nothing happens the server sends a
/// `heartbeat` every `ATTACH_HEARTBEAT_SECONDS`, so a silence longer than a few
/// of those means the stream is dead (reconnect with the last `resourceVersion`
/// and `offset`).
// A frame is built, sent and dropped one at a time, never stored in bulk: the
// status variant's size costs nothing, and boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", try_from = "RawAttachFrame")]
pub enum AttachFrame {
    /// The pod's status, first as it is now (unless the caller's
    /// `resourceVersion` is already that new), then at every change.
    #[serde(rename_all = "camelCase")]
    Status { resource_version: u64, status: PodStatus },
    /// Container output. `offset` counts the output bytes sent so far,
    /// this chunk included (resume with `offset=`). `data` is UTF-8 text (a
    /// sequence split across chunks is kept whole; invalid bytes become U+FFFD).
    #[serde(rename_all = "camelCase")]
    Output { offset: u64, data: String },
    /// The stream is alive and nothing happened.
    Heartbeat,
    /// Something the follower should know that does not end the stream (the
    /// output cannot be read from the node).
    #[serde(rename_all = "camelCase")]
    Notice { message: String },
    /// The pod finished and its output is complete: the last frame.
    #[serde(rename_all = "camelCase")]
    Exit {
        phase: crate::status::PodPhase,
        /// The container's exit code; none when it never ran.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The container's reason (`Completed`, `Error`, `OOMKilled`, ...), else the pod's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// The pod was deleted after its end, as the stream's `rm` asked
        /// (`pinion run --rm`); false when it was not asked or could not be
        /// done, and the follower deletes it itself.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        removed: bool,
    },
    /// The pod was deleted before it finished: the last frame.
    Deleted,
    /// The stream cannot go on: the last frame.
    #[serde(rename_all = "camelCase")]
    Error { error: ApiError },
}

/// An `AttachFrame` as read: one flat object. serde reads an internally
/// tagged enum through a buffer that loses JSON's number-keyed maps (a
/// status's per-NUMA maps), so the frame is read flat, then checked.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAttachFrame {
    #[serde(rename = "type")]
    kind: String,
    resource_version: Option<u64>,
    status: Option<PodStatus>,
    offset: Option<u64>,
    data: Option<String>,
    message: Option<String>,
    phase: Option<crate::status::PodPhase>,
    exit_code: Option<i32>,
    reason: Option<String>,
    removed: Option<bool>,
    error: Option<ApiError>,
}

impl TryFrom<RawAttachFrame> for AttachFrame {
    type Error = String;

    fn try_from(r: RawAttachFrame) -> Result<Self, String> {
        let missing = |field: &str| format!("attach frame {:?} without {field}", r.kind);
        Ok(match r.kind.as_str() {
            "status" => AttachFrame::Status {
                resource_version: r.resource_version.ok_or_else(|| missing("resourceVersion"))?,
                status: r.status.clone().ok_or_else(|| missing("status"))?,
            },
            "output" => AttachFrame::Output {
                offset: r.offset.ok_or_else(|| missing("offset"))?,
                data: r.data.clone().ok_or_else(|| missing("data"))?,
            },
            "heartbeat" => AttachFrame::Heartbeat,
            "notice" => AttachFrame::Notice { message: r.message.clone().ok_or_else(|| missing("message"))? },
            "exit" => AttachFrame::Exit {
                phase: r.phase.ok_or_else(|| missing("phase"))?,
                exit_code: r.exit_code,
                reason: r.reason,
                message: r.message,
                removed: r.removed.unwrap_or(false),
            },
            "deleted" => AttachFrame::Deleted,
            "error" => AttachFrame::Error { error: r.error.ok_or_else(|| missing("error"))? },
            other => return Err(format!("unknown attach frame type {other:?}")),
        })
    }
}

/// `POST /api/v1/pods/{name}/exec` body: a command to run inside one of the
/// pod's running containers (`pinion exec`), checked by
/// `validate::validate_exec`. The node's endpoint takes the same body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// The container; may be left out when the pod has only one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// argv: the program (looked up in the container's `PATH`) and its arguments.
    pub command: Vec<String>,
    /// Forward stdin (`pinion exec -i`): the stream starts with a `started`
    /// frame naming the session, whose `ExecInput` the caller posts to
    /// `POST /api/v1/pods/{name}/exec/input`. Without it the command reads
    /// an empty stdin (`/dev/null`), as from callers that predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// Run the command on a terminal (`pinion exec -it`): a pty of the
    /// container's own is its stdin, stdout and stderr (all output comes as
    /// `stdout`); needs `stdin`. Its size comes as `ExecInput::resize`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The terminal's size from the start (with `tty`): set before the
    /// command runs, so that its first look at it is right.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<TerminalSize>,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

/// `POST /api/v1/pods/{name}/exec/input` body (and the node's `POST
/// /exec/input`): what the caller of an exec with `stdin` sends it, in order.
/// Each post is answered once its input was handed to the command's stdin
/// (or queued there, within `limits::MAX_EXEC_INPUT_BYTES`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecInput {
    /// The session of the `started` frame.
    pub session: String,
    /// Text for the command's stdin (UTF-8, as the output frames are).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// The caller's stdin ended: the command reads end of file after `data`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eof: bool,
    /// The caller's terminal has this size now (an exec with `tty`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<TerminalSize>,
}

/// One line of an exec stream. Output comes as it is read, each stream in its
/// own frames (UTF-8 text: a sequence split across reads is kept whole,
/// invalid bytes become U+FFFD); `heartbeat` while nothing happens (see
/// `Liveness`); `exit` or `error` is the last frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ExecFrame {
    /// The first frame of an exec with `stdin`: where its input goes.
    Started {
        session: String,
    },
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Heartbeat,
    /// The command ended (128 + N when killed by signal N; 126 or 127, with
    /// `message`, when it could not be executed): the last frame.
    #[serde(rename_all = "camelCase")]
    Exit {
        exit_code: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The exec cannot go on (its node's stream broke, the helper failed):
    /// the last frame; the command is ended on the node.
    Error {
        error: ApiError,
    },
}

/// How many leading bytes of `b` end on a character boundary: all of them but
/// an incomplete multi-byte sequence at the very end (output read in chunks
/// is sent as text: a character split across two reads waits for its rest).
pub fn complete_utf8(b: &[u8]) -> usize {
    // The last character starts at most 3 bytes before the end.
    for back in 1..=b.len().min(4) {
        let i = b.len() - back;
        let lead = b[i];
        if lead & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match lead {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if back < need { i } else { b.len() };
    }
    b.len()
}

/// A byte stream as text, chunk by chunk (`ExecFrame` output): a sequence
/// split across chunks is kept whole, invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct TextChunks {
    held: Vec<u8>,
}

impl TextChunks {
    /// The text ready after `data`, if any.
    pub fn push(&mut self, data: &[u8]) -> Option<String> {
        self.held.extend_from_slice(data);
        let ready = complete_utf8(&self.held);
        if ready == 0 {
            return None;
        }
        let rest = self.held.split_off(ready);
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held = rest;
        Some(text)
    }

    /// What is left at the end of the stream.
    pub fn flush(&mut self) -> Option<String> {
        (!self.held.is_empty()).then(|| String::from_utf8_lossy(&std::mem::take(&mut self.held)).into_owned())
    }

    /// Bytes held back (the start of a character whose rest has not come).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Forgets what is held (the stream starts again from its beginning).
    pub fn clear(&mut self) {
        self.held.clear();
    }
}

/// How often an idle attach stream carries a heartbeat (`Liveness`'s default).
pub const ATTACH_HEARTBEAT_SECONDS: u64 = 5;

/// Longest line a stream reader buffers (a watch event, an attach frame): a
/// longer one is refused and the stream dropped, so a hostile or broken peer
/// cannot grow the reader's memory without bound. A pod's JSON is a few KiB.
pub const MAX_STREAM_LINE: usize = 4 << 20;

/// The one liveness rule of every long-lived stream (watches, attach, log
/// follows) and of the connections under them: the sender sends something
/// every `heartbeat` while it has nothing else to send (a watch's BOOKMARK,
/// an attach `heartbeat` frame, an HTTP/2 PING on a quiet connection), and a
/// reader treats a silence longer than `silence()` as a dead stream and
/// resumes from where it was. A NAT or relay that forgets an idle flow leaves
/// the socket open and silent; only this bound notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub heartbeat: std::time::Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness { heartbeat: std::time::Duration::from_secs(ATTACH_HEARTBEAT_SECONDS) }
    }
}

impl Liveness {
    /// How many heartbeats may go missing before a stream counts as dead:
    /// one late heartbeat is jitter, three missed is a dead path.
    pub const MISSED: u32 = 3;

    /// Silence longer than this means the stream (or its connection) is dead.
    pub fn silence(&self) -> std::time::Duration {
        self.heartbeat * Self::MISSED
    }
}

/// A list response: the items and the store version it was read at (resume a
/// watch from it to miss nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct List<T> {
    pub resource_version: u64,
    pub items: Vec<T>,
    /// Stored objects left out because the server cannot read them (each is
    /// logged with its key); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unreadable: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Every error body: a summary, a machine word, and each field problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    pub code: u16,
    /// CamelCase: `Invalid`, `NotFound`, `AlreadyExists`, `Unauthorized`, `Forbidden`, `Gone`, ...
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<crate::validate::FieldError>,
}

impl ApiError {
    /// 400 for one field of a request (a body's path, a query or path
    /// parameter) and what is wrong with it.
    pub fn bad_field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let (field, message) = (field.into(), message.into());
        ApiError {
            code: 400,
            reason: "BadRequest".into(),
            message: format!("{field} is invalid"),
            details: vec![crate::validate::FieldError { field, message }],
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)?;
        for d in &self.details {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

/// What a person may do: `admin` everything, `user` their own pods and jobs,
/// `viewer` read everything and write nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    Admin,
    User,
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Viewer => "viewer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            "viewer" => Ok(Role::Viewer),
            other => Err(format!("{other:?} is not a role (admin, user, viewer)")),
        }
    }
}

/// A person who uses the cluster (`pinion user add`). Their certificates
/// carry the record's `metadata.uid`: a revoked user, or one added again,
/// makes every earlier certificate useless.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct User {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: UserSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserSpec {
    pub role: Role,
    /// The Unix uid the person's pods run as on the nodes; unset: looked up
    /// by name on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Supplementary groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
    /// The pod security profile; the role's default when unset (users
    /// `baseline`, admins `privileged`, viewers create nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::security::Profile>,
    /// Capabilities granted beyond the profile's list (`SYS_NICE`, `IPC_LOCK`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// May run pods on the host's network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// When the user was revoked (RFC 3339); a revoked user's certificates
    /// are refused, and the record stays so that owners keep a name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<String>,
}

/// `POST /api/v1/users`'s answer: the person as stored and their first
/// certificate (the CLI writes the credentials file with its own servers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserCredentials {
    pub user: User,
    pub ca_cert: String,
    pub client_cert: String,
    pub client_key: String,
}

impl UserSpec {
    /// The profile their pods are held to: their own, else their role's.
    pub fn profile(&self) -> crate::security::Profile {
        use crate::security::Profile;
        self.profile.unwrap_or(match self.role {
            Role::Admin => Profile::Privileged,
            Role::User | Role::Viewer => Profile::Baseline,
        })
    }
}

/// A join token as stored: its secret only as a SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Token {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: TokenSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenSpec {
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    /// RFC 3339; never expires when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Joins left; unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses_left: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// When the token was revoked (RFC 3339); kept so that a restart does not
    /// bring the bootstrap token back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<String>,
}

/// `POST /api/v1/join` body (the bootstrap token travels as a bearer token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub node_name: String,
    /// The node's join record: random, made once and kept. A retry whose
    /// first reply was lost, or a node whose certificate expired while it
    /// was cut off, joins again with it (no token needed) instead of a 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
}

/// The credential a joined node keeps: PEM texts. The key is generated by the
/// server and travels once over the TLS connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    pub node_name: String,
    pub ca_cert: String,
    pub client_cert: String,
    pub client_key: String,
    /// `https://HOST:PORT` of the cluster's servers as the answering one
    /// knows them, which the node adds to the list it joined with; empty
    /// when it knows none that a node could reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
}

/// `POST /api/v1/tokens` body: a new join token's lifetime, uses and note.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    /// Seconds from now (at most `limits::MAX_TTL_SECONDS`); absent: never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Joins it admits; absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// A join token just made: the token to hand out (`PIN.ID.SECRET`), shown
/// this once, and its record (without the secret's digest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenCreated {
    pub token: String,
    pub record: Token,
}

/// `POST /api/v1/renew` answer: a fresh certificate and key for the
/// caller's own identity (the same common name and incarnation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Renewed {
    pub common_name: String,
    pub ca_cert: String,
    pub client_cert: String,
    pub client_key: String,
    /// The cluster's servers as the answering one knows them (as `JoinResponse`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
}

/// A label selector: `a=b,c!=d,e` (exists), `!f` (absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    terms: Vec<SelectorTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SelectorTerm {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {input:?}: {reason}")]
pub struct SelectorError {
    pub input: String,
    pub reason: String,
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<LabelSelector, SelectorError> {
        let err = |reason: &str| SelectorError { input: input.to_string(), reason: reason.to_string() };
        let mut terms = Vec::new();
        for raw in input.split(',').map(str::trim) {
            if raw.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(err("empty term"));
            }
            let term = if let Some((k, v)) = raw.split_once("!=") {
                SelectorTerm::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
                SelectorTerm::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some(k) = raw.strip_prefix('!') {
                SelectorTerm::NotExists(k.trim().to_string())
            } else {
                SelectorTerm::Exists(raw.to_string())
            };
            let key = match &term {
                SelectorTerm::Eq(k, _)
                | SelectorTerm::NotEq(k, _)
                | SelectorTerm::Exists(k)
                | SelectorTerm::NotExists(k) => k,
            };
            if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '=' || c == '!') {
                return Err(err(&format!("bad key in {raw:?}")));
            }
            terms.push(term);
        }
        Ok(LabelSelector { terms })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| match t {
            SelectorTerm::Eq(k, v) => labels.get(k) == Some(v),
            SelectorTerm::NotEq(k, v) => labels.get(k) != Some(v),
            SelectorTerm::Exists(k) => labels.contains_key(k),
            SelectorTerm::NotExists(k) => !labels.contains_key(k),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(selector: &str, labels: &[(&str, &str)], expected: Result<bool, ()>) {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let got = LabelSelector::parse(selector).map(|s| s.matches(&labels)).map_err(|_| ());
        assert_eq!(got, expected, "selector {selector:?} on {labels:?}");
    }

    #[test]
    fn attach_frames_are_tagged_camel_case() {
        let f = AttachFrame::Exit {
            phase: crate::status::PodPhase::Failed,
            exit_code: Some(3),
            reason: Some("Error".into()),
            message: None,
            removed: false,
        };
        let text = serde_json::to_string(&f).unwrap_or_default();
        // `removed` only when true: an older follower reads the same frame.
        assert_eq!(text, r#"{"type":"exit","phase":"Failed","exitCode":3,"reason":"Error"}"#);
        let back: AttachFrame = serde_json::from_str(&text).unwrap_or(AttachFrame::Heartbeat);
        assert_eq!(back, f);
        let removed = AttachFrame::Exit {
            phase: crate::status::PodPhase::Succeeded,
            exit_code: Some(0),
            reason: None,
            message: None,
            removed: true,
        };
        let text = serde_json::to_string(&removed).unwrap_or_default();
        assert_eq!(text, r#"{"type":"exit","phase":"Succeeded","exitCode":0,"removed":true}"#);
        assert_eq!(serde_json::from_str::<AttachFrame>(&text).ok(), Some(removed));
        let out: AttachFrame =
            serde_json::from_str(r#"{"type":"output","offset":3,"data":"hi\n"}"#).unwrap_or(AttachFrame::Heartbeat);
        assert_eq!(out, AttachFrame::Output { offset: 3, data: "hi\n".into() });
        // A status with number-keyed maps (per NUMA node) reads back whole.
        let status: PodStatus =
            serde_json::from_str(r#"{"phase":"Running","plan":{"epoch":0,"placement":{"numaAffinity":[0],"containers":[{"name":"main","cpuPolicy":"exclusive","cpus":[1],"mems":[0],"memory":{"0":268435456}}],"requested":{"cpuMillis":1000,"memory":268435456}}}}"#)
                .unwrap_or_default();
        assert_eq!(status.phase, crate::status::PodPhase::Running, "the fixture parses");
        let f = AttachFrame::Status { resource_version: 9, status };
        let text = serde_json::to_string(&f).unwrap_or_default();
        assert_eq!(serde_json::from_str::<AttachFrame>(&text).ok(), Some(f));
        assert!(serde_json::from_str::<AttachFrame>(r#"{"type":"output","offset":1}"#).is_err());
    }

    #[test]
    fn label_selectors() {
        check("", &[], Ok(true));
        check("a=b", &[("a", "b")], Ok(true));
        check("a==b", &[("a", "c")], Ok(false));
        check("a=b,c!=d", &[("a", "b"), ("c", "d")], Ok(false));
        check("a=b,c!=d", &[("a", "b")], Ok(true));
        check("a", &[("a", "x")], Ok(true));
        check("!a", &[("a", "x")], Ok(false));
        check("a=b,,c=d", &[], Err(()));
        check("=b", &[], Err(()));
    }

    #[test]
    fn a_bookmark_is_a_watch_event_type() {
        let e: WatchEvent<serde_json::Value> =
            serde_json::from_str(r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":7}}}"#)
                .unwrap_or(WatchEvent { event_type: WatchEventType::Error, object: serde_json::Value::Null });
        assert_eq!(e.event_type, WatchEventType::Bookmark);
        assert_eq!(e.object["metadata"]["resourceVersion"], 7);
    }

    #[test]
    fn silence_is_three_missed_heartbeats() {
        let check = |heartbeat_ms: u64, silence_ms: u64| {
            let l = Liveness { heartbeat: std::time::Duration::from_millis(heartbeat_ms) };
            assert_eq!(l.silence(), std::time::Duration::from_millis(silence_ms), "{heartbeat_ms}");
        };
        check(5000, 15000);
        check(200, 600);
        assert_eq!(Liveness::default().heartbeat, std::time::Duration::from_secs(ATTACH_HEARTBEAT_SECONDS));
    }

    #[test]
    fn text_chunks_keep_split_characters_whole() {
        let mut t = TextChunks::default();
        assert_eq!(t.push(b"a\xC3"), Some("a".into()));
        assert_eq!(t.push(b"\xA9!"), Some("\u{e9}!".into()));
        assert_eq!(t.push(&"\u{1F600}".as_bytes()[..3]), None);
        assert_eq!(t.push(&"\u{1F600}".as_bytes()[3..]), Some("\u{1F600}".into()));
        assert_eq!(t.push(b"x\xFFy"), Some("x\u{FFFD}y".into()));
        assert_eq!(t.flush(), None);
        assert_eq!(t.push(b"\xE2"), None);
        assert_eq!(t.flush(), Some("\u{FFFD}".into()));
    }

    #[test]
    fn exec_frames_are_tagged_camel_case() {
        let f = ExecFrame::Exit { exit_code: 127, message: Some("command \"x\" not found".into()) };
        let text = serde_json::to_string(&f).unwrap_or_default();
        assert_eq!(text, r#"{"type":"exit","exitCode":127,"message":"command \"x\" not found"}"#);
        let text = serde_json::to_string(&ExecFrame::Stderr { data: "e\n".into() }).unwrap_or_default();
        assert_eq!(text, r#"{"type":"stderr","data":"e\n"}"#);
    }
}
