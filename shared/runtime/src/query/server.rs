//! The query listener: parsing a request, answering it from a local task,
//! forwarding it to the owner, or fanning a range out over every task.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_native_tls::TlsAcceptor;

use super::peers::{Peer, Peers};
use super::read::{Selection, Snapshot};
use super::{QueryToken, QueryableStage};
use crate::http;
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
/// How long a forwarded query may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a query is answered with.
pub(crate) struct QueryServer {
    pub application_id: String,
    pub stages: Vec<QueryableStage>,
    pub open_stores: Arc<OpenStores>,
    pub peers: Arc<Peers>,
    pub token: Option<QueryToken>,
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
}

impl Request {
    fn parse<B>(request: &hyper::Request<B>) -> Self {
        let uri = request.uri();
        let segments = (uri.path().split('/'))
            .filter(|segment| !segment.is_empty())
            .map(|segment| {
                percent_encoding::percent_decode_str(segment)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        let params = form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
        let headers = request.headers();
        Request {
            segments,
            target: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), ToString::to_string),
            params,
            authorization: (headers.get(hyper::header::AUTHORIZATION))
                .and_then(|value| value.to_str().ok())
                .map(|value| value.trim().to_string()),
            hop: headers.contains_key(HOP_HEADER),
        }
    }
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
    Ok(http::serve(listener, tls, move |request| {
        let server = server.clone();
        async move { server.respond(request).await }
    }))
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
    /// Answers one request: a GET within `--query-max-concurrent`, or its
    /// refusal.
    async fn respond(self: Arc<Self>, request: hyper::Request<Incoming>) -> http::Answer {
        let answer = if request.method() != Method::GET {
            Answer::error(405, "only GET is served")
        } else {
            match self.permits.clone().try_acquire_owned() {
                Ok(_answering) => self.answer(&Request::parse(&request)).await,
                Err(_) => Answer::error(
                    429,
                    format!(
                        "more than {} queries at once (--query-max-concurrent)",
                        self.max_concurrent
                    ),
                ),
            }
        };
        let status =
            StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = http::answer(status, "application/json", answer.body.to_string());
        let headers = response.headers_mut();
        match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            StatusCode::UNAUTHORIZED => {
                headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }

    async fn answer(self: &Arc<Self>, request: &Request) -> Answer {
        if let Some(token) = &self.token {
            let token = token.get();
            let presented =
                (request.authorization.as_deref()).and_then(|value| value.strip_prefix("Bearer "));
            if !presented.is_some_and(|presented| same_secret(presented, &token)) {
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
        let answers = join_all(asks).await;
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
            forwarded = forwarded.bearer_auth(token.get());
        }
        let response = forwarded.send().await?;
        let status = response.status().as_u16();
        let body = serde_json::from_slice(&response.bytes().await?)?;
        Ok(Answer { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_gives_its_path_parameters_and_headers() {
        let request = Request::parse(
            &hyper::Request::get("/stores/main/sessions/keys/user%201?max_lag=5&standby=allow")
                .header("Authorization", "Bearer t0k")
                .header("X-Streams-Query-Hop", "1")
                .body(())
                .unwrap(),
        );
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
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
