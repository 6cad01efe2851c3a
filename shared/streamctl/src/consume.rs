//! `streamctl consume`: Avro records out of a topic, as JSON lines or a table.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use streams_runtime::avro::{split_wire_format, Registry};
use streams_runtime::HumanDuration;

use crate::{table, Connection, Format};
use streams_runtime::avro::json::{format_line, write_value};

#[derive(Args)]
pub struct ConsumeArgs {
    /// Topic to read.
    #[arg(long)]
    topic: String,
    /// Start at the earliest offset instead of the end.
    #[arg(long)]
    from_beginning: bool,
    /// Exit after no record arrived for this long.
    #[arg(long)]
    idle_exit: Option<HumanDuration>,
    /// Exit after this many records.
    #[arg(long)]
    max: Option<usize>,
    /// Exit once every partition has been read up to its end as it was at
    /// start (for committed reads: up to the last committed record).
    #[arg(long)]
    until_end: bool,
    /// Output format; `table` prints once the command exits.
    #[arg(long, value_enum, default_value = "jsonl")]
    format: Format,
    /// Also show records of open or aborted transactions.
    #[arg(long)]
    read_uncommitted: bool,
    /// Add the record headers to each JSON line.
    #[arg(long)]
    headers: bool,
    /// Add each record's Kafka timestamp (milliseconds since the epoch) to
    /// its JSON line.
    #[arg(long)]
    timestamps: bool,
}

/// Decodes values with their writer schema, caching a reader per schema id.
struct ValueDecoder {
    registry: Registry,
    readers: HashMap<u32, GenericDatumReader<'static>>,
}

impl ValueDecoder {
    fn decode(&mut self, bytes: &[u8]) -> anyhow::Result<Value> {
        let (id, mut datum) = split_wire_format(bytes)?;
        if !self.readers.contains_key(&id) {
            let schema = self.registry.schema_by_id(id)?;
            let reader = GenericDatumReader::builder(schema)
                .build()
                .map_err(|e| anyhow::anyhow!("schema id {id}: {e}"))?;
            self.readers.insert(id, reader);
        }
        self.readers[&id]
            .read_value(&mut datum)
            .map_err(|e| anyhow::anyhow!("Avro: {e}"))
    }
}

pub fn run(connection: &Connection, args: ConsumeArgs) -> anyhow::Result<()> {
    let admin = connection.admin()?;
    let partitions = admin
        .partition_count(&args.topic)?
        .ok_or_else(|| anyhow::anyhow!("topic {} does not exist", args.topic))?;
    let mut config = connection.config.clone();
    config
        .set("group.id", "streamctl")
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if args.read_uncommitted {
                "read_uncommitted"
            } else {
                "read_committed"
            },
        );
    if args.until_end {
        // Report each partition's end, and do not let the broker hold a
        // fetch back waiting for more data that is not wanted.
        config
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "10");
    }
    let consumer: BaseConsumer = config.create()?;
    let start = if args.from_beginning {
        Offset::Beginning
    } else {
        Offset::End
    };
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment.add_partition_offset(&args.topic, partition as i32, start)?;
    }
    consumer.assign(&assignment)?;

    let mut decoder = ValueDecoder {
        registry: connection.registry()?,
        readers: HashMap::new(),
    };
    let mut rows: Vec<(Option<String>, Value)> = Vec::new();
    let mut seen = 0usize;
    let mut last_record = Instant::now();
    let mut ends = if args.until_end {
        end_offsets(&consumer, &args.topic, partitions)?
    } else {
        HashMap::new()
    };
    loop {
        if args.max.is_some_and(|max| seen >= max) {
            break;
        }
        if args.until_end && ends.is_empty() {
            break;
        }
        if args
            .idle_exit
            .is_some_and(|idle| last_record.elapsed() >= idle.as_std())
        {
            break;
        }
        let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = match polled {
            Err(rdkafka::error::KafkaError::PartitionEOF(partition)) => {
                if reached_end(&consumer, &args.topic, partition, &ends)? {
                    ends.remove(&partition);
                }
                continue;
            }
            other => other.map_err(|e| anyhow::anyhow!("consuming {}: {e}", args.topic))?,
        };
        last_record = Instant::now();
        seen += 1;
        let key = message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned());
        let decoded = match message.payload() {
            Some(payload) => decoder.decode(payload),
            None => Ok(Value::Null),
        };
        match args.format {
            Format::Table => match decoded {
                Ok(value) => rows.push((key, value)),
                Err(error) => eprintln!("offset {}: undecodable value: {error}", message.offset()),
            },
            Format::Jsonl => {
                let mut line = match &decoded {
                    Ok(value) => format_line(key.as_deref(), value),
                    Err(error) => {
                        let raw = String::from_utf8_lossy(message.payload().unwrap_or_default());
                        let mut line = format_line(key.as_deref(), &Value::Null);
                        line.pop();
                        line.push_str(&format!(
                            ", \"undecodable\": {}, \"raw\": {}}}",
                            serde_json::Value::String(error.to_string()),
                            serde_json::Value::String(raw.into_owned())
                        ));
                        line
                    }
                };
                if args.headers {
                    line.pop();
                    let mut fields = Vec::new();
                    if let Some(headers) = message.headers() {
                        for header in headers.iter() {
                            let value = header
                                .value
                                .map(|v| String::from_utf8_lossy(v).into_owned());
                            let mut text = String::new();
                            write_value(&mut text, &value.map_or(Value::Null, Value::String));
                            fields.push(format!(
                                "{}: {text}",
                                serde_json::Value::String(header.key.to_string())
                            ));
                        }
                    }
                    line.push_str(&format!(", \"headers\": {{{}}}}}", fields.join(", ")));
                }
                if args.timestamps {
                    line.pop();
                    let timestamp = message.timestamp().to_millis();
                    line.push_str(&format!(
                        ", \"timestamp\": {}}}",
                        timestamp.map_or("null".to_string(), |ms| ms.to_string())
                    ));
                }
                println!("{line}");
            }
        }
    }
    if args.format == Format::Table {
        print!("{}", table::render(&rows));
    }
    Ok(())
}

/// The end offset of every partition of `topic` that holds records now.
fn end_offsets(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: usize,
) -> anyhow::Result<HashMap<i32, i64>> {
    let mut ends = HashMap::new();
    // A broker that is restarting or moving leaders answers with transient
    // errors for a while: retry those for up to a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    for partition in 0..partitions as i32 {
        let (low, high) = loop {
            match consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)) {
                Ok(watermarks) => break watermarks,
                Err(error) if Instant::now() < deadline => {
                    eprintln!("end offsets of {topic}: {error}; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(error) => anyhow::bail!("end offsets of {topic}: {error}"),
            }
        };
        if high > low {
            ends.insert(partition, high);
        }
    }
    Ok(ends)
}

/// Whether the consumer's position in `partition` has reached its end as
/// noted at start (transaction markers included).
fn reached_end(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    ends: &HashMap<i32, i64>,
) -> anyhow::Result<bool> {
    let Some(end) = ends.get(&partition) else {
        return Ok(true);
    };
    let position = consumer.position()?;
    Ok(matches!(
        position.find_partition(topic, partition).map(|e| e.offset()),
        Some(Offset::Offset(offset)) if offset >= *end
    ))
}
