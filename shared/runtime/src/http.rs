//! The operations listener: `/metrics` (Prometheus), `/healthz`, `/readyz`.
//!
//! Three fixed GET endpoints do not justify an HTTP framework's build time;
//! this reads one request line per connection and answers with `Connection:
//! close`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Binds the listener (so a taken port is a clear startup error) and serves
/// it on the current tokio runtime.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(address).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {address} for /metrics (--http-addr): {e}")
    })?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                let Ok(read) = socket.read(&mut buffer).await else {
                    return;
                };
                let request = String::from_utf8_lossy(&buffer[..read]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, content_type, body) = respond(path, &metrics);
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    }))
}

fn respond(path: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            metrics.snapshot().render(),
        ),
        "/healthz" if metrics.has_failed() => ("503 Service Unavailable", TEXT, "failed\n".into()),
        "/healthz" => ("200 OK", TEXT, "ok\n".into()),
        "/readyz" if metrics.is_ready() => ("200 OK", TEXT, "ready\n".into()),
        "/readyz" => (
            "503 Service Unavailable",
            TEXT,
            "restoring or not assigned\n".into(),
        ),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}
