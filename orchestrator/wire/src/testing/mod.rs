//! What the workspace's tests share (feature `testing`): waiting for a
//! condition with a bound (`eventually` in async tests, `wait_for` in
//! blocking ones, one message shape), the guard for what a host may lack
//! (`requires`: a skip on a laptop, a failure under `CI=true`), and a TCP
//! relay a test can cut or silence. It lives here, in the lowest crate the
//! orchestrator, the nodelet, the CLI and e2e all depend on.

pub mod relay;

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

pub use relay::Relay;

/// How often `eventually` asks again (in-process probes are cheap).
const ASYNC_POLL: Duration = Duration::from_millis(25);
/// How often `wait_for` asks again (its probes often start a process).
const BLOCKING_POLL: Duration = Duration::from_millis(100);

/// What a probe answers: `true` or `Some(value)` when the condition holds.
pub trait Ready {
    type Value;
    fn ready(self) -> Option<Self::Value>;
}

impl Ready for bool {
    type Value = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Ready for Option<T> {
    type Value = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// Polls `probe` until it is ready and returns its value; panics with
/// "`what`: not within `within`" when it is not ready by then. On tokio's
/// clock, so a test with paused time waits in virtual time.
pub async fn eventually<R, F, Fut>(what: impl Display, within: Duration, mut probe: F) -> R::Value
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await.ready() {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(ASYNC_POLL).await;
    }
}

/// `eventually` for a blocking test: the thread sleeps between probes.
pub fn wait_for<R: Ready>(what: impl Display, within: Duration, mut probe: impl FnMut() -> R) -> R::Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().ready() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(BLOCKING_POLL);
    }
}

/// Whether this run is CI's (`CI=true`), where a missing privilege or tool
/// is a failure, never a silent skip.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether a test that needs `what` can go on: true when `met`; otherwise
/// `missing(what)` (SKIPPED on a laptop, a panic under `CI=true`) and false.
pub fn requires(met: bool, what: impl Display) -> bool {
    if !met {
        missing(what);
    }
    met
}

/// `requires` root (real containers, mounts, network namespaces).
pub fn requires_root() -> bool {
    requires(is_root(), "root")
}

/// The test cannot run here for want of `what`: prints SKIPPED and returns,
/// the caller then returns too; under `CI=true` it panics instead (CI's
/// hosts have everything; e2e/host-setup.sh installs it).
pub fn missing(what: impl Display) {
    // libtest names a test's thread after the test; tokio's workers are not.
    let test = std::thread::current().name().filter(|n| *n != "main" && !n.starts_with("tokio-")).map(str::to_string);
    let test = test.map(|t| format!(" {t}")).unwrap_or_default();
    assert!(!under_ci(), "needs {what}, and CI=true");
    eprintln!("SKIPPED{test}: needs {what}");
}

/// Whether this process runs as root (real containers need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Whether CPUs 0 and 1 are online (CPU 0 reserved, CPU 1 exclusive).
pub fn has_two_cpus() -> bool {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| specs::CpuSet::parse_list(s.trim()).ok())
        .is_some_and(|cpus| cpus.contains(0) && cpus.contains(1))
}

/// Whether `program` is an executable file in one of `PATH`'s folders.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: std::thread::Result<()>) -> String {
        let e = r.expect_err("a panic");
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn wait_for_returns_the_value_or_names_what_it_waited_for() {
        let mut n = 0;
        assert_eq!(
            wait_for("three", Duration::from_secs(5), || {
                n += 1;
                (n == 3).then_some(n)
            }),
            3
        );
        let r = std::panic::catch_unwind(|| wait_for("never", Duration::from_millis(150), || false));
        assert_eq!(message(r), "never: not within 150ms");
    }

    /// The only test here that reads `CI`: it sets it, then puts it back.
    #[test]
    fn a_missing_need_skips_on_a_laptop_and_fails_under_ci() {
        let before = std::env::var_os("CI");
        std::env::remove_var("CI");
        assert!(requires(true, "nothing"));
        assert!(!requires(false, "a unicorn"), "a skip outside CI");
        std::env::set_var("CI", "true");
        let r = std::panic::catch_unwind(|| {
            requires(false, "a unicorn");
        });
        assert!(requires(true, "nothing"), "what is there passes under CI too");
        match before {
            Some(v) => std::env::set_var("CI", v),
            None => std::env::remove_var("CI"),
        }
        assert_eq!(message(r), "needs a unicorn, and CI=true");
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_waits_on_tokios_clock() {
        let start = tokio::time::Instant::now();
        let r = tokio::spawn(eventually("never", Duration::from_secs(3600), || async { false })).await;
        let e = r.expect_err("a panic").into_panic();
        assert_eq!(e.downcast_ref::<String>().map(String::as_str), Some("never: not within 3600s"));
        assert!(start.elapsed() >= Duration::from_secs(3600));
        let mut n = 0;
        let got = eventually("two", Duration::from_secs(1), || {
            n += 1;
            let v = n;
            async move { (v == 2).then_some("yes") }
        })
        .await;
        assert_eq!(got, "yes");
    }
}
