//! Where pinion's own processes run. An exclusive CPU is exclusive among pods
//! only unless the node's own work stays off it: the agent confines itself to
//! the reserved CPUs, and each shim asks for every CPU while it creates its
//! container (so the container inherits nothing) and then confines itself to
//! the reserved CPUs for the rest of its life (copying the container's output).

use nix::sched::{sched_setaffinity, CpuSet as Mask};
use nix::unistd::Pid;
use specs::CpuSet;

/// The mask for `cpus`; `None` when it names no CPU the kernel's mask can hold.
fn mask(cpus: &CpuSet) -> Option<Mask> {
    let mut m = Mask::new();
    let mut any = false;
    for cpu in cpus.iter() {
        if m.set(cpu as usize).is_ok() {
            any = true;
        }
    }
    any.then_some(m)
}

/// Every CPU: the calling thread may run anywhere its cpuset allows. Since
/// Linux 6.2 a task keeps the affinity it inherited even when its cpuset is
/// wider, and the kernel intersects the two.
pub fn widen_thread() -> nix::Result<()> {
    let mut all = Mask::new();
    for cpu in 0..Mask::count() {
        let _ = all.set(cpu);
    }
    sched_setaffinity(Pid::from_raw(0), &all)
}

/// Confines the calling thread to `cpus`.
pub fn confine_thread(cpus: &CpuSet) -> nix::Result<()> {
    let m = mask(cpus).ok_or(nix::Error::EINVAL)?;
    sched_setaffinity(Pid::from_raw(0), &m)
}

/// Confines every thread of this process to `cpus` (threads made later
/// inherit it from their creator). Returns how many threads were moved.
pub fn confine_process(cpus: &CpuSet) -> Result<usize, String> {
    let m = mask(cpus).ok_or_else(|| format!("CPUs {cpus} are not usable"))?;
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?;
    let mut moved = 0;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        match sched_setaffinity(Pid::from_raw(tid), &m) {
            Ok(()) => moved += 1,
            // A thread that just exited.
            Err(nix::Error::ESRCH) => {}
            Err(e) => return Err(format!("thread {tid}: {e}")),
        }
    }
    Ok(moved)
}
