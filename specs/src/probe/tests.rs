use super::*;
use ProbeResult::{Failure as F, Success as S, Timeout as T};
use ProbeVerdict::*;

fn tcp() -> Probe {
    Probe { tcp_socket: Some(TcpSocketAction { port: 8080 }), ..Default::default() }
}

/// Runs `results` (each at its due time) and checks the verdict after each
/// and the next due time at the end.
fn check(
    what: &str,
    kind: ProbeKind,
    probe: Probe,
    results: &[ProbeResult],
    verdicts: &[ProbeVerdict],
    due: Option<u64>,
) {
    let mut t = ProbeTracker::new(kind, &probe);
    let mut got = Vec::new();
    for r in results {
        let at = t.next_due().unwrap_or(Duration::from_secs(9999));
        got.push(t.record(at, *r));
    }
    assert_eq!(got, verdicts, "{what}: verdicts");
    assert_eq!(t.next_due(), due.map(Duration::from_secs), "{what}: next due");
}

#[test]
fn tracker_table() {
    let p = |delay: u32, period: u32, fail: u32, ok: u32| Probe {
        initial_delay_seconds: Some(delay),
        period_seconds: Some(period),
        failure_threshold: Some(fail),
        success_threshold: Some(ok),
        ..tcp()
    };
    use ProbeKind::*;
    check("liveness, nothing run: due after the delay", Liveness, p(5, 10, 3, 1), &[], &[], Some(5));
    check("liveness, defaults: due at once, every 10 s", Liveness, tcp(), &[S, S], &[Alive, Alive], Some(20));
    check("liveness, two failures are not three", Liveness, tcp(), &[F, T], &[Alive, Alive], Some(20));
    check("liveness, three failures restart", Liveness, tcp(), &[F, T, F], &[Alive, Alive, Restart], None);
    check(
        "liveness, a success resets the count",
        Liveness,
        tcp(),
        &[F, F, S, F, F],
        &[Alive, Alive, Alive, Alive, Alive],
        Some(50),
    );
    check("liveness, threshold 1", Liveness, p(0, 2, 1, 1), &[S, F], &[Alive, Restart], None);
    check("liveness, done after restart", Liveness, p(0, 2, 1, 1), &[F, S], &[Restart, Restart], None);
    check("readiness starts not ready", Readiness, tcp(), &[F], &[NotReady], Some(10));
    check("readiness, one success", Readiness, tcp(), &[S], &[Ready], Some(10));
    check("readiness, success threshold 2", Readiness, p(3, 5, 3, 2), &[S, S], &[NotReady, Ready], Some(13));
    check(
        "readiness, ready holds through two failures, drops at three",
        Readiness,
        tcp(),
        &[S, F, F, F, S],
        &[Ready, Ready, Ready, NotReady, Ready],
        Some(50),
    );
    check(
        "readiness, interrupted successes do not count",
        Readiness,
        p(0, 1, 3, 3),
        &[S, S, F, S, S, S],
        &[NotReady, NotReady, NotReady, NotReady, NotReady, Ready],
        Some(6),
    );
    check("startup, waits", Startup, p(0, 5, 4, 1), &[F, F, F], &[Starting, Starting, Starting], Some(15));
    check("startup, started stops probing", Startup, p(0, 5, 4, 1), &[F, S], &[Starting, Started], None);
    check("startup, failed restarts", Startup, p(0, 5, 2, 1), &[F, T], &[Starting, Restart], None);
}

#[test]
fn a_late_run_moves_the_schedule_from_when_it_began() {
    let mut t = ProbeTracker::new(ProbeKind::Liveness, &tcp());
    t.record(Duration::from_secs(17), ProbeResult::Success);
    assert_eq!(t.next_due(), Some(Duration::from_secs(27)));
}

#[test]
fn validation_names_each_field() {
    type Edit = Box<dyn Fn(&mut Probe)>;
    /// (field after the probe's path, words the message must hold)
    type Want = Vec<(&'static str, &'static str)>;
    let at = "spec.containers[0].livenessProbe";
    let cases: Vec<(&str, ProbeKind, Edit, Want)> = vec![
        ("valid", ProbeKind::Liveness, Box::new(|_| {}), vec![]),
        (
            "no action",
            ProbeKind::Liveness,
            Box::new(|p| p.tcp_socket = None),
            vec![("", "set exactly one of exec, tcpSocket, httpGet or grpc")],
        ),
        (
            "two actions",
            ProbeKind::Liveness,
            Box::new(|p| p.grpc = Some(GrpcAction { port: 9, service: None })),
            vec![("", "not several")],
        ),
        (
            "period zero",
            ProbeKind::Liveness,
            Box::new(|p| p.period_seconds = Some(0)),
            vec![(".periodSeconds", "must be at least 1")],
        ),
        (
            "timeout zero",
            ProbeKind::Readiness,
            Box::new(|p| p.timeout_seconds = Some(0)),
            vec![(".timeoutSeconds", "must be at least 1")],
        ),
        (
            "delay too long",
            ProbeKind::Readiness,
            Box::new(|p| p.initial_delay_seconds = Some(MAX_WORKLOAD_SECONDS + 1)),
            vec![(".initialDelaySeconds", "at most")],
        ),
        (
            "failure threshold zero",
            ProbeKind::Readiness,
            Box::new(|p| p.failure_threshold = Some(0)),
            vec![(".failureThreshold", "at least 1")],
        ),
        (
            "threshold too high",
            ProbeKind::Readiness,
            Box::new(|p| p.success_threshold = Some(MAX_PROBE_THRESHOLD + 1)),
            vec![(".successThreshold", "at most")],
        ),
        ("readiness may want 2 successes", ProbeKind::Readiness, Box::new(|p| p.success_threshold = Some(2)), vec![]),
        (
            "liveness may not",
            ProbeKind::Liveness,
            Box::new(|p| p.success_threshold = Some(2)),
            vec![(".successThreshold", "must be 1 for a livenessProbe")],
        ),
        (
            "startup may not",
            ProbeKind::Startup,
            Box::new(|p| p.success_threshold = Some(3)),
            vec![(".successThreshold", "must be 1 for a startupProbe")],
        ),
        (
            "port zero",
            ProbeKind::Liveness,
            Box::new(|p| p.tcp_socket = Some(TcpSocketAction { port: 0 })),
            vec![(".tcpSocket.port", "1 to 65535")],
        ),
        (
            "empty command",
            ProbeKind::Liveness,
            Box::new(|p| {
                p.tcp_socket = None;
                p.exec = Some(ExecAction { command: vec![] })
            }),
            vec![(".exec.command", "must name a program")],
        ),
        (
            "long command",
            ProbeKind::Liveness,
            Box::new(|p| {
                p.tcp_socket = None;
                p.exec = Some(ExecAction { command: vec!["x".into(); MAX_PROBE_ARGS + 1] })
            }),
            vec![(".exec.command", "at most 256 entries")],
        ),
        (
            "big command",
            ProbeKind::Liveness,
            Box::new(|p| {
                p.tcp_socket = None;
                p.exec = Some(ExecAction { command: vec!["x".repeat(MAX_PROBE_COMMAND_BYTES + 1)] })
            }),
            vec![(".exec.command", "bytes altogether")],
        ),
        (
            "http path and header",
            ProbeKind::Readiness,
            Box::new(|p| {
                p.tcp_socket = None;
                p.http_get = Some(HttpGetAction {
                    path: Some("healthz".into()),
                    port: 80,
                    scheme: Some(Scheme::Https),
                    http_headers: vec![
                        HttpHeader { name: "X Bad".into(), value: "v".into() },
                        HttpHeader { name: "X-Ok".into(), value: "a\r\nInjected: 1".into() },
                    ],
                })
            }),
            vec![
                (".httpGet.path", "must start with /"),
                (".httpGet.httpHeaders[0].name", "token"),
                (".httpGet.httpHeaders[1].value", "control characters"),
            ],
        ),
        (
            "too many headers",
            ProbeKind::Readiness,
            Box::new(|p| {
                p.tcp_socket = None;
                let h = HttpHeader { name: "X".into(), value: "v".into() };
                p.http_get = Some(HttpGetAction {
                    path: None,
                    port: 80,
                    scheme: None,
                    http_headers: vec![h; MAX_PROBE_HEADERS + 1],
                })
            }),
            vec![(".httpGet.httpHeaders", "at most 32 entries")],
        ),
        (
            "grpc service",
            ProbeKind::Readiness,
            Box::new(|p| {
                p.tcp_socket = None;
                p.grpc = Some(GrpcAction { port: 50051, service: Some("a b".into()) })
            }),
            vec![(".grpc.service", "printable")],
        ),
    ];
    for (what, kind, edit, want) in cases {
        let mut p = tcp();
        edit(&mut p);
        let got = validate(kind, &p, at);
        let fields: Vec<String> = got.iter().map(|e| e.field.clone()).collect();
        let want_fields: Vec<String> = want.iter().map(|(f, _)| format!("{at}{f}")).collect();
        assert_eq!(fields, want_fields, "{what}: {got:?}");
        for (e, (_, words)) in got.iter().zip(&want) {
            assert!(e.message.contains(words), "{what}: {:?} should say {words:?}", e.message);
        }
    }
}

#[test]
fn reads_as_kubernetes_writes_it() {
    let yaml = r#"
httpGet: {path: /healthz, port: 8080, scheme: HTTPS, httpHeaders: [{name: X-Probe, value: "1"}]}
initialDelaySeconds: 2
periodSeconds: 5
"#;
    let p: Probe = serde_yaml_ng::from_str(yaml).expect("a probe");
    assert!(matches!(p.action(), Some(ProbeAction::HttpGet(h)) if h.scheme == Some(Scheme::Https)));
    assert_eq!((p.period(), p.timeout(), p.failure_threshold()), (Duration::from_secs(5), Duration::from_secs(1), 3));
    assert!(serde_yaml_ng::from_str::<Probe>("tcpSocket: {port: 1}\nperiod: 3").is_err(), "unknown field");
    assert!(serde_yaml_ng::from_str::<Probe>("tcpSocket: {port: 70000}").is_err(), "port over 65535");
    let back: Probe = serde_json::from_str(&serde_json::to_string(&p).expect("json")).expect("reads back");
    assert_eq!(back, p);
}
