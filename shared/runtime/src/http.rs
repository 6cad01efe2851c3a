//! The operations listener: `/metrics` (Prometheus), `/healthz`, `/readyz`.
//!
//! Three fixed GET endpoints do not justify an HTTP framework's build time;
//! this reads one request line per connection and answers with `Connection:
//! close`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
    Ok(tokio::spawn(answer_connections(listener, metrics)))
}

/// Answers each connection of `listener` in its own task.
async fn answer_connections(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let mut socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(error) => {
                // Out of file descriptors, typically: wait rather than spin.
                tracing::warn!(%error, "cannot accept an HTTP connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            let Ok(Ok(read)) =
                tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut socket, &mut buffer)).await
            else {
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
}

/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the request head (up to the blank line) into `buffer` and returns
/// its length. A request arrives in as many segments as the client wrote it
/// in; answering after the first one would misread the path, and closing a
/// socket with unread bytes makes the kernel reset the connection before the
/// client has read the answer.
async fn read_head(socket: &mut TcpStream, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() && !buffer[..filled].windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buffer[filled..]).await? {
            0 => break,
            read => filled += read,
        }
    }
    Ok(filled)
}

fn respond(path: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            metrics.snapshot().render(),
        ),
        "/healthz" => match metrics.unhealthy() {
            Some(why) => ("503 Service Unavailable", TEXT, format!("{why}\n")),
            None => ("200 OK", TEXT, "ok\n".into()),
        },
        "/readyz" if metrics.is_ready() => ("200 OK", TEXT, "ready\n".into()),
        "/readyz" => (
            "503 Service Unavailable",
            TEXT,
            "restoring or not assigned\n".into(),
        ),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Sends `segments` with pauses between them, as a slow or preempted
    /// client would, and returns the whole answer.
    fn request_in_segments(address: SocketAddr, segments: &[&str]) -> String {
        let mut client = std::net::TcpStream::connect(address).unwrap();
        for segment in segments {
            client.write_all(segment.as_bytes()).unwrap();
            client.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn a_request_split_across_segments_is_answered_whole() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let address = listener.local_addr().unwrap();
        runtime.spawn(answer_connections(listener, Arc::new(Metrics::default())));

        let answer = request_in_segments(
            address,
            &[
                "GET /hea",
                "lthz HTTP/1.1\r\nHost: x\r\n",
                "Accept: */*\r\n\r\n",
            ],
        );
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");

        let answer = request_in_segments(address, &["GET /nowhere HTTP/1.1\r\n\r\n"]);
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    }
}
