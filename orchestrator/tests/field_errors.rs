//! What Schemathesis found against the real server (issue 12), one
//! regression test each: a 405 carries `Allow`; every 400 and every 422
//! `Invalid` names the field at fault in `details` (body path, query or
//! path parameter, `(body)`); a log request for a pod not on a node yet is
//! a conflict, not a bad request.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request};
use orchestrator::testing::server::TestServer;
use specs::api::ApiError;

/// The status and the error body of a request to `s` expected to be refused.
async fn refused(s: &TestServer, method: Method, path: &str, body: Option<&str>) -> (u16, ApiError) {
    let payload = body.map(|b| ("application/json", Bytes::from(b.to_string())));
    let (code, bytes) = s.admin.request(method.clone(), path, payload).await.expect("request");
    // A reply that is no ApiError (an accepted request) is reported with the others.
    let e = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
        code,
        reason: "(accepted)".into(),
        message: String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned(),
        details: Vec::new(),
    });
    (code, e)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_names_its_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.controller.heartbeat_grace = Duration::from_secs(60)).await;
    let two = r#"{"apiVersion":"pinion.io/v1","kind":"Pod","metadata":{"name":"two"},
        "spec":{"containers":[{"name":"a","rootfs":"host"},{"name":"b","rootfs":"host"}]}}"#;
    let (code, _) = s
        .admin
        .request(Method::POST, "/api/v1/pods", Some(("application/json", Bytes::from(two))))
        .await
        .expect("create");
    assert_eq!(code, 201);
    let table: &[(Method, &str, Option<&str>, u16, &str)] = &[
        // Path and query parameters.
        (Method::GET, "/api/v1/pods/UPPER", None, 400, "name"),
        (Method::POST, "/api/v1/nodes/a_b/heartbeat", None, 400, "name"),
        (Method::GET, "/api/v1/pods?watch=maybe", None, 400, "watch"),
        (Method::GET, "/api/v1/pods?allowWatchBookmarks=null", None, 400, "allowWatchBookmarks"),
        (Method::GET, "/api/v1/pods?watch=true&resourceVersion=x", None, 400, "resourceVersion"),
        (Method::GET, "/api/v1/pods?labelSelector=a%3D%3D%2C", None, 400, "labelSelector"),
        (Method::GET, "/api/v1/pods?resourceVersion=18446744073709551616", None, 400, "resourceVersion"),
        (Method::GET, "/api/v1/pods?resourceVersion=", None, 400, "resourceVersion"),
        (Method::GET, "/api/v1/pods?k=%zz", None, 400, "k"),
        (Method::GET, "/api/v1/nodes?labelSelector=%2C", None, 400, "labelSelector"),
        (Method::GET, "/api/v1/events", None, 400, "name"),
        (Method::GET, "/api/v1/events?kind=Deployment&name=a", None, 400, "kind"),
        (Method::GET, "/api/v1/pods/two/log?follow=maybe", None, 400, "follow"),
        (Method::GET, "/api/v1/pods/two/log", None, 400, "container"),
        (Method::GET, "/api/v1/pods/two/log?container=c", None, 400, "container"),
        (Method::GET, "/api/v1/pods/two/attach?offset=-1", None, 400, "offset"),
        // JSON bodies: the path inside the body, a missing field by its name.
        (Method::PUT, "/api/v1/pods/two/status", Some(""), 400, "(body)"),
        (Method::PUT, "/api/v1/pods/two/status", Some(r#"{"phase":"Gone"}"#), 400, "phase"),
        (Method::PUT, "/api/v1/pods/two/status", Some(r#"{"phase":"Running"} x"#), 400, "(body)"),
        (Method::PUT, "/api/v1/nodes/n/status", Some(r#"{"pods":{"two":{"phase":1}}}"#), 400, "pods.two.phase"),
        (Method::PUT, "/api/v1/nodes/n/status", Some(r#"{"nodeName":"m"}"#), 400, "nodeName"),
        (Method::POST, "/api/v1/pods/two/rejection", Some(r#"{"reason":"R"}"#), 400, "message"),
        (Method::POST, "/api/v1/join", Some("{}"), 400, "nodeName"),
        (Method::POST, "/api/v1/join", Some("[]"), 400, "(body)"),
        (Method::POST, "/api/v1/join", Some(r#"{"nodeName":"a","attempt":7}"#), 400, "attempt"),
        // 422 Invalid: the same for a node and a pod.
        (
            Method::POST,
            "/api/v1/nodes",
            Some(
                r#"{"apiVersion":"pinion.io/v1","kind":"Node","metadata":{"name":"n"},"spec":{"topology":{"numaNodes":[]}}}"#,
            ),
            422,
            "spec.topology.cpus",
        ),
        (
            Method::POST,
            "/api/v1/nodes",
            Some(
                r#"{"apiVersion":"pinion.io/v1","kind":"Node","metadata":{"name":"n","annotations":{"":"x"}},
                "spec":{"topology":{"cpus":[{"id":0,"core":0,"socket":0,"numa":0}],"numaNodes":[{"id":0,"cpus":[0],"memoryBytes":1024}]}}}"#,
            ),
            422,
            "metadata.annotations[]",
        ),
        (Method::POST, "/api/v1/pods", Some("{}"), 422, "apiVersion"),
        (Method::POST, "/api/v1/pods", Some("[null, null]"), 422, "(body)"),
        (
            Method::POST,
            "/api/v1/pods",
            Some(r#"{"apiVersion":"pinion.io/v1","kind":"Pod","metadata":{"name":"x"},"spec":{}}"#),
            422,
            "spec.containers",
        ),
        (Method::POST, "/api/v1/jobs", Some("{}"), 422, "apiVersion"),
        (Method::POST, "/api/v1/jobs", Some("[1]"), 422, "(body)"),
        (
            Method::POST,
            "/api/v1/jobs",
            Some(
                r#"{"apiVersion":"pinion.io/v1","kind":"Job","metadata":{"name":"j"},"spec":{"parallelism":2,"gang":{"placment":"pack"},"template":{"spec":{"containers":[]}}}}"#,
            ),
            422,
            "spec.gang.placment",
        ),
        (
            Method::POST,
            "/api/v1/jobs",
            Some(
                r#"{"apiVersion":"pinion.io/v1","kind":"Job","metadata":{"name":"j"},"spec":{"parallelism":0,"template":{"spec":{"restartPolicy":"Never","containers":[]}}}}"#,
            ),
            422,
            "spec.parallelism",
        ),
        (
            Method::POST,
            "/api/v1/jobs",
            Some(
                r#"{"apiVersion":"pinion.io/v1","kind":"Job","metadata":{"name":"j"},"spec":{"parallelism":1,"template":{"spec":{"restartPolicy":"Never","containers":[]}}}}"#,
            ),
            422,
            "spec.template.spec.containers",
        ),
    ];
    let mut wrong = Vec::new();
    for (method, path, body, code, field) in table {
        let (got, e) = refused(&s, method.clone(), path, *body).await;
        let fields: Vec<&str> = e.details.iter().map(|d| d.field.as_str()).collect();
        if got != *code || !fields.contains(field) || fields.iter().any(|f| f.is_empty()) {
            wrong.push(format!(
                "{method} {path} {body:?}: want {code} naming {field:?}, got {got} naming {fields:?} ({e})"
            ));
        }
    }
    // The pod's state is at fault, not a field: not on a node yet, or on a
    // node that registered no endpoint (a 4xx: no upstream failed).
    let (got, e) = refused(&s, Method::GET, "/api/v1/pods/two/log?container=a", None).await;
    if got != 409 {
        wrong.push(format!("log of a pod on no node: want 409, got {got} ({e})"));
    }
    let node = r#"{"apiVersion":"pinion.io/v1","kind":"Node","metadata":{"name":"quiet"},
        "spec":{"topology":{"cpus":[{"id":0,"core":0,"socket":0,"numa":0}],"numaNodes":[{"id":0,"cpus":[0],"memoryBytes":1073741824}]}}}"#;
    let bound = r#"{"apiVersion":"pinion.io/v1","kind":"Pod","metadata":{"name":"bound"},
        "spec":{"nodeName":"quiet","containers":[{"name":"a","rootfs":"host"}]}}"#;
    for (path, body) in [("/api/v1/nodes", node), ("/api/v1/pods", bound)] {
        let (code, _) =
            s.admin.request(Method::POST, path, Some(("application/json", Bytes::from(body)))).await.expect("create");
        assert_eq!(code, 201, "{path}");
    }
    let (got, e) = refused(&s, Method::GET, "/api/v1/pods/bound/log", None).await;
    if got != 409 {
        wrong.push(format!("log of a pod on a node without an endpoint: want 409, got {got} ({e})"));
    }
    assert!(wrong.is_empty(), "{} of {} wrong:\n{}", wrong.len(), table.len() + 1, wrong.join("\n"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_method_lists_the_allowed_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.controller.heartbeat_grace = Duration::from_secs(60)).await;
    for (method, path, allow) in [
        (Method::TRACE, "/healthz", "GET"),
        (Method::PATCH, "/api/v1/pods/web", "GET, DELETE"),
        (Method::PUT, "/api/v1/pods", "GET, POST"),
    ] {
        let uri = format!("https://{}{path}", s.admin.authority());
        let req = Request::builder().method(method.clone()).uri(uri).body(Full::new(Bytes::new())).expect("request");
        let resp = s.admin.send(req).await.expect("send");
        assert_eq!(resp.status().as_u16(), 405, "{method} {path}");
        let got = resp.headers().get(hyper::header::ALLOW).and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(got.as_deref(), Some(allow), "{method} {path}");
    }
    s.stop().await;
}
