//! Flags and helpers shared by several verbs: global options, output formats,
//! where a topology comes from.

use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;
use specs::NodeTopology;

#[derive(clap::Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Client credentials file (default: $XDG_CONFIG_HOME/pinion/config, else ~/.config/pinion/config).
    #[arg(long, global = true, env = "PINION_CONFIG")]
    pub config: Option<PathBuf>,
    /// A server of the cluster, `https://HOST:PORT` (repeatable, or a comma
    /// list; tried in this order, moving on when one cannot be reached).
    /// Client verbs: instead of the credentials file's list. `agent`: the
    /// servers to join and follow.
    #[arg(long = "server", global = true, value_name = "URL", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `nodelet=debug`.
    #[arg(long, global = true, env = "PINION_LOG", default_value = DEFAULT_LOG)]
    pub log: String,
    /// Log lines as text, or as one JSON object each (for a log collector).
    #[arg(long, global = true, env = "PINION_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// How often an idle stream carries a heartbeat, in milliseconds (the
    /// server's and agent's send period, every reader's bound is three of
    /// them); client and server must agree. For tests of dead connections.
    #[arg(long, global = true, env = "PINION_STREAM_HEARTBEAT_MS", value_name = "MS", hide = true)]
    pub stream_heartbeat_ms: Option<u64>,
}

impl GlobalArgs {
    pub fn liveness(&self) -> specs::api::Liveness {
        match self.stream_heartbeat_ms {
            Some(ms) => specs::api::Liveness { heartbeat: std::time::Duration::from_millis(ms.max(1)) },
            None => specs::api::Liveness::default(),
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log filter when neither `--log` nor `PINION_LOG` says one.
pub const DEFAULT_LOG: &str = "warn,libcgroups=error,libcontainer=error";

pub fn init_tracing(log: &str, format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        LogFormat::Json => fmt.json().flatten_event(true).try_init(),
    };
}

/// A daemon's note for its operator: a plain stderr line, or with
/// `--log-format json` an info event, so a log collector reads only JSON.
pub fn daemon_note(g: &GlobalArgs, note: &str) {
    match g.log_format {
        LogFormat::Text => eprintln!("{note}"),
        LogFormat::Json => tracing::info!(target: "pinion", "{note}"),
    }
}

/// Tells systemd the daemon is ready (`Type=notify`); nothing outside systemd
/// (no `NOTIFY_SOCKET`). A failure is logged: the daemon runs on, and systemd
/// times the start out by itself.
pub fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "cannot tell systemd the daemon is ready");
    }
}

/// Tells systemd the daemon is stopping.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    Text,
}

/// Where a machine's topology comes from; at most one of the four (clap refuses
/// two, naming both), default the host's own `/sys`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TopologyArgs {
    /// Read the topology from a sysfs tree under DIR (e.g. an extracted fixture).
    #[arg(long, value_name = "DIR", group = "topology_source")]
    pub sysfs_root: Option<PathBuf>,
    /// Read the topology from the JSON that `pinion discover -o json` prints.
    #[arg(long, value_name = "FILE", group = "topology_source")]
    pub topology: Option<PathBuf>,
    /// A synthetic machine in hwloc's words, e.g. "pack:2 numa:1 core:28 pu:2".
    #[arg(long, value_name = "DESC", group = "topology_source")]
    pub synthetic: Option<String>,
    /// Read the topology from hwloc XML (`lstopo --of xml`, 1.x or 2.x).
    #[arg(long, value_name = "FILE", group = "topology_source")]
    pub hwloc_xml: Option<PathBuf>,
}

impl TopologyArgs {
    /// The sysfs root the topology is read from, when it is one (the host's
    /// `/` by default): the agent reads its CPUs' online state there again.
    pub fn sysfs_source(&self) -> Option<PathBuf> {
        if self.synthetic.is_some() || self.topology.is_some() || self.hwloc_xml.is_some() {
            return None;
        }
        Some(self.sysfs_root.clone().unwrap_or_else(|| PathBuf::from("/")))
    }

    pub fn load(&self) -> anyhow::Result<NodeTopology> {
        if let Some(desc) = &self.synthetic {
            return Ok(specs::topology::synthetic::parse(desc)?);
        }
        if let Some(path) = &self.hwloc_xml {
            return Ok(nodelet::hwloc::read(path)?);
        }
        if let Some(path) = &self.topology {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            return serde_json::from_str(&text).with_context(|| format!("{}: not a topology document", path.display()));
        }
        let root = self.sysfs_source().unwrap_or_else(|| PathBuf::from("/"));
        Ok(nodelet::discovery::discover(&root)?)
    }
}

/// A clap value parser for the kebab-case names the manifests use
/// (`single-numa-node`, `most-allocated`, ...).
/// A duration as operators write it: `90s`, `30m`, `24h`, `30d` (a bare
/// number is seconds); `0` is zero. At most a year.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?}: want a number and s, m, h or d (`24h`)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    let secs = n.checked_mul(scale).filter(|t| *t <= specs::limits::MAX_TTL_SECONDS);
    secs.map(std::time::Duration::from_secs).ok_or_else(|| format!("{s:?}: at most a year (365d)"))
}

pub fn parse_kebab<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|e| e.to_string())
}

/// Reopening a stream that broke (`logs -f`, `get -w`): a growing pause
/// between tries, and an end to trying. A stream that lived a while before
/// it broke starts the count over, so a follow that runs for days on a
/// flaky path is not given up on, while one that dies at once every time is.
pub struct Resumes {
    tries: u32,
    opened: std::time::Instant,
}

impl Resumes {
    /// Tries before giving up.
    const MAX: u32 = 8;
    /// A stream open this long before it broke was healthy.
    const HEALTHY: std::time::Duration = std::time::Duration::from_secs(30);

    pub fn new() -> Resumes {
        Resumes { tries: 0, opened: std::time::Instant::now() }
    }

    /// The stream is open again.
    pub fn opened(&mut self) {
        self.opened = std::time::Instant::now();
    }

    /// After a break or a failed reopen: the pause before the next try, or
    /// `None` when it is time to give up.
    pub fn pause(&mut self) -> Option<std::time::Duration> {
        if self.opened.elapsed() >= Self::HEALTHY {
            self.tries = 0;
        }
        self.tries += 1;
        (self.tries < Self::MAX).then(|| std::time::Duration::from_millis(100 << self.tries.min(6)))
    }

    pub fn tries(&self) -> u32 {
        self.tries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_grow_their_pause_give_up_and_start_over_after_a_healthy_stream() {
        let mut r = Resumes::new();
        let pauses: Vec<u64> = std::iter::from_fn(|| r.pause()).map(|d| d.as_millis() as u64).collect();
        assert_eq!(pauses, [200, 400, 800, 1600, 3200, 6400, 6400]);
        assert_eq!(r.pause(), None, "still given up");
        // A stream that stayed open a while: the count starts over.
        r.opened = std::time::Instant::now() - Resumes::HEALTHY;
        assert_eq!(r.pause(), Some(std::time::Duration::from_millis(200)));
    }
}
