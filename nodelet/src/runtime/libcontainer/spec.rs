//! Builds the OCI runtime spec (`config.json`) of one container from its
//! `ContainerConfig`: namespaces, cgroup resources (cpuset, memory, CPU, hugetlb,
//! devices), NUMA memory policy, capabilities, seccomp and the root filesystem's
//! mounts, and who the process is (uid, groups, capabilities). Pure apart from
//! `stat` of device nodes, so it is unit-tested.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Arch, Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceBuilder,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxHugepageLimitBuilder, LinuxMemoryBuilder, LinuxMemoryPolicyBuilder,
    LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, LinuxSeccomp, LinuxSeccompAction,
    LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscallBuilder, MemoryPolicyModeType,
    Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, UserBuilder,
};

use super::super::users::ProcessUser;
use super::super::{ContainerConfig, CpuQuota, RuntimeError};

/// The cgroup of a container under `parent` (see [`super::cgroups::settle_parent`]),
/// relative to each hierarchy's root; absolute so that libcgroups never derives
/// one from the caller's own cgroup.
pub(crate) fn cgroup_path(parent: &Path, id: &str) -> PathBuf {
    parent.join(id)
}

/// What the resolved process looks like (image defaults already merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    /// Who it runs as, resolved on this node ([`crate::runtime::users::resolve`]).
    pub user: ProcessUser,
}

/// The size of a container's `/tmp` when it has no memory limit. A tmpfs's
/// pages are charged to the memory cgroup of whoever writes them, so with a
/// limit `/tmp` is as big as the limit (it can cost the host no more); without
/// one, an unsized tmpfs may take half the host's RAM, so it gets what
/// Docker gives `/dev/shm`, which programs use the same way.
const DEFAULT_TMP_BYTES: u64 = 64 << 20;

/// The umask of a container's processes, whatever the agent's own is.
const CONTAINER_UMASK: u32 = 0o022;

/// The `size=` of a container's `/tmp` (see [`DEFAULT_TMP_BYTES`]).
fn tmp_size(cfg: &ContainerConfig) -> u64 {
    cfg.memory_limit_bytes.unwrap_or(DEFAULT_TMP_BYTES)
}

/// Host directories a `rootfs: host` container sees read-only, when present.
pub(crate) const HOST_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"];

/// Docker's default capability set (14).
const DEFAULT_CAPS: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// The default set, less `cap_drop` (`ALL`: everything), plus `cap_add`.
fn capability_set(cfg: &ContainerConfig) -> Result<std::collections::HashSet<Capability>, String> {
    let parse = |name: &String| {
        serde_json::from_value::<Capability>(serde_json::Value::String(name.clone()))
            .map_err(|_| format!("unknown capability {name:?}"))
    };
    let mut caps: std::collections::HashSet<Capability> = if cfg.cap_drop.iter().any(|c| c == "ALL") {
        Default::default()
    } else {
        DEFAULT_CAPS.iter().copied().collect()
    };
    for name in cfg.cap_drop.iter().filter(|c| *c != "ALL") {
        caps.remove(&parse(name)?);
    }
    for name in &cfg.cap_add {
        caps.insert(parse(name)?);
    }
    Ok(caps)
}

/// The capabilities the pod added (`cap_add`) and nothing else: all a
/// non-root process gets.
fn added_capabilities(cfg: &ContainerConfig) -> Result<std::collections::HashSet<Capability>, String> {
    cfg.cap_add
        .iter()
        .map(|name| {
            serde_json::from_value::<Capability>(serde_json::Value::String(name.clone()))
                .map_err(|_| format!("unknown capability {name:?}"))
        })
        .collect()
}

/// The process's capability sets.
///
/// Root keeps Docker's default set (less `cap_drop`, plus `cap_add`) in the
/// bounding, effective and permitted sets, with inheritable and ambient
/// empty, as containerd and Docker since CVE-2022-24769: oci-spec's builder
/// would otherwise fill them with its default three (AUDIT_WRITE, KILL,
/// NET_BIND_SERVICE), which an exec'd file could pick up, and which make
/// `drop: [ALL]` fail (an inheritable capability outside the bounding set is
/// EPERM at capset).
///
/// A non-root process gets none of the default set, in no set at all: a
/// user's job is that user on the host, nothing more. The bounding set holds
/// only what the pod added, so no setuid or file-capability program can
/// give it more; an added capability is also inheritable and ambient (and so
/// permitted and effective), because a non-root process loses its permitted
/// set at `execve` and only ambient capabilities survive it: that is how an
/// admin's grant of, say, SYS_NICE to a telecom user's pod really works.
fn capabilities(
    cfg: &ContainerConfig,
    user: &ProcessUser,
) -> Result<oci_spec::runtime::LinuxCapabilities, RuntimeError> {
    let id = cfg.id.as_str();
    let e = |err: oci_spec::OciSpecError| spec_err(id, "capabilities", err);
    if user.is_root() {
        let caps = capability_set(cfg).map_err(|m| spec_err(id, "capabilities", m))?;
        return LinuxCapabilitiesBuilder::default()
            .bounding(caps.clone())
            .effective(caps.clone())
            .permitted(caps)
            .inheritable(std::collections::HashSet::new())
            .ambient(std::collections::HashSet::new())
            .build()
            .map_err(e);
    }
    let added = added_capabilities(cfg).map_err(|m| spec_err(id, "capabilities", m))?;
    LinuxCapabilitiesBuilder::default()
        .bounding(added.clone())
        .effective(added.clone())
        .permitted(added.clone())
        .inheritable(added.clone())
        .ambient(added)
        .build()
        .map_err(e)
}

/// Syscalls the default profile allows only with a capability (Docker's
/// `includes.caps` rules), for the capabilities a pod may add.
fn syscalls_for_capability(cap: &str) -> &'static [&'static str] {
    match cap {
        "CAP_DAC_READ_SEARCH" => &["open_by_handle_at"],
        "CAP_SYS_ADMIN" => &[
            "bpf",
            // Any flags: new namespaces (without it, only clone's flags
            // without a namespace pass).
            "clone",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount2",
            "unshare",
        ],
        "CAP_SYS_BOOT" => &["reboot"],
        "CAP_SYS_MODULE" => &["delete_module", "init_module", "finit_module"],
        "CAP_SYS_PACCT" => &["acct"],
        "CAP_SYS_PTRACE" => {
            &["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"]
        }
        "CAP_SYS_RAWIO" => &["iopl", "ioperm"],
        "CAP_SYS_TIME" => &["settimeofday", "clock_settime", "adjtimex", "clock_adjtime"],
        "CAP_SYS_TTY_CONFIG" => &["vhangup"],
        // Memory policy calls: what numactl and DPDK use inside the container.
        "CAP_SYS_NICE" => &["get_mempolicy", "mbind", "set_mempolicy"],
        "CAP_SYSLOG" => &["syslog"],
        "CAP_BPF" => &["bpf"],
        "CAP_PERFMON" => &["perf_event_open"],
        _ => &[],
    }
}

fn spec_err(id: &str, what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Container { id: id.to_string(), message: format!("building the OCI spec ({what}): {e}") }
}

/// `mems` to write when the config names none: every online node of the host.
pub(crate) fn all_mems() -> String {
    std::fs::read_to_string("/sys/devices/system/node/online")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "0".to_string())
}

/// containerd's open-files limit (2^20), capped by the creator's own hard limit:
/// raising it needs CAP_SYS_RESOURCE, which the host may not grant.
fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into `lim`, a valid rlimit.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    if ok {
        lim.rlim_max.min(1 << 20)
    } else {
        1024
    }
}

/// Builds the spec. `host_mounts` are the host directories to bind read-only
/// (empty for an image rootfs); the rootfs is `rootfs` inside the bundle.
///
/// The CFS quota (`cfg.cpu_quota`) is left out: the shim sets it between create
/// and start ([`super::shim`]), so that the runtime's own work inside the new
/// cgroup (libseccomp compiling the filter takes more CPU than a 100m
/// container's whole first period) is not throttled, while the container's
/// process never runs a single instruction without it. [`with_cpu_quota`] puts
/// it back for a runtime that applies everything at create (crun, runc).
pub fn build(
    cfg: &ContainerConfig,
    process: &ProcessSpec,
    host_mounts: &[PathBuf],
    cgroup_parent: &Path,
) -> Result<Spec, RuntimeError> {
    let id = cfg.id.as_str();
    let e = |what: &str| {
        let what = what.to_string();
        move |err: oci_spec::OciSpecError| spec_err(id, &what, err)
    };

    let user = &process.user;
    let capabilities = capabilities(cfg, user)?;
    let mut user_spec = UserBuilder::default().uid(user.uid).gid(user.gid).umask(CONTAINER_UMASK);
    if !user.additional_gids.is_empty() {
        user_spec = user_spec.additional_gids(user.additional_gids.clone());
    }
    let proc = ProcessBuilder::default()
        .terminal(false)
        .args(process.args.clone())
        .env(process.env.clone())
        .cwd(process.cwd.clone())
        .user(user_spec.build().map_err(e("user"))?)
        // Always, root or not: no setuid program raises what a process holds.
        .no_new_privileges(true)
        .capabilities(capabilities)
        .rlimits(vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .hard(nofile_limit())
            .soft(nofile_limit())
            .build()
            .map_err(e("rlimits"))?])
        .build()
        .map_err(e("process"))?;

    // Resources.
    let mems = if cfg.mems.is_empty() { all_mems() } else { cfg.mems.to_string() };
    let mut cpu = LinuxCpuBuilder::default().cpus(cfg.cpus.to_string()).mems(mems);
    if let Some(shares) = cfg.cpu_shares {
        cpu = cpu.shares(shares);
    }
    let mut resources = LinuxResourcesBuilder::default().cpu(cpu.build().map_err(e("cpu"))?);
    if let Some(limit) = cfg.memory_limit_bytes {
        let limit = i64::try_from(limit).map_err(|_| spec_err(id, "memory", "limit out of range"))?;
        resources = resources.memory(LinuxMemoryBuilder::default().limit(limit).build().map_err(e("memory"))?);
    }
    if !cfg.hugepage_limits.is_empty() {
        let mut limits = Vec::new();
        for (page, limit) in &cfg.hugepage_limits {
            limits.push(
                LinuxHugepageLimitBuilder::default()
                    .page_size(page_size_name(*page))
                    .limit(i64::try_from(*limit).map_err(|_| spec_err(id, "hugepages", "limit out of range"))?)
                    .build()
                    .map_err(e("hugepages"))?,
            );
        }
        resources = resources.hugepage_limits(limits);
    }
    if let Some(limit) = cfg.pids_limit {
        let limit = i64::try_from(limit).ok().filter(|l| *l > 0);
        let limit = limit.ok_or_else(|| spec_err(id, "pids", "the limit must be from 1 to 2^63-1"))?;
        resources = resources.pids(LinuxPidsBuilder::default().limit(limit).build().map_err(e("pids"))?);
    }
    // Deny every device, then allow the configured nodes (libcgroups adds the
    // standard /dev/null, /dev/zero, ... rules on top).
    let mut dev_rules =
        vec![LinuxDeviceCgroupBuilder::default().allow(false).access("rwm").build().map_err(e("devices"))?];
    let mut devices = Vec::new();
    for path in &cfg.device_nodes {
        let meta =
            std::fs::metadata(path).map_err(|err| spec_err(id, "deviceNodes", format!("{}: {err}", path.display())))?;
        let ft = meta.file_type();
        let typ = if ft.is_char_device() {
            LinuxDeviceType::C
        } else if ft.is_block_device() {
            LinuxDeviceType::B
        } else {
            return Err(spec_err(id, "deviceNodes", format!("{}: not a device node", path.display())));
        };
        let rdev = meta.rdev();
        let (major, minor) = (libc::major(rdev) as i64, libc::minor(rdev) as i64);
        devices.push(
            LinuxDeviceBuilder::default()
                .path(path.clone())
                .typ(typ)
                .major(major)
                .minor(minor)
                .file_mode(meta.mode() & 0o777)
                // The pod was given the device: its user may open it (root
                // on the host made it for root alone: /dev/vfio/N is 0600),
                // as containerd's `device_ownership_from_security_context`.
                .uid(user.uid)
                .gid(user.gid)
                .build()
                .map_err(e("devices"))?,
        );
        dev_rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(typ)
                .major(major)
                .minor(minor)
                .access("rwm")
                .build()
                .map_err(e("devices"))?,
        );
    }
    resources = resources.devices(dev_rules);

    let mut namespaces = oci_spec::runtime::get_default_namespaces();
    if cfg.host_network {
        namespaces.retain(|ns| ns.typ() != LinuxNamespaceType::Network);
    } else if let Some(netns) = &cfg.netns {
        for ns in namespaces.iter_mut().filter(|ns| ns.typ() == LinuxNamespaceType::Network) {
            ns.set_path(Some(netns.clone()));
        }
    }
    let mut id_maps = None;
    if let Some(ns) = &cfg.userns {
        if ns.base == 0 {
            return Err(spec_err(id, "userns", "the pod's host ids are not claimed"));
        }
        let mut user = oci_spec::runtime::LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::User)
            .build()
            .map_err(e("userns"))?;
        match &ns.pinned {
            // The pod's own, which its network namespace belongs to.
            Some(path) => {
                user.set_path(Some(path.clone()));
            }
            None => {
                let map = oci_spec::runtime::LinuxIdMappingBuilder::default()
                    .host_id(ns.base)
                    .container_id(0u32)
                    .size(super::super::userns::IDS_PER_POD)
                    .build()
                    .map_err(e("userns"))?;
                id_maps = Some(vec![map]);
            }
        }
        namespaces.push(user);
    }
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .cgroups_path(cgroup_path(cgroup_parent, id))
        .resources(resources.build().map_err(e("resources"))?)
        .devices(devices)
        .masked_paths(oci_spec::runtime::get_default_maskedpaths())
        .readonly_paths(oci_spec::runtime::get_default_readonly_paths())
        .seccomp(default_seccomp(&cfg.cap_add).map_err(e("seccomp"))?);
    if let Some(maps) = id_maps {
        linux = linux.uid_mappings(maps.clone()).gid_mappings(maps);
    }
    if cfg.bind_memory && !cfg.mems.is_empty() {
        linux = linux.memory_policy(
            LinuxMemoryPolicyBuilder::default()
                .mode(MemoryPolicyModeType::MpolBind)
                .nodes(cfg.mems.to_string())
                .flags(Vec::new())
                .build()
                .map_err(e("memoryPolicy"))?,
        );
    }

    let mut mounts = oci_spec::runtime::get_default_mounts();
    // The cgroup filesystem is not needed inside and on a hybrid host it is the
    // slowest mount to set up; containers read their limits from /proc.
    mounts.retain(|m| m.destination() != Path::new("/sys/fs/cgroup"));
    let tmp_size = format!("size={}", tmp_size(cfg));
    mounts.push(mount("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", "mode=1777", &tmp_size]).map_err(e("mounts"))?);
    for dir in host_mounts {
        mounts.push(mount(dir, "bind", dir, &["rbind", "ro", "nosuid", "nodev"]).map_err(e("mounts"))?);
    }
    for m in &cfg.mounts {
        let options: &[&str] =
            if m.read_only { &["rbind", "ro", "nosuid", "nodev"] } else { &["rbind", "rw", "nosuid", "nodev"] };
        mounts.push(mount(&m.destination, "bind", &m.source, options).map_err(e("volumeMounts"))?);
    }

    let hostname: String = cfg.pod.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(63).collect();
    let root = RootBuilder::default().path("rootfs").readonly(!host_mounts.is_empty()).build().map_err(e("root"))?;
    let mut spec = Spec::default();
    spec.set_version("1.0.2".to_string())
        .set_hostname(Some(if hostname.is_empty() { "pinion".to_string() } else { hostname }))
        .set_process(Some(proc))
        .set_root(Some(root))
        .set_mounts(Some(mounts))
        .set_annotations(None)
        .set_linux(Some(linux.build().map_err(e("linux"))?));
    Ok(spec)
}

/// Where the minimal init (`pinion init`) is bind-mounted inside a container.
pub(crate) const INIT_PATH: &str = "/.pinion-init";

/// `spec` with `host_init` (the pinion binary) bind-mounted read-only at
/// [`INIT_PATH`]; the caller puts `INIT_PATH init --` before the command.
pub(crate) fn with_init(mut spec: Spec, host_init: &Path) -> Result<Spec, oci_spec::OciSpecError> {
    let m = mount(INIT_PATH, "bind", host_init, &["bind", "ro", "nosuid", "nodev"])?;
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(m);
    spec.set_mounts(Some(mounts));
    Ok(spec)
}

/// `spec` with `quota` in its CPU resources, as a runtime that applies every
/// limit at create time expects it.
pub fn with_cpu_quota(mut spec: Spec, quota: CpuQuota) -> Spec {
    if let Some(cpu) =
        spec.linux_mut().as_mut().and_then(|l| l.resources_mut().as_mut()).and_then(|r| r.cpu_mut().as_mut())
    {
        cpu.set_quota(Some(quota.quota_us));
        cpu.set_period(Some(quota.period_us));
    }
    spec
}

fn mount(
    dest: impl Into<PathBuf>,
    typ: &str,
    source: impl Into<PathBuf>,
    opts: &[&str],
) -> Result<Mount, oci_spec::OciSpecError> {
    MountBuilder::default()
        .destination(dest.into())
        .typ(typ)
        .source(source.into())
        .options(opts.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()
}

/// The hugetlb controller's name for a page size: `2MB`, `1GB`, `64KB`.
fn page_size_name(bytes: u64) -> String {
    const K: u64 = 1024;
    if bytes >= K * K * K && bytes.is_multiple_of(K * K * K) {
        format!("{}GB", bytes / (K * K * K))
    } else if bytes >= K * K && bytes.is_multiple_of(K * K) {
        format!("{}MB", bytes / (K * K))
    } else {
        format!("{}KB", bytes / K)
    }
}

/// Syscalls a default container may make: Docker's default profile for 64-bit
/// x86 and ARM (everything else fails with EPERM). Dangerous ones (mount,
/// unshare, setns, bpf, kexec, module loading, keyring, perf, reboot, swap,
/// clock setting, ...) are absent on purpose.
const ALLOWED_SYSCALLS: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chroot",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_getfd",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "ptrace",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "socket",
    "socketpair",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
];

#[cfg(target_arch = "x86_64")]
const ARCH_SYSCALLS: &[&str] = &["arch_prctl", "modify_ldt", "set_thread_area", "get_thread_area"];
#[cfg(not(target_arch = "x86_64"))]
const ARCH_SYSCALLS: &[&str] = &[];

/// Namespace-creating clone flags a default container may not pass to `clone`.
const CLONE_NS_FLAGS: u64 = 0x7E02_0000;

/// The runtime default seccomp profile: Docker's, with the capability-gated
/// syscalls of the capabilities the pod added (`cap_add`).
///
/// Architectures: the native one and its 32-bit compat ABI, but not x32 (the
/// ILP32 ABI on x86-64, which Docker lists too). libcontainer compiles the
/// filter inside the new container, on its CPUs, at every start, and x32
/// doubles that work: 8.0 ms with x86-64, x86 and x32 against 3.9 ms without
/// x32 (libseccomp 2.5.4, this profile, an idle core). Kernels build x32 out
/// or disable it at boot (Debian: `syscall.x32=n`); without it in the filter an
/// x32 syscall is refused as a foreign architecture (the thread is killed)
/// instead of being allowed.
pub fn default_seccomp(cap_add: &[String]) -> Result<LinuxSeccomp, oci_spec::OciSpecError> {
    let architectures = if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![]
    };
    let mut names: Vec<String> = ALLOWED_SYSCALLS.iter().chain(ARCH_SYSCALLS).map(|s| s.to_string()).collect();
    names.extend(cap_add.iter().flat_map(|c| syscalls_for_capability(c)).map(|s| s.to_string()));
    names.sort();
    names.dedup();
    let syscalls = vec![
        LinuxSyscallBuilder::default().names(names).action(LinuxSeccompAction::ScmpActAllow).build()?,
        // clone without namespace flags (the flags are argument 0 on x86-64 and arm64).
        LinuxSyscallBuilder::default()
            .names(vec!["clone".to_string()])
            .action(LinuxSeccompAction::ScmpActAllow)
            .args(vec![LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(CLONE_NS_FLAGS)
                .value_two(0u64)
                .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                .build()?])
            .build()?,
        // clone3 cannot be filtered by flags: ENOSYS makes libc fall back to clone.
        LinuxSyscallBuilder::default()
            .names(vec!["clone3".to_string()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(libc::ENOSYS as u32)
            .build()?,
        // personality: only the harmless personas (Linux, UNAME26, 32-bit).
        LinuxSyscallBuilder::default()
            .names(vec!["personality".to_string()])
            .action(LinuxSeccompAction::ScmpActAllow)
            .args(vec![LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(0u64)
                .op(LinuxSeccompOperator::ScmpCmpEq)
                .build()?])
            .build()?,
    ];
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(libc::EPERM as u32)
        .architectures(architectures)
        .syscalls(syscalls)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerConfig, RootfsConfig};

    fn cfg() -> ContainerConfig {
        ContainerConfig {
            mounts: Vec::new(),
            id: "t1".into(),
            pod: "web".into(),
            container: "c".into(),
            args: vec!["true".into()],
            env: vec![],
            cwd: "/".into(),
            rootfs: RootfsConfig::Host,
            cpus: "1".parse().unwrap_or_default(),
            mems: "0".parse().unwrap_or_default(),
            bind_memory: true,
            memory_limit_bytes: Some(128 << 20),
            cpu_quota: None,
            cpu_shares: Some(512),
            hugepage_limits: [(2 << 20, 4 << 20)].into_iter().collect(),
            device_nodes: vec![PathBuf::from("/dev/null")],
            host_network: false,
            netns: None,
            cap_add: vec![],
            cap_drop: vec![],
            system_cpus: Default::default(),
            log_path: PathBuf::from("/tmp/x.log"),
            init: false,
            pids_limit: Some(4096),
            realtime_budget_us: None,
            run_as: Default::default(),
            userns: None,
            output: None,
        }
    }

    fn process() -> ProcessSpec {
        ProcessSpec {
            args: vec!["true".into()],
            env: vec!["PATH=/bin".into()],
            cwd: "/".into(),
            user: Default::default(),
        }
    }

    #[test]
    fn resources_namespaces_and_policy() {
        let spec = build(&cfg(), &process(), &[PathBuf::from("/usr")], Path::new("/pinion")).map_err(|e| e.to_string());
        let spec = match spec {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let v = serde_json::to_value(&spec).unwrap_or_default();
        let check = |ptr: &str, expected: serde_json::Value| {
            assert_eq!(v.pointer(ptr), Some(&expected), "{ptr} in {v:#}");
        };
        check("/linux/cgroupsPath", "/pinion/t1".into());
        check("/linux/resources/cpu/cpus", "1".into());
        check("/linux/resources/cpu/mems", "0".into());
        check("/linux/resources/cpu/shares", 512.into());
        check("/linux/resources/memory/limit", (128i64 << 20).into());
        check("/linux/resources/hugepageLimits/0/pageSize", "2MB".into());
        check("/linux/memoryPolicy/mode", "MPOL_BIND".into());
        check("/linux/memoryPolicy/nodes", "0".into());
        check("/linux/seccomp/defaultAction", "SCMP_ACT_ERRNO".into());
        check("/process/noNewPrivileges", true.into());
        check("/linux/resources/pids/limit", 4096.into());
        check("/process/user/umask", 0o022.into());
        let tmp = v
            .pointer("/mounts")
            .and_then(|m| m.as_array())
            .and_then(|m| m.iter().find(|m| m.get("destination").and_then(|d| d.as_str()) == Some("/tmp")).cloned());
        let options = tmp.and_then(|t| t.get("options").cloned()).unwrap_or_default();
        assert_eq!(options, serde_json::json!(["nosuid", "nodev", "mode=1777", "size=134217728"]), "the memory limit");
        check("/root/readonly", true.into());
        let caps = v.pointer("/process/capabilities/bounding").and_then(|c| c.as_array()).map(|c| c.len());
        assert_eq!(caps, Some(14));
        let ns: Vec<&str> = v
            .pointer("/linux/namespaces")
            .and_then(|n| n.as_array())
            .map(|a| a.iter().filter_map(|n| n.get("type").and_then(|t| t.as_str())).collect())
            .unwrap_or_default();
        for want in ["pid", "network", "ipc", "uts", "mount"] {
            assert!(ns.contains(&want), "{want} missing from {ns:?}");
        }
        // A device node (a GPU's /dev/nvidiaN on a GPU host) is created in the
        // container and allowed in its cgroup, after a deny-all rule.
        check(
            "/linux/devices/0",
            serde_json::json!({"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666, "uid": 0, "gid": 0}),
        );
        check("/linux/resources/devices/0", serde_json::json!({"allow": false, "access": "rwm"}));
        check(
            "/linux/resources/devices/1",
            serde_json::json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}),
        );
    }

    /// The process's user and capability sets, as the spec says them.
    fn user_and_caps(c: &ContainerConfig, user: ProcessUser) -> (serde_json::Value, [Vec<String>; 5]) {
        let spec = build(c, &ProcessSpec { user, ..process() }, &[], Path::new("/pinion")).map_err(|e| e.to_string());
        let v = serde_json::to_value(spec.unwrap_or_else(|e| panic!("{e}"))).unwrap_or_default();
        let set = |name: &str| {
            let mut caps: Vec<String> = v
                .pointer(&format!("/process/capabilities/{name}"))
                .and_then(|c| c.as_array())
                .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
                .unwrap_or_else(|| panic!("{name} is missing: an unset set is the runtime's default"));
            caps.sort();
            caps
        };
        let sets = ["bounding", "effective", "permitted", "inheritable", "ambient"].map(set);
        (v.pointer("/process/user").cloned().unwrap_or_default(), sets)
    }

    #[test]
    fn root_keeps_the_default_capabilities_and_no_inheritable_or_ambient() {
        let mut c = cfg();
        c.cap_add = vec!["CAP_SYS_NICE".into()];
        c.cap_drop = vec!["CAP_NET_RAW".into()];
        let (user, [bounding, effective, permitted, inheritable, ambient]) = user_and_caps(&c, ProcessUser::default());
        assert_eq!(user, serde_json::json!({"uid": 0, "gid": 0, "umask": 0o022}));
        assert_eq!(bounding.len(), 14, "{bounding:?}");
        assert!(bounding.contains(&"CAP_SYS_NICE".to_string()) && !bounding.contains(&"CAP_NET_RAW".to_string()));
        assert_eq!((&effective, &permitted), (&bounding, &bounding));
        assert_eq!((inheritable, ambient), (vec![], vec![]));
        // Root with groups named: exactly those.
        let root = ProcessUser { additional_gids: vec![0, 7], ..Default::default() };
        let (user, _) = user_and_caps(&c, root);
        assert_eq!(user["additionalGids"], serde_json::json!([0, 7]));
    }

    #[test]
    fn a_non_root_process_gets_only_what_the_pod_added_and_keeps_it_across_exec() {
        let alice = ProcessUser { uid: 1001, gid: 1001, additional_gids: vec![1001, 1002], home: None };
        let (user, sets) = user_and_caps(&cfg(), alice.clone());
        assert_eq!(user, serde_json::json!({"uid": 1001, "gid": 1001, "additionalGids": [1001, 1002], "umask": 0o022}));
        assert_eq!(sets, <[Vec<String>; 5]>::default(), "no capability at all");
        let mut c = cfg();
        c.cap_add = vec!["CAP_SYS_NICE".into(), "CAP_IPC_LOCK".into()];
        // What root's default set would have given is not given back by a drop list.
        c.cap_drop = vec!["CAP_NET_RAW".into()];
        let (_, sets) = user_and_caps(&c, alice.clone());
        let added = vec!["CAP_IPC_LOCK".to_string(), "CAP_SYS_NICE".to_string()];
        assert_eq!(sets, [added.clone(), added.clone(), added.clone(), added.clone(), added]);
        let spec = build(&c, &ProcessSpec { user: alice, ..process() }, &[], Path::new("/pinion"));
        let v = serde_json::to_value(spec.unwrap_or_else(|e| panic!("{e}"))).unwrap_or_default();
        assert_eq!(v.pointer("/process/noNewPrivileges"), Some(&true.into()), "always");
        // The device the pod was given is its user's to open.
        assert_eq!(v.pointer("/linux/devices/0/uid"), Some(&1001.into()));
        assert_eq!(v.pointer("/linux/devices/0/gid"), Some(&1001.into()));
    }

    #[test]
    fn host_network_drops_the_network_namespace_and_no_policy_without_mems() {
        let mut c = cfg();
        c.host_network = true;
        c.mems = Default::default();
        c.pids_limit = None;
        c.memory_limit_bytes = None;
        let spec = build(&c, &process(), &[], Path::new("/pinion")).map_err(|e| e.to_string());
        let v = serde_json::to_value(spec.unwrap_or_default()).unwrap_or_default();
        let text = v.pointer("/linux/namespaces").map(|n| n.to_string()).unwrap_or_default();
        assert!(!text.contains("network"), "{text}");
        assert!(v.pointer("/linux/memoryPolicy").is_none());
        assert!(v.pointer("/linux/resources/pids").is_none());
        let mounts = v.pointer("/mounts").map(|m| m.to_string()).unwrap_or_default();
        assert!(mounts.contains("\"size=67108864\""), "no memory limit: a 64 MiB /tmp: {mounts}");
        assert_eq!(v.pointer("/root/readonly"), Some(&false.into()));
    }

    #[test]
    fn the_cpu_quota_is_left_to_the_shim_and_can_be_put_back() {
        let mut c = cfg();
        c.cpu_quota = Some(CpuQuota { quota_us: 10_000, period_us: 100_000 });
        let spec = build(&c, &process(), &[], Path::new("/pinion")).map_err(|e| e.to_string());
        let spec = match spec {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let v = serde_json::to_value(&spec).unwrap_or_default();
        assert!(v.pointer("/linux/resources/cpu/quota").is_none(), "{v:#}");
        assert_eq!(v.pointer("/linux/resources/cpu/shares"), Some(&512.into()));
        let v = serde_json::to_value(with_cpu_quota(spec, CpuQuota { quota_us: 10_000, period_us: 100_000 }))
            .unwrap_or_default();
        assert_eq!(v.pointer("/linux/resources/cpu/quota"), Some(&10_000.into()));
        assert_eq!(v.pointer("/linux/resources/cpu/period"), Some(&100_000.into()));
    }

    #[test]
    fn bad_device_node_names_the_path() {
        let mut c = cfg();
        c.device_nodes = vec![PathBuf::from("/etc/hostname")];
        let err = build(&c, &process(), &[], Path::new("/pinion")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("/etc/hostname") && err.contains("not a device node"), "{err}");
    }

    #[test]
    fn page_size_names() {
        for (bytes, name) in [(2 << 20, "2MB"), (1 << 30, "1GB"), (64 << 10, "64KB")] {
            assert_eq!(page_size_name(bytes), name);
        }
    }
}
