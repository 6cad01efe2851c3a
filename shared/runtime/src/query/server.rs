//! The query listener: parsing a request, answering it from a local task,
//! forwarding it to the owner, or fanning a range out over every task.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_native_tls::TlsAcceptor;

use super::peers::{Peer, Peers};
use super::read::{Selection, Snapshot};
use super::QueryableStage;
use crate::partitioner::murmur2_partition;
use crate::processor::StoreShape;
use crate::state::open_stores::{OpenStores, StoreRole};

/// Marks a query forwarded by another instance: answered here or not at all.
pub const HOP_HEADER: &str = "x-streams-query-hop";
/// What a client is told to wait before asking again, in seconds.
const RETRY_AFTER_SECONDS: u32 = 1;
/// Entries per task a range query returns unless it says `limit=`.
const DEFAULT_LIMIT: usize = 1_000;
const MAX_LIMIT: usize = 100_000;
/// How long a client may take to send its first request head (and its TLS
/// handshake).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a kept-alive connection may wait for its next request.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// The longest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a forwarded query may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a query is answered with.
pub(crate) struct QueryServer {
    pub application_id: String,
    pub stages: Vec<QueryableStage>,
    pub open_stores: Arc<OpenStores>,
    pub peers: Arc<Peers>,
    pub token: Option<String>,
    pub client: reqwest::Client,
    /// One per query being answered, `max_concurrent` in all.
    pub permits: Arc<tokio::sync::Semaphore>,
    pub max_concurrent: usize,
}

/// An answer: status, body, and whether to say `Retry-After`.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn ok(body: Value) -> Self {
        Answer { status: 200, body }
    }
    fn error(status: u16, message: impl Into<String>) -> Self {
        Answer {
            status,
            body: json!({"error": message.into()}),
        }
    }
    /// 503: not answerable here now; asking again shortly will do.
    fn unavailable(message: impl Into<String>) -> Self {
        Answer::error(503, message)
    }
}

/// A parsed request.
struct Request {
    segments: Vec<String>,
    /// The path and query as received, for forwarding.
    target: String,
    params: HashMap<String, String>,
    authorization: Option<String>,
    hop: bool,
    /// HTTP/1.1 without `Connection: close`.
    keep_alive: bool,
}

fn parse_request(head: &str) -> Option<(String, Request)> {
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let method = first.next()?.to_string();
    let target = first.next()?.to_string();
    let mut keep_alive = first.next() == Some("HTTP/1.1");
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let segments = path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .map(|segment| {
            percent_encoding::percent_decode_str(segment)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let params = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let mut authorization = None;
    let mut hop = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "authorization" => authorization = Some(value.trim().to_string()),
            HOP_HEADER => hop = true,
            "connection" => keep_alive &= !value.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    Some((
        method,
        Request {
            segments,
            target,
            params,
            authorization,
            hop,
            keep_alive,
        },
    ))
}

/// Binds the query listener (a taken port is a clear startup error) and
/// serves it on the current tokio runtime, over TLS with `tls`.
pub(crate) async fn serve(
    address: SocketAddr,
    tls: Option<TlsAcceptor>,
    server: Arc<QueryServer>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(address).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {address} for queries (--query-addr): {e}")
    })?;
    tracing::info!(%address, tls = tls.is_some(), "serving interactive queries");
    let tls = tls.map(Arc::new);
    Ok(tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((socket, _)) => {
                    let (server, tls) = (server.clone(), tls.clone());
                    tokio::spawn(async move {
                        match tls {
                            None => answer_connection(socket, server).await,
                            Some(tls) => {
                                let handshake = tls.accept(socket);
                                if let Ok(Ok(socket)) =
                                    tokio::time::timeout(HEAD_TIMEOUT, handshake).await
                                {
                                    answer_connection(socket, server).await;
                                }
                            }
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a query connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }))
}

/// Answers the requests of one connection, kept alive between them (a
/// client asking many queries, or another instance forwarding them, pays
/// for one connection, not one per query) until the client closes it,
/// says `Connection: close`, or stays idle for [`KEEP_ALIVE`].
async fn answer_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut socket: S,
    server: Arc<QueryServer>,
) {
    let mut buffer = Vec::with_capacity(4096);
    let mut wait = HEAD_TIMEOUT;
    loop {
        let Ok(Ok(Some(end))) =
            tokio::time::timeout(wait, read_request_head(&mut socket, &mut buffer)).await
        else {
            return;
        };
        wait = KEEP_ALIVE;
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        // Whatever follows the head is the start of the next request.
        buffer.drain(..end);
        let (answer, keep_alive) = match parse_request(&head) {
            None => (Answer::error(400, "malformed request"), false),
            Some((method, request)) if method != "GET" => {
                let keep_alive = request.keep_alive;
                (Answer::error(405, "only GET is served"), keep_alive)
            }
            Some((_, request)) => {
                let answer = match server.permits.clone().try_acquire_owned() {
                    Ok(_answering) => server.answer(&request).await,
                    Err(_) => Answer::error(
                        429,
                        format!(
                            "more than {} queries at once (--query-max-concurrent)",
                            server.max_concurrent
                        ),
                    ),
                };
                (answer, request.keep_alive)
            }
        };
        let body = answer.body.to_string();
        let reason = match answer.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            429 => "Too Many Requests",
            503 => "Service Unavailable",
            _ => "Error",
        };
        let extra = match answer.status {
            429 | 503 => format!("Retry-After: {RETRY_AFTER_SECONDS}\r\n"),
            401 => "WWW-Authenticate: Bearer\r\n".to_string(),
            _ => String::new(),
        };
        let connection = if keep_alive { "keep-alive" } else { "close" };
        let response = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
            answer.status,
            body.len()
        );
        if socket.write_all(response.as_bytes()).await.is_err() || !keep_alive {
            return;
        }
    }
}

/// Reads into `buffer` (which may already hold the start of it) until it
/// holds a whole request head; returns the head's length, or `None` when
/// the client closed the connection or sent a head too long.
async fn read_request_head<S: AsyncRead + Unpin>(
    socket: &mut S,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<usize>> {
    let mut searched: usize = 0;
    loop {
        let from = searched.saturating_sub(3);
        if let Some(at) = buffer[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some(from + at + 4));
        }
        searched = buffer.len();
        if buffer.len() >= MAX_HEAD_BYTES {
            return Ok(None);
        }
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await? {
            0 => return Ok(None),
            read => buffer.extend_from_slice(&chunk[..read]),
        }
    }
}

/// Compares without stopping at the first difference, so that the time an
/// answer takes tells nothing about the token.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// One query, parsed.
#[derive(Clone, Copy)]
struct Ask<'a> {
    request: &'a Request,
    stage: &'a QueryableStage,
    /// The store's index among the stage's queryable stores.
    store: usize,
    selection: &'a Selection,
    bounds: &'a Bounds,
}

/// A query's options on consistency.
struct Bounds {
    min_position: Option<i64>,
    max_lag: Option<i64>,
    standby: bool,
}

impl QueryServer {
    async fn answer(self: &Arc<Self>, request: &Request) -> Answer {
        if let Some(token) = &self.token {
            let presented =
                (request.authorization.as_deref()).and_then(|value| value.strip_prefix("Bearer "));
            if !presented.is_some_and(|presented| same_secret(presented, token)) {
                return Answer::error(401, "a bearer token is required");
            }
        }
        let segments: Vec<&str> = request.segments.iter().map(String::as_str).collect();
        match segments.as_slice() {
            ["stores"] => Answer::ok(self.catalog()),
            ["stores", stage, store, rest @ ..] => match self.find(stage, store) {
                Some((stage, spec)) => self.query(request, stage, spec, rest).await,
                None => Answer::error(404, format!("no store {store} in stage {stage}")),
            },
            _ => Answer::error(404, "not found; GET /stores lists the stores"),
        }
    }

    fn catalog(&self) -> Value {
        let stores: Vec<Value> = (self.stages.iter())
            .flat_map(|stage| {
                stage.stores.iter().map(move |(spec, _, changelog)| {
                    let (kind, windowed) = match spec.shape {
                        StoreShape::Value => ("value", false),
                        StoreShape::Map { timed, .. } => ("map", timed),
                    };
                    json!({
                        "stage": stage.name,
                        "store": spec.name,
                        "kind": kind,
                        "windowed": windowed,
                        "changelog": changelog,
                        "partitions": stage.group.tasks,
                    })
                })
            })
            .collect();
        json!({"application_id": self.application_id, "stores": stores})
    }

    fn find(&self, stage: &str, store: &str) -> Option<(&QueryableStage, usize)> {
        let stage = self.stages.iter().find(|s| s.name == stage)?;
        let index = stage
            .stores
            .iter()
            .position(|(spec, _, _)| spec.name == store)?;
        Some((stage, index))
    }

    async fn query(
        self: &Arc<Self>,
        request: &Request,
        stage: &QueryableStage,
        store: usize,
        rest: &[&str],
    ) -> Answer {
        let number = |name: &str| -> Result<Option<i64>, Answer> {
            match request.params.get(name) {
                None => Ok(None),
                Some(text) => text.parse().map(Some).map_err(|_| {
                    Answer::error(400, format!("{name} must be an integer, not {text:?}"))
                }),
            }
        };
        let parsed = (|| {
            let bounds = Bounds {
                min_position: number("min_position")?,
                max_lag: number("max_lag")?,
                standby: request.params.get("standby").is_some_and(|v| v == "allow"),
            };
            // The key in the path, or as `?key=` (an empty key, say).
            let param_key = || request.params.get("key").cloned();
            let (selection, partition) = match rest {
                ["keys", key] => (Selection::Key(key.to_string()), None),
                ["keys"] if param_key().is_some() => (Selection::Key(param_key().unwrap()), None),
                ["keys", key, "windows"] => (
                    Selection::Windows {
                        key: key.to_string(),
                        from: number("from")?.unwrap_or(i64::MIN),
                        to: number("to")?.unwrap_or(i64::MAX),
                    },
                    None,
                ),
                ["windows"] if param_key().is_some() => (
                    Selection::Windows {
                        key: param_key().unwrap(),
                        from: number("from")?.unwrap_or(i64::MIN),
                        to: number("to")?.unwrap_or(i64::MAX),
                    },
                    None,
                ),
                ["range"] => {
                    let limit = number("limit")?.map_or(DEFAULT_LIMIT, |l| l.max(1) as usize);
                    let partition = number("partition")?;
                    if partition.is_some_and(|p| p < 0 || p >= stage.group.tasks as i64) {
                        return Err(Answer::error(400, "no such partition"));
                    }
                    let selection = Selection::Range {
                        from: request.params.get("from").cloned(),
                        to: request.params.get("to").cloned(),
                        prefix: request.params.get("prefix").cloned(),
                        limit: limit.min(MAX_LIMIT),
                    };
                    (selection, partition.map(|p| p as i32))
                }
                _ => return Err(Answer::error(404, "not found; see docs/queries.md")),
            };
            Ok((bounds, selection, partition))
        })();
        let (bounds, selection, partition) = match parsed {
            Ok(parsed) => parsed,
            Err(answer) => return answer,
        };
        let ask = Ask {
            request,
            stage,
            store,
            selection: &selection,
            bounds: &bounds,
        };
        let task = match (&selection, partition) {
            (Selection::Key(key) | Selection::Windows { key, .. }, _) => {
                murmur2_partition(key.as_bytes(), stage.group.tasks)
            }
            (Selection::Range { .. }, Some(task)) => task,
            (Selection::Range { .. }, None) => return self.every_task_answer(&ask).await,
        };
        let mut answer = self.task_answer(&ask, &request.target, task).await;
        if let (200, Selection::Key(key) | Selection::Windows { key, .. }) =
            (answer.status, &selection)
        {
            answer.body["key"] = key.as_str().into();
        }
        answer
    }

    /// A range query's answers from every task, gathered; a 503 if any
    /// task could not answer.
    async fn every_task_answer(self: &Arc<Self>, ask: &Ask<'_>) -> Answer {
        let target = &ask.request.target;
        let separator = if target.contains('?') { '&' } else { '?' };
        let asks = (0..ask.stage.group.tasks as i32).map(|task| {
            let target = format!("{target}{separator}partition={task}");
            async move { self.task_answer(ask, &target, task).await }
        });
        let answers = futures_join_all(asks).await;
        let complete = answers.iter().all(|answer| answer.status == 200);
        let partitions: Vec<Value> = answers
            .into_iter()
            .enumerate()
            .map(|(task, answer)| match answer.status {
                200 => answer.body,
                status => {
                    json!({"partition": task, "status": status, "error": answer.body["error"]})
                }
            })
            .collect();
        let body = json!({
            "stage": ask.stage.name,
            "store": ask.stage.stores[ask.store].0.name,
            "partitions": partitions,
        });
        match complete {
            true => Answer::ok(body),
            false => Answer {
                status: 503,
                body: json!({"error": "not every partition could answer", "answer": body}),
            },
        }
    }

    /// The answer of task `task` to `ask`: from here, or from the instance
    /// that has it (asked for `target`).
    async fn task_answer(self: &Arc<Self>, ask: &Ask<'_>, target: &str, task: i32) -> Answer {
        let Ask {
            request,
            stage,
            store,
            selection,
            bounds,
        } = *ask;
        if let Some(answer) = self
            .local_answer(stage, store, task, selection, bounds)
            .await
        {
            return answer;
        }
        if request.hop {
            return Answer::unavailable(format!("partition {task} is not served here (moved?)"));
        }
        let owner = self.peers.owner(&stage.group, task);
        let mut candidates: Vec<Peer> = owner.iter().cloned().collect();
        if bounds.standby {
            candidates.extend(self.peers.standbys(&stage.group, task));
        }
        candidates.retain(|peer| peer.instance != stage.group.instance);
        if owner
            .as_ref()
            .is_some_and(|o| o.instance == stage.group.instance)
            && !bounds.standby
        {
            return Answer::unavailable(format!("partition {task} is being restored here"));
        }
        if candidates.is_empty() {
            return Answer::unavailable(format!(
                "no instance serves partition {task} now (rebalancing, restoring or starting)"
            ));
        }
        let mut last = None;
        for peer in candidates {
            match self.forward(&peer, target).await {
                Ok(answer) if answer.status == 200 => return answer,
                Ok(answer) => last = Some(answer),
                Err(error) => {
                    last = Some(Answer::unavailable(format!(
                        "the instance serving partition {task} ({}) did not answer: {error}",
                        peer.instance
                    )))
                }
            }
        }
        last.expect("at least one candidate was asked")
    }

    /// The answer from this process's copy of task `task`, if it has one it
    /// may answer from.
    async fn local_answer(
        &self,
        stage: &QueryableStage,
        store: usize,
        task: i32,
        selection: &Selection,
        bounds: &Bounds,
    ) -> Option<Answer> {
        let open = self
            .open_stores
            .get(&stage.state_dir.join(format!("task-{task}")))?;
        let role = open.role();
        let allowed = role == StoreRole::Active || (role == StoreRole::Standby && bounds.standby);
        if !allowed {
            return None;
        }
        let db = open.db()?;
        let (spec, index, changelog) = stage.stores[store].clone();
        let point = matches!(
            (spec.shape, selection),
            (StoreShape::Value, Selection::Key(_))
        );
        let selection = selection.clone();
        let read = move || {
            let snapshot = Snapshot::new(&db, spec.name)?;
            let position = snapshot.position()?;
            let body = snapshot.read(spec.shape, &selection)?;
            anyhow::Ok((position, body))
        };
        // A point read takes microseconds from the block cache: handing it
        // to another thread and back would cost more than the read. Scans
        // go to the blocking pool, off the runtime's one worker.
        let read = if point {
            Ok(read())
        } else {
            tokio::task::spawn_blocking(read).await
        };
        let (position, mut body) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => return Some(Answer::error(500, format!("{error:#}"))),
            Err(error) => return Some(Answer::error(500, error.to_string())),
        };
        let reached = position.unwrap_or(-1);
        // Unknown while nothing was committed or seen since the task opened
        // (its restore brought it to the changelog's end).
        let lag = open
            .known_end(index)
            .map_or(0, |end| (end - reached).max(0));
        if bounds.min_position.is_some_and(|min| reached < min) {
            return Some(Answer::unavailable(format!(
                "partition {task} is at position {reached}, below min_position"
            )));
        }
        if bounds.max_lag.is_some_and(|max| lag > max) {
            return Some(Answer::unavailable(format!(
                "partition {task} lags by {lag}, more than max_lag"
            )));
        }
        body["stage"] = stage.name.as_str().into();
        body["store"] = spec.name.into();
        body["partition"] = task.into();
        body["position"] = json!({"changelog": changelog, "offset": position});
        body["lag"] = lag.into();
        body["served_by"] = json!({
            "instance": stage.group.instance,
            "role": if role == StoreRole::Active { "active" } else { "standby" },
        });
        Some(Answer::ok(body))
    }

    /// Asks `peer` the query at `target`, marked as forwarded.
    async fn forward(&self, peer: &Peer, target: &str) -> anyhow::Result<Answer> {
        let mut forwarded = self
            .client
            .get(format!("{}{target}", peer.url))
            .header(HOP_HEADER, "1")
            .timeout(FORWARD_TIMEOUT);
        if let Some(token) = &self.token {
            forwarded = forwarded.bearer_auth(token);
        }
        let response = forwarded.send().await?;
        let status = response.status().as_u16();
        let body = serde_json::from_slice(&response.bytes().await?)?;
        Ok(Answer { status, body })
    }
}

/// Awaits every future of `futures`, concurrently, in order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut done = true;
        for (future, result) in pending.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(output) => *result = Some(output),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results.into_iter().map(Option::unwrap).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_gives_its_path_parameters_and_headers() {
        let (method, request) = parse_request(
            "GET /stores/main/sessions/keys/user%201?max_lag=5&standby=allow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\nX-Streams-Query-Hop: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(method, "GET");
        assert_eq!(
            request.segments,
            ["stores", "main", "sessions", "keys", "user 1"]
        );
        assert_eq!(request.params["max_lag"], "5");
        assert_eq!(request.params["standby"], "allow");
        assert_eq!(request.authorization.as_deref(), Some("Bearer t0k"));
        assert!(request.hop);
        assert_eq!(
            request.target,
            "/stores/main/sessions/keys/user%201?max_lag=5&standby=allow"
        );
    }

    #[test]
    fn a_connection_is_kept_alive_unless_the_client_says_close() {
        let keep = |head: &str| parse_request(head).unwrap().1.keep_alive;
        assert!(keep("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!keep("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
        assert!(!keep("GET / HTTP/1.0\r\n\r\n"));
    }

    #[test]
    fn request_heads_are_read_one_at_a_time_from_what_arrives() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut client, mut server) = tokio::io::duplex(1024);
            let first = "GET /a HTTP/1.1\r\n\r\n";
            let second = "GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
            // Both heads in one write, the second split across two.
            client.write_all(first.as_bytes()).await.unwrap();
            client.write_all(&second.as_bytes()[..10]).await.unwrap();
            let mut buffer = Vec::new();
            let end = read_request_head(&mut server, &mut buffer).await.unwrap();
            assert_eq!(end, Some(first.len()));
            buffer.drain(..first.len());
            client.write_all(&second.as_bytes()[10..]).await.unwrap();
            let end = read_request_head(&mut server, &mut buffer).await.unwrap();
            assert_eq!(&buffer[..end.unwrap()], second.as_bytes());
            buffer.clear();
            drop(client);
            assert_eq!(
                read_request_head(&mut server, &mut buffer).await.unwrap(),
                None
            );
        });
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
