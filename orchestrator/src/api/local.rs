//! The local listener (`pinion server --local-listen 127.0.0.1:PORT`): plain
//! HTTP on a loopback address, for a browser on this machine (or elsewhere,
//! through `ssh -L`) and a local scraper, which have no client certificate.
//! Read-only: the web view's static files under `/ui/` (`/` redirects there)
//! and the GET routes named in `LOCAL_ROUTES`, served by the same parser and
//! handlers as the HTTPS API. Any other path is 404, another method 405.
//!
//! Loopback alone does not keep other web sites out: a page elsewhere can
//! point a name it controls at 127.0.0.1 (DNS rebinding) and read the answers
//! as its own. So a request must name a loopback host (`localhost`,
//! `127.0.0.1`, `[::1]`, any port) in its `Host` header, or it is refused.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HOST, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::apply::ApiState;
use super::error::error;
use super::routes::{Route, RouteId};
use super::{error_response, handle, ApiConfig, Body};

/// The API routes the local listener serves (their GET method only): what the
/// web view reads. Every entry is a read; a route added here is readable by
/// every user of this machine.
pub const LOCAL_ROUTES: &[RouteId] =
    &[RouteId::Health, RouteId::Version, RouteId::Metrics, RouteId::ListPods, RouteId::ListNodes, RouteId::ListEvents];

/// The route table of the local listener: `LOCAL_ROUTES`, GET only.
pub fn routes() -> Vec<Route> {
    super::routes::routes().into_iter().filter(|r| r.method == Method::GET && LOCAL_ROUTES.contains(&r.id)).collect()
}

/// The web view, embedded in the binary: no build step, nothing loaded from
/// elsewhere.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset { path: "/ui/", content_type: "text/html; charset=utf-8", body: include_bytes!("../../ui/index.html") },
    Asset {
        path: "/ui/index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../ui/index.html"),
    },
    Asset {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../ui/app.js"),
    },
    Asset {
        path: "/ui/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../ui/style.css"),
    },
];

/// The page may load and call only its own origin (no inline script, no
/// other site), whatever a pod's name holds.
const CSP: &str =
    "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; base-uri 'none'";

#[derive(Debug, thiserror::Error)]
pub enum LocalListenError {
    #[error("--local-listen {addr}: not an IP address and port (e.g. 127.0.0.1:7480)")]
    NotAnAddress { addr: String },
    #[error("--local-listen {addr}: {ip} is not a loopback address; the local listener is plain HTTP without authentication, so it listens on loopback only (reach it from elsewhere with `ssh -L`)")]
    NotLoopback { addr: String, ip: IpAddr },
    #[error("--local-listen {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
}

/// Checks that `addr` is a loopback `IP:PORT`, then binds it.
pub async fn bind(addr: &str) -> Result<TcpListener, LocalListenError> {
    let parsed: SocketAddr = addr.parse().map_err(|_| LocalListenError::NotAnAddress { addr: addr.to_string() })?;
    if !parsed.ip().is_loopback() {
        return Err(LocalListenError::NotLoopback { addr: addr.to_string(), ip: parsed.ip() });
    }
    TcpListener::bind(parsed).await.map_err(|source| LocalListenError::Bind { addr: addr.to_string(), source })
}

/// Serves the local listener until `shutdown` turns true, then drains it.
pub async fn serve(listener: TcpListener, state: Arc<ApiState>, config: ApiConfig, shutdown: watch::Receiver<bool>) {
    super::accept_loop(listener, super::Listener::Local, routes(), state, config, shutdown).await;
}

/// One request on the local listener: the Host check, then a static file,
/// the redirect to the page, or an API route of `table`.
pub(super) async fn respond(
    req: Request<Incoming>,
    caller: &super::Caller,
    state: Arc<ApiState>,
    table: &[Route],
    config: ApiConfig,
    shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    if !loopback_host(req.headers().get(HOST)) {
        return error_response(&error(
            403,
            "Forbidden",
            "the local listener answers only requests for a loopback host (localhost, 127.0.0.1, [::1])",
        ));
    }
    let path = req.uri().path();
    if path == "/" || path == "/ui" || path.starts_with("/ui/") {
        if req.method() != Method::GET {
            let mut r = error_response(&error(
                405,
                "MethodNotAllowed",
                format!("{} is not allowed on {path} (allowed: GET)", req.method()),
            ));
            r.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static("GET"));
            return r;
        }
        return asset(path);
    }
    handle(req, caller, state, table, config, shutdown).await
}

fn asset(path: &str) -> Response<Body> {
    if path == "/" || path == "/ui" {
        let mut r = Response::new(empty());
        *r.status_mut() = StatusCode::FOUND;
        r.headers_mut().insert(LOCATION, HeaderValue::from_static("/ui/"));
        return r;
    }
    let Some(a) = ASSETS.iter().find(|a| a.path == path) else {
        return error_response(&error(404, "NotFound", format!("no file {path}")));
    };
    let mut r = Response::new(Full::new(Bytes::from_static(a.body)).map_err(|never| match never {}).boxed());
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(a.content_type));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    // The files change with the binary: a browser asks again rather than
    // keep an older page against a newer server.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}

/// Whether a `Host` header names this machine by a loopback name: `localhost`
/// or a loopback IP, with any port (an `ssh -L` tunnel picks its own).
fn loopback_host(host: Option<&HeaderValue>) -> bool {
    let Some(host) = host.and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => ip,
            _ => return false,
        },
        None => host.split_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::routes::{match_route, Matched};

    #[test]
    fn only_reads_are_routed() {
        let table = routes();
        assert!(table.iter().all(|r| r.method == Method::GET), "only GET routes");
        let check = |method: Method, path: &str, expected: Matched| {
            assert_eq!(match_route(&table, &method, path), expected, "{method} {path}");
        };
        check(Method::GET, "/api/v1/pods", Matched::Route(RouteId::ListPods, None));
        check(Method::GET, "/api/v1/nodes", Matched::Route(RouteId::ListNodes, None));
        check(Method::GET, "/api/v1/events", Matched::Route(RouteId::ListEvents, None));
        check(Method::POST, "/api/v1/pods", Matched::MethodNotAllowed);
        check(Method::POST, "/api/v1/nodes", Matched::MethodNotAllowed);
        check(Method::GET, "/api/v1/pods/web", Matched::NotFound);
        check(Method::DELETE, "/api/v1/pods/web", Matched::NotFound);
        check(Method::GET, "/api/v1/pods/web/log", Matched::NotFound);
        check(Method::POST, "/api/v1/join", Matched::NotFound);
        check(Method::PUT, "/api/v1/nodes/n1/status", Matched::NotFound);
    }

    #[test]
    fn host_must_be_loopback() {
        let check = |host: &str, expected: bool| {
            assert_eq!(loopback_host(Some(&HeaderValue::from_str(host).expect("a header value"))), expected, "{host}");
        };
        check("127.0.0.1:7480", true);
        check("127.0.0.1", true);
        check("127.1.2.3:80", true);
        check("localhost:8080", true);
        check("LOCALHOST", true);
        check("[::1]:7480", true);
        check("[::1]", true);
        check("evil.example:7480", false);
        check("localhost.evil.example", false);
        check("10.0.0.1:7480", false);
        check("[::2]:7480", false);
        check("[::1]x", false);
        assert!(!loopback_host(None));
    }

    #[tokio::test]
    async fn bind_refuses_other_addresses_naming_the_flag() {
        for (addr, words) in [
            ("0.0.0.0:0", "not a loopback address"),
            ("192.0.2.1:0", "not a loopback address"),
            ("[::]:0", "not a loopback address"),
            ("localhost:0", "not an IP address"),
            ("127.0.0.1", "not an IP address"),
        ] {
            let e = bind(addr).await.expect_err(addr).to_string();
            assert!(e.starts_with(&format!("--local-listen {addr}: ")) && e.contains(words), "{addr}: {e}");
        }
        assert!(bind("127.0.0.1:0").await.is_ok());
    }
}
