//! The process's HTTP listeners on hyper: the operations endpoint here
//! (`/metrics` for Prometheus, `/healthz`, `/readyz`) and the query listener
//! ([`crate::query`]), both served by [`serve`].
//!
//! Each connection is an HTTP/1.1 connection of hyper's, kept alive between
//! requests, with a bounded request head that must arrive within
//! [`HEAD_TIMEOUT`]; a handler answers each request with a whole body.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_native_tls::TlsAcceptor;

use crate::metrics::Metrics;

/// How long a client may take to send a request head (and its TLS
/// handshake).
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// An answer of a listener: a whole body.
pub(crate) type Answer = Response<Full<Bytes>>;

/// An answer of `status` with `body` as `content_type`.
pub(crate) fn answer(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Answers every connection of `listener` on the current tokio runtime,
/// over TLS with `tls`, each request with `handle`.
pub(crate) fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handle: H,
) -> tokio::task::JoinHandle<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let tls = tls.map(Arc::new);
    tokio::spawn(async move {
        loop {
            let socket = match listener.accept().await {
                Ok((socket, _)) => socket,
                Err(error) => {
                    // Out of file descriptors, typically: wait rather than spin.
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (tls, handle) = (tls.clone(), handle.clone());
            tokio::spawn(async move {
                match tls {
                    None => answer_connection(socket, handle).await,
                    Some(tls) => {
                        let handshake = tokio::time::timeout(HEAD_TIMEOUT, tls.accept(socket));
                        if let Ok(Ok(socket)) = handshake.await {
                            answer_connection(socket, handle).await;
                        }
                    }
                }
            });
        }
    })
}

/// Answers the requests of one connection until the client closes it.
async fn answer_connection<S, H, F>(socket: S, handle: H)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let service = service_fn(move |request| {
        let answered = handle(request);
        async move { Ok::<_, std::convert::Infallible>(answered.await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(socket), service)
        .await;
}

/// Binds the operations listener (so a taken port is a clear startup
/// error) and serves it on the current tokio runtime.
pub async fn serve_operations(
    address: SocketAddr,
    metrics: Arc<Metrics>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(address).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {address} for /metrics (--http-addr): {e}")
    })?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    Ok(serve(listener, None, move |request: Request<Incoming>| {
        let answer = respond(request.uri().path(), &metrics);
        std::future::ready(answer)
    }))
}

fn respond(path: &str, metrics: &Metrics) -> Answer {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => answer(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.snapshot().render(),
        ),
        "/healthz" => match metrics.unhealthy() {
            Some(why) => answer(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
            None => answer(StatusCode::OK, TEXT, "ok\n".into()),
        },
        "/readyz" if metrics.is_ready() => answer(StatusCode::OK, TEXT, "ready\n".into()),
        "/readyz" => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "restoring or not assigned\n".into(),
        ),
        _ => answer(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
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
        let address: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let metrics = Arc::new(Metrics::default());
        let address = runtime.block_on(async {
            let listener = TcpListener::bind(address).await.unwrap();
            let address = listener.local_addr().unwrap();
            serve(listener, None, move |request: Request<Incoming>| {
                std::future::ready(respond(request.uri().path(), &metrics))
            });
            address
        });

        let answer = request_in_segments(
            address,
            &[
                "GET /hea",
                "lthz HTTP/1.1\r\nHost: x\r\n",
                "Connection: close\r\n\r\n",
            ],
        );
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");

        let answer = request_in_segments(address, &["GET /nowhere HTTP/1.0\r\n\r\n"]);
        assert!(answer.starts_with("HTTP/1.0 404"), "{answer}");
    }
}
