//! The control plane as a library (mini-redis style): `Server::bind` prepares
//! the data dir (store, CA, admin credentials, join token) and binds the
//! listener; `run` serves until shutdown, then drains and flushes. `pinion
//! server` only parses flags and calls these.
//!
//! Data dir layout (0700, every file in it 0600): `store/` (sled), `pki/`,
//! `admin.conf`, `join-token`.
//!
//! With `ServerOptions::etcd` the store is etcd's instead of `store/`, the CA
//! and the join token are the cluster's (`identity`), and the scheduler and
//! the controller run only while this server leads (`leader`, `leading`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::apply::ApiState;
use crate::api::local::LocalListenError;
use crate::api::proxy::NodeClients;
use crate::api::{serve, ApiConfig};
use crate::controller::{Controller, ControllerConfig};
use crate::identity::IdentityError;
use crate::leader::{ElectionConfig, Term};
use crate::leading::Leading;
use crate::metrics::{ControllerMetrics, Metrics};
use crate::peers::Peers;
use crate::store::{EtcdConfig, EtcdOptions, LeaderGuard, Store, StoreError, StoreOptions};
use crate::tls::{load_or_create_join_token, Credentials, JoinToken, Pki, TlsError, ADMIN_CN};
use pinion_wire::private::{private_dir, tighten_tree};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("store under {path}: {source}")]
    Store { path: PathBuf, source: StoreError },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("etcd {endpoints}: {source}")]
    Etcd { endpoints: String, source: StoreError },
    #[error("the cluster identity: {0}")]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    LocalListen(#[from] LocalListenError),
    #[error("the bootstrap join token's record: {0}")]
    BootstrapToken(String),
}

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub data_dir: PathBuf,
    /// `HOST:PORT`; port 0 picks a free one.
    pub listen: String,
    /// Extra names (DNS or IP) for the server certificate.
    pub tls_sans: Vec<String>,
    pub api: ApiConfig,
    pub controller: ControllerConfig,
    pub store: StoreOptions,
    /// Keep the store in etcd, shared with the other servers of the cluster.
    pub etcd: Option<EtcdConfig>,
    /// Bounds on the talk with etcd.
    pub etcd_options: EtcdOptions,
    /// The URL other machines reach this server by (`https://HOST:PORT`):
    /// given to joining nodes, and on etcd listed for every server's nodes.
    pub advertise_url: Option<String>,
    /// The leader lease's time to live (etcd only): a dead leader is replaced
    /// within about this long.
    pub leader_ttl: Duration,
    /// The plain-HTTP, read-only loopback listener of the web view (`api::local`).
    pub local_listen: Option<LocalListen>,
    /// How long the node, user and admin certificates this server issues live.
    pub lifetimes: crate::tls::Lifetimes,
    /// How long the bootstrap join token (`DATA_DIR/join-token`) admits
    /// nodes, from the cluster's first start; `None`: until revoked.
    pub join_token_ttl: Option<Duration>,
    /// Host folders under which a `baseline` person's pods may mount host
    /// paths (`--allowed-host-paths`); none by default.
    pub allowed_host_paths: Vec<String>,
    /// The cluster range each node's pod range comes from, and their size
    /// (`--pod-cidr`, `--node-cidr-mask-size`); the same on every server.
    pub pod_ranges: specs::net::PodRanges,
}

#[derive(Debug, Clone)]
pub struct LocalListen {
    /// A loopback `IP:PORT`; port 0 picks a free one.
    pub addr: String,
    /// A port already taken means no local listener and a warning, not a
    /// failure: `pinion up`'s default port, which another `up` on the same
    /// machine may hold. An address that is not loopback is refused all the same.
    pub if_free: bool,
}

impl ServerOptions {
    pub fn new(data_dir: impl Into<PathBuf>, listen: impl Into<String>) -> ServerOptions {
        ServerOptions {
            data_dir: data_dir.into(),
            listen: listen.into(),
            tls_sans: Vec::new(),
            api: ApiConfig::default(),
            controller: ControllerConfig::default(),
            store: StoreOptions::default(),
            etcd: None,
            etcd_options: EtcdOptions::default(),
            advertise_url: None,
            leader_ttl: Duration::from_secs(3),
            local_listen: None,
            lifetimes: crate::tls::Lifetimes::default(),
            join_token_ttl: Some(Duration::from_secs(24 * 3600)),
            allowed_host_paths: Vec::new(),
            pod_ranges: specs::net::PodRanges::default(),
        }
    }
}

pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    local: Option<(TcpListener, SocketAddr)>,
    tls: Arc<rustls::ServerConfig>,
    store: Store,
    /// The etcd client and key prefix of a shared store.
    etcd: Option<(crate::etcdv3::Client, String)>,
    /// The cluster's servers as advertised in etcd.
    peers: Option<Peers>,
    pki: Arc<Pki>,
    options: ServerOptions,
    /// First start: the CA and the join token were just made.
    pub first_start: bool,
    pub join_token: JoinToken,
    pub admin_config: PathBuf,
}

impl Server {
    pub async fn bind(options: ServerOptions) -> Result<Server, ServerError> {
        // First: a refused address leaves no data dir behind.
        let local = match &options.local_listen {
            None => None,
            Some(l) => match crate::api::local::bind(&l.addr).await {
                Ok(listener) => {
                    let addr = listener
                        .local_addr()
                        .map_err(|source| LocalListenError::Bind { addr: l.addr.clone(), source })?;
                    Some((listener, addr))
                }
                Err(LocalListenError::Bind { addr, source })
                    if l.if_free && source.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    tracing::warn!(%addr, "the web view's port is taken; serving no web view (choose one with --local-listen)");
                    None
                }
                Err(e) => return Err(e.into()),
            },
        };
        let dir = options.data_dir.clone();
        // The store, the CA's key and the admin's credentials live here.
        private_dir(&dir).map_err(|source| ServerError::Io { path: dir.clone(), source })?;
        // On etcd the first server to start creates the cluster's identity.
        let mut identity_created = false;
        let (store, etcd) = match &options.etcd {
            None => {
                let store_dir = dir.join("store");
                let store = Store::open(&store_dir, options.store)
                    .map_err(|source| ServerError::Store { path: store_dir, source })?;
                (store, None)
            }
            Some(config) => {
                let endpoints = config.endpoints.join(",");
                let etcd_err = |source| ServerError::Etcd { endpoints: endpoints.clone(), source };
                let client = crate::store::etcd::connect(config).await.map_err(etcd_err)?;
                let key = format!("{}identity", config.prefix);
                let limit = options.etcd_options.request_timeout;
                identity_created = crate::identity::share(&client, key.as_bytes(), &dir, limit).await?;
                let store = Store::open_etcd(client.clone(), &config.prefix, options.store, options.etcd_options)
                    .await
                    .map_err(etcd_err)?;
                (store, Some((client, config.prefix.clone())))
            }
        };
        let peers = etcd.as_ref().map(|(client, prefix)| {
            Peers::new(client.clone(), prefix, options.advertise_url.clone(), options.etcd_options.request_timeout)
        });
        if let Some(p) = &peers {
            p.advertise().await.map_err(|e| ServerError::Etcd {
                endpoints: options.etcd.as_ref().map(|c| c.endpoints.join(",")).unwrap_or_default(),
                source: StoreError::Etcd(e),
            })?;
        }
        let (pki, created) = Pki::load_or_create(&dir)?;
        let (join_token, _) = load_or_create_join_token(&dir, &pki.ca_cert_pem)?;
        bootstrap_token_record(&store, &join_token, options.join_token_ttl).await?;
        let listener = TcpListener::bind(&options.listen)
            .await
            .map_err(|source| ServerError::Bind { addr: options.listen.clone(), source })?;
        let addr =
            listener.local_addr().map_err(|source| ServerError::Bind { addr: options.listen.clone(), source })?;
        let host = listen_host(&options.listen);
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        if !host.is_empty() && host != "0.0.0.0" && host != "::" {
            names.push(host.clone());
        } else {
            names.extend(this_machines_names());
        }
        names.extend(options.tls_sans.iter().cloned());
        // The certificate must name the host others are told to reach.
        if let Some(host) =
            options.advertise_url.as_deref().and_then(|u| pinion_wire::parse_url(u).ok()).map(|(_, host)| host)
        {
            names.push(host);
        }
        let tls = Arc::new(pki.server_config(&names)?);
        let url_host =
            if host.is_empty() || host == "0.0.0.0" || host == "::" { "127.0.0.1".to_string() } else { host };
        let server_url = if url_host.contains(':') {
            format!("https://[{url_host}]:{}", addr.port())
        } else {
            format!("https://{url_host}:{}", addr.port())
        };
        let admin_config = dir.join("admin.conf");
        // This machine's own URL first, then the cluster's other servers.
        let mut servers = vec![server_url.clone()];
        let others = match &peers {
            Some(p) => p.list().await,
            None => options.advertise_url.iter().cloned().collect(),
        };
        servers.extend(others.into_iter().filter(|u| Some(u) != options.advertise_url.as_ref()));
        write_admin_config(&pki, &admin_config, &servers, options.lifetimes.admin)?;
        // Pod specs (their env) are in the store, and sled makes its files
        // with the umask's mode; the dir's 0700 is what guards them, this the rest.
        tighten_tree(&dir, |_| false).map_err(|source| ServerError::Io { path: dir.clone(), source })?;
        Ok(Server {
            listener,
            addr,
            local,
            tls,
            store,
            etcd,
            peers,
            pki: Arc::new(pki),
            options,
            first_start: created || identity_created,
            join_token,
            admin_config,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the local listener (`--local-listen`) listens, if it does.
    pub fn local_listen_addr(&self) -> Option<SocketAddr> {
        self.local.as_ref().map(|(_, a)| *a)
    }

    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Serves until `shutdown` turns true; returns after in-flight requests end
    /// and the store is flushed.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<(), ServerError> {
        // One set of counters for every controller this server runs (a term each on etcd).
        let controller_metrics = ControllerMetrics::default();
        let (leading, loops) = match self.etcd.clone() {
            None => {
                // Started here, not in the task: a store that cannot be read
                // stops the server before it listens.
                let (stop, stopped) = watch::channel(false);
                let (controller, loops) =
                    Controller::start(self.store.clone(), self.options.controller, controller_metrics.clone(), stopped)
                        .map_err(|source| ServerError::Store { path: self.options.data_dir.join("store"), source })?;
                let leading = Arc::new(Leading::single(controller.clone()));
                let follow = tokio::spawn(follow_alone(
                    self.store.clone(),
                    self.options.controller,
                    controller_metrics.clone(),
                    leading.clone(),
                    (controller, loops, stop),
                    shutdown.clone(),
                ));
                (leading, vec![follow])
            }
            Some((client, prefix)) => {
                let leading = Arc::new(Leading::elected());
                let mut election = ElectionConfig::new(
                    format!("{prefix}leader"),
                    self.options.advertise_url.clone().unwrap_or_else(|| self.server_url()),
                );
                election.ttl = self.options.leader_ttl;
                let (terms, campaign) = crate::leader::spawn(client.clone(), election, shutdown.clone());
                let mut loops = vec![campaign];
                if let Some(interval) = self.options.etcd_options.compaction_interval {
                    loops.push(tokio::spawn(crate::compaction::run(
                        client,
                        interval,
                        self.options.etcd_options.request_timeout,
                        terms.clone(),
                        shutdown.clone(),
                    )));
                }
                let follow = tokio::spawn(lead(
                    self.store.clone(),
                    self.options.controller,
                    controller_metrics.clone(),
                    leading.clone(),
                    terms,
                    shutdown.clone(),
                ));
                loops.push(follow);
                (leading, loops)
            }
        };
        let metrics = Arc::new(Metrics::new(&controller_metrics, self.store.commit_seconds(), leading.clone()));
        let state = Arc::new(ApiState {
            store: self.store.clone(),
            controller: leading,
            pki: self.pki.clone(),
            server_url: self.server_url(),
            peers: self.peers.clone(),
            advertise_url: self.options.advertise_url.clone(),
            proxy: NodeClients::new(Arc::new(self.pki.proxy_client_config()?), self.options.api.liveness),
            metrics,
            joins: Default::default(),
            lifetimes: self.options.lifetimes,
            allowed_host_paths: self.options.allowed_host_paths.clone(),
            pod_ranges: self.options.pod_ranges,
        });
        let local = self.local.map(|(listener, _)| {
            tokio::spawn(crate::api::local::serve(listener, state.clone(), self.options.api, shutdown.clone()))
        });
        serve(self.listener, self.tls, state.clone(), self.options.api, shutdown).await;
        if let Some(l) = local {
            let _ = l.await;
        }
        for l in loops {
            let _ = l.await;
        }
        drop(state);
        self.store
            .flush()
            .await
            .map_err(|source| ServerError::Store { path: self.options.data_dir.join("store"), source })?;
        let closed = self.store.close(self.options.api.shutdown_timeout).await;
        // sled writes its last snapshot on close, with the umask's mode.
        if let Err(e) = tighten_tree(&self.options.data_dir, |_| false) {
            tracing::warn!(error = %e, dir = %self.options.data_dir.display(), "cannot make the data dir's files the server's only");
        }
        if closed {
            tracing::info!("server stopped; store flushed and closed");
        } else {
            tracing::warn!("server stopped; store flushed, but some handle kept it open");
        }
        Ok(())
    }
}

/// One server's controller learns every change from the store's watch, as a
/// leader's does on etcd (one path for both). When its watch fails (it fell
/// behind the change log) a fresh controller is started from the store; at
/// shutdown its loops finish.
async fn follow_alone(
    store: Store,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    leading: Arc<Leading>,
    first: (Arc<Controller>, Vec<tokio::task::JoinHandle<()>>, watch::Sender<bool>),
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut controller, mut loops, mut stop) = first;
    loop {
        let lost = tokio::select! {
            r = controller.clone().follow(stop.subscribe()) => r.err(),
            _ = shutdown.changed() => None,
        };
        let _ = stop.send(true);
        for l in loops.drain(..) {
            let _ = l.await;
        }
        let Some(e) = lost else { return };
        if *shutdown.borrow() {
            return;
        }
        tracing::warn!(error = %e, "the controller lost the store's watch; restarting it");
        loop {
            let (next_stop, stopped) = watch::channel(false);
            match Controller::start(store.clone(), config, metrics.clone(), stopped) {
                Ok((c, l)) => {
                    leading.set(Some(c.clone()));
                    (controller, loops, stop) = (c, l, next_stop);
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the controller from the store; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.changed() => return,
                    }
                }
            }
        }
    }
}

/// Runs a controller for each term this server leads: the store's guard set
/// first (bindings carry the term's lease), then a controller started from
/// the store, fed by the store's watch; at the term's end (or shutdown) the
/// API stops using it, the guard goes and its loops finish.
async fn lead(
    store: Store,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    leading: Arc<Leading>,
    mut terms: watch::Receiver<Option<Term>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let term = loop {
            if *shutdown.borrow() {
                return;
            }
            if let Some(t) = terms.borrow_and_update().clone() {
                break t;
            }
            tokio::select! {
                r = terms.changed() => if r.is_err() { return },
                _ = shutdown.changed() => {}
            }
        };
        store.set_leader_guard(Some(LeaderGuard { key: term.key.clone(), lease: term.lease }));
        let (stop, stopped) = watch::channel(false);
        match Controller::start(store.clone(), config, metrics.clone(), stopped.clone()) {
            Ok((controller, loops)) => {
                leading.set(Some(controller.clone()));
                let follow = controller.follow(stopped);
                tokio::pin!(follow);
                loop {
                    tokio::select! {
                        r = &mut follow => {
                            // Fell behind the change log, or the store closed: start afresh.
                            if let Err(e) = r {
                                tracing::warn!(error = %e, "the leader's controller lost the store's watch; restarting it");
                            }
                            break;
                        }
                        r = terms.changed() => {
                            if r.is_err() || terms.borrow().as_ref() != Some(&term) {
                                break;
                            }
                        }
                        _ = shutdown.changed() => break,
                    }
                }
                leading.set(None);
                store.set_leader_guard(None);
                let _ = stop.send(true);
                for l in loops {
                    let _ = l.await;
                }
            }
            Err(e) => {
                store.set_leader_guard(None);
                tracing::error!(error = %e, "cannot start the controller from the store; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }
}

fn listen_host(listen: &str) -> String {
    match listen.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => String::new(),
    }
}

/// The bootstrap token's record in the store, made at the cluster's first
/// start (by whichever server of an etcd cluster writes first: one record,
/// one write) and never renewed or revived afterwards: it admits nodes until
/// it expires or is revoked, as `pinion token create` tokens do.
async fn bootstrap_token_record(store: &Store, token: &JoinToken, ttl: Option<Duration>) -> Result<(), ServerError> {
    use crate::cluster::tokens;
    let digest = pinion_wire::tls::sha256_hex(token.secret.as_bytes());
    let now = chrono::Utc::now();
    let (record, made) = store
        .write(move |t| tokens::ensure_bootstrap(t, &digest, ttl, now))
        .await
        .map_err(|e| ServerError::BootstrapToken(e.to_string()))?;
    if made {
        tracing::info!(
            expires = record.spec.expires.as_deref().unwrap_or("never"),
            "the bootstrap join token is recorded"
        );
    } else if let Some(why) = tokens::refusal(&record, now) {
        tracing::info!(reason = %why, "the bootstrap join token admits no node; `pinion token create` makes another");
    }
    Ok(())
}

/// Keeps the admin's certificate across restarts while it is young; only the
/// URL follows the port. One two thirds into its life (or living longer than
/// `lifetime`, as those written before certificates expired do) is issued
/// again, so that an admin who only restarts the server never holds an
/// expired one; the CLI renews it too (`POST /api/v1/renew`).
fn write_admin_config(pki: &Pki, path: &Path, servers: &[String], lifetime: Duration) -> Result<(), TlsError> {
    let young = |c: &Credentials| {
        let now = std::time::SystemTime::now();
        pinion_wire::tls::CertificateFacts::from_pem(&c.client_cert, "admin.conf")
            .is_ok_and(|f| now < f.renew_at() && f.not_after <= now + lifetime + crate::tls::CLOCK_SKEW_ALLOWANCE)
    };
    match Credentials::load(path) {
        Ok(mut c) if c.ca_cert == pki.ca_cert_pem && young(&c) => {
            if c.servers != servers {
                c.servers = servers.to_vec();
                c.save(path)?;
            }
            Ok(())
        }
        _ => {
            tracing::info!(path = %path.display(), "writing a fresh admin certificate");
            let mut c = pki.credentials(&servers[0], ADMIN_CN, None, lifetime)?;
            c.servers = servers.to_vec();
            Ok(c.save(path)?)
        }
    }
}

/// A wildcard listener is reached by this machine's name and addresses: the
/// certificate carries them all, so a node can join by any of them.
fn this_machines_names() -> Vec<String> {
    let mut out = Vec::new();
    if let Some(h) = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()) {
        out.push(h);
    }
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => {
            for a in addrs {
                let Some(sa) = a.address else { continue };
                let ip = match (sa.as_sockaddr_in(), sa.as_sockaddr_in6()) {
                    (Some(v4), _) => std::net::IpAddr::V4(v4.ip()),
                    (_, Some(v6)) => std::net::IpAddr::V6(v6.ip()),
                    _ => continue,
                };
                // Link-local addresses need a zone to be dialled; no one joins by them.
                let link_local = matches!(ip, std::net::IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
                if !ip.is_loopback() && !link_local {
                    out.push(ip.to_string());
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list this machine's addresses; use --tls-san"),
    }
    out
}
