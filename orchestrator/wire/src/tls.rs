//! The client side of Pinion's PKI: the credentials file the CLI and a joined
//! node read, the rustls configurations built from it (to call the server, and
//! for the node's own endpoint), the join token with its CA pin, and the
//! identity names certificates carry. Issuing certificates (the CA, rcgen)
//! stays in `orchestrator::tls`.
//!
//! Identity is the client certificate's common name: `admin`, `node:<name>`, or
//! the server's proxy identity.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use sha2::Digest;

pub const ADMIN_CN: &str = "admin";
pub const NODE_CN_PREFIX: &str = "node:";
/// The server's identity when it calls a nodelet (to proxy a pod's logs).
pub const PROXY_CN: &str = "pinion-server";

/// What both ends of a connection offer over ALPN, preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{what}: bad PEM: {reason}")]
    Pem { what: String, reason: String },
    #[error("{path}: not a credentials file: {source}")]
    Credentials { path: PathBuf, source: serde_yaml_ng::Error },
    #[error("join token: {0}")]
    Token(String),
    #[error("{what}: {reason}")]
    Certificate { what: String, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io { path: path.to_path_buf(), source }
}

/// A fresh join record (`JoinRequest::attempt`): 256 random bits in hex.
pub fn new_join_attempt() -> Result<String, TlsError> {
    // 256 bits: the record stands in for a token when the node joins again.
    let mut bytes = [0u8; 32];
    provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Token("no random numbers from the system".into()))?;
    Ok(hex(&bytes))
}

/// What a CLI (or a joined node) needs to reach the cluster: YAML, mode 0600.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "CredentialsFile")]
pub struct Credentials {
    /// `https://HOST:PORT` of each server of the cluster, tried in this
    /// order; never empty.
    pub servers: Vec<String>,
    pub ca_cert: String,
    pub client_cert: String,
    pub client_key: String,
}

/// The file as written: `servers`, or the one `server` of files written
/// before a cluster could have several.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CredentialsFile {
    server: Option<String>,
    servers: Option<Vec<String>>,
    ca_cert: String,
    client_cert: String,
    client_key: String,
}

impl TryFrom<CredentialsFile> for Credentials {
    type Error = String;

    fn try_from(f: CredentialsFile) -> Result<Credentials, String> {
        let servers = match (f.server, f.servers) {
            (Some(_), Some(_)) => return Err("give `servers` (a list) or the older `server`, not both".into()),
            (Some(one), None) => vec![one],
            (None, Some(list)) => list,
            (None, None) => return Err("missing field `servers` (the list of server URLs)".into()),
        };
        if servers.is_empty() {
            return Err("`servers` is empty: list at least one server URL".into());
        }
        if let Some(blank) = servers.iter().position(|s| s.trim().is_empty()) {
            return Err(format!("`servers[{blank}]` is empty"));
        }
        Ok(Credentials { servers, ca_cert: f.ca_cert, client_cert: f.client_cert, client_key: f.client_key })
    }
}

impl Credentials {
    pub fn load(path: &Path) -> Result<Credentials, TlsError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        Credentials::parse(&text).map_err(|source| TlsError::Credentials { path: path.to_path_buf(), source })
    }

    pub fn parse(text: &str) -> Result<Credentials, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(text)
    }

    /// `servers`, then those of `more` not in it: a list given on the command
    /// line first, what the file or the server knew after it.
    pub fn merge_servers(servers: &[String], more: &[String]) -> Vec<String> {
        let mut out = servers.to_vec();
        for s in more {
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
        out
    }

    pub fn save(&self, path: &Path) -> Result<(), TlsError> {
        let text = serde_yaml_ng::to_string(self)
            .map_err(|source| TlsError::Credentials { path: path.to_path_buf(), source })?;
        write_private(path, text.as_bytes())
    }

    /// A rustls client configuration that trusts only our CA and presents the cert.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_cert(&self.ca_cert, "caCert")?)?;
        let chain = vec![pem_cert(&self.client_cert, "clientCert")?];
        let key = pem_key(&self.client_key, "clientKey")?;
        Ok(rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?)
    }

    /// As `client_config`, presenting whatever `live` holds at each handshake.
    pub fn client_config_live(&self, live: Arc<LiveIdentity>) -> Result<rustls::ClientConfig, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_cert(&self.ca_cert, "caCert")?)?;
        Ok(rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_cert_resolver(live))
    }

    /// As `serving_config`, serving whatever `live` holds at each handshake.
    pub fn serving_config_live(&self, live: Arc<LiveIdentity>) -> Result<rustls::ServerConfig, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_cert(&self.ca_cert, "caCert")?)?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(live);
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// Two thirds into its certificate's life (`CertificateFacts::renew_at`):
    /// time to ask for the next one.
    pub fn renewal_due(&self, now: SystemTime) -> Result<bool, TlsError> {
        Ok(now >= CertificateFacts::from_pem(&self.client_cert, "clientCert")?.renew_at())
    }

    /// The nodelet's HTTPS endpoint: serves with the node certificate and
    /// requires a client certificate from our CA (the caller checks the name).
    pub fn serving_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_cert(&self.ca_cert, "caCert")?)?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![pem_cert(&self.client_cert, "clientCert")?, pem_cert(&self.ca_cert, "caCert")?],
                pem_key(&self.client_key, "clientKey")?,
            )?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// A certificate and key that can be replaced while in use: every new TLS
/// connection made or accepted with a configuration built on it presents the
/// current one, so a renewed certificate takes over without a restart (the
/// connections already open keep the one they were opened with).
#[derive(Debug)]
pub struct LiveIdentity {
    current: std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>,
}

impl LiveIdentity {
    pub fn new(creds: &Credentials) -> Result<Arc<LiveIdentity>, TlsError> {
        Ok(Arc::new(LiveIdentity { current: std::sync::RwLock::new(LiveIdentity::certified(creds)?) }))
    }

    /// From now on, new connections present `creds`' certificate.
    pub fn replace(&self, creds: &Credentials) -> Result<(), TlsError> {
        let next = LiveIdentity::certified(creds)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(())
    }

    fn current(&self) -> Arc<rustls::sign::CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The certificate with the CA after it (the node's endpoint serves the
    /// chain; as a client certificate the CA is an extra the verifier skips).
    fn certified(creds: &Credentials) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
        let chain = vec![pem_cert(&creds.client_cert, "clientCert")?, pem_cert(&creds.ca_cert, "caCert")?];
        let key = provider().key_provider.load_private_key(pem_key(&creds.client_key, "clientKey")?)?;
        Ok(Arc::new(rustls::sign::CertifiedKey::new(chain, key)))
    }
}

impl rustls::client::ResolvesClientCert for LiveIdentity {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for LiveIdentity {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }
}

pub fn pem_cert(pem: &str, what: &str) -> Result<CertificateDer<'static>, TlsError> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsError::Pem { what: what.to_string(), reason: e.to_string() })
}

pub fn pem_key(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsError::Pem { what: what.to_string(), reason: e.to_string() })
}

/// The one crypto provider (see the workspace's `Cargo.toml` for why ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Writes a secret atomically with mode 0600 (temp file, fsync, rename, fsync dir).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// What a certificate says about its holder and its life, read from its DER
/// bytes without checking its signature (rustls verified it, or the file is
/// our own): enough to name the caller and to know when to renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFacts {
    /// The subject's CN: `admin`, `node:NAME`, `user:NAME`.
    pub common_name: Option<String>,
    /// The subject's OrganizationalUnitName, if any: which incarnation of
    /// the identity holds it (for a node, its join claim), so that deleting
    /// and joining again makes earlier certificates useless.
    pub incarnation: Option<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl CertificateFacts {
    /// From one certificate's DER bytes; `what` names it in the error.
    pub fn parse(der: &[u8], what: &str) -> Result<CertificateFacts, TlsError> {
        let bad = |reason: String| TlsError::Certificate { what: what.to_string(), reason };
        let tbs = yasna::parse_der(der, |r| {
            r.read_sequence(|r| {
                let tbs = r.next().read_der()?;
                r.next().read_der()?; // signatureAlgorithm
                r.next().read_der()?; // signatureValue
                Ok(tbs)
            })
        })
        .map_err(|e| bad(format!("not an X.509 certificate: {e}")))?;
        let (validity, subject) = yasna::parse_der(&tbs, |r| {
            r.read_sequence(|r| {
                // [0] version, absent in a version 1 certificate.
                r.read_optional(|r| r.read_tagged(yasna::Tag::context(0), |r| r.read_der()))?;
                r.next().read_der()?; // serialNumber
                r.next().read_der()?; // signature
                r.next().read_der()?; // issuer
                let validity = r.next().read_sequence(|r| Ok((read_time(r.next())?, read_time(r.next())?)))?;
                let subject = r.next().read_der()?;
                // subjectPublicKeyInfo, the unique ids and the extensions.
                while r.read_optional(|r| r.read_der())?.is_some() {}
                Ok((validity, subject))
            })
        })
        .map_err(|e| bad(format!("unreadable tbsCertificate: {e}")))?;
        let (not_before, not_after) = validity;
        let (not_before, not_after) = match (not_before, not_after) {
            (Some(b), Some(a)) => (b, a),
            _ => return Err(bad("unreadable validity".into())),
        };
        let mut facts = CertificateFacts { common_name: None, incarnation: None, not_before, not_after };
        for (oid, value) in name_attributes(&subject).map_err(|e| bad(format!("unreadable subject: {e}")))? {
            if oid == [2, 5, 4, 3] {
                facts.common_name = Some(value);
            } else if oid == [2, 5, 4, 11] {
                facts.incarnation = Some(value);
            }
        }
        Ok(facts)
    }

    /// From a PEM text's first certificate.
    pub fn from_pem(pem: &str, what: &str) -> Result<CertificateFacts, TlsError> {
        CertificateFacts::parse(pem_cert(pem, what)?.as_ref(), what)
    }

    /// Two thirds into its life: when its holder asks for the next one (as
    /// the kubelet does), leaving a third of it for retries.
    pub fn renew_at(&self) -> SystemTime {
        let life = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_before + life * 2 / 3
    }
}

/// A `Time` (UTCTime or GeneralizedTime); `None` for one out of range.
fn read_time(r: yasna::BERReader<'_, '_>) -> yasna::ASN1Result<Option<SystemTime>> {
    let v = r.read_tagged_der()?;
    let at = match v.tag() {
        yasna::tags::TAG_UTCTIME => yasna::models::UTCTime::parse(v.value()).map(|t| t.datetime().unix_timestamp()),
        yasna::tags::TAG_GENERALIZEDTIME => {
            yasna::models::GeneralizedTime::parse(v.value()).map(|t| t.datetime().unix_timestamp())
        }
        _ => return Err(yasna::ASN1Error::new(yasna::ASN1ErrorKind::Invalid)),
    };
    let Some(secs) = at else { return Err(yasna::ASN1Error::new(yasna::ASN1ErrorKind::Invalid)) };
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    Ok(if secs >= 0 { UNIX_EPOCH.checked_add(magnitude) } else { UNIX_EPOCH.checked_sub(magnitude) })
}

/// A Name's attributes as (OID, text) pairs, in order; a value of any string
/// type is read as its bytes (lossily, as UTF-8).
fn name_attributes(name_der: &[u8]) -> yasna::ASN1Result<Vec<(Vec<u64>, String)>> {
    let mut out = Vec::new();
    yasna::parse_der(name_der, |r| {
        r.read_sequence_of(|r| {
            r.read_set_of(|r| {
                r.read_sequence(|r| {
                    let oid = r.next().read_oid()?;
                    let value = r.next().read_tagged_der()?;
                    out.push((oid.components().to_vec(), String::from_utf8_lossy(value.value()).into_owned()));
                    Ok(())
                })
            })
        })
    })?;
    Ok(out)
}

/// The subject's common name of a DER certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let ee = webpki::EndEntityCert::try_from(cert).ok()?;
    // webpki hands out the Name's contents; re-wrap them as a SEQUENCE for yasna.
    let content = ee.subject();
    let mut der = vec![0x30];
    der.extend(der_length(content.len()));
    der.extend_from_slice(content);
    let cn_oid = yasna::models::ObjectIdentifier::from_slice(&[2, 5, 4, 3]);
    let mut found = None;
    yasna::parse_der(&der, |r| {
        r.read_sequence_of(|r| {
            r.read_set_of(|r| {
                r.read_sequence(|r| {
                    let oid = r.next().read_oid()?;
                    let value = r.next().read_der()?;
                    if oid == cn_oid {
                        // Any string type: the value bytes after tag and length.
                        let s = yasna::parse_der(&value, |r| r.read_utf8string().or_else(|_| Ok(String::new())))
                            .ok()
                            .filter(|s| !s.is_empty())
                            .or_else(|| skip_header(&value).map(|b| String::from_utf8_lossy(b).into_owned()));
                        found = s;
                    }
                    Ok(())
                })
            })
        })
    })
    .ok()?;
    found
}

fn der_length(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
    let mut out = vec![0x80 | bytes.len() as u8];
    out.extend(bytes);
    out
}

/// The contents of a short-form or long-form DER value.
fn skip_header(v: &[u8]) -> Option<&[u8]> {
    let l = *v.get(1)?;
    if l < 0x80 {
        v.get(2..2 + l as usize)
    } else {
        let n = (l & 0x7f) as usize;
        let mut len = 0usize;
        for b in v.get(2..2 + n)? {
            len = (len << 8) | *b as usize;
        }
        v.get(2 + n..2 + n + len)
    }
}

/// The SHA-256 of a CA certificate's DER bytes: what a join token pins.
pub fn ca_pin(ca_pem: &str) -> Result<[u8; 32], TlsError> {
    let der = pem_cert(ca_pem, "CA certificate")?;
    Ok(sha2::Sha256::digest(der.as_ref()).into())
}

/// The hex SHA-256 of `bytes`: how a join token's secret is stored.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` random bytes from the provider's secure source, in hex: tokens,
/// secrets and session ids.
pub fn random_hex<const N: usize>() -> Result<String, String> {
    let mut buf = [0u8; N];
    provider().secure_random.fill(&mut buf).map_err(|e| format!("no secure random bytes: {e:?}"))?;
    Ok(hex(&buf))
}

/// A join token, `PIN.ID.SECRET`: PIN is the hex SHA-256 of the server's CA
/// certificate, so a machine given only the URL and the token can check the
/// server before it sends the secret (as kubeadm's `--discovery-token-ca-cert-hash`
/// and k3s's secure tokens do); ID names the token's record on the server
/// (`pinion token create` makes them). The bootstrap token of the first
/// start has no ID (`PIN.SECRET`). Without a pin (`ID.SECRET`, `SECRET`) a
/// token is accepted with `--ca`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub ca_pin: Option<[u8; 32]>,
    /// The record's id: 1 to 16 lowercase letters and digits.
    pub id: Option<String>,
    pub secret: String,
}

/// Whether `id` can be a token's id (and so never a 64-digit pin).
pub fn is_token_id(id: &str) -> bool {
    (1..=16).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl JoinToken {
    pub fn parse(text: &str) -> Result<JoinToken, TlsError> {
        let text = text.trim();
        let parts: Vec<&str> = text.split('.').collect();
        let (pin, id, secret) = match parts.as_slice() {
            [secret] => (None, None, *secret),
            [first, secret] if is_token_id(first) => (None, Some(*first), *secret),
            [pin, secret] => (Some(*pin), None, *secret),
            [pin, id, secret] => (Some(*pin), Some(*id), *secret),
            _ => return Err(TlsError::Token("a join token is PIN.ID.SECRET, PIN.SECRET or ID.SECRET".into())),
        };
        if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(TlsError::Token("the secret (after the last '.') must be letters and digits".into()));
        }
        if let Some(id) = id.filter(|id| !is_token_id(id)) {
            return Err(TlsError::Token(format!("the id {id:?} must be 1 to 16 lowercase letters and digits")));
        }
        let ca_pin = match pin {
            None => None,
            Some(p) => {
                let bytes: Vec<u8> = (0..p.len())
                    .step_by(2)
                    .map(|i| p.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                    .collect::<Option<_>>()
                    .filter(|b: &Vec<u8>| b.len() == 32 && p.len() == 64)
                    .ok_or_else(|| {
                        TlsError::Token("the part before the '.' must be the CA's SHA-256, 64 hex digits".into())
                    })?;
                let mut pin = [0u8; 32];
                pin.copy_from_slice(&bytes);
                Some(pin)
            }
        };
        Ok(JoinToken { ca_pin, id: id.map(str::to_string), secret: secret.to_string() })
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(pin) = &self.ca_pin {
            write!(f, "{}.", hex(pin))?;
        }
        if let Some(id) = &self.id {
            write!(f, "{id}.")?;
        }
        f.write_str(&self.secret)
    }
}

/// Verifies a server against the CA its own chain carries, once that CA's
/// hash matches the pin: trust on a known fingerprint, then ordinary WebPKI
/// checks (signature, validity, the server name).
#[derive(Debug)]
pub(crate) struct PinnedCa {
    pub(crate) pin: [u8; 32],
    pub(crate) provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| <[u8; 32]>::from(sha2::Sha256::digest(c.as_ref())) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the server's CA is not the one the join token pins (wrong server or token)".into(),
                )
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A credentials file with `servers_yaml` in place of its server lines:
    /// the servers it loads as, or the error's text.
    fn check(servers_yaml: &str, expected: Result<&[&str], &str>) {
        let text = format!("{servers_yaml}caCert: C\nclientCert: X\nclientKey: K\n");
        match (Credentials::parse(&text), expected) {
            (Ok(c), Ok(want)) => {
                assert_eq!(c.servers, want, "{servers_yaml}");
                // It is written back as the list, and reads back the same.
                let written = serde_yaml_ng::to_string(&c).expect("serialize");
                assert!(written.contains("servers:") && !written.contains("server:"), "{written}");
                assert_eq!(Credentials::parse(&written).expect("round trip"), c);
            }
            (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{servers_yaml}: {e}"),
            (got, want) => panic!("{servers_yaml}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn credentials_files_old_and_new_load_and_name_what_is_wrong() {
        check("server: https://a:1\n", Ok(&["https://a:1"]));
        check("servers: [https://a:1, https://b:2]\n", Ok(&["https://a:1", "https://b:2"]));
        check("servers:\n- https://a:1\n", Ok(&["https://a:1"]));
        check("", Err("missing field `servers`"));
        check("servers: []\n", Err("`servers` is empty"));
        check("servers: [https://a:1, '']\n", Err("`servers[1]` is empty"));
        check("server: https://a:1\nservers: [https://b:2]\n", Err("not both"));
        check("servers: https://a:1\n", Err("servers"));
        check("servers: [https://a:1]\nsurplus: 1\n", Err("surplus"));
    }

    #[test]
    fn merged_server_lists_keep_the_first_lists_order_and_no_duplicates() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Credentials::merge_servers(&l(&["b", "a"]), &l(&["a", "c", "b", "d"])), l(&["b", "a", "c", "d"]));
        assert_eq!(Credentials::merge_servers(&l(&["a"]), &[]), l(&["a"]));
    }

    /// A certificate with these subject attributes and validity (UTC dates).
    fn certificate(cn: Option<&str>, ou: Option<&str>, from: (i32, u8, u8), to: (i32, u8, u8)) -> String {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        let mut dn = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(rcgen::DnType::CommonName, cn);
        }
        if let Some(ou) = ou {
            dn.push(rcgen::DnType::OrganizationalUnitName, ou);
        }
        p.distinguished_name = dn;
        p.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        p.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        let key = rcgen::KeyPair::generate().expect("key");
        p.self_signed(&key).expect("sign").pem()
    }

    fn at(y: i32, m: u8, d: u8) -> SystemTime {
        let secs = rcgen::date_time_ymd(y, m, d).unix_timestamp();
        UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).expect("after 1970"))
    }

    #[test]
    fn certificate_facts_name_the_holder_its_incarnation_and_its_life() {
        let check = |cn: Option<&str>, ou: Option<&str>, from, to| {
            let pem = certificate(cn, ou, from, to);
            let facts = CertificateFacts::from_pem(&pem, "test").expect("parses");
            let want = CertificateFacts {
                common_name: cn.map(str::to_string),
                incarnation: ou.map(str::to_string),
                not_before: at(from.0, from.1, from.2),
                not_after: at(to.0, to.1, to.2),
            };
            assert_eq!(facts, want, "{cn:?} {ou:?}");
            // The common name reads the same through both readers.
            assert_eq!(common_name(&pem_cert(&pem, "test").expect("pem")), facts.common_name);
        };
        check(Some("node:edge-1"), Some("3f2a"), (2024, 1, 2), (2024, 2, 1));
        check(Some("user:alice"), None, (2024, 1, 2), (2025, 1, 2));
        check(Some("admin"), None, (1975, 1, 1), (4096, 1, 1)); // GeneralizedTime past 2049
        check(None, Some("x"), (2030, 6, 1), (2051, 6, 1)); // UTCTime, then GeneralizedTime
    }

    #[test]
    fn renewal_is_due_two_thirds_into_a_certificates_life() {
        let pem = certificate(Some("node:n"), None, (2024, 1, 1), (2024, 1, 31));
        let facts = CertificateFacts::from_pem(&pem, "test").expect("parses");
        assert_eq!(facts.renew_at(), at(2024, 1, 21));
    }

    #[test]
    fn what_is_not_a_certificate_is_named_not_parsed() {
        for (der, needle) in [(&b""[..], "not an X.509"), (&[0x30, 0x03, 0x02, 0x01, 0x01][..], "not an X.509")] {
            let e = CertificateFacts::parse(der, "clientCert").expect_err("garbage");
            assert!(e.to_string().starts_with("clientCert: ") && e.to_string().contains(needle), "{e}");
        }
        let e = CertificateFacts::from_pem("nothing", "clientCert").expect_err("no PEM");
        assert!(e.to_string().contains("clientCert"), "{e}");
    }

    #[test]
    fn join_tokens_parse_and_name_what_is_wrong() {
        let pin = "ab".repeat(32);
        for (text, ok) in [
            (format!("{pin}.s3cret"), Ok(true)),
            (format!("{pin}.ab12.s3cret"), Ok(true)),
            ("ab12.s3cret".to_string(), Ok(false)),
            ("s3cret\n".to_string(), Ok(false)),
            (format!("{pin}."), Err("the secret")),
            (format!("{pin}.AB.s3cret"), Err("lowercase")),
            (format!("{pin}.a.b.c"), Err("PIN.ID.SECRET")),
            ("ABC.s3cret".to_string(), Err("64 hex digits")),
            (format!("{}.s3cret", "zz".repeat(32)), Err("64 hex digits")),
            (format!("{pin}.a b"), Err("letters and digits")),
        ] {
            match (JoinToken::parse(&text), ok) {
                (Ok(t), Ok(has_pin)) => {
                    assert_eq!(t.ca_pin.is_some(), has_pin, "{text}");
                    assert_eq!(t.to_string(), text.trim(), "round trip");
                }
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{text}: {e}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
