//! `GET /api/v1/pods/{name}/attach`: one pod followed to its end on one
//! stream of `AttachFrame` lines, so that `pinion run` needs one request to
//! create and one stream to follow (no watch, then a log request, then a poll
//! for the final status).
//!
//! The stream starts from the pod as `apply` read it, after taking the store
//! version, and follows the store's change log from that version: no status
//! change is missed. Once the container has started, the node's log follow is
//! proxied (the same request as `/log?follow`, through `open_node_stream`); the
//! `exit` frame comes when the pod is final and the output has ended (the node
//! ends its follow when the container stopped and the file is read to its end),
//! or `OUTPUT_DRAIN` after the pod is final if the node never ends it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Response;
use specs::api::{AttachFrame, Liveness};
use specs::status::ContainerState;
use specs::{Pod, PodPhase};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::apply::{log_target, ApiState};
use super::error::{internal, store_error, unauthorized};
use super::proxy::{open_node_stream, NodeStream};
use super::{Body, ChannelBody};
use crate::cluster::{pods, ClusterError};
use crate::store::{Kind, Watch};
use crate::tls::Identity;

/// How long the output may go on after the pod is final (bounds a node that
/// never ends its log follow).
const OUTPUT_DRAIN: Duration = Duration::from_secs(10);

/// What `apply` hands over: the pod as read, and the change log from the
/// version read before it.
pub struct Attach {
    pub pod: Pod,
    pub container: String,
    /// The pod version the caller already has: an older or equal pod sends no
    /// first status frame.
    pub known_version: Option<u64>,
    /// Output bytes the caller already has (a resumed stream skips them).
    pub offset: u64,
    pub watch: Watch,
    /// The person following: a change to their record (revoked, added
    /// again) ends the stream, as it ends their watches.
    pub holder: Option<String>,
    /// `rm`: who deletes the pod once it finished (the caller, already
    /// allowed to), before the exit frame.
    pub remove_as: Option<Identity>,
}

/// The streaming reply; the stream runs in its own task until it ends, the
/// caller goes away or the server shuts down.
/// A silent stream carries a heartbeat every `liveness.heartbeat`, so a
/// follower can tell a dead stream from a quiet pod.
pub fn respond(
    state: Arc<ApiState>,
    attach: Attach,
    liveness: Liveness,
    shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let frames = Frames { tx, last: Instant::now(), heartbeat: liveness.heartbeat };
    tokio::spawn(follow(state, attach, frames, shutdown));
    let mut r = Response::new(BodyExt::boxed(ChannelBody::new(rx)));
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-ndjson"));
    r
}

struct Frames {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    /// When the last frame went out (the heartbeat clock).
    last: Instant,
    heartbeat: Duration,
}

impl Frames {
    /// False when the caller has gone.
    async fn send(&mut self, frame: &AttachFrame) -> bool {
        let mut line = match serde_json::to_vec(frame) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode an attach frame");
                return false;
            }
        };
        line.push(b'\n');
        self.last = Instant::now();
        self.tx.send(Ok(Bytes::from(line))).await.is_ok()
    }
}

/// Times a broken output stream from the node is opened again (the bytes
/// already sent skipped), waiting `REOPEN_DELAY` times the try before each.
const MAX_REOPENS: u32 = 6;
const REOPEN_DELAY: Duration = Duration::from_millis(200);

enum Output {
    /// The container has not started (or the pod has no node yet).
    NotStarted,
    /// The node's log follow is being opened: a future polled beside the
    /// heartbeats and the pod's changes, so a slow node never silences the
    /// stream.
    Opening(Pin<Box<dyn Future<Output = (Output, Option<String>)> + Send>>),
    Streaming(NodeStream),
    /// The stream from the node broke: opened again at this time.
    Reopen(Instant),
    /// Ended, or could not be read.
    Done,
}

/// The container's output as UTF-8 frames: bytes already sent by an earlier
/// stream are skipped, a character split across chunks waits for its rest.
struct Text {
    /// Raw output bytes seen from the node.
    seen: u64,
    skip: u64,
    chunks: specs::api::TextChunks,
}

impl Text {
    fn new(skip: u64) -> Text {
        Text { seen: 0, skip, chunks: Default::default() }
    }

    /// The frame for a chunk, if any text is ready.
    fn push(&mut self, data: &[u8]) -> Option<AttachFrame> {
        let start = self.seen;
        self.seen += data.len() as u64;
        let already = self.skip.saturating_sub(start).min(data.len() as u64) as usize;
        let text = self.chunks.push(&data[already..])?;
        Some(AttachFrame::Output { offset: self.seen - self.chunks.held() as u64, data: text })
    }

    /// The node's stream is read again from its start: what was sent is skipped.
    fn restart(&mut self) {
        self.skip = self.skip.max(self.seen - self.chunks.held() as u64);
        self.seen = 0;
        self.chunks.clear();
    }

    /// What is left at the end of the output.
    fn flush(&mut self) -> Option<AttachFrame> {
        let data = self.chunks.flush()?;
        Some(AttachFrame::Output { offset: self.seen, data })
    }
}

/// Whether the container has (or had) a process whose output can be read.
fn output_ready(pod: &Pod, container: &str) -> bool {
    let Some(s) = &pod.status else { return false };
    if pod.spec.node_name.is_none() {
        return false;
    }
    match s.phase {
        PodPhase::Running => true,
        PodPhase::Succeeded | PodPhase::Failed => s
            .container_statuses
            .iter()
            .any(|c| c.name == container && (c.state != ContainerState::Waiting || c.last_exit_code.is_some())),
        PodPhase::Pending | PodPhase::Scheduled | PodPhase::Unknown => false,
    }
}

fn exit_frame(pod: &Pod, container: &str, removed: bool) -> AttachFrame {
    let s = pod.status.clone().unwrap_or_default();
    let c = s.container_statuses.iter().find(|c| c.name == container);
    AttachFrame::Exit {
        phase: s.phase,
        exit_code: c.and_then(|c| c.last_exit_code),
        reason: c.and_then(|c| c.reason.clone()).or(s.reason),
        message: s.message,
        removed,
    }
}

/// `rm`: the finished pod deleted before its exit frame goes, so the
/// follower has one request less to make before it can exit. Only the
/// incarnation followed: a pod of the same name made since is left alone.
/// False when nothing was deleted; the follower then deletes it itself.
async fn remove(state: &ApiState, who: &Identity, pod: &Pod) -> bool {
    let (name, uid, who) = (pod.metadata.name.clone(), pod.metadata.uid.clone().unwrap_or_default(), who.clone());
    let deleted = state.store.write(move |t| pods::delete_finished(t, &who, &name, &uid)).await;
    deleted.map(|p| p.is_some()).unwrap_or_else(|e: ClusterError| {
        tracing::warn!(pod = %pod.metadata.name, error = %e, "the finished pod could not be deleted as its run asked; the follower deletes it");
        false
    })
}

enum Chunk {
    Data(Bytes),
    /// The output ended.
    End,
    /// The stream from the node broke: the output goes on, read it again.
    Broke,
    /// An open finished: the output, and a notice if it cannot be read.
    Opened(Output, Option<String>),
    /// Time to open a broken stream again.
    Reopen,
}

/// What the output does next. Never ready while there is nothing to read,
/// open or wait for.
async fn next_output(output: &mut Output) -> Chunk {
    let s = match output {
        Output::Streaming(s) => s,
        Output::Opening(opening) => {
            let (o, notice) = opening.await;
            return Chunk::Opened(o, notice);
        }
        Output::Reopen(at) => {
            tokio::time::sleep_until(*at).await;
            return Chunk::Reopen;
        }
        Output::NotStarted | Output::Done => return std::future::pending().await,
    };
    loop {
        match s.body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    return Chunk::Data(data);
                }
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "log stream from the node broke");
                return Chunk::Broke;
            }
            None => return Chunk::End,
        }
    }
}

fn kept_breaking() -> AttachFrame {
    AttachFrame::Notice { message: "the output stream from the node kept breaking; the exit code still comes".into() }
}

/// After a break: open again after a growing pause, or, after
/// `MAX_REOPENS` breaks with no output between them, stop reading.
fn reopen_or_give_up(reopens: &mut u32) -> Output {
    *reopens += 1;
    if *reopens > MAX_REOPENS {
        tracing::debug!(reopens = *reopens, "the output stream from the node kept breaking; no more output");
        return Output::Done;
    }
    Output::Reopen(Instant::now() + REOPEN_DELAY * *reopens)
}

/// Opens the node's log follow; a failure is a notice (when it matters), not
/// the end of the stream: the exit code still comes.
async fn open_output(state: Arc<ApiState>, pod: Pod, container: String) -> (Output, Option<String>) {
    let (state, pod, container) = (&*state, &pod, container.as_str());
    let opened = match log_target(state, pod, container, true) {
        Ok((node, endpoint, path)) => open_node_stream(&state.proxy, &node, &endpoint, &path).await,
        Err(e) => Err(e),
    };
    match opened {
        Ok(s) if s.status == hyper::StatusCode::OK => (Output::Streaming(s), None),
        Ok(s) => {
            let body = s.body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let why = serde_json::from_slice::<specs::api::ApiError>(&body)
                .map(|e| e.message)
                .unwrap_or_else(|_| format!("the node answered {}", s.status));
            (Output::Done, Some(format!("the output cannot be read: {why}")))
        }
        Err(e) => (Output::Done, Some(format!("the output cannot be read: {}", e.message))),
    }
}

async fn follow(state: Arc<ApiState>, attach: Attach, mut out: Frames, mut stop: watch::Receiver<bool>) {
    let Attach { mut pod, container, known_version, offset, mut watch, holder, remove_as } = attach;
    let name = pod.metadata.name.clone();
    let mut version = pod.metadata.resource_version.unwrap_or(0);
    if known_version.is_none_or(|k| k < version) {
        let status = pod.status.clone().unwrap_or_default();
        if !out.send(&AttachFrame::Status { resource_version: version, status }).await {
            return;
        }
    }
    let mut output = Output::NotStarted;
    let mut text = Text::new(offset);
    let mut final_since: Option<Instant> = None;
    // Breaks in a row with no output between them.
    let mut reopens = 0u32;
    loop {
        if matches!(output, Output::NotStarted) && output_ready(&pod, &container) {
            output = Output::Opening(Box::pin(open_output(state.clone(), pod.clone(), container.clone())));
        }
        let terminal = pod.status.as_ref().is_some_and(|s| s.phase.is_terminal());
        if terminal {
            let since = *final_since.get_or_insert_with(Instant::now);
            let reading = matches!(output, Output::Streaming(_) | Output::Opening(_));
            if !reading || since.elapsed() >= OUTPUT_DRAIN {
                if let Some(f) = text.flush() {
                    if !out.send(&f).await {
                        return;
                    }
                }
                let removed = match &remove_as {
                    Some(who) => remove(&state, who, &pod).await,
                    None => false,
                };
                let _ = out.send(&exit_frame(&pod, &container, removed)).await;
                return;
            }
        }
        let drain_until = final_since.map(|t| t + OUTPUT_DRAIN);
        tokio::select! {
            change = watch.next() => match change {
                Ok(c) if c.kind == Kind::Pod && c.name == name && c.rv > version => {
                    version = c.rv;
                    if c.event_type == specs::api::WatchEventType::Deleted {
                        let _ = out.send(&AttachFrame::Deleted).await;
                        return;
                    }
                    match serde_json::from_str::<Pod>(&c.object) {
                        Ok(p) => {
                            let changed = p.status != pod.status;
                            pod = p;
                            if changed {
                                let status = pod.status.clone().unwrap_or_default();
                                if !out.send(&AttachFrame::Status { resource_version: version, status }).await {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            let error = internal(format!("pod {name:?} in the store: {e}"));
                            let _ = out.send(&AttachFrame::Error { error }).await;
                            return;
                        }
                    }
                }
                Ok(c) if c.kind == Kind::User && holder.as_deref() == Some(c.name.as_str()) => {
                    let error = unauthorized(format!("the credentials of user {:?} changed: sign in again", c.name));
                    let _ = out.send(&AttachFrame::Error { error }).await;
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = out.send(&AttachFrame::Error { error: store_error(e) }).await;
                    return;
                }
            },
            data = next_output(&mut output) => match data {
                Chunk::Data(bytes) => {
                    reopens = 0;
                    if let Some(f) = text.push(&bytes) {
                        if !out.send(&f).await {
                            return;
                        }
                    }
                }
                Chunk::End => output = Output::Done,
                Chunk::Broke => {
                    text.restart();
                    output = reopen_or_give_up(&mut reopens);
                    if matches!(output, Output::Done) && !terminal && !out.send(&kept_breaking()).await {
                        return;
                    }
                }
                // Reopening after a break: the node may be unreachable a moment longer.
                Chunk::Opened(Output::Done, _) if reopens > 0 => {
                    output = reopen_or_give_up(&mut reopens);
                    if matches!(output, Output::Done) && !terminal && !out.send(&kept_breaking()).await {
                        return;
                    }
                }
                Chunk::Reopen => output = Output::NotStarted,
                Chunk::Opened(o, notice) => {
                    output = o;
                    if let Some(message) = notice.filter(|_| !terminal) {
                        if !out.send(&AttachFrame::Notice { message }).await {
                            return;
                        }
                    }
                }
            },
            _ = tokio::time::sleep_until(out.last + out.heartbeat) => {
                if !out.send(&AttachFrame::Heartbeat).await {
                    return;
                }
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now)), if drain_until.is_some() => {}
            _ = stop.changed() => return,
            _ = out.tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::api::complete_utf8;

    fn check(input: &[u8], expected: usize) {
        assert_eq!(complete_utf8(input), expected, "{input:?}");
    }

    #[test]
    fn characters_split_across_chunks_wait_for_their_rest() {
        check(b"", 0);
        check(b"abc", 3);
        check("é".as_bytes(), 2);
        check(&"é".as_bytes()[..1], 0);
        check(&"a€".as_bytes()[..3], 1);
        check("a€".as_bytes(), 4);
        check(&"😀".as_bytes()[..3], 0);
        check(&[b'a', 0xFF], 2); // invalid bytes pass (as U+FFFD)
    }

    #[test]
    fn resumed_output_skips_what_was_sent() {
        let mut t = Text::new(4);
        assert_eq!(t.push(b"abc"), None);
        assert_eq!(t.push(b"de\xC3"), Some(AttachFrame::Output { offset: 5, data: "e".into() }));
        assert_eq!(t.push(b"\xA9!"), Some(AttachFrame::Output { offset: 8, data: "é!".into() }));
        assert_eq!(t.flush(), None);
        assert_eq!(t.push(b"\xE2"), None);
        assert_eq!(t.flush(), Some(AttachFrame::Output { offset: 9, data: "\u{FFFD}".into() }));
    }
}
