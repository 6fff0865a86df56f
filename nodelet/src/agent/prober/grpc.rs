//! gRPC probes: the standard health checking protocol
//! (`grpc.health.v1.Health/Check`), as the kubelet runs it: one unary call
//! over HTTP/2 with prior knowledge, in cleartext, without TLS. A result of
//! `SERVING` with `grpc-status: 0` is success; anything else fails with what
//! the server said.
//!
//! The two messages are one field each, so they are encoded and decoded here
//! by hand (`request`, `status_of`) rather than through a protobuf code
//! generator and its build step: `HealthCheckRequest { string service = 1 }`
//! and `HealthCheckResponse { ServingStatus status = 1 }`.
//!
//! The call runs on the probe's thread (the agent's reserved CPUs, or a
//! thread inside the pod's network namespace: see `super::in_netns`), on a
//! single-threaded tokio runtime of its own that ends with the probe, so no
//! task of it outlives the probe or runs anywhere else. The socket is
//! connected before that, by the caller, where the namespace is right.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use super::Failed;

/// The method every gRPC health check calls.
const PATH: &str = "/grpc.health.v1.Health/Check";
/// Most bytes of an answer's body read (its messages, framing included).
/// A health answer is a few bytes; anything larger is not one.
pub(super) const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// Most bytes of an answer's headers or trailers (HTTP/2
/// `SETTINGS_MAX_HEADER_LIST_SIZE`), for the same reason.
pub(super) const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ServingStatus {
    Unknown,
    Serving,
    NotServing,
    /// Only `Watch` answers it, but a server may.
    ServiceUnknown,
    /// A value this version of the protocol does not name.
    Other(u64),
}

impl ServingStatus {
    fn from_wire(v: u64) -> ServingStatus {
        match v {
            0 => ServingStatus::Unknown,
            1 => ServingStatus::Serving,
            2 => ServingStatus::NotServing,
            3 => ServingStatus::ServiceUnknown,
            n => ServingStatus::Other(n),
        }
    }

    /// As the protocol's enum spells it (the kubelet's messages do too).
    fn name(self) -> String {
        match self {
            ServingStatus::Unknown => "UNKNOWN".into(),
            ServingStatus::Serving => "SERVING".into(),
            ServingStatus::NotServing => "NOT_SERVING".into(),
            ServingStatus::ServiceUnknown => "SERVICE_UNKNOWN".into(),
            ServingStatus::Other(n) => format!("status {n}"),
        }
    }
}

/// The request's body: one length-prefixed gRPC message (uncompressed)
/// holding `HealthCheckRequest { service }`. An empty service (the server's
/// overall health) is the empty message, as proto3 leaves out defaults.
pub(super) fn request(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        varint(service.len() as u64, &mut message);
        message.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0); // not compressed
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Why an answer's body is not one health response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("the answer holds no message")]
    Empty,
    #[error("the answer's message is compressed, which the request did not offer")]
    Compressed,
    #[error("the answer's message is cut short")]
    Truncated,
    #[error("the answer holds more than one message")]
    Trailing,
    #[error("the answer's message is not a HealthCheckResponse: {0}")]
    Malformed(&'static str),
}

/// The serving status in a response body (a gRPC length-prefixed message).
/// Unknown fields are skipped, as protobuf readers do; without field 1 the
/// status is its default, `UNKNOWN`.
pub(super) fn status_of(body: &[u8]) -> Result<ServingStatus, DecodeError> {
    let Some((head, rest)) = body.split_first_chunk::<5>() else {
        return Err(if body.is_empty() { DecodeError::Empty } else { DecodeError::Truncated });
    };
    if head[0] != 0 {
        return Err(DecodeError::Compressed);
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() < len {
        return Err(DecodeError::Truncated);
    }
    if rest.len() > len {
        return Err(DecodeError::Trailing);
    }
    let mut msg = rest;
    let mut status = 0;
    while !msg.is_empty() {
        let key = read_varint(&mut msg)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = read_varint(&mut msg)?;
                if field == 1 {
                    status = v; // the last one wins, as in protobuf
                }
            }
            1 => skip(&mut msg, 8)?,
            2 => {
                let n = read_varint(&mut msg)?;
                skip(&mut msg, usize::try_from(n).map_err(|_| DecodeError::Malformed("a length too large"))?)?;
            }
            5 => skip(&mut msg, 4)?,
            _ => return Err(DecodeError::Malformed("an unknown wire type")),
        }
        if field == 0 {
            return Err(DecodeError::Malformed("field number 0"));
        }
        if field == 1 && wire != 0 {
            return Err(DecodeError::Malformed("status is not a varint"));
        }
    }
    Ok(ServingStatus::from_wire(status))
}

fn read_varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or(DecodeError::Malformed("a varint cut short"))?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(DecodeError::Malformed("a varint longer than 10 bytes"))
}

fn skip(buf: &mut &[u8], n: usize) -> Result<(), DecodeError> {
    if buf.len() < n {
        return Err(DecodeError::Malformed("a field cut short"));
    }
    *buf = &buf[n..];
    Ok(())
}

/// Runs the check over `stream` (connected to `addr`) within `timeout`.
pub(super) fn check(stream: TcpStream, addr: SocketAddr, service: &str, timeout: Duration) -> Result<(), Failed> {
    let timed_out = || Failed::Timeout(format!("grpc {addr}: timed out after {timeout:?}"));
    let deadline = Instant::now() + timeout;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failed::Error(format!("grpc {addr}: a runtime for the probe: {e}")))?;
    let left = deadline.saturating_duration_since(Instant::now());
    let outcome = rt.block_on(async { tokio::time::timeout(left, call(stream, addr, service, timeout)).await });
    // Drops the connection's task with the runtime, whatever it was doing.
    drop(rt);
    outcome.unwrap_or_else(|_| Err(timed_out()))
}

/// What the kubelet tells a person for the codes it names.
fn explain(code: u32) -> &'static str {
    match code {
        5 => " (NOT_FOUND: the server does not know the service)",
        12 => " (UNIMPLEMENTED: the server does not implement the grpc health protocol, grpc.health.v1.Health)",
        14 => " (UNAVAILABLE)",
        _ => "",
    }
}

async fn call(stream: TcpStream, addr: SocketAddr, service: &str, timeout: Duration) -> Result<(), Failed> {
    let err = |what: String| Failed::Error(format!("grpc {addr}: {what}"));
    stream.set_nonblocking(true).map_err(|e| err(format!("socket: {e}")))?;
    let tcp = tokio::net::TcpStream::from_std(stream).map_err(|e| err(format!("socket: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        // The server may not send more than this before we read it.
        .initial_stream_window_size(MAX_ANSWER_BYTES as u32)
        .handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
        .await
        .map_err(|e| err(format!("HTTP/2 handshake: {e}")))?;
    let conn = tokio::spawn(conn);
    let authority = match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let req = hyper::Request::post(format!("http://{authority}{PATH}"))
        .header(hyper::header::CONTENT_TYPE, "application/grpc")
        .header(hyper::header::TE, "trailers")
        .header(hyper::header::USER_AGENT, "pinion-probe")
        // The server's side of the deadline, in milliseconds (its unit `m`).
        .header("grpc-timeout", format!("{}m", timeout.as_millis().clamp(1, 99_999_999)))
        .body(Full::new(Bytes::from(request(service))))
        .map_err(|e| err(format!("the request: {e}")))?;
    let answer = sender.send_request(req).await.map_err(|e| err(format!("not a gRPC server over HTTP/2? {e}")));
    let outcome = match answer {
        Ok(resp) => judge(resp, &err).await,
        Err(e) => Err(e),
    };
    conn.abort();
    outcome
}

/// An answer's verdict: its HTTP status and content type, then its
/// `grpc-status` (in the trailers, or in the headers of a trailers-only
/// answer), then its message.
async fn judge(resp: hyper::Response<hyper::body::Incoming>, err: &impl Fn(String) -> Failed) -> Result<(), Failed> {
    if resp.status() != hyper::StatusCode::OK {
        return Err(err(format!("not a gRPC answer: HTTP status {}", resp.status().as_u16())));
    }
    let content_type = resp.headers().get(hyper::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.starts_with("application/grpc") {
        return Err(err(format!("not a gRPC answer: content-type {content_type:?}")));
    }
    let head = resp.headers().clone();
    let mut body = resp.into_body();
    let mut data = Vec::new();
    let mut trailers = None;
    // A trailers-only answer ends the stream with its headers.
    if !head.contains_key("grpc-status") {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| err(format!("reading the answer: {e}")))?;
            match frame.into_data() {
                Ok(chunk) => {
                    if data.len() + chunk.len() > MAX_ANSWER_BYTES {
                        return Err(err(format!("the answer is larger than {MAX_ANSWER_BYTES} bytes")));
                    }
                    data.extend_from_slice(&chunk);
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                    }
                }
            }
        }
    }
    let meta = trailers.as_ref().unwrap_or(&head);
    let text = |name: &str| meta.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(code) = text("grpc-status") else {
        return Err(err("the answer has no grpc-status".into()));
    };
    let code: u32 = code.trim().parse().map_err(|_| err(format!("grpc-status {code:?} is not a code")))?;
    if code != 0 {
        let message = text("grpc-message").map(|m| format!(": {m}")).unwrap_or_default();
        let why = format!("grpc-status {code}{}{message}", explain(code));
        // DEADLINE_EXCEEDED: the server's side of our timeout.
        return Err(if code == 4 { Failed::Timeout(why) } else { err(why) });
    }
    match status_of(&data) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(err(format!("service unhealthy (responded with {})", other.name()))),
        Err(e) => Err(err(e.to_string())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_health_check_requests() {
        let check = |service: &str, want: &[u8]| assert_eq!(request(service), want, "{service:?}");
        check("", &[0, 0, 0, 0, 0]);
        check("a", &[0, 0, 0, 0, 3, 0x0a, 1, b'a']);
        // A length past one varint byte.
        let long = "s".repeat(200);
        let mut want = vec![0, 0, 0, 0, 203, 0x0a, 0xc8, 0x01];
        want.extend_from_slice(long.as_bytes());
        check(&long, &want);
    }

    #[test]
    fn answers_decode_to_a_status_or_say_why_not() {
        let framed = |msg: &[u8]| {
            let mut b = vec![0];
            b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            b.extend_from_slice(msg);
            b
        };
        let check =
            |body: Vec<u8>, want: Result<ServingStatus, DecodeError>| assert_eq!(status_of(&body), want, "{body:?}");
        check(framed(&[0x08, 1]), Ok(ServingStatus::Serving));
        check(framed(&[0x08, 2]), Ok(ServingStatus::NotServing));
        check(framed(&[0x08, 3]), Ok(ServingStatus::ServiceUnknown));
        check(framed(&[0x08, 0x96, 0x01]), Ok(ServingStatus::Other(150)));
        // proto3 leaves a default out: no field is UNKNOWN.
        check(framed(&[]), Ok(ServingStatus::Unknown));
        // Unknown fields of every wire type are skipped; the last status wins.
        check(
            framed(&[0x10, 5, 0x19, 1, 2, 3, 4, 5, 6, 7, 8, 0x22, 2, b'h', b'i', 0x2d, 1, 2, 3, 4, 0x08, 2, 0x08, 1]),
            Ok(ServingStatus::Serving),
        );
        check(vec![], Err(DecodeError::Empty));
        check(vec![0, 0, 0], Err(DecodeError::Truncated));
        check(vec![1, 0, 0, 0, 2, 0x08, 1], Err(DecodeError::Compressed));
        check(vec![0, 0, 0, 0, 3, 0x08, 1], Err(DecodeError::Truncated));
        let mut two = framed(&[0x08, 1]);
        two.extend(framed(&[0x08, 1]));
        check(two, Err(DecodeError::Trailing));
        check(framed(&[0x08]), Err(DecodeError::Malformed("a varint cut short")));
        check(framed(&[0x0a, 1, b'x']), Err(DecodeError::Malformed("status is not a varint")));
        check(framed(&[0x0b]), Err(DecodeError::Malformed("an unknown wire type")));
        check(framed(&[0x22, 5, b'x']), Err(DecodeError::Malformed("a field cut short")));
        check(framed(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), {
            Err(DecodeError::Malformed("a varint longer than 10 bytes"))
        });
    }
}
