//! `pinion install server|agent [--unit-dir DIR] [--bin PATH] -- FLAGS...`:
//! writes the systemd unit that runs `pinion server` or `pinion agent` with
//! these flags (checked as the daemon would parse them, before anything is
//! written). A join token given as `--token` is written to a file of its own
//! (root's only) and the unit passes `--token-file`, so `ps` never shows it.
//! Both are `Type=notify`: the daemon says it is ready once it
//! listens (the server) or has joined and opened its runtime (the agent).
//! The agent's unit has `Delegate=yes` (it manages its containers' cgroups)
//! and `KillMode=process` (stopping or restarting the agent never stops a
//! container: they outlive it by design). The agent keeps its containers'
//! cgroups inside the delegated subtree (`nodelet`'s `cgroups::settle_parent`),
//! itself in `supervisor/`; on systemd 254 and later the unit starts it there
//! (`DelegateSubgroup=supervisor`), which is what lets systemd start the next
//! agent while containers run. Older systemd attaches the new agent to the
//! unit's own cgroup, which the kernel refuses once that cgroup hands
//! controllers to running containers: `install` says so.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    Server,
    Agent,
}

impl Daemon {
    fn verb(self) -> &'static str {
        match self {
            Daemon::Server => "server",
            Daemon::Agent => "agent",
        }
    }

    pub fn unit_name(self) -> String {
        format!("pinion-{}.service", self.verb())
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    pub daemon: Daemon,
    /// Where the unit file goes.
    #[arg(long, value_name = "DIR", default_value = "/etc/systemd/system")]
    pub unit_dir: PathBuf,
    /// The pinion binary the unit runs [default: this one].
    #[arg(long = "bin", value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// Where a join token given as `--token` goes (agent): written there
    /// readable by root only, and the unit says `--token-file PATH`, so the
    /// token is never in the unit or in any process's command line.
    #[arg(long, value_name = "PATH", default_value = "/etc/pinion/join-token")]
    pub token_file: PathBuf,
    /// The daemon's flags, after `--` (e.g. `-- --data-dir /var/lib/pinion --listen 0.0.0.0:7443`).
    #[arg(last = true, value_name = "FLAGS")]
    pub flags: Vec<String>,
}

/// Takes `--token T` / `--token=T` out of `flags`: the token, and the flags
/// with `--token-file PATH` in its place.
fn take_token(flags: &[String], path: &Path) -> anyhow::Result<(Option<String>, Vec<String>)> {
    let mut out = Vec::with_capacity(flags.len());
    let mut token = None;
    let mut words = flags.iter();
    while let Some(f) = words.next() {
        let value = if f == "--token" {
            Some(words.next().context("--token needs a value")?.clone())
        } else {
            f.strip_prefix("--token=").map(str::to_string)
        };
        match value {
            Some(v) => {
                if token.replace(v).is_some() {
                    bail!("--token is given twice");
                }
                out.push("--token-file".to_string());
                out.push(path.to_str().context("the token file's path is not UTF-8")?.to_string());
            }
            None => out.push(f.clone()),
        }
    }
    Ok((token, out))
}

/// Whether the binary is cargo's build output (`…/target/release/pinion`).
fn in_a_build_folder(binary: &Path) -> bool {
    let parts: Vec<&std::ffi::OsStr> = binary.iter().collect();
    parts.windows(2).any(|w| w[0] == "target" && (w[1] == "release" || w[1] == "debug"))
}

/// Writes the unit; `check` parses `pinion VERB FLAGS...` as the binary would.
pub fn run(args: Args, check: impl Fn(&[String]) -> Result<(), String>) -> anyhow::Result<ExitCode> {
    let mut argv = vec!["pinion".to_string(), args.daemon.verb().to_string()];
    argv.extend(args.flags.iter().cloned());
    if let Err(why) = check(&argv) {
        bail!("pinion install {}: the flags would not start the {}: {why}", args.daemon.verb(), args.daemon.verb());
    }
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("finding this binary (give --bin PATH)")?,
    };
    if !binary.is_absolute() {
        bail!("--bin {}: systemd needs an absolute path", binary.display());
    }
    if !args.token_file.is_absolute() {
        bail!("--token-file {}: systemd needs an absolute path", args.token_file.display());
    }
    let systemd = systemd_version();
    let (token, flags) = take_token(&args.flags, &args.token_file)?;
    let text = unit(args.daemon, &binary, &flags, systemd)?;
    // The token first: a unit that names a file is never written without it.
    if let Some(token) = token {
        if let Some(dir) = args.token_file.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        write_file(&args.token_file, &format!("{token}\n"), 0o600)?;
        outln!("wrote {} (the join token, readable by root only)", args.token_file.display());
    }
    std::fs::create_dir_all(&args.unit_dir).with_context(|| format!("creating {}", args.unit_dir.display()))?;
    let path = args.unit_dir.join(args.daemon.unit_name());
    write_file(&path, &text, 0o644)?;
    outln!("wrote {}", path.display());
    outln!("start it: systemctl daemon-reload && systemctl enable --now {}", args.daemon.unit_name());
    if args.binary.is_none() && in_a_build_folder(&binary) {
        eprintln!(
            "note: the unit runs {}, in a build folder (a `cargo clean` or rebuild changes it under the service); \
             to install it: install -m 755 {} /usr/local/bin/pinion, then run this again with --bin /usr/local/bin/pinion",
            binary.display(),
            binary.display()
        );
    }
    if args.daemon == Daemon::Agent && !has_delegate_subgroup(systemd) {
        let found = systemd.map(|v| format!("systemd {v}")).unwrap_or_else(|| "no systemctl".into());
        eprintln!(
            "note: {found} here, DelegateSubgroup= needs 254: on cgroup v2, restarting the agent while \
             containers run fails (systemd cannot attach it to a cgroup that hands controllers down); \
             stopping and starting it with no containers works"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The first systemd with `DelegateSubgroup=`.
const DELEGATE_SUBGROUP_SINCE: u32 = 254;

fn has_delegate_subgroup(systemd: Option<u32>) -> bool {
    systemd.is_some_and(|v| v >= DELEGATE_SUBGROUP_SINCE)
}

/// The host's systemd version (`systemctl --version`: "systemd 252 (252.39-1~deb12u1)").
fn systemd_version() -> Option<u32> {
    let out = std::process::Command::new("systemctl").arg("--version").output().ok()?;
    parse_systemd_version(&String::from_utf8_lossy(&out.stdout))
}

fn parse_systemd_version(text: &str) -> Option<u32> {
    text.lines().next()?.strip_prefix("systemd ")?.split_whitespace().next()?.parse().ok()
}

/// Written whole or not at all (a temporary file renamed into place).
fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // A leftover from an interrupted run would keep its own mode.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))
}

/// One `ExecStart=` word, quoted as systemd reads it when it needs to be (a
/// leading `@`, `-`, `:`, `+` or `!` means something only on the program).
fn quote(word: &str, program: bool) -> anyhow::Result<String> {
    if word.chars().any(|c| c.is_control()) {
        bail!("{word:?}: a control character cannot go into a unit file");
    }
    let plain = !word.is_empty()
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-=:,@+".contains(c))
        && !(program && word.starts_with(['@', '-', ':', '+', '!']));
    if plain {
        return Ok(word.to_string());
    }
    // Inside double quotes systemd takes C escapes; `%` is a specifier and `$` a variable.
    let escaped = word.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%").replace('$', "$$");
    Ok(format!("\"{escaped}\""))
}

/// The unit file's text; `systemd` is the host's version (for `DelegateSubgroup=`).
pub fn unit(daemon: Daemon, binary: &Path, flags: &[String], systemd: Option<u32>) -> anyhow::Result<String> {
    let bin = binary.to_str().context("the binary's path is not UTF-8")?;
    let mut exec = vec![quote(bin, true)?, daemon.verb().to_string()];
    for f in flags {
        exec.push(quote(f, false)?);
    }
    let exec = exec.join(" ");
    let subgroup = if has_delegate_subgroup(systemd) {
        "# Started in supervisor/: the unit's cgroup hands controllers to the containers' cgroups.\n\
         DelegateSubgroup=supervisor\n"
    } else {
        ""
    };
    let (description, service) = match daemon {
        Daemon::Server => ("Pinion control plane (API, store, scheduler)", "Restart=on-failure\n".to_string()),
        Daemon::Agent => (
            "Pinion node agent",
            "# The agent manages its containers' cgroups itself, inside this unit's.\n\
             Delegate=yes\n"
                .to_string()
                + subgroup
                + "\
             # Stopping or restarting the agent never stops a container: they outlive it.\n\
             KillMode=process\n\
             Restart=always\n\
             TasksMax=infinity\n\
             OOMScoreAdjust=-500\n",
        ),
    };
    Ok(format!(
        "# Written by `pinion install {verb}`; run it again to change the flags.\n\
         [Unit]\n\
         Description={description}\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=notify\n\
         NotifyAccess=main\n\
         ExecStart={exec}\n\
         {service}\
         RestartSec=2s\n\
         TimeoutStartSec=5min\n\
         TimeoutStopSec=90s\n\
         LimitNOFILE=1048576\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        verb = daemon.verb(),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_as_systemd_reads_them() {
        let q = |w: &str| quote(w, false).unwrap();
        assert_eq!(quote("/usr/local/bin/pinion", true).unwrap(), "/usr/local/bin/pinion");
        assert_eq!(quote("-pinion", true).unwrap(), "\"-pinion\"");
        assert_eq!(q("--listen=0.0.0.0:7443"), "--listen=0.0.0.0:7443");
        assert_eq!(q("--label"), "--label");
        assert_eq!(q("a b"), "\"a b\"");
        assert_eq!(q("50%"), "\"50%%\"");
        assert_eq!(q("$HOME"), "\"$$HOME\"");
        assert_eq!(q("say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(q(""), "\"\"");
        assert!(quote("a\nb", false).is_err());
    }

    #[test]
    fn the_agent_starts_in_supervisor_where_systemd_can() {
        let versions = [
            ("systemd 252 (252.39-1~deb12u1)\n+PAM +AUDIT", Some(252)),
            ("systemd 255 (255.4-1ubuntu8.4)\n", Some(255)),
            ("", None),
            ("not systemd\n", None),
        ];
        for (text, want) in versions {
            assert_eq!(parse_systemd_version(text), want, "{text:?}");
        }
        let bin = Path::new("/usr/local/bin/pinion");
        let cases = [
            (Daemon::Agent, Some(254), true),
            (Daemon::Agent, Some(255), true),
            (Daemon::Agent, Some(252), false),
            (Daemon::Agent, None, false),
            (Daemon::Server, Some(255), false),
        ];
        for (daemon, systemd, subgroup) in cases {
            let text = unit(daemon, bin, &[], systemd).unwrap();
            assert_eq!(text.contains("\nDelegateSubgroup=supervisor\n"), subgroup, "{daemon:?} {systemd:?}:\n{text}");
            assert_eq!(text.contains("\nDelegate=yes\n"), daemon == Daemon::Agent, "{text}");
        }
    }

    /// The units kept in the repository are what `install` writes for their
    /// flags (on a systemd with `DelegateSubgroup=`), so they cannot drift.
    #[test]
    fn the_repositorys_units_are_what_install_writes() {
        let bin = Path::new("/usr/local/bin/pinion");
        let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let cases = [
            (
                Daemon::Server,
                "--data-dir /var/lib/pinion --listen 0.0.0.0:7443",
                include_str!("../../../dist/systemd/pinion-server.service"),
            ),
            (
                Daemon::Agent,
                "--server https://ctl.example:7443 --token-file /etc/pinion/join-token --data-dir /var/lib/pinion-agent --reserved-cpus 0",
                include_str!("../../../dist/systemd/pinion-agent.service"),
            ),
        ];
        for (daemon, flags, kept) in cases {
            assert_eq!(unit(daemon, bin, &words(flags), Some(DELEGATE_SUBGROUP_SINCE)).unwrap(), kept, "{daemon:?}");
        }
    }
}
