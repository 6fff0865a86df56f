//! gRPC's wire format over HTTP/2, as far as etcd's API needs it: each
//! message is a 5-byte prefix (a compression flag, then the length as a
//! big-endian u32) and the protobuf bytes; the call's outcome is the
//! `grpc-status` trailer (or header, in a "trailers-only" answer), with
//! `grpc-message` percent-encoded beside it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::HeaderMap;
use tokio::sync::mpsc;

use super::Error;

/// Most bytes of one message from etcd. etcd's own Go client takes up to
/// 2 GiB; Pinion's largest answers are range pages (`store::etcd::PAGE`
/// keys, each a bounded object) far below this.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// `message` framed as one uncompressed gRPC message.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    // `encode` fails only when the buffer is too small, and it was sized for it.
    let _ = message.encode(&mut out);
    out.freeze()
}

/// A request's body: one message (a unary call), or the messages sent on
/// a channel for as long as its sender lives (a streaming call).
pub enum Outgoing {
    Once(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Outgoing::Once(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Outgoing::Stream(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Outgoing::Once(None))
    }
}

/// A call's status when it is not OK, from the trailers (or the headers of
/// an answer that carries only them); `Ok(None)` when there is no
/// `grpc-status` in `headers`.
pub fn status(headers: &HeaderMap) -> Result<Option<()>, Error> {
    let Some(code) = headers.get("grpc-status") else { return Ok(None) };
    let code: i32 = code
        .to_str()
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Protocol(format!("grpc-status {code:?} is not a number")))?;
    if code == 0 {
        return Ok(Some(()));
    }
    let message = headers.get("grpc-message").map(|m| percent_decode(m.as_bytes())).unwrap_or_default();
    Err(Error::Status { code, message })
}

/// gRPC's percent-encoding of `grpc-message` undone; a stray `%` stays.
fn percent_decode(bytes: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The messages of an answer's body, one at a time.
pub struct Messages {
    body: Option<Incoming>,
    buf: BytesMut,
}

impl Messages {
    /// The answer's messages. A trailers-only answer (its headers carry the
    /// status) has none: a failure is returned at once.
    pub fn new(response: hyper::Response<Incoming>) -> Result<Messages, Error> {
        let http = response.status();
        if http != hyper::StatusCode::OK {
            return Err(Error::Protocol(format!("HTTP status {} where gRPC answers 200", http.as_u16())));
        }
        let ended = status(response.headers())?.is_some();
        let body = (!ended).then(|| response.into_body());
        Ok(Messages { body, buf: BytesMut::new() })
    }

    /// The next message; `None` once the call ended with status OK.
    pub async fn next<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Error> {
        loop {
            if let Some(message) = take(&mut self.buf)? {
                return M::decode(message).map(Some).map_err(|e| Error::Protocol(format!("etcd's answer: {e}")));
            }
            let Some(body) = self.body.as_mut() else {
                return if self.buf.is_empty() { Ok(None) } else { Err(cut()) };
            };
            match body.frame().await {
                None => {
                    self.body = None;
                    return Err(Error::Protocol("the answer ended without a grpc-status".into()));
                }
                Some(Err(e)) => {
                    self.body = None;
                    return Err(Error::Transport(format!("reading etcd's answer: {e}")));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        self.body = None;
                        if let Some(trailers) = frame.trailers_ref() {
                            if status(trailers)?.is_none() {
                                return Err(Error::Protocol("the answer's trailers hold no grpc-status".into()));
                            }
                        }
                    }
                },
            }
        }
    }
}

fn cut() -> Error {
    Error::Protocol("the answer ended inside a message".into())
}

/// The first whole message in `buf`, taken out of it.
fn take(buf: &mut BytesMut) -> Result<Option<Bytes>, Error> {
    let Some(head) = buf.first_chunk::<5>() else { return Ok(None) };
    if head[0] != 0 {
        return Err(Error::Protocol("etcd sent a compressed message, which was not offered".into()));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(Error::Protocol(format!("a message of {len} bytes, over the bound of {MAX_MESSAGE_BYTES}")));
    }
    if buf.len() < 5 + len {
        // Room for the rest, once, rather than growing chunk by chunk.
        buf.reserve(5 + len - buf.len());
        return Ok(None);
    }
    buf.advance(5);
    Ok(Some(buf.split_to(len).freeze()))
}

#[cfg(test)]
mod tests {
    use super::super::proto::{KeyValue, LeaseRevokeRequest};
    use super::*;
    use prost::Message;

    #[test]
    fn a_framed_message_reads_back_across_any_split() {
        let kv = KeyValue { key: b"k".to_vec(), value: vec![7; 300], mod_revision: 9, ..Default::default() };
        let mut wire = frame(&kv).to_vec();
        wire.extend_from_slice(&frame(&LeaseRevokeRequest { id: 5 }));
        for split in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..split]);
            let mut got = Vec::new();
            while let Some(m) = take(&mut buf).expect("take") {
                got.push(m);
            }
            buf.extend_from_slice(&wire[split..]);
            while let Some(m) = take(&mut buf).expect("take") {
                got.push(m);
            }
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(KeyValue::decode(got[0].clone()).expect("kv"), kv);
            assert_eq!(LeaseRevokeRequest::decode(got[1].clone()).expect("revoke").id, 5);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn oversized_and_compressed_messages_are_refused() {
        let mut buf = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(take(&mut buf), Err(Error::Protocol(m)) if m.contains("over the bound")));
        let mut buf = BytesMut::from(&[1u8, 0, 0, 0, 0][..]);
        assert!(matches!(take(&mut buf), Err(Error::Protocol(m)) if m.contains("compressed")));
    }

    #[test]
    fn a_status_reads_its_code_and_decoded_message() {
        let mut h = HeaderMap::new();
        assert!(matches!(status(&h), Ok(None)));
        h.insert("grpc-status", "0".parse().expect("value"));
        assert!(matches!(status(&h), Ok(Some(()))));
        h.insert("grpc-status", "11".parse().expect("value"));
        h.insert("grpc-message", "etcdserver: mvcc: required revision has been compacted%21%".parse().expect("value"));
        match status(&h) {
            Err(Error::Status { code: 11, message }) => {
                assert_eq!(message, "etcdserver: mvcc: required revision has been compacted!%")
            }
            other => panic!("{other:?}"),
        }
        h.insert("grpc-status", "eleven".parse().expect("value"));
        assert!(matches!(status(&h), Err(Error::Protocol(_))));
    }
}
