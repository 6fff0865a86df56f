//! The one set of bounds on what the API accepts, shared by `validate`, the
//! server's request parser and the engine, so that nothing one of them accepts
//! can be refused by another (or fail to read back from the store).

/// Largest CPU, core, socket or NUMA node id: Linux's `NR_CPUS` tops out at
/// 8192. It is also the capacity of an `IdSet` (ids `0..=MAX_ID`), so every id
/// a validated topology holds fits in a set.
pub const MAX_ID: u32 = 8191;
/// Most CPUs a node may list, and so the largest cpu request any node can hold.
pub const MAX_CPUS: usize = MAX_ID as usize + 1;
/// Most NUMA nodes a topology may have: the engine keeps a set of NUMA nodes
/// in one `u128` (it never enumerates subsets).
pub const MAX_NUMA_NODES: usize = 128;
/// Most PCI devices a topology may list, and so the largest device request.
pub const MAX_DEVICES: usize = 4096;
/// Object names (pods, nodes, containers): a DNS-1123 label's length.
pub const MAX_NAME_LEN: usize = 63;
/// Most memory (or huge page bytes) one pod may ask for: 1 PiB.
pub const MAX_POD_MEMORY_BYTES: u64 = 1 << 50;
/// Most memory (or hugepage bytes of one size) per NUMA node: 64 PiB, so that a
/// sum over `MAX_NUMA_NODES` nodes never overflows a u64.
pub const MAX_NODE_MEMORY_BYTES: u64 = 1 << 56;
/// Largest hugepage size accepted (16 GiB is the largest any CPU offers).
pub const MAX_HUGEPAGE_BYTES: u64 = 16 << 30;
/// Containers per pod: far above any real pod, low enough to bound engine work.
pub const MAX_CONTAINERS: usize = 64;
/// Env vars per container.
pub const MAX_ENV: usize = 1024;
/// Command plus args entries per container.
pub const MAX_ARGS: usize = 4096;
/// Bytes of one command/arg/env value/working dir.
pub const MAX_STRING_LEN: usize = 128 * 1024;
/// Total bytes of all annotation keys and values (Kubernetes: 256 KiB).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// Labels and nodeSelector entries per object.
pub const MAX_LABELS: usize = 256;
/// Longest `spec.ttlSecondsAfterFinished` (a year), so that a deadline is always representable.
pub const MAX_TTL_SECONDS: u64 = 365 * 24 * 3600;
/// Image reference length.
pub const MAX_IMAGE_LEN: usize = 255;
/// The longest join attempt id (`JoinRequest::attempt`).
pub const MAX_JOIN_ATTEMPT_LEN: usize = 64;
/// Names in a partition's `spec.allowedUsers`.
pub const MAX_PARTITION_USERS: usize = 4096;
/// Members of one job (`spec.parallelism`): all of them are stored in the
/// job's own write.
pub const MAX_JOB_MEMBERS: u32 = 4096;
/// Largest `spec.pidsLimit`: Linux's `PID_MAX_LIMIT` (2^22), more than any
/// node can hold, so a larger value can only be a mistake.
pub const MAX_PIDS_LIMIT: u64 = 1 << 22;
/// hostPath volumes per pod.
pub const MAX_VOLUMES: usize = 64;
/// Bytes of a host or mount path (Linux's `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// Deepest nesting of `[` and `{` a YAML or JSON body may have: libyaml's
/// scanner is quadratic in flow nesting (160,000 levels took 125 s), so a
/// deeper body is refused before it sees it. Real manifests nest under 20.
pub const MAX_NESTING: usize = 64;
/// Largest text `manifest::parse_pods` reads (`pinion plan`, each file of the
/// nodelet's static pod folder): bounds parser memory on hostile input. The
/// server's API bounds a body by `ApiConfig::body_limit` instead.
pub const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;
/// Most pods in one manifest.
pub const MAX_PODS: usize = 1024;
/// Largest file the nodelet reads from its static pod folder (`--manifests`),
/// checked on the file's length before it is read: a pod is a few KiB, and
/// a node reads the folder again at every change.
pub const MAX_STATIC_MANIFEST_BYTES: u64 = 1 << 20;
/// Most `securityContext.supplementalGroups` of a pod: every one becomes a
/// `setgroups` entry of each of its processes. Linux allows 65536, NFS's
/// AUTH_SYS carries 16; a lab user is in a handful, so 64 is room for any
/// real one while keeping the spec and the OCI config small.
pub const MAX_SUPPLEMENTAL_GROUPS: usize = 64;
/// Largest uid or gid a pod may name: `(uid_t) -1` (4294967295) is not an id
/// but "leave unchanged" to `setresuid`, `setresgid` and `chown`, so it can
/// be no one's.
pub const MAX_UNIX_ID: u32 = u32::MAX - 1;
/// Longest `securityContext.runAsUserName`: `useradd`'s limit (32), which is
/// also what `utmp` records and what portable tools expect.
pub const MAX_USER_NAME_LEN: usize = 32;
/// Largest magnitude of a quantity, in whole units (10^24: a yotta-byte is
/// absurd enough); in nano-units it fits an `i128` with room for sums.
pub const MAX_UNITS: i128 = 1_000_000_000_000_000_000_000_000;
/// Replicas of one Deployment: a thousand-node site runs one or a few per
/// node; every replica is a pod the controller watches, so the bound keeps a
/// typo (`replicas: 100000`) from flooding the store.
pub const MAX_REPLICAS: u32 = 10_000;
/// Longest Deployment or DaemonSet name: its pods are named
/// `NAME-HASH-XXXXX` (10 + 5 characters and two dashes), and a pod's name is
/// a DNS-1123 label (`MAX_NAME_LEN`).
pub const MAX_WORKLOAD_NAME_LEN: usize = MAX_NAME_LEN - 17;
/// Nodes a DaemonSet's status names where its pod does not fit now (its
/// count is whole): the status stays small on a large cluster.
pub const MAX_STATUS_NODES: usize = 32;
/// Most old revisions a Deployment keeps (`spec.revisionHistoryLimit`): each
/// holds a whole pod template in the Deployment's own status.
pub const MAX_REVISION_HISTORY: u32 = 100;
/// Longest `spec.minReadySeconds` and probe delays, periods and timeouts (a
/// day): longer is a mistake, and sums of them stay far from overflow.
pub const MAX_WORKLOAD_SECONDS: u32 = 24 * 3600;
/// Longest `spec.progressDeadlineSeconds` (a week): a rollout that has not
/// moved in a week has failed.
pub const MAX_PROGRESS_DEADLINE_SECONDS: u32 = 7 * 24 * 3600;
/// Largest probe `failureThreshold` or `successThreshold`.
pub const MAX_PROBE_THRESHOLD: u32 = 1000;
/// Entries of a probe's `exec.command`: a probe is a short check, and the
/// node runs it every period.
pub const MAX_PROBE_ARGS: usize = 256;
/// Bytes of one post of an exec's stdin (`ExecInput::data`); the CLI sends
/// what it read at once, a terminal's keystrokes or a pipe's chunk.
pub const MAX_EXEC_INPUT_BYTES: usize = 64 * 1024;
/// Posts of an exec's stdin queued on the node before the command reads
/// them; past it a post waits (`EXEC_INPUT_WAIT`) then is refused.
pub const MAX_EXEC_INPUT_QUEUED: usize = 16;
/// Bytes of a probe's `exec.command` altogether.
pub const MAX_PROBE_COMMAND_BYTES: usize = 16 * 1024;
/// Bytes of an `httpGet.path` (what common servers accept in a request line).
pub const MAX_PROBE_PATH_LEN: usize = 2048;
/// `httpGet.httpHeaders` entries.
pub const MAX_PROBE_HEADERS: usize = 32;
/// Bytes of one probe header's name or value, or a gRPC probe's `service`.
pub const MAX_PROBE_HEADER_LEN: usize = 1024;
/// Largest `spec.tuning.cpuCStates: max-latency-us:N`: the kernel's value is
/// an `s32`, and a second is more than any idle state's exit latency.
pub const MAX_CSTATE_LATENCY_US: u32 = 1_000_000;
/// Longest `spec.tuning.cpuFreqGovernor`: the kernel's `CPUFREQ_NAME_LEN` is
/// 16 with its final NUL.
pub const MAX_GOVERNOR_LEN: usize = 15;
