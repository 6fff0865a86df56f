//! User namespaces for pods with `hostUsers: false`: each such pod gets a
//! block of 65,536 host ids of its own (its root is the block's first id,
//! nobody on the host), claimed in a folder of the data directory so that
//! two live pods never share one; the namespace that carries the map
//! (made by a short-lived child process, since a threaded process may not
//! enter one); and idmapped mounts, through which a filesystem owned by the
//! host's root is owned by the pod's root inside.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};

/// Ids in one pod's block: uid and gid 0..65536 inside.
pub const IDS_PER_POD: u32 = 65_536;
/// The first host id handed to pods: above any id a directory service or
/// `useradd` gives out, as Kubernetes' default range is.
pub const FIRST_HOST_ID: u32 = 1 << 31;
/// Blocks from [`FIRST_HOST_ID`] up to just below 2^32 - 1 (`(uid_t)-1`,
/// which means "no change" to the kernel).
pub const BLOCKS: u32 = (u32::MAX - FIRST_HOST_ID) / IDS_PER_POD;

/// How long the helper child may take for each step.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// The host id of block `n`'s root.
pub fn base_of(block: u32) -> u32 {
    FIRST_HOST_ID + block * IDS_PER_POD
}

/// The claims of blocks (`<data>/userns/<block>`, each holding the sandbox
/// id of the pod that has it). Claims survive a restart; the agent releases
/// those no pod wants.
#[derive(Debug, Clone)]
pub struct Blocks {
    dir: PathBuf,
}

impl Blocks {
    pub fn new(data_dir: &Path) -> Blocks {
        Blocks { dir: data_dir.join("userns") }
    }

    /// Every claim: (block, sandbox).
    pub fn claimed(&self) -> io::Result<Vec<(u32, String)>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Some(block) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            // A claim being written (or torn by a crash) is empty: it holds the block all the same.
            let mut owner = String::new();
            if let Ok(mut f) = fs::File::open(entry.path()) {
                let _ = Read::by_ref(&mut f).take(256).read_to_string(&mut owner);
            }
            out.push((block, owner.trim().to_string()));
        }
        out.sort();
        Ok(out)
    }

    /// The host id of `sandbox`'s root: its claim, or a new one (the first
    /// free block from a point its id picks, so that pods made in a row do
    /// not all probe from block 0).
    pub fn claim(&self, sandbox: &str) -> io::Result<u32> {
        let claimed = self.claimed()?;
        if let Some((block, _)) = claimed.iter().find(|(_, s)| s == sandbox) {
            return Ok(base_of(*block));
        }
        crate::fsutil::private_dir(&self.dir)?;
        let start = sandbox.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into())) % BLOCKS;
        for i in 0..BLOCKS {
            let block = (start + i) % BLOCKS;
            if claimed.iter().any(|(b, _)| *b == block) {
                continue;
            }
            let path = self.dir.join(block.to_string());
            // O_EXCL is the lock: two claims racing for one block cannot both win.
            match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(mut f) => {
                    f.write_all(sandbox.as_bytes())?;
                    f.sync_all()?;
                    fs::File::open(&self.dir)?.sync_all()?;
                    return Ok(base_of(block));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!("all {BLOCKS} blocks of {IDS_PER_POD} host ids are held by pods")))
    }

    /// Gives back `sandbox`'s block; none held is fine.
    pub fn release(&self, sandbox: &str) -> io::Result<()> {
        for (block, owner) in self.claimed()? {
            if owner == sandbox {
                match fs::remove_file(self.dir.join(block.to_string())) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// The map of a pod whose root is host id `base`, as `/proc/PID/uid_map` takes it.
fn map_line(base: u32) -> String {
    format!("0 {base} {IDS_PER_POD}\n")
}

/// What the helper child does once its new user namespace is mapped.
enum Then<'a> {
    Nothing,
    /// Make a network namespace owned by it (the pod's network).
    NewNet,
    /// Enter this user namespace, then make a network namespace owned by it.
    JoinThenNewNet(BorrowedFd<'a>),
}

/// Runs a child process that makes the namespaces `then` says (a new user
/// namespace mapped to `base` unless it joins one), and calls `with` with
/// the child's pid while the child waits; the child is gone on return.
fn with_child<T>(base: u32, then: Then<'_>, with: impl FnOnce(Pid) -> Result<T, String>) -> Result<T, String> {
    let (up_r, up_w) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (go_r, go_w) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let join = match &then {
        Then::JoinThenNewNet(fd) => Some(fd.as_raw_fd()),
        _ => None,
    };
    let new_net = matches!(then, Then::NewNet | Then::JoinThenNewNet(_));
    // SAFETY: the child only makes raw system calls (no allocation, no
    // locks) and ends with `_exit`, as is safe after fork in a threaded process.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            let up = up_w.as_raw_fd();
            let go = go_r.as_raw_fd();
            let mut byte = [0u8; 1];
            // SAFETY: raw syscalls on fds this child holds; see above.
            unsafe {
                let ok = match join {
                    Some(fd) => libc::setns(fd, libc::CLONE_NEWUSER) == 0,
                    None => libc::unshare(libc::CLONE_NEWUSER) == 0,
                };
                if !ok {
                    libc::_exit(1);
                }
                // Mapped (or joined): now a network namespace, if asked.
                if libc::write(up, b"u".as_ptr().cast(), 1) != 1 || libc::read(go, byte.as_mut_ptr().cast(), 1) != 1 {
                    libc::_exit(1);
                }
                if new_net && libc::unshare(libc::CLONE_NEWNET) != 0 {
                    libc::_exit(1);
                }
                if libc::write(up, b"n".as_ptr().cast(), 1) != 1 {
                    libc::_exit(1);
                }
                // Held until the parent is done with our namespaces (or gone).
                libc::read(go, byte.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        ForkResult::Parent { child } => {
            drop((up_w, go_r));
            let result = (|| {
                wait_byte(&up_r, "the namespace helper did not make its user namespace")?;
                if join.is_none() {
                    for file in ["uid_map", "gid_map"] {
                        let path = format!("/proc/{child}/{file}");
                        fs::write(&path, map_line(base)).map_err(|e| format!("{path}: {e}"))?;
                    }
                }
                nix::unistd::write(&go_w, b"g").map_err(|e| format!("the namespace helper: {e}"))?;
                wait_byte(&up_r, "the namespace helper did not make its network namespace")?;
                with(child)
            })();
            drop(go_w);
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            let _ = waitpid(child, None);
            result
        }
    }
}

fn wait_byte(fd: &OwnedFd, what: &str) -> Result<(), String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{what} within {CHILD_TIMEOUT:?}"));
        }
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(left.as_millis().min(10_000) as i32).unwrap_or(PollTimeout::MAX)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
    let mut byte = [0u8; 1];
    match nix::unistd::read(fd.as_raw_fd(), &mut byte) {
        Ok(1) => Ok(()),
        _ => Err(what.to_string()),
    }
}

/// A new user namespace mapped to `base`, held open by the returned fd.
pub fn new_userns(base: u32) -> Result<OwnedFd, String> {
    with_child(base, Then::Nothing, |pid| open_ns(pid, "user"))
}

fn open_ns(pid: Pid, kind: &str) -> Result<OwnedFd, String> {
    let path = format!("/proc/{pid}/ns/{kind}");
    fs::File::open(&path).map(OwnedFd::from).map_err(|e| format!("{path}: {e}"))
}

/// Pins a new user namespace mapped to `base` on `user_pin` and, inside it, a
/// new network namespace on `net_pin` (the pod's network; the caller brings
/// `lo` up). Both pins must be existing empty files.
pub fn pin_pod_namespaces(base: u32, user_pin: &Path, net_pin: &Path) -> Result<(), String> {
    with_child(base, Then::NewNet, |pid| {
        bind(&format!("/proc/{pid}/ns/user"), user_pin)?;
        bind(&format!("/proc/{pid}/ns/net"), net_pin)
    })
}

/// Pins a new network namespace owned by the pinned user namespace `user_pin`.
pub fn pin_netns_in(user_pin: &Path, net_pin: &Path) -> Result<(), String> {
    let user = fs::File::open(user_pin).map_err(|e| format!("{}: {e}", user_pin.display()))?;
    with_child(0, Then::JoinThenNewNet(user.as_fd()), |pid| bind(&format!("/proc/{pid}/ns/net"), net_pin))
}

fn bind(source: &str, target: &Path) -> Result<(), String> {
    nix::mount::mount(Some(source), target, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| format!("pinning {source} on {}: {e}", target.display()))
}

/// Mounts `source` on `target` idmapped through `userns`: a file that the
/// host's id K owns is seen owned by the namespace's K.
pub fn idmapped_bind(source: &Path, userns: BorrowedFd<'_>, target: &Path) -> Result<(), String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: a NUL in the path", p.display()));
    let (src, dst, empty) = (c(source)?, c(target)?, CString::default());
    // SAFETY: open_tree with a valid C string; the fd is checked and owned.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(format!("open_tree {}: {}", source.display(), io::Error::last_os_error()));
    }
    // SAFETY: `tree` is a new fd owned from here on.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on the detached tree, with `attr` outliving the call.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set < 0 {
        return Err(format!("idmapping {}: {}", source.display(), io::Error::last_os_error()));
    }
    // SAFETY: move_mount of the detached tree onto an existing directory.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        )
    };
    if moved < 0 {
        return Err(format!("mounting {} on {}: {}", source.display(), target.display(), io::Error::last_os_error()));
    }
    Ok(())
}

/// Opens the pinned user namespace at `pin`.
pub fn open_pinned(pin: &Path) -> Result<OwnedFd, String> {
    fs::File::open(pin).map(OwnedFd::from).map_err(|e| format!("{}: {e}", pin.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fit_below_the_invalid_id() {
        let last = base_of(BLOCKS - 1) as u64 + IDS_PER_POD as u64 - 1;
        assert!(last < u32::MAX as u64, "{last}");
        assert_eq!(base_of(0), 2_147_483_648);
    }

    #[test]
    fn a_claim_is_kept_found_again_and_released() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let blocks = Blocks::new(dir.path());
        let a = blocks.claim("pa")?;
        let b = blocks.claim("pb")?;
        assert_ne!(a, b);
        assert_eq!(blocks.claim("pa")?, a, "a second claim finds the first");
        assert_eq!((a - FIRST_HOST_ID) % IDS_PER_POD, 0);
        // Another process (a restarted agent) sees the same claims.
        assert_eq!(Blocks::new(dir.path()).claim("pb")?, b);
        blocks.release("pa")?;
        assert_eq!(blocks.claimed()?.len(), 1);
        blocks.release("pa")?;
        Ok(())
    }

    #[test]
    fn a_taken_block_is_skipped() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let blocks = Blocks::new(dir.path());
        let a = blocks.claim("pa")?;
        blocks.release("pa")?;
        // Someone else holds pa's preferred block now: pa gets the next.
        fs::write(dir.path().join("userns").join(((a - FIRST_HOST_ID) / IDS_PER_POD).to_string()), "other")?;
        let again = blocks.claim("pa")?;
        assert_eq!(again, a + IDS_PER_POD);
        Ok(())
    }
}
