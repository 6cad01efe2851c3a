//! `streamctl produce`: JSON lines in, Avro records out, all or nothing.
//!
//! Every line is parsed and checked against the schema *before* anything is
//! sent, so a malformed line fails the command with its line number and no
//! record at all is written: fixing the file and running again duplicates
//! nothing. The records are then written in one Kafka transaction, so a
//! failure half-way leaves nothing visible to read_committed consumers either.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use clap::Args;
use streams_runtime::avro::{leak_schema, AvroEncoder};
use streams_runtime::delivery::{Delivery, Outgoing, UNTRACKED};

use crate::{read_schema, Connection};
use streams_runtime::avro::json::{parse_line, parse_raw_line, Line, RawLine};

#[derive(Args)]
pub struct ProduceArgs {
    /// Topic to write to.
    #[arg(long)]
    topic: String,
    /// Avro schema (.avsc) of the values; registered under `<topic>-value`.
    #[arg(long, required_unless_present = "raw")]
    schema: Option<PathBuf>,
    /// Send each value (a JSON string) as plain bytes, not Avro: for testing
    /// how consumers treat bad input.
    #[arg(long, conflicts_with = "schema")]
    raw: bool,
    /// JSON lines file; standard input when absent or `-`.
    #[arg(long)]
    file: Option<PathBuf>,
}

/// How values are turned into bytes.
enum Encoding {
    Avro {
        path: PathBuf,
        json: String,
        schema: &'static apache_avro::Schema,
    },
    Raw,
}

pub fn run(connection: &Connection, args: ProduceArgs) -> anyhow::Result<()> {
    let encoding = match &args.schema {
        Some(path) => {
            let json = read_schema(path)?;
            let schema =
                leak_schema(&json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Encoding::Avro {
                path: path.clone(),
                json,
                schema,
            }
        }
        None => Encoding::Raw,
    };
    let input: Box<dyn Read> = match &args.file {
        Some(path) if path.as_os_str() != "-" => Box::new(
            std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?,
        ),
        _ => Box::new(std::io::stdin()),
    };
    let source = args
        .file
        .as_ref()
        .map_or("<stdin>".to_string(), |p| p.display().to_string());
    let mut lines: Vec<Line> = Vec::new();
    let mut raw_lines: Vec<RawLine> = Vec::new();
    for (index, text) in BufReader::new(input).lines().enumerate() {
        let number = index + 1;
        let text =
            text.map_err(|e| anyhow::anyhow!("{source}: line {number}: cannot read: {e}"))?;
        if text.trim().is_empty() {
            continue;
        }
        let parsed = match &encoding {
            Encoding::Avro { schema, .. } => parse_line(&text, schema).map(|line| lines.push(line)),
            Encoding::Raw => parse_raw_line(&text).map(|line| raw_lines.push(line)),
        };
        parsed
            .map_err(|e| anyhow::anyhow!("{source}: line {number}: {e}; nothing was produced"))?;
    }

    let admin = connection.admin()?;
    let exists = admin
        .partition_count(&args.topic)
        .map_err(|e| anyhow::anyhow!("{e:#}; nothing was produced"))?
        .is_some();
    anyhow::ensure!(
        exists,
        "topic {} does not exist (create it with `streamctl topics create`)",
        args.topic
    );
    if let Encoding::Avro { path, json, schema } = &encoding {
        let subject = format!("{}-value", args.topic);
        let schema_id = connection
            .registry()?
            .register(&subject, json)
            .map_err(|e| {
                anyhow::anyhow!(
                    "the schema registry refused {} for subject {subject}: {e}",
                    path.display()
                )
            })?;
        let encoder = AvroEncoder::new(schema, schema_id)?;
        let mut payload = Vec::with_capacity(256);
        for line in lines {
            encoder.encode_value(line.value, &mut payload)?;
            raw_lines.push(RawLine {
                key: line.key,
                value: Some(std::mem::take(&mut payload)),
            });
        }
    }

    let transactional_id = format!(
        "streamctl-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    );
    let mut delivery = Delivery::new(connection.config.clone(), Some(&transactional_id), None)?;
    for line in &raw_lines {
        delivery.send(Outgoing {
            topic: &args.topic,
            partition: None,
            key: line.key.as_deref().map(str::as_bytes),
            payload: line.value.as_deref(),
            headers: None,
            tag: UNTRACKED,
        });
    }
    let everything = delivery.seal();
    delivery
        .commit(
            everything,
            &rdkafka::TopicPartitionList::new(),
            None,
            &mut streams_runtime::metrics::PhaseTimes::default(),
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "producing to {} failed, nothing was committed: {e}",
                args.topic
            )
        })?;
    eprintln!("produced {} records to {}", raw_lines.len(), args.topic);
    Ok(())
}
