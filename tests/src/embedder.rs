//! A fake OpenAI-compatible `/v1/embeddings` endpoint for embed-batcher's
//! end-to-end tests: it answers every input with the vector `[0.25, 0.5]`,
//! after holding the request until released, or after a fixed delay, and
//! counts the requests received and in flight.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

/// Dimensions of the vectors the fake answers with.
pub const DIMENSIONS: usize = 2;

/// The endpoint's behaviour and counts, shared with its connections.
#[derive(Clone, Default)]
pub struct FakeEmbedder {
    /// Requests wait until this is set.
    pub released: Arc<AtomicBool>,
    /// How long each request takes once released.
    delay: Duration,
    pub received: Arc<AtomicUsize>,
    pub in_flight: Arc<AtomicUsize>,
    pub most_in_flight: Arc<AtomicUsize>,
}

impl FakeEmbedder {
    /// Holds every request until [`FakeEmbedder::released`] is set.
    pub fn held() -> Self {
        FakeEmbedder::default()
    }

    /// Answers every request after `delay`.
    pub fn slow(delay: Duration) -> Self {
        let embedder = FakeEmbedder {
            delay,
            ..FakeEmbedder::default()
        };
        embedder.released.store(true, Ordering::SeqCst);
        embedder
    }

    /// Serves on a free port of 127.0.0.1, which it returns.
    pub fn serve(&self) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let this = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let this = this.clone();
                std::thread::spawn(move || this.answer(stream));
            }
        });
        port
    }

    fn answer(&self, stream: TcpStream) -> Option<()> {
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).ok()?;
            let header = header.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(value) = header.strip_prefix("content-length:") {
                length = value.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        let request: Value = serde_json::from_slice(&body).ok()?;
        self.received.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        while !self.released.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(self.delay);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let data: Vec<Value> = request["input"]
            .as_array()?
            .iter()
            .enumerate()
            .map(|(index, _)| json!({"object": "embedding", "index": index, "embedding": [0.25, 0.5]}))
            .collect();
        let answer = json!({"object": "list", "data": data}).to_string();
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .ok()
    }
}
