//! The orchestrator's request parsing without HTTP: route matching, then
//! `api::parse::parse` turning (route, path parameter, query, headers, body) into
//! a typed `Action`, as the server does after reading a request.
//!
//! Input: the first line is `METHOD PATH[?QUERY]`, the second the Authorization
//! header's value (left out when empty), the rest is the body.
#![no_main]

use bytes::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{HeaderMap, Method};
use libfuzzer_sys::fuzz_target;
use orchestrator::api::parse::parse;
use orchestrator::api::routes::{match_route, routes, Matched, Route};
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

fuzz_target!(|data: &[u8]| {
    let (request_line, rest) = line(data);
    let (auth, body) = line(rest);
    let Ok(request_line) = std::str::from_utf8(request_line) else { return };
    let Some((method, target)) = request_line.split_once(' ') else { return };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else { return };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Matched::Route(route, param) = match_route(table(), &method, path) else { return };
    let mut headers = HeaderMap::new();
    if !auth.is_empty() {
        if let Ok(v) = HeaderValue::from_bytes(auth) {
            headers.insert(AUTHORIZATION, v);
        }
    }
    let _ = parse(route, param, query, &headers, &Bytes::copy_from_slice(body));
});
