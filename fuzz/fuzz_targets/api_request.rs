//! The orchestrator's request path as the server runs it, without the
//! sockets: route matching, the front door's `screen` (who asks, before any
//! body is read, and the body limit for them), then `api::parse::parse`
//! turning (route, path parameter, query, headers, body) into a typed
//! `Action`. An anonymous caller let past the door on a route that is not
//! public, or a body over the caller's limit handed to the parser, is a
//! finding.
//!
//! Input: the first line is `METHOD PATH[?QUERY]`; the second the caller
//! (`admin`, `node:NAME`, `cn:NAME` for a certificate naming no identity,
//! anything else anonymous); the third the Content-Type header's value and
//! the fourth the Authorization header's (each left out when empty); the
//! rest is the body.
#![no_main]

use bytes::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{HeaderMap, Method};
use libfuzzer_sys::fuzz_target;
use orchestrator::api::parse::parse;
use orchestrator::api::routes::{match_route, routes, Matched, Route};
use orchestrator::api::{public, screen, ApiConfig};
use orchestrator::tls::Identity;
use std::sync::OnceLock;

fn table() -> &'static [Route] {
    static TABLE: OnceLock<Vec<Route>> = OnceLock::new();
    TABLE.get_or_init(routes)
}

fn line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

fn identity(text: &[u8]) -> Identity {
    let text = String::from_utf8_lossy(text);
    if text == "admin" {
        Identity::Admin
    } else if let Some(n) = text.strip_prefix("node:") {
        Identity::Node(n.to_string())
    } else if let Some(cn) = text.strip_prefix("cn:") {
        Identity::Other(cn.to_string())
    } else {
        Identity::Anonymous
    }
}

fuzz_target!(|data: &[u8]| {
    let (request_line, rest) = line(data);
    let (caller, rest) = line(rest);
    let (content_type, rest) = line(rest);
    let (auth, body) = line(rest);
    let Ok(request_line) = std::str::from_utf8(request_line) else { return };
    let Some((method, target)) = request_line.split_once(' ') else { return };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else { return };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Matched::Route(route, param) = match_route(table(), &method, path) else { return };
    let who = identity(caller);
    // Small limits, so that the fuzzer reaches both sides of them.
    let config = ApiConfig { body_limit: 4096, anonymous_body_limit: 256, ..ApiConfig::default() };
    let limit = match screen(route, &who, &config) {
        Ok(limit) => limit,
        Err(e) => {
            assert!(!public(route), "a public route refused {who:?}: {e:?}");
            return;
        }
    };
    if matches!(who, Identity::Anonymous | Identity::Other(_)) {
        assert!(public(route), "{who:?} was let past the door on {route:?}");
        assert_eq!(limit, config.anonymous_body_limit);
    }
    if body.len() > limit {
        return; // the server answers 413 without decoding
    }
    let mut headers = HeaderMap::new();
    for (name, value) in [(CONTENT_TYPE, content_type), (AUTHORIZATION, auth)] {
        if !value.is_empty() {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.insert(name, v);
            }
        }
    }
    let _ = parse(route, param, query, &headers, &Bytes::copy_from_slice(body));
});
