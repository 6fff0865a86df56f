//! The HTTPS API: a bounded accept loop (hyper 1 over tokio-rustls), the client
//! identity from the verified certificate, body limits and read timeouts, then
//! route -> `parse` (typed `Action`) -> `apply` (store) -> JSON or a watch
//! stream. Graceful shutdown: stop accepting, let in-flight requests finish,
//! end watch streams. Liveness (`ApiConfig::liveness`): TCP keepalive on every
//! accepted socket, an HTTP/2 PING on a quiet connection, a BOOKMARK on an idle
//! watch that asked for them, a heartbeat frame on an idle attach stream.

pub(crate) mod apply;
pub(crate) mod attach;
pub(crate) mod error;
pub(crate) mod joins;
pub(crate) mod local;
pub(crate) mod parse;
pub(crate) mod proxy;
pub mod routes;

pub use apply::bookmark_line;
pub use parse::percent_encode;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pinion_wire::door::{self, Activity, Bounds, Pool, Seat, Watched, WhenFull};
use specs::api::{ApiError, Liveness, WatchEventType};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use self::apply::{apply, watch_line, ApiState, Reply};
use self::error::{bad_request, error};
use self::routes::{match_route, routes, Matched, Route, RouteId};
use crate::tls::Identity;

/// A reply body. Its error ends a stream abruptly (HTTP/2 RST_STREAM, an
/// HTTP/1 connection closed mid-body), which is how a proxied stream whose
/// upstream broke tells its reader to resume rather than to stop.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// Requests (and watches) one HTTP/2 connection may have open at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// A request's head: its path, query and headers (the certificate, not a
/// header, says who asks; nothing here needs more).
const MAX_HEADER_BYTES: u32 = 64 << 10;

#[derive(Debug, Clone, Copy)]
pub struct ApiConfig {
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// Largest body from a caller without a certificate (a join request).
    pub anonymous_body_limit: usize,
    /// Connections of nodes served at once; one more is refused.
    pub max_connections: usize,
    /// Connections of the admin served at once; one more is refused.
    pub max_admin_connections: usize,
    /// Connections without a known identity (joins, health checks; the local
    /// listener's callers); one more evicts the oldest.
    pub max_anonymous_connections: usize,
    /// TLS handshakes under way at once; one more evicts the oldest.
    pub max_handshakes: usize,
    pub handshake_timeout: Duration,
    /// Time to send the request head, and separately the body.
    pub read_timeout: Duration,
    /// From the handshake's end to the first request byte.
    pub first_byte_timeout: Duration,
    /// A connection where nothing moved either way for this long ends.
    pub idle_timeout: Duration,
    /// A reply the caller does not read for this long ends its connection.
    pub write_timeout: Duration,
    /// The whole life of a connection without a known identity.
    pub anonymous_lifetime: Duration,
    /// How long decoding one body may take before the caller is answered 503
    /// (the decoding runs off the async workers, bounded in size and depth).
    pub decode_timeout: Duration,
    /// MiB of large replies the API holds at once (a reply waits for room
    /// up to `read_timeout`, then 503).
    pub reply_budget_mib: usize,
    /// The same for the local listener, whose callers are every local user.
    pub local_reply_budget_mib: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// How often an idle stream or connection carries something; clients
    /// bound silence by the same rule.
    pub liveness: Liveness,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            body_limit: 1 << 20,
            anonymous_body_limit: 16 << 10,
            max_connections: 4096,
            max_admin_connections: 1024,
            max_anonymous_connections: 256,
            max_handshakes: 512,
            handshake_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            write_timeout: Duration::from_secs(30),
            anonymous_lifetime: Duration::from_secs(60),
            decode_timeout: Duration::from_secs(10),
            reply_budget_mib: 512,
            local_reply_budget_mib: 128,
            shutdown_timeout: Duration::from_secs(10),
            liveness: Liveness::default(),
        }
    }
}

impl ApiConfig {
    fn bounds(&self, class: Class) -> Bounds {
        let known = Bounds {
            first_byte: self.first_byte_timeout,
            idle: self.idle_timeout,
            write_stall: self.write_timeout,
            lifetime: None,
        };
        match class {
            Class::Admin | Class::Node | Class::Local => known,
            Class::Anonymous => Bounds {
                idle: self.idle_timeout.min(self.first_byte_timeout),
                lifetime: Some(self.anonymous_lifetime),
                ..known
            },
        }
    }
}

/// The pools a connection is counted in, by who it proved to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Admin,
    Node,
    /// No certificate, or one naming no identity this server grants anything.
    Anonymous,
    /// The local listener's callers (loopback, no certificate, read-only).
    Local,
}

impl Class {
    fn of(identity: &Identity) -> Class {
        match identity {
            // People share the admin's pool: their certificates are ours,
            // and each request checks them against the store.
            Identity::Admin | Identity::User(_) | Identity::Person(_) => Class::Admin,
            Identity::Node(_) => Class::Node,
            Identity::Anonymous | Identity::Other(_) => Class::Anonymous,
        }
    }
}

struct Pools {
    handshakes: Arc<Pool>,
    admin: Arc<Pool>,
    node: Arc<Pool>,
    anonymous: Arc<Pool>,
    /// MiB of lists held at once on this listener: a caller that does not
    /// read holds its reply until the write bound, and many of them must not
    /// hold many copies of a big list.
    replies: Budget,
}

impl Pools {
    fn new(config: &ApiConfig, kind: &Listener) -> Pools {
        let anonymous = match kind {
            Listener::Api(_) => "anonymous",
            Listener::Local => "local",
        };
        let replies = match kind {
            Listener::Api(_) => config.reply_budget_mib,
            Listener::Local => config.local_reply_budget_mib,
        };
        Pools {
            replies: Budget::new(replies),
            handshakes: Pool::new("handshake", config.max_handshakes, WhenFull::EvictOldest),
            admin: Pool::new("admin", config.max_admin_connections, WhenFull::Refuse),
            node: Pool::new("node", config.max_connections, WhenFull::Refuse),
            anonymous: Pool::new(anonymous, config.max_anonymous_connections, WhenFull::EvictOldest),
        }
    }

    fn of(&self, class: Class) -> &Arc<Pool> {
        match class {
            Class::Admin => &self.admin,
            Class::Node => &self.node,
            Class::Anonymous | Class::Local => &self.anonymous,
        }
    }

    /// Every connection at once, counted for shutdown.
    fn total(config: &ApiConfig) -> usize {
        config
            .max_handshakes
            .saturating_add(config.max_admin_connections)
            .saturating_add(config.max_connections)
            .saturating_add(config.max_anonymous_connections)
            .min(Semaphore::MAX_PERMITS)
    }
}

/// Serves until `shutdown` turns true, then drains connections.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<ApiState>,
    config: ApiConfig,
    shutdown: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    accept_loop(listener, Listener::Api(acceptor), routes(), state, config, shutdown).await;
}

/// What a listener speaks: the HTTPS API, or the local listener's plain HTTP
/// (`local`).
#[derive(Clone)]
enum Listener {
    Api(tokio_rustls::TlsAcceptor),
    Local,
}

/// The accept loop both listeners share. It never waits for a slot: a
/// connection is seated in the handshake pool, then in its identity's pool
/// (`pinion_wire::door`), and closed where a pool refuses it; on shutdown
/// it stops accepting and waits (up to `shutdown_timeout`) for the
/// connections to finish.
async fn accept_loop(
    listener: TcpListener,
    kind: Listener,
    table: Vec<Route>,
    state: Arc<ApiState>,
    config: ApiConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let table = Arc::new(table);
    let pools = Arc::new(Pools::new(&config, &kind));
    let total = Pools::total(&config);
    let live = Arc::new(Semaphore::new(total));
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        // Every pool is full at once: nothing can be seated.
        let Ok(permit) = live.clone().try_acquire_owned() else { continue };
        let _ = tcp.set_nodelay(true);
        pinion_wire::keep_alive(&tcp, &config.liveness);
        // Seated here, in the order of arrival, so that "oldest" means it.
        let handshake = match kind {
            Listener::Api(_) => pools.handshakes.enter(),
            Listener::Local => None,
        };
        let (kind, state, table, pools, shutdown) =
            (kind.clone(), state.clone(), table.clone(), pools.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match kind {
                Listener::Api(acceptor) => {
                    let Some(mut seat) = handshake else { return };
                    let tls = tokio::select! {
                        r = tokio::time::timeout(config.handshake_timeout, acceptor.accept(tcp)) => match r {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                            Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                        },
                        _ = seat.evicted() => return tracing::debug!(%peer, "TLS handshake evicted by newer ones"),
                    };
                    drop(seat);
                    let certs = tls.get_ref().1.peer_certificates();
                    let identity = Identity::from_peer(certs);
                    let incarnation = certs
                        .and_then(|c| c.first())
                        .and_then(|c| pinion_wire::tls::CertificateFacts::parse(c.as_ref(), "client certificate").ok())
                        .and_then(|f| f.incarnation);
                    let class = Class::of(&identity);
                    let pool = pools.of(class);
                    let Some(seat) = pool.enter() else {
                        return tracing::warn!(%peer, pool = pool.name(), "connection refused: its pool is full");
                    };
                    let conn = Conn {
                        caller: Arc::new(Caller {
                            identity,
                            incarnation,
                            peer,
                            env_values: true,
                            replies: pools.replies.clone(),
                        }),
                        local: false,
                        seat,
                        class,
                    };
                    serve_connection(tls, conn, state, table, config, shutdown).await;
                }
                // Only the read-only routes of `local::routes` are in `table`;
                // on them the local listener reads what the admin may read.
                Listener::Local => {
                    let Some(seat) = pools.of(Class::Local).enter() else { return };
                    // Every user of this machine may call here: the env's values stay out.
                    let caller = Caller {
                        identity: Identity::Admin,
                        incarnation: None,
                        peer,
                        env_values: false,
                        replies: pools.replies.clone(),
                    };
                    let conn = Conn { caller: Arc::new(caller), local: true, seat, class: Class::Local };
                    serve_connection(tcp, conn, state, table, config, shutdown).await
                }
            }
        });
    }
    drop(listener);
    // Every connection holds a permit: all permits back means all handlers gone.
    let all = u32::try_from(total).unwrap_or(u32::MAX);
    if tokio::time::timeout(config.shutdown_timeout, live.acquire_many(all)).await.is_err() {
        tracing::warn!("shutdown: some connections did not finish in time");
    }
}

/// One accepted connection, once its caller is known.
struct Conn {
    caller: Arc<Caller>,
    local: bool,
    seat: Seat,
    class: Class,
}

/// Who is on the other end of a connection, and what its listener grants.
pub(crate) struct Caller {
    /// As the certificate presents it; a person is resolved at each request.
    identity: Identity,
    /// The certificate's incarnation (its subject's OU): a person's or node's
    /// current one is in the store, and an older one is refused.
    incarnation: Option<String>,
    peer: SocketAddr,
    /// False on the local listener: pods are shown without env values.
    env_values: bool,
    replies: Budget,
}

async fn serve_connection<S>(
    io: S,
    conn: Conn,
    state: Arc<ApiState>,
    table: Arc<Vec<Route>>,
    config: ApiConfig,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Conn { caller, local, mut seat, class } = conn;
    let peer = caller.peer;
    let stop = shutdown.clone();
    let svc = hyper::service::service_fn(move |req| {
        let (caller, state, table, stop) = (caller.clone(), state.clone(), table.clone(), stop.clone());
        async move {
            Ok::<_, Infallible>(if local {
                local::respond(req, &caller, state, &table, config, stop).await
            } else {
                handle(req, &caller, state, &table, config, stop).await
            })
        }
    });
    // HTTP/2 when the client chose it over ALPN (one connection for all its
    // requests and watches), HTTP/1.1 otherwise; the auto builder reads the
    // connection preface to tell them apart.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.read_timeout)
        .max_buf_size(MAX_HEADER_BYTES as usize * 2);
    // Pings on a quiet connection: a client whose path went silent is let go
    // (its watches and follows with it) instead of held until the OS gives up.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .max_header_list_size(MAX_HEADER_BYTES)
        .keep_alive_interval(config.liveness.heartbeat)
        .keep_alive_timeout(config.liveness.silence().saturating_sub(config.liveness.heartbeat));
    let activity = Activity::new();
    let conn = builder.serve_connection(TokioIo::new(Watched::new(io, activity.clone())), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r { tracing::debug!(error = %e, "connection ended") },
        why = door::watch(activity, config.bounds(class)) => {
            tracing::debug!(%peer, ?class, reason = %why, "connection closed");
            if why.lets_the_reply_finish() {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(door::LAST_REPLY_GRACE, conn).await;
            }
        }
        _ = seat.evicted() => tracing::debug!(%peer, ?class, "connection evicted by newer ones"),
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(config.shutdown_timeout, conn).await;
        }
    }
}

pub fn json_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(e).unwrap_or_else(|_| b"{\"code\":500}".to_vec());
    json_response(e.code, body)
}

/// Routes a caller without a known identity may reach: health checks and
/// the join (which carries its own proof, the token).
pub fn public(route: RouteId) -> bool {
    matches!(route, RouteId::Health | RouteId::Version | RouteId::Join)
}

/// Who asks is known before anything they send is read: a caller without a
/// certificate, or with one naming no identity, reaches only `public` routes.
fn admit(route: RouteId, identity: &Identity) -> Result<(), ApiError> {
    if public(route) {
        return Ok(());
    }
    crate::cluster::authorize(identity, crate::cluster::Request::Known).map_err(error::answer)
}

/// What the front door decides before a byte of the body is read: a
/// refusal, or the largest body this caller may send on this route.
pub fn screen(route: RouteId, identity: &Identity, config: &ApiConfig) -> Result<usize, ApiError> {
    admit(route, identity)?;
    Ok(match identity {
        Identity::Admin | Identity::Person(_) | Identity::Node(_) => config.body_limit,
        Identity::User(_) | Identity::Anonymous | Identity::Other(_) => config.anonymous_body_limit,
    })
}

async fn handle(
    req: Request<Incoming>,
    caller: &Caller,
    state: Arc<ApiState>,
    table: &[Route],
    config: ApiConfig,
    shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    let (peer, env_values) = (caller.peer, caller.env_values);
    let (route, param) = match match_route(table, req.method(), req.uri().path()) {
        Matched::Route(r, p) => (r, p),
        Matched::MethodNotAllowed => {
            let allowed = routes::allowed_methods(table, req.uri().path());
            let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
            let mut r = error_response(&error(
                405,
                "MethodNotAllowed",
                format!("{} is not allowed on {} (allowed: {allow})", req.method(), req.uri().path()),
            ));
            if let Ok(v) = hyper::header::HeaderValue::from_str(&allow) {
                r.headers_mut().insert(hyper::header::ALLOW, v);
            }
            return refused_unread(req, r).await;
        }
        Matched::NotFound => {
            let r = error_response(&error(404, "NotFound", format!("no route {}", req.uri().path())));
            return refused_unread(req, r).await;
        }
    };
    // Who asks, as the store knows them now: a revoked person or a deleted
    // node is refused from their next request on, before their body is read;
    // the public routes stay open to them as to anyone.
    let identity = match crate::cluster::resolve(&state.store, &caller.identity, caller.incarnation.as_deref()) {
        Ok(id) => id,
        Err(_) if public(route) => Identity::Anonymous,
        Err(e) => return refused_unread(req, error_response(&error::answer(e))).await,
    };
    let identity = &identity;
    // Refused before the body is read: it is never decoded, and an
    // anonymous upload costs at most what `refused_unread` throws away.
    let limit = match screen(route, identity, &config) {
        Ok(limit) => limit,
        Err(e) => return refused_unread(req, error_response(&e)).await,
    };
    if route == RouteId::Join {
        if let Err(limited) = state.joins.admit(peer.ip()) {
            let mut r = error_response(&error(
                429,
                "TooManyRequests",
                format!(
                    "too many failed joins from {}; try again in {} s",
                    peer.ip(),
                    limited.retry_after.as_secs().max(1)
                ),
            ));
            if let Ok(v) = hyper::header::HeaderValue::from_str(&limited.retry_after.as_secs().max(1).to_string()) {
                r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
            }
            return refused_unread(req, r).await;
        }
    }
    let too_large = || error(413, "RequestEntityTooLarge", format!("request body is larger than {limit} bytes"));
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        drain(req.into_body(), limit, config).await;
        return error_response(&too_large());
    }
    let (parts, mut body) = req.into_parts();
    let collected = tokio::time::timeout(config.read_timeout, async {
        let mut buf = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                if buf.len() + data.len() > limit {
                    return Ok(None);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok::<_, hyper::Error>(Some(buf.freeze()))
    })
    .await;
    let body = match collected {
        Ok(Ok(Some(b))) => b,
        Ok(Ok(None)) => {
            drain(body, limit, config).await;
            return error_response(&too_large());
        }
        Ok(Err(e)) => return error_response(&bad_request(format!("cannot read the body: {e}"))),
        Err(_) => return error_response(&error(408, "RequestTimeout", "the body did not arrive in time")),
    };
    let action = match decode(route, param, parts, body, config).await {
        Ok(parse::Action::Renew { .. }) => parse::Action::Renew { incarnation: caller.incarnation.clone() },
        Ok(a) if env_values => a,
        Ok(a) => a.without_env_values(),
        Err(e) => return error_response(&e),
    };
    // A list is as large as the store: room for it (as large as the last one
    // was) is taken before it is read, so callers that do not read their
    // replies cannot make the server hold many copies of it.
    let mut held = None;
    if lists_everything(&action) {
        match caller.replies.hold(caller.replies.estimate(), config.read_timeout).await {
            Some(p) => held = Some(p),
            None => return error_response(&busy()),
        }
    }
    let result = apply(&state, identity, action).await;
    if route == RouteId::Join {
        if let Err(e) = &result {
            if e.code == 401 {
                state.joins.failed(peer.ip(), &e.message);
            }
        }
    }
    match result {
        Ok(Reply::Json(code, v)) => match held {
            None => json_response(code, v),
            Some(permit) => {
                caller.replies.note(v.len());
                let Some(permit) = caller.replies.grow(permit, v.len()) else {
                    return error_response(&busy());
                };
                let mut r = json_response(code, Vec::new());
                *r.body_mut() = BodyExt::boxed(Held { rest: Bytes::from(v), permit: Some(permit) });
                r
            }
        },
        Ok(Reply::Metrics(text)) => {
            let mut r = json_response(200, text.into_bytes());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            r
        }
        Ok(Reply::Watch { initial, mut watch, filter, from, bookmarks }) => {
            let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
            let mut stop = shutdown;
            let heartbeat = config.liveness.heartbeat;
            let watches = state.metrics.watches.clone();
            if held.is_some() {
                caller.replies.note(initial.iter().map(String::len).sum());
            }
            tokio::spawn(async move {
                // Counted while this task lives, however it ends.
                watches.inc();
                let _open = WatchOpen(watches);
                for line in initial {
                    if tx.send(Ok(Bytes::from(line))).await.is_err() {
                        return;
                    }
                }
                // The listed objects are in the channel or sent: the changes after are small.
                drop(held);
                // Every change read so far was sent or filtered out: a bookmark
                // at this version skips nothing.
                let mut version = from;
                let mut last_sent = tokio::time::Instant::now();
                loop {
                    let change = tokio::select! {
                        c = watch.next() => c,
                        _ = tokio::time::sleep_until(last_sent + heartbeat), if bookmarks => {
                            if tx.send(Ok(Bytes::from(bookmark_line(filter.kind, version)))).await.is_err() {
                                return;
                            }
                            last_sent = tokio::time::Instant::now();
                            continue;
                        }
                        _ = stop.changed() => return,
                        _ = tx.closed() => return,
                    };
                    let line = match change {
                        Ok(c) => {
                            version = version.max(c.rv);
                            if filter.ends(&c) {
                                let err = error::unauthorized(format!(
                                    "the credentials of user {:?} changed: sign in again",
                                    c.name
                                ));
                                let obj = serde_json::to_string(&err).unwrap_or_default();
                                let _ = tx.send(Ok(Bytes::from(watch_line(WatchEventType::Error, &obj)))).await;
                                return;
                            }
                            match filter.line(&c) {
                                Some(l) => l,
                                None => continue,
                            }
                        }
                        Err(e) => {
                            let err = error::store_error(e);
                            let obj = serde_json::to_string(&err).unwrap_or_default();
                            let _ = tx.send(Ok(Bytes::from(watch_line(WatchEventType::Error, &obj)))).await;
                            return;
                        }
                    };
                    if tx.send(Ok(Bytes::from(line))).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
            });
            let mut r = Response::new(BodyExt::boxed(ChannelBody { rx }));
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-ndjson"));
            r
        }
        Ok(Reply::Proxy { node, endpoint, path }) => {
            proxy::proxy(&state.proxy, &node, &endpoint, &path, shutdown).await
        }
        Ok(Reply::Attach(a)) => attach::respond(state, *a, config.liveness, shutdown),
        Ok(Reply::Exec { node, endpoint, path, request }) => {
            proxy::exec(&state.proxy, &node, &endpoint, &path, &request, config.liveness, shutdown).await
        }
        Ok(Reply::ExecInput { node, endpoint, path, input }) => {
            proxy::exec_input(&state.proxy, &node, &endpoint, &path, &input).await
        }
        Err(e) => error_response(&e),
    }
}

/// Whether an action reads a whole kind from the store (a list, or a watch
/// that lists first).
fn lists_everything(action: &parse::Action) -> bool {
    use parse::Action::*;
    matches!(
        action,
        ListPods { .. }
            | ListNodes { .. }
            | ListJobs { .. }
            | ListAcct
            | ListEvents { .. }
            | WatchPods { from: None, .. }
            | WatchNodes { from: None, .. }
    )
}

fn busy() -> ApiError {
    error(503, "ServiceUnavailable", "too many large replies are being sent; try again")
}

/// MiB of lists a listener holds at once, and the size of the last list it
/// sent (the estimate for the next).
#[derive(Clone)]
struct Budget {
    mib: Arc<Semaphore>,
    size: u32,
    last: Arc<std::sync::atomic::AtomicUsize>,
}

impl Budget {
    fn new(mib: usize) -> Budget {
        let size = u32::try_from(mib.clamp(1, Semaphore::MAX_PERMITS)).unwrap_or(u32::MAX);
        Budget { mib: Arc::new(Semaphore::new(size as usize)), size, last: Default::default() }
    }

    fn mib_of(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX).clamp(1, self.size)
    }

    fn estimate(&self) -> usize {
        self.last.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note(&self, bytes: usize) {
        self.last.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Room for a reply of `bytes`, waited for up to `limit`; a reply larger
    /// than the whole budget takes all of it.
    async fn hold(&self, bytes: usize, limit: Duration) -> Option<OwnedSemaphorePermit> {
        let mib = self.mib_of(bytes);
        tokio::time::timeout(limit, self.mib.clone().acquire_many_owned(mib)).await.ok()?.ok()
    }

    /// `held`, grown to cover `bytes` when the reply came out larger, if
    /// there is room now: a reply waiting for room would hold its bytes
    /// while it waits, which is what the budget is there to prevent.
    fn grow(&self, mut held: OwnedSemaphorePermit, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let want = self.mib_of(bytes);
        let have = u32::try_from(held.num_permits()).unwrap_or(u32::MAX);
        if want > have {
            held.merge(self.mib.clone().try_acquire_many_owned(want - have).ok()?);
        }
        Some(held)
    }
}

/// A large reply handed out in pieces, holding its listener's reply budget
/// until the last piece is taken. The pieces matter: the HTTP layer asks for
/// the next one only when it has room to write it, so the budget is held
/// while the caller is still reading, not only until the reply was handed
/// to a buffer in one piece.
struct Held {
    rest: Bytes,
    permit: Option<OwnedSemaphorePermit>,
}

/// The piece a `Held` reply is handed out in.
const PIECE: usize = 64 << 10;

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.rest.is_empty() {
            self.permit = None;
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(PIECE);
        let piece = self.rest.split_to(n);
        if self.rest.is_empty() {
            self.permit = None;
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Takes one off the open-watch gauge when the watch's task ends.
struct WatchOpen(prometheus_client::metrics::gauge::Gauge);

impl Drop for WatchOpen {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Parses a request into an action. A body is decoded on a blocking thread,
/// never on the async workers, so no body can stall the other connections;
/// its size and nesting are bounded (`parse`), and a decoding that still
/// takes longer than `decode_timeout` is answered 503 (its thread finishes
/// on its own).
async fn decode(
    route: RouteId,
    param: Option<String>,
    parts: hyper::http::request::Parts,
    body: Bytes,
    config: ApiConfig,
) -> Result<parse::Action, ApiError> {
    let query = parts.uri.query().unwrap_or("").to_string();
    if body.is_empty() {
        return parse::parse(route, param, &query, &parts.headers, &body);
    }
    let headers = parts.headers;
    let task = tokio::task::spawn_blocking(move || parse::parse(route, param, &query, &headers, &body));
    match tokio::time::timeout(config.decode_timeout, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(error::internal(format!("decoding the body failed: {e}"))),
        Err(_) => Err(error(503, "ServiceUnavailable", "decoding the body took too long")),
    }
}

/// How long a refusal sent before the body is read waits for the body's end.
const REFUSED_BODY_WAIT: Duration = Duration::from_secs(2);
/// The most of a refused body thrown away so that the refusal arrives (Go's
/// net/http drains as much; Schemathesis sends up to 131 KB).
const REFUSED_BODY_DRAIN: u64 = 256 << 10;

/// A refusal sent before the body is read (who asks may not send it). The
/// body the client is still sending is thrown away unread, up to
/// `REFUSED_BODY_DRAIN` and for at most `REFUSED_BODY_WAIT`: a server that
/// closes with bytes unread resets the connection, and the client loses the
/// refusal with it (Schemathesis saw a TLS EOF on a POST without a
/// certificate). Nothing of it is kept or parsed. A body declared larger
/// than `REFUSED_BODY_DRAIN` is not waited for, nor one that goes on past
/// it: the refusal then says `connection: close`.
async fn refused_unread(req: Request<Incoming>, mut r: Response<Body>) -> Response<Body> {
    use hyper::body::Body as _;
    let mut body = req.into_body();
    if body.is_end_stream() {
        return r;
    }
    let small = body.size_hint().upper().is_some_and(|n| n <= REFUSED_BODY_DRAIN);
    let drained = small && discard(&mut body, REFUSED_BODY_DRAIN, REFUSED_BODY_WAIT).await;
    if !drained {
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    r
}

/// Reads and discards what is left of a refused body (up to 16 times the limit)
/// so the client, still sending, reads the 413 instead of a broken pipe.
async fn drain(mut body: Incoming, limit: usize, config: ApiConfig) {
    discard(&mut body, limit.saturating_mul(16) as u64, config.read_timeout).await;
}

/// Reads `body` to its end and throws it away, unless it goes past `cap`
/// bytes, fails or takes longer than `wait`; whether it reached its end.
async fn discard(body: &mut Incoming, cap: u64, wait: Duration) -> bool {
    let read = async {
        let mut seen = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Ok(d) = frame.into_data() {
                seen += d.len() as u64;
                if seen > cap {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout(wait, read).await.unwrap_or(false)
}

/// A streaming body fed by a channel (a watch's lines, attach frames, a
/// node's log bytes); an error item ends it abruptly (see `Body`).
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> ChannelBody {
        ChannelBody { rx }
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|item| item.map(|r| r.map(Frame::data)))
    }
}
