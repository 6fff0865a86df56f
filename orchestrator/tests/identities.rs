//! Identities that expire and can be taken back (issue 27), through the real
//! API: join tokens with a lifetime and uses, renewal of a certificate for
//! the same identity, and a node's join record that joins it again.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use pinion_wire::tls::{CertificateFacts, Credentials};
use pinion_wire::{Client, ClientError};
use specs::api::{List, Renewed, Token, TokenCreated, TokenRequest};

/// The refusal's code and message.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api(e)) => (e.code, e.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn create_token(client: &Client, request: &TokenRequest) -> Result<TokenCreated, ClientError> {
    let body = Bytes::from(serde_json::to_vec(request).expect("encode"));
    Ok(client.call::<TokenCreated>(Method::POST, "/api/v1/tokens", Some(("application/json", body))).await?.1)
}

fn record(n: char) -> String {
    n.to_string().repeat(64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_tokens_expire_run_out_and_are_revoked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let anon = s.anonymous(dir.path());

    let once = create_token(&s.admin, &TokenRequest { uses: Some(1), ..Default::default() }).await.expect("create");
    assert!(once.token.split('.').count() == 3, "PIN.ID.SECRET: {}", once.token);
    anon.join(&once.token, "n1", Some(&record('a'))).await.expect("the single use");
    let (code, message) = refusal(anon.join(&once.token, "n2", Some(&record('b'))).await);
    assert_eq!((code, message.contains("no uses left")), (401, true), "{message}");

    let short =
        create_token(&s.admin, &TokenRequest { ttl_seconds: Some(1), ..Default::default() }).await.expect("ttl");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (code, message) = refusal(anon.join(&short.token, "n2", Some(&record('b'))).await);
    assert_eq!((code, message.contains("expired at")), (401, true), "{message}");

    let gone = create_token(&s.admin, &TokenRequest::default()).await.expect("create");
    let id = gone.record.metadata.name.clone();
    s.admin.call::<Token>(Method::DELETE, &format!("/api/v1/tokens/{id}"), None).await.expect("revoke");
    let (code, message) = refusal(anon.join(&gone.token, "n2", Some(&record('b'))).await);
    assert_eq!((code, message.contains("was revoked")), (401, true), "{message}");

    // Listed without secrets; only the admin lists or makes them.
    let (_, list): (u16, List<Token>) = s.admin.call(Method::GET, "/api/v1/tokens", None).await.expect("list");
    assert_eq!(list.items.len(), 4, "three made and the bootstrap one");
    assert!(list.items.iter().all(|t| t.spec.secret_sha256.is_empty()));
    let node = Client::new(&s.join(dir.path(), "n3").await).expect("node client");
    assert_eq!(refusal(node.call::<List<Token>>(Method::GET, "/api/v1/tokens", None).await).0, 403);
    assert_eq!(refusal(create_token(&node, &TokenRequest::default()).await).0, 403);

    // The bootstrap token, revoked, stays revoked across a restart.
    s.admin.call::<Token>(Method::DELETE, "/api/v1/tokens/bootstrap", None).await.expect("revoke bootstrap");
    let token = s.token.clone();
    s.stop().await;
    let s = TestServer::start(dir.path(), |_| {}).await;
    let (code, message) = refusal(s.anonymous(dir.path()).join(&token, "n4", Some(&record('d'))).await);
    assert_eq!((code, message.contains("was revoked")), (401, true), "{message}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_past_its_lifetime_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.join_token_ttl = Some(Duration::from_secs(1))).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (code, message) = refusal(s.anonymous(dir.path()).join(&s.token, "n1", Some(&record('a'))).await);
    assert_eq!((code, message.contains("expired at")), (401, true), "{message}");
    s.stop().await;
}

async fn joined(s: &TestServer, dir: &Path, name: &str, record: &str) -> Credentials {
    let j = s.anonymous(dir).join(&s.token, name, Some(record)).await.expect("join");
    Credentials {
        servers: vec![s.url.clone()],
        ca_cert: j.ca_cert,
        client_cert: j.client_cert,
        client_key: j.client_key,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renews_for_the_same_identity_until_the_node_is_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.lifetimes.node = Duration::from_secs(3600)).await;
    let creds = joined(&s, dir.path(), "n1", &record('a')).await;
    let first = CertificateFacts::from_pem(&creds.client_cert, "joined").expect("facts");
    assert_eq!(first.common_name.as_deref(), Some("node:n1"));
    assert!(first.incarnation.is_some(), "a node's certificate carries its join's incarnation");
    assert_eq!(first.not_after.duration_since(first.not_before).expect("ordered"), Duration::from_secs(2 * 3600));

    let node = Client::new(&creds).expect("client");
    let (_, renewed): (u16, Renewed) = node.call(Method::POST, "/api/v1/renew", None).await.expect("renew");
    let second = CertificateFacts::from_pem(&renewed.client_cert, "renewed").expect("facts");
    assert_eq!((&second.common_name, &second.incarnation), (&first.common_name, &first.incarnation));
    assert!(second.not_after >= first.not_after);
    let renewed = Credentials { client_cert: renewed.client_cert, client_key: renewed.client_key, ..creds.clone() };
    let node2 = Client::new(&renewed).expect("client");
    node2.list_pods(None).await.expect("the renewed certificate works");

    // The admin renews too (the CLI does, two thirds into admin.conf's life).
    let (_, admin): (u16, Renewed) = s.admin.call(Method::POST, "/api/v1/renew", None).await.expect("admin renews");
    assert_eq!(admin.common_name, "admin");

    // The join record joins again, without a token, as the same incarnation.
    let again = s.anonymous(dir.path()).join("", "n1", Some(&record('a'))).await.expect("join record");
    let third = CertificateFacts::from_pem(&again.client_cert, "again").expect("facts");
    assert_eq!(third.incarnation, first.incarnation);
    let (code, _) = refusal(s.anonymous(dir.path()).join("", "n1", Some(&record('b'))).await);
    assert_eq!(code, 401, "another record without a token");

    // Deleted: the old certificate renews nothing, and joining again (same
    // record, with a token) is another incarnation.
    s.admin.delete_node("n1").await.expect("delete");
    let (code, message) = refusal(node2.call::<Renewed>(Method::POST, "/api/v1/renew", None).await);
    assert_eq!(code, 401, "{message}");
    let reborn = joined(&s, dir.path(), "n1", &record('a')).await;
    let fourth = CertificateFacts::from_pem(&reborn.client_cert, "reborn").expect("facts");
    assert_ne!(fourth.incarnation, first.incarnation);
    let (code, _) = refusal(node2.call::<Renewed>(Method::POST, "/api/v1/renew", None).await);
    assert_eq!(code, 401, "an earlier join's certificate renews nothing after a new join");
    s.stop().await;
}
