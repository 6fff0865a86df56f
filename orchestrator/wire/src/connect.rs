//! The connector behind the pooled client: TCP, then TLS with a fixed server
//! name (the URL's host, or the node's name for the server's proxy), telling
//! the pool when ALPN chose HTTP/2 so that one connection carries every request.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use specs::api::Liveness;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

#[derive(Clone)]
pub(crate) struct TlsConnect {
    pub(crate) tls: tokio_rustls::TlsConnector,
    pub(crate) server_name: ServerName<'static>,
    pub(crate) timeout: Duration,
    pub(crate) liveness: Liveness,
}

/// TCP keepalive on a connection (both ends set it: the server's listener,
/// the nodelet's endpoint, this connector): probes after a heartbeat of
/// quiet, so a NAT keeps the flow and a peer that is gone is noticed by the
/// kernel. The kernel counts in whole seconds.
pub fn keep_alive(tcp: &TcpStream, liveness: &Liveness) {
    let every = liveness.heartbeat.max(Duration::from_secs(1));
    let params = socket2::TcpKeepalive::new().with_time(every).with_interval(every).with_retries(Liveness::MISSED);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&params) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// One TLS connection as the pool holds it.
pub(crate) struct TlsConn(TokioIo<TlsStream<TcpStream>>);

impl tower_service::Service<Uri> for TlsConnect {
    type Response = TlsConn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConn, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addr = uri
                .authority()
                .map(|a| a.as_str().to_string())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
            let timed_out = |what: &str| io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out"));
            let tcp = tokio::time::timeout(this.timeout, TcpStream::connect(&addr))
                .await
                .map_err(|_| timed_out("connecting"))??;
            let _ = tcp.set_nodelay(true);
            keep_alive(&tcp, &this.liveness);
            let tls = tokio::time::timeout(this.timeout, this.tls.connect(this.server_name.clone(), tcp))
                .await
                .map_err(|_| timed_out("the TLS handshake"))??;
            Ok(TlsConn(TokioIo::new(tls)))
        })
    }
}

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        let (_, session) = self.0.inner().get_ref();
        if session.alpn_protocol() == Some(b"h2") {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl hyper::rt::Read for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}
