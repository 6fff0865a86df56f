//! A real server for in-process tests (this crate's API tests, the node
//! daemon's): 127.0.0.1:0, real TLS, a real sled store in the test's folder,
//! the admin's client, and nodes that join it.

use std::path::Path;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::server::{Server, ServerError, ServerOptions};
use crate::tls::Credentials;
use pinion_wire::Client;

pub struct TestServer {
    pub url: String,
    /// Where the server listens.
    pub addr: std::net::SocketAddr,
    /// The local listener's address, when the options asked for one.
    pub local: Option<std::net::SocketAddr>,
    pub token: String,
    /// The admin's credentials.
    pub creds: Credentials,
    pub admin: Client,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl TestServer {
    /// Starts a server on `dir`, its options as `configure` leaves them.
    pub async fn start(dir: &Path, configure: impl FnOnce(&mut ServerOptions)) -> TestServer {
        let mut opts = ServerOptions::new(dir, "127.0.0.1:0");
        configure(&mut opts);
        let server = Server::bind(opts).await.expect("bind the server");
        let url = server.server_url();
        let addr = server.local_addr();
        let local = server.local_listen_addr();
        let token = server.join_token.to_string();
        let creds = Credentials::load(&server.admin_config).expect("admin config");
        assert_eq!(creds.servers, std::slice::from_ref(&url));
        let admin = Client::new(&creds).expect("admin client");
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(server.run(rx));
        TestServer { url, addr, local, token, creds, admin, stop, task }
    }

    /// Stops the server; it must end without an error.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("the server task").expect("the server stops cleanly");
    }

    /// A client with no identity that trusts the server's CA (in `dir/pki`).
    pub fn anonymous(&self, dir: &Path) -> Client {
        let ca = std::fs::read_to_string(dir.join("pki/ca.crt")).expect("ca");
        Client::anonymous(std::slice::from_ref(&self.url), &ca).expect("anonymous client")
    }

    /// Joins `name` with the server's token: the node's credentials.
    pub async fn join(&self, dir: &Path, name: &str) -> Credentials {
        let joined = self.anonymous(dir).join(&self.token, name, None).await.expect("join");
        Credentials {
            servers: vec![self.url.clone()],
            ca_cert: joined.ca_cert,
            client_cert: joined.client_cert,
            client_key: joined.client_key,
        }
    }

    /// A joined node's client.
    pub async fn node_client(&self, dir: &Path, name: &str) -> Client {
        Client::new(&self.join(dir, name).await).expect("node client")
    }

    /// A person of `role` the admin added: their client.
    pub async fn person(&self, name: &str, role: specs::api::Role) -> Client {
        // From its wire form: every field but the role has its default.
        let wire = serde_json::json!({"apiVersion": specs::pod::API_VERSION, "kind": "User", "metadata": {"name": name}, "spec": {"role": role}});
        let user: specs::api::User = serde_json::from_value(wire).expect("a user");
        let added = self.admin.add_user(&user).await.expect("add the person");
        let creds = Credentials {
            servers: vec![self.url.clone()],
            ca_cert: added.ca_cert,
            client_cert: added.client_cert,
            client_key: added.client_key,
        };
        Client::new(&creds).expect("the person's client")
    }
}
