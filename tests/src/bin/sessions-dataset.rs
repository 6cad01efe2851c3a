//! Generated sessionizer input and the sessions the model expects of it, as
//! JSON lines in the format of `tests/fixtures/`: for runs outside `cargo
//! test` that need more than the fixture (`make k8s-test`).

use std::fs;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use e2e_tests::sessions::generate;
use serde_json::Value;

/// Writes random users' events (time-ordered, each user ending with a
/// far-future event that closes what is open) and the expected sessions.
#[derive(Parser)]
struct Args {
    /// Users, each with one to --max-events events.
    #[arg(long, default_value_t = 3_000)]
    users: usize,
    #[arg(long, default_value_t = 9)]
    max_events: usize,
    /// The first event's time, epoch milliseconds.
    #[arg(long, default_value_t = 1_783_345_153_000)]
    base: i64,
    /// Where the `user-events` lines go.
    events: PathBuf,
    /// Where the expected `user-sessions` lines go.
    sessions: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (events, sessions) = generate(args.users, args.max_events, args.base);
    write_lines(&args.events, &events)?;
    write_lines(&args.sessions, &sessions)?;
    eprintln!("{} events, {} sessions", events.len(), sessions.len());
    Ok(())
}

fn write_lines(path: &PathBuf, lines: &[Value]) -> anyhow::Result<()> {
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
