//! The QEMU NUMA guest from the host's side: `e2e/qemu/prepare.sh` (packages, Debian
//! kernel, initramfs, all cached under `target/qemu`) and `e2e/qemu/boot.sh` (one boot
//! under software emulation, two NUMA nodes, cgroup v2), run with a hard timeout.
//!
//! The guest exchanges files with the host through one shared folder (`/tmp/pinion-out`
//! inside): the host writes `run` (the script to run), the guest writes `log`,
//! `exit-code`, `verdict`, `failures` and `figures` (see `e2e/qemu/guest-numa.sh`).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// What `prepare.sh` built: paths handed to `boot.sh` as environment variables.
#[derive(Debug, Clone)]
pub struct Guest {
    scripts: PathBuf,
    vars: BTreeMap<String, String>,
}

/// How one boot ended.
#[derive(Debug)]
pub struct Boot {
    /// The serial console (kernel messages, init, the script's output).
    pub serial: String,
    /// From starting QEMU to its exit (or to the kill on timeout).
    pub wall: Duration,
    pub ended: Ended,
    /// QEMU exited with status 0 (never, when it was killed).
    pub exit_ok: bool,
}

/// How a boot ended: the guest powered off, or which deadline killed QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    PoweredOff,
    /// `/init` had not started the script by [`Deadlines::script_within`]: the
    /// kernel or the emulator stalled before any of the project's code ran.
    Stalled,
    /// The script's log had not grown for [`Deadlines::quiet_within`]: the
    /// guest stopped making progress.
    Quiet,
    /// [`Deadlines::total`] passed.
    TimedOut,
}

impl Boot {
    /// The script stopped writing while the guest's kernel reported soft
    /// lockups: its virtual CPUs got no time from a loaded host.
    pub fn starved(&self) -> bool {
        self.ended == Ended::Quiet && self.serial.contains("soft lockup")
    }

    /// The guest's kernel panicked before `/init` started the script (the
    /// guest then powers off at once, `panic=-1`): nothing of the project ran.
    pub fn panicked_before_script(&self) -> bool {
        match self.serial.find("Kernel panic") {
            Some(at) => !self.serial[..at].contains(SCRIPT_STARTED),
            None => false,
        }
    }
}

/// When a boot is killed. Under software emulation on a loaded 2-core host the
/// guest runs two to three times slower than on a quiet one, so the total is
/// generous; the two shorter bounds catch a guest that stopped early.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// QEMU is killed after this long, whatever the guest is doing.
    pub total: Duration,
    /// `/init` must start the script by then (it does within seconds of a
    /// healthy boot).
    pub script_within: Duration,
    /// Once the script runs, its log must grow at least this often: every
    /// check writes a line, and the longest wait between two is for a pod to
    /// start.
    pub quiet_within: Duration,
}

/// The guest's kernel, from Debian's packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Debian 12's own, 6.1.
    Bookworm,
    /// bookworm-backports' newest PREEMPT_RT one (6.12 now): cgroup v2's
    /// `cpuset.cpus.exclusive` and remote partitions need Linux 6.7.
    Backports,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Bookworm => "bookworm",
            Kernel::Backports => "backports",
        }
    }
}

/// What `e2e/qemu/init.sh` prints on the serial console just before it runs the
/// script.
const SCRIPT_STARTED: &str = "init: running ";

/// `prepare.sh` exits with this when packages are missing and it may not install them.
const EXIT_MISSING_PACKAGES: i32 = 3;

impl Guest {
    /// Runs `prepare.sh` (quick when its cache is warm). `Ok(None)`: the host lacks the
    /// Debian packages and this process may not install them (not root).
    pub fn prepare(repo: &Path) -> anyhow::Result<Option<Guest>> {
        Self::prepare_kernel(repo, Kernel::Bookworm)
    }

    /// [`Guest::prepare`] with another kernel (`PINION_QEMU_KERNEL` of `prepare.sh`).
    pub fn prepare_kernel(repo: &Path, kernel: Kernel) -> anyhow::Result<Option<Guest>> {
        let scripts = repo.join("e2e/qemu");
        let prepare = scripts.join("prepare.sh");
        let output = Command::new("bash")
            .arg(&prepare)
            .env("PINION_QEMU_KERNEL", kernel.name())
            .output()
            .with_context(|| format!("running {}", prepare.display()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.code() == Some(EXIT_MISSING_PACKAGES) {
            eprintln!("{stderr}");
            return Ok(None);
        }
        if !output.status.success() {
            bail!("{} failed ({}):\n{stderr}", prepare.display(), output.status);
        }
        let vars = parse_assignments(&String::from_utf8_lossy(&output.stdout));
        for key in ["QEMU_KERNEL", "QEMU_INITRD", "NUMA_TOUCH"] {
            if !vars.contains_key(key) {
                bail!("{} printed no {key}=...; stderr:\n{stderr}", prepare.display());
            }
        }
        Ok(Some(Guest { scripts, vars }))
    }

    /// A value `prepare.sh` printed (`QEMU_KERNEL`, `QEMU_INITRD`, `NUMA_TOUCH`, ...).
    pub fn var(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// Boots the guest once with `out` as its shared folder and waits for it to power
    /// off, killing QEMU when one of `deadlines` passes. `kernel_args` go on the
    /// kernel command line after the usual ones.
    pub fn boot(&self, out: &Path, deadlines: Deadlines, kernel_args: &[&str]) -> anyhow::Result<Boot> {
        let serial_path = out.with_extension("serial");
        let serial = File::create(&serial_path).with_context(|| format!("creating {}", serial_path.display()))?;
        let serial_err = serial.try_clone().context("duplicating the serial log handle")?;
        let started = Instant::now();
        let mut child = Command::new("bash")
            .arg(self.scripts.join("boot.sh"))
            .arg(out)
            .args(kernel_args)
            .envs(&self.vars)
            .stdin(Stdio::null())
            .stdout(serial)
            .stderr(serial_err)
            .spawn()
            .context("starting e2e/qemu/boot.sh")?;
        let log_path = out.join("log");
        let mut script_started = false;
        // The log's length, and when it last changed.
        let mut progress = (0_u64, Instant::now());
        let (ended, exit_ok) = loop {
            if let Some(status) = child.try_wait().context("waiting for QEMU")? {
                break (Ended::PoweredOff, status.success());
            }
            if !script_started {
                script_started =
                    std::fs::read(&serial_path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(SCRIPT_STARTED));
                progress.1 = Instant::now();
            }
            let logged = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
            if logged != progress.0 {
                progress = (logged, Instant::now());
            }
            let ended = if !script_started && started.elapsed() > deadlines.script_within {
                Some(Ended::Stalled)
            } else if script_started && progress.1.elapsed() > deadlines.quiet_within {
                Some(Ended::Quiet)
            } else if started.elapsed() > deadlines.total {
                Some(Ended::TimedOut)
            } else {
                None
            };
            if let Some(ended) = ended {
                // boot.sh execs QEMU, so this is QEMU's PID.
                let _ = child.kill();
                let _ = child.wait();
                break (ended, false);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let wall = started.elapsed();
        let serial = std::fs::read(&serial_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let _ = std::fs::remove_file(&serial_path);
        Ok(Boot { serial, wall, ended, exit_ok })
    }
}

/// `KEY=VALUE` lines; anything else is ignored.
fn parse_assignments(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `KEY VALUE` lines of the guest's `figures` file, in order.
pub fn parse_figures(text: &str) -> Vec<(String, String)> {
    text.lines().filter_map(|line| line.split_once(' ')).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prepare_output() {
        let vars = parse_assignments("QEMU_KERNEL=/k/vmlinuz\nprepare: noise=1\nNUMA_TOUCH=/t/numa-touch\n=x\n");
        let expected: BTreeMap<String, String> =
            [("QEMU_KERNEL", "/k/vmlinuz"), ("NUMA_TOUCH", "/t/numa-touch")].map(|(k, v)| (k.into(), v.into())).into();
        assert_eq!(vars, expected);
    }

    #[test]
    fn parses_figures() {
        let figures = parse_figures("numactl_node1_share_pct 100.0\npinion_nodes_used  2 0; 1 1;\nbare\n");
        assert_eq!(
            figures,
            vec![
                ("numactl_node1_share_pct".to_string(), "100.0".to_string()),
                ("pinion_nodes_used".to_string(), "2 0; 1 1;".to_string()),
            ]
        );
    }

    /// `boot` against a stand-in for `boot.sh`: each case's script plays a
    /// guest, and the deadlines are a second or two.
    #[test]
    fn a_boot_ends_at_the_first_deadline_that_passes() {
        let started = format!("echo '{SCRIPT_STARTED}/tmp/pinion-out/run'");
        let cases = [
            // (what the guest does, how the boot ends: powered off, stalled, quiet, timed out)
            (format!("{started}; for i in 1 2 3 4 5 6; do echo ok >>\"$1/log\"; sleep 0.3; done"), Ended::PoweredOff),
            ("exec sleep 30".to_string(), Ended::Stalled),
            (format!("{started}; echo ok >>\"$1/log\"; exec sleep 30"), Ended::Quiet),
            (format!("{started}; while :; do echo ok >>\"$1/log\"; sleep 0.3; done"), Ended::TimedOut),
        ];
        let deadlines = Deadlines {
            total: Duration::from_secs(4),
            script_within: Duration::from_secs(1),
            quiet_within: Duration::from_secs(1),
        };
        for (script, want) in cases {
            let scripts = tempfile::tempdir().expect("a temporary folder");
            std::fs::write(scripts.path().join("boot.sh"), &script).expect("writing the stand-in boot.sh");
            let out = tempfile::tempdir().expect("a temporary folder");
            let guest = Guest { scripts: scripts.path().to_path_buf(), vars: BTreeMap::new() };
            let boot = guest.boot(out.path(), deadlines, &[]).expect("running the stand-in boot.sh");
            assert_eq!(
                (boot.ended, boot.exit_ok),
                (want, want == Ended::PoweredOff),
                "{script} (after {:?})",
                boot.wall
            );
        }
    }

    #[test]
    fn a_guest_is_starved_when_it_went_quiet_with_soft_lockups() {
        let lockup = "init: running /tmp/pinion-out/run\n[ 312.4] watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [youki:INTER]\n";
        let cases = [
            (lockup, Ended::Quiet, true),
            (lockup, Ended::TimedOut, false),
            ("init: running /tmp/pinion-out/run\nok\n", Ended::Quiet, false),
        ];
        for (serial, ended, expected) in cases {
            let boot = Boot { serial: serial.into(), wall: Duration::ZERO, ended, exit_ok: false };
            assert_eq!(boot.starved(), expected, "{serial:?}, {ended:?}");
        }
    }

    #[test]
    fn a_panic_counts_only_before_the_script_started() {
        let boot = |serial: &str| Boot {
            serial: serial.into(),
            wall: Duration::ZERO,
            ended: Ended::PoweredOff,
            exit_ok: true,
        };
        let cases = [
            ("[ 9.3] RIP: sched_clock_cpu\n[ 9.38] Kernel panic - not syncing: Fatal exception in interrupt\n", true),
            ("init: running /tmp/pinion-out/run\n[ 60.1] Kernel panic - not syncing: oom\n", false),
            ("init: running /tmp/pinion-out/run\nPASS\n", false),
            ("", false),
        ];
        for (serial, expected) in cases {
            assert_eq!(boot(serial).panicked_before_script(), expected, "{serial:?}");
        }
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
