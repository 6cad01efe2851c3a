//! `querygen`: interactive-query load (docs/queries.md). `--connections`
//! clients each ask for random keys with plain HTTP/1.1 `GET`s, each client
//! on one kept-alive connection (or, with `--connection-per-query`, a new
//! connection per query, as a client without a connection pool does), for
//! `--seconds`: as fast as the answers come, or at a total `--rate`. Prints
//! one JSON object: queries per second, answers by status, and latency
//! percentiles.
//!
//! At a fixed rate, query `i` is due at `i / rate` seconds from the start and
//! its latency counts from then if it is sent late because its client was
//! still waiting for the answer before: a server that stalls delays the
//! queries behind it, and their wait is counted (no coordinated omission).
//! Only the timer's own lateness (it wakes on the next millisecond) is not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_loadgen::procfs;
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser)]
#[command(name = "querygen", about = "Interactive-query load generator")]
struct Args {
    /// The query listener, host:port (`--query-addr` of the service).
    #[arg(long)]
    addr: String,
    /// The request path, `{}` standing for a key number: e.g.
    /// `/stores/main/sessions/keys/user-{}`.
    #[arg(long)]
    path: String,
    /// Key numbers are drawn uniformly from `0..keys`.
    #[arg(long)]
    keys: u64,
    /// Clients, each with one connection at a time.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    #[arg(long)]
    seconds: f64,
    /// Queries per second, all clients together; 0: as fast as answered.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Opens a new connection for every query (`Connection: close`)
    /// instead of keeping one alive per client.
    #[arg(long)]
    connection_per_query: bool,
}

/// What one client saw.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    statuses: BTreeMap<u16, u64>,
    /// 200 answers whose value was null: a key with no state.
    null_values: u64,
    /// Connections refused or cut before an answer.
    failures: u64,
    first_failure: Option<String>,
}

/// When the run's queries are due.
struct Schedule {
    start: Instant,
    end: Instant,
    rate: f64,
    next: AtomicU64,
}

impl Schedule {
    /// The next query's due time, `None` once the run is over. Without a
    /// rate a query is due when its client is free.
    fn next_due(&self) -> Option<Instant> {
        let due = if self.rate > 0.0 {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            self.start + Duration::from_secs_f64(index as f64 / self.rate)
        } else {
            Instant::now()
        };
        (due < self.end).then_some(due)
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.path.contains("{}"), "--path needs a {{}} for the key");
    anyhow::ensure!(
        args.keys > 0 && args.connections > 0,
        "--keys and --connections must be positive"
    );
    // One thread: the client takes at most one of the cores it shares with
    // the service under test.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cpu_before = procfs::cpu_seconds(std::process::id());
    let start = Instant::now();
    let schedule = Arc::new(Schedule {
        start,
        end: start + Duration::from_secs_f64(args.seconds),
        rate: args.rate,
        next: AtomicU64::new(0),
    });
    let (prefix, suffix) = args.path.split_once("{}").expect("checked above");
    let tallies = runtime.block_on(async {
        let clients: Vec<_> = (0..args.connections)
            .map(|client| {
                let (schedule, addr) = (schedule.clone(), args.addr.clone());
                let (prefix, suffix) = (prefix.to_string(), suffix.to_string());
                let rng = StdRng::seed_from_u64(args.seed.wrapping_add(client as u64));
                let keep_alive = !args.connection_per_query;
                tokio::spawn(run_client(
                    schedule, addr, prefix, suffix, args.keys, rng, keep_alive,
                ))
            })
            .collect();
        let mut tallies = Vec::new();
        for client in clients {
            tallies.push(client.await?);
        }
        anyhow::Ok(tallies)
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = procfs::cpu_seconds(std::process::id())
        .zip(cpu_before)
        .map(|(after, before)| after - before);

    let mut all = Tally::default();
    for tally in tallies {
        all.latencies_us.extend(tally.latencies_us);
        for (status, count) in tally.statuses {
            *all.statuses.entry(status).or_default() += count;
        }
        all.null_values += tally.null_values;
        all.failures += tally.failures;
        all.first_failure = all.first_failure.or(tally.first_failure);
    }
    all.latencies_us.sort_unstable();
    let percentile = |p: f64| -> Option<f64> {
        let n = all.latencies_us.len();
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1;
        all.latencies_us.get(rank).map(|&us| us as f64 / 1000.0)
    };
    let answered = all.latencies_us.len() as u64;
    let ok = all.statuses.get(&200).copied().unwrap_or(0);
    let statuses: serde_json::Map<_, _> = (all.statuses.iter())
        .map(|(status, count)| (status.to_string(), json!(count)))
        .collect();
    println!(
        "{}",
        json!({
            "connections": args.connections,
            "keep_alive": !args.connection_per_query,
            "rate": args.rate,
            "seconds": elapsed,
            "answered": answered,
            "ok": ok,
            "qps": answered as f64 / elapsed,
            "ok_qps": ok as f64 / elapsed,
            "null_values": all.null_values,
            "statuses": statuses,
            "failures": all.failures,
            "first_failure": all.first_failure,
            "p50_ms": percentile(0.50),
            "p90_ms": percentile(0.90),
            "p99_ms": percentile(0.99),
            "max_ms": all.latencies_us.last().map(|&us| us as f64 / 1000.0),
            "client_cpu_s": cpu,
        })
    );
    Ok(())
}

async fn run_client(
    schedule: Arc<Schedule>,
    addr: String,
    prefix: String,
    suffix: String,
    keys: u64,
    mut rng: StdRng,
    keep_alive: bool,
) -> Tally {
    let mut tally = Tally::default();
    let mut answer = Vec::with_capacity(4096);
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut open: Option<TcpStream> = None;
    while let Some(due) = schedule.next_due() {
        // A query sent late because the one before it was slow counts from
        // when it was due; one sent late only by the timer (which wakes on
        // the next millisecond) counts from when it was sent.
        let start = if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
            Instant::now()
        } else {
            due
        };
        let key = rng.random_range(0..keys);
        let request = format!(
            "GET {prefix}{key}{suffix} HTTP/1.1\r\nHost: {addr}\r\nConnection: {connection}\r\n\r\n"
        );
        answer.clear();
        let asked = match open.take() {
            Some(stream) => Ok(stream),
            None => connect(&addr).await,
        };
        let asked = match asked {
            Ok(mut stream) => ask(&mut stream, request.as_bytes(), &mut answer, keep_alive)
                .await
                .map(|(status, reusable)| {
                    if reusable {
                        open = Some(stream);
                    }
                    status
                }),
            Err(error) => Err(error),
        };
        match asked {
            Ok(status) => {
                let micros = start.elapsed().as_micros().min(u32::MAX as u128) as u32;
                tally.latencies_us.push(micros);
                *tally.statuses.entry(status).or_default() += 1;
                if status == 200 && contains(&answer, b"\"value\":null") {
                    tally.null_values += 1;
                }
            }
            Err(error) => {
                tally.failures += 1;
                tally.first_failure.get_or_insert(error.to_string());
                // A refused connection fails at once: not a busy loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

async fn connect(addr: &str) -> anyhow::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends `request` on `stream` and reads its answer: to the connection's
/// end, or with `keep_alive` to the end of its `Content-Length`. Returns
/// the status and whether the server left the connection open.
async fn ask(
    stream: &mut TcpStream,
    request: &[u8],
    answer: &mut Vec<u8>,
    keep_alive: bool,
) -> anyhow::Result<(u16, bool)> {
    stream.write_all(request).await?;
    let reusable = if keep_alive {
        read_one_answer(stream, answer).await?
    } else {
        stream.read_to_end(answer).await?;
        false
    };
    let status = answer
        .strip_prefix(b"HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| std::str::from_utf8(code).ok()?.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP answer ({} bytes)", answer.len()))?;
    Ok((status, reusable))
}

/// Reads one answer's head and its `Content-Length` bytes of body; returns
/// whether the server keeps the connection (no `Connection: close`).
async fn read_one_answer(stream: &mut TcpStream, answer: &mut Vec<u8>) -> anyhow::Result<bool> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = find(answer, b"\r\n\r\n") {
            break at + 4;
        }
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "connection closed before an answer");
        answer.extend_from_slice(&chunk[..read]);
    };
    let head = std::str::from_utf8(&answer[..head_end])?.to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let length: usize = header("content-length")
        .ok_or_else(|| anyhow::anyhow!("an answer without Content-Length"))?
        .parse()?;
    let reusable = header("connection") != Some("close");
    while answer.len() < head_end + length {
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "connection closed inside an answer");
        answer.extend_from_slice(&chunk[..read]);
    }
    Ok(reusable)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}
