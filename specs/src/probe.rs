//! Container probes (`livenessProbe`, `readinessProbe`, `startupProbe`), as
//! Kubernetes has them: their shape, their checks (`validate`) and the pure
//! tracker that turns a container's probe results into a verdict
//! (`ProbeTracker`). Running a probe is the nodelet's; this module never
//! touches a socket or a clock: times are offsets from the container's start.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_PROBE_ARGS, MAX_PROBE_COMMAND_BYTES, MAX_PROBE_HEADERS, MAX_PROBE_HEADER_LEN, MAX_PROBE_PATH_LEN,
    MAX_PROBE_THRESHOLD, MAX_WORKLOAD_SECONDS,
};
use crate::validate::FieldError;

/// Kubernetes' defaults, used when a field is unset.
pub const DEFAULT_PERIOD_SECONDS: u32 = 10;
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;

/// One probe: exactly one of `exec`, `tcpSocket`, `httpGet`, `grpc`, and its
/// timing. Unset timings read as Kubernetes' defaults (the accessors), and
/// stay unset on the wire so a manifest reads back as it was written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<u32>,
}

/// A command run inside the container's namespaces (on the node's reserved
/// CPUs, never the pod's exclusive ones); exit status 0 is success.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecAction {
    pub command: Vec<String>,
}

/// A TCP connect to the pod's address; an accepted connection is success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpSocketAction {
    pub port: u16,
}

/// An HTTP GET; a status from 200 to 399 is success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGetAction {
    /// `/` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<Scheme>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<HttpHeader>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Scheme {
    #[default]
    Http,
    /// TLS without verifying the certificate, as the kubelet does.
    Https,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

/// A gRPC health check (`grpc.health.v1.Health/Check`); `SERVING` is success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcAction {
    pub port: u16,
    /// The service name sent in the request; empty (the server's overall
    /// health) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// What a probe does, once validation made sure there is exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAction<'a> {
    Exec(&'a ExecAction),
    TcpSocket(&'a TcpSocketAction),
    HttpGet(&'a HttpGetAction),
    Grpc(&'a GrpcAction),
}

/// Which of a container's probes, for rules that differ between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    /// The field's name in a container.
    pub fn field(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "livenessProbe",
            ProbeKind::Readiness => "readinessProbe",
            ProbeKind::Startup => "startupProbe",
        }
    }
}

impl Probe {
    /// The one action, or `None` when there are none or several (which
    /// `validate` refuses).
    pub fn action(&self) -> Option<ProbeAction<'_>> {
        let all = [
            self.exec.as_ref().map(ProbeAction::Exec),
            self.tcp_socket.as_ref().map(ProbeAction::TcpSocket),
            self.http_get.as_ref().map(ProbeAction::HttpGet),
            self.grpc.as_ref().map(ProbeAction::Grpc),
        ];
        let mut set = all.into_iter().flatten();
        match (set.next(), set.next()) {
            (Some(a), None) => Some(a),
            _ => None,
        }
    }

    pub fn initial_delay(&self) -> Duration {
        secs(self.initial_delay_seconds.unwrap_or(0))
    }

    pub fn period(&self) -> Duration {
        secs(self.period_seconds.unwrap_or(DEFAULT_PERIOD_SECONDS).max(1))
    }

    pub fn timeout(&self) -> Duration {
        secs(self.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS).max(1))
    }

    pub fn failure_threshold(&self) -> u32 {
        self.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD).max(1)
    }

    pub fn success_threshold(&self) -> u32 {
        self.success_threshold.unwrap_or(DEFAULT_SUCCESS_THRESHOLD).max(1)
    }
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

/// Every problem of one probe, at `at` (`spec.containers[0].livenessProbe`).
pub fn validate(kind: ProbeKind, probe: &Probe, at: &str) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: String, message: String| e.push(FieldError { field, message });
    let set = [probe.exec.is_some(), probe.tcp_socket.is_some(), probe.http_get.is_some(), probe.grpc.is_some()];
    match set.iter().filter(|s| **s).count() {
        1 => {}
        0 => push(at.into(), "set exactly one of exec, tcpSocket, httpGet or grpc".into()),
        _ => push(at.into(), "set exactly one of exec, tcpSocket, httpGet or grpc, not several".into()),
    }
    for (field, value, least) in [
        ("initialDelaySeconds", probe.initial_delay_seconds, 0),
        ("periodSeconds", probe.period_seconds, 1),
        ("timeoutSeconds", probe.timeout_seconds, 1),
    ] {
        match value {
            Some(v) if v < least => push(format!("{at}.{field}"), format!("must be at least {least}")),
            Some(v) if v > MAX_WORKLOAD_SECONDS => {
                push(format!("{at}.{field}"), format!("must be at most {MAX_WORKLOAD_SECONDS} (a day), got {v}"))
            }
            _ => {}
        }
    }
    for (field, value) in [("failureThreshold", probe.failure_threshold), ("successThreshold", probe.success_threshold)]
    {
        match value {
            Some(0) => push(format!("{at}.{field}"), "must be at least 1".into()),
            Some(v) if v > MAX_PROBE_THRESHOLD => {
                push(format!("{at}.{field}"), format!("must be at most {MAX_PROBE_THRESHOLD}, got {v}"))
            }
            _ => {}
        }
    }
    // A liveness or startup probe acts on its first success (the container
    // is alive, or has started): a higher threshold would mean nothing.
    if kind != ProbeKind::Readiness && probe.success_threshold.is_some_and(|s| s != 1) {
        push(format!("{at}.successThreshold"), format!("must be 1 for a {}", kind.field()));
    }
    if let Some(x) = &probe.exec {
        let f = format!("{at}.exec.command");
        let bytes: usize = x.command.iter().map(String::len).sum();
        if x.command.is_empty() || x.command[0].is_empty() {
            push(f, "must name a program".into());
        } else if x.command.len() > MAX_PROBE_ARGS {
            push(f, format!("at most {MAX_PROBE_ARGS} entries, got {}", x.command.len()));
        } else if bytes > MAX_PROBE_COMMAND_BYTES {
            push(f, format!("at most {MAX_PROBE_COMMAND_BYTES} bytes altogether, got {bytes}"));
        } else if let Some(j) = x.command.iter().position(|s| s.contains('\0')) {
            push(format!("{f}[{j}]"), "must not contain NUL".into());
        }
    }
    let port_ok = |p: u16| p != 0;
    if let Some(t) = &probe.tcp_socket {
        if !port_ok(t.port) {
            push(format!("{at}.tcpSocket.port"), "must be 1 to 65535".into());
        }
    }
    if let Some(h) = &probe.http_get {
        if !port_ok(h.port) {
            push(format!("{at}.httpGet.port"), "must be 1 to 65535".into());
        }
        if let Some(p) = &h.path {
            if !p.starts_with('/') || p.len() > MAX_PROBE_PATH_LEN || !p.bytes().all(|b| b.is_ascii_graphic()) {
                push(
                    format!("{at}.httpGet.path"),
                    format!("must start with / and be at most {MAX_PROBE_PATH_LEN} printable ASCII bytes, no spaces"),
                );
            }
        }
        if h.http_headers.len() > MAX_PROBE_HEADERS {
            push(
                format!("{at}.httpGet.httpHeaders"),
                format!("at most {MAX_PROBE_HEADERS} entries, got {}", h.http_headers.len()),
            );
        } else {
            for (j, hd) in h.http_headers.iter().enumerate() {
                if !is_header_name(&hd.name) {
                    push(
                        format!("{at}.httpGet.httpHeaders[{j}].name"),
                        format!("must be 1 to {MAX_PROBE_HEADER_LEN} HTTP token characters"),
                    );
                }
                // CR or LF in a value would let it add headers of its own.
                if hd.value.len() > MAX_PROBE_HEADER_LEN || hd.value.bytes().any(|b| b.is_ascii_control() && b != b'\t')
                {
                    push(
                        format!("{at}.httpGet.httpHeaders[{j}].value"),
                        format!("must be at most {MAX_PROBE_HEADER_LEN} bytes without control characters"),
                    );
                }
            }
        }
    }
    if let Some(g) = &probe.grpc {
        if !port_ok(g.port) {
            push(format!("{at}.grpc.port"), "must be 1 to 65535".into());
        }
        if g.service
            .as_ref()
            .is_some_and(|s| s.len() > MAX_PROBE_HEADER_LEN || !s.bytes().all(|b| b.is_ascii_graphic()))
        {
            push(format!("{at}.grpc.service"), format!("must be at most {MAX_PROBE_HEADER_LEN} printable ASCII bytes"));
        }
    }
    e
}

/// RFC 9110's `token`: what a header name may hold.
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PROBE_HEADER_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// One run's outcome; a run past `timeoutSeconds` counts as a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure,
    Timeout,
}

/// What a probe's results so far mean for the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Liveness: not (yet) `failureThreshold` failures in a row.
    Alive,
    /// Liveness or startup: `failureThreshold` failures in a row; restart the
    /// container under the pod's restart policy. The tracker is done; a new
    /// container gets a new one.
    Restart,
    /// Readiness: the pod may take traffic (`successThreshold` successes in a
    /// row, and no `failureThreshold` failures since).
    Ready,
    /// Readiness: not ready, which is also where a container starts.
    NotReady,
    /// Startup: no success yet; liveness and readiness wait.
    Starting,
    /// Startup: one success; the probe stops, liveness and readiness begin.
    Started,
}

impl ProbeVerdict {
    /// No more runs are due.
    pub fn is_final(self) -> bool {
        matches!(self, ProbeVerdict::Restart | ProbeVerdict::Started)
    }
}

/// One probe of one container: the consecutive counts Kubernetes keeps, and
/// when the next run is due. Times are offsets from when the container (or,
/// for liveness and readiness behind a startup probe, the startup probe's
/// success) began, so the tracker needs no clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTracker {
    kind: ProbeKind,
    initial_delay: Duration,
    period: Duration,
    failure_threshold: u32,
    success_threshold: u32,
    last_run: Option<Duration>,
    successes: u32,
    failures: u32,
    verdict: ProbeVerdict,
}

impl ProbeTracker {
    pub fn new(kind: ProbeKind, probe: &Probe) -> ProbeTracker {
        let verdict = match kind {
            ProbeKind::Liveness => ProbeVerdict::Alive,
            ProbeKind::Readiness => ProbeVerdict::NotReady,
            ProbeKind::Startup => ProbeVerdict::Starting,
        };
        ProbeTracker {
            kind,
            initial_delay: probe.initial_delay(),
            period: probe.period(),
            failure_threshold: probe.failure_threshold(),
            success_threshold: probe.success_threshold(),
            last_run: None,
            successes: 0,
            failures: 0,
            verdict,
        }
    }

    pub fn verdict(&self) -> ProbeVerdict {
        self.verdict
    }

    /// When the next run starts: `initialDelaySeconds` after the start, then
    /// one period after the previous run began (as the kubelet's ticker, so a
    /// slow probe does not drift the schedule). `None` once the verdict is final.
    pub fn next_due(&self) -> Option<Duration> {
        if self.verdict.is_final() {
            return None;
        }
        Some(match self.last_run {
            None => self.initial_delay,
            Some(t) => t + self.period,
        })
    }

    /// Takes the result of the run that began at `at` and returns the verdict.
    /// A result after the verdict is final changes nothing.
    pub fn record(&mut self, at: Duration, result: ProbeResult) -> ProbeVerdict {
        if self.verdict.is_final() {
            return self.verdict;
        }
        self.last_run = Some(at);
        if result == ProbeResult::Success {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        }
        let (ok, bad) = (self.successes >= self.success_threshold, self.failures >= self.failure_threshold);
        self.verdict = match self.kind {
            ProbeKind::Liveness if bad => ProbeVerdict::Restart,
            ProbeKind::Startup if bad => ProbeVerdict::Restart,
            ProbeKind::Startup if ok => ProbeVerdict::Started,
            ProbeKind::Readiness if ok => ProbeVerdict::Ready,
            ProbeKind::Readiness if bad => ProbeVerdict::NotReady,
            // Between thresholds a verdict holds: a ready pod stays ready
            // through fewer than `failureThreshold` failures.
            _ => self.verdict,
        };
        self.verdict
    }
}

#[cfg(test)]
mod tests;
