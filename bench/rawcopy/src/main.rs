//! `rawcopy`: the physical limit of a stream processor on this stack.
//!
//! Consumes a use case's input topics, decodes every value into its typed
//! record (Confluent wire format, writer schema from the registry, as the
//! services do), encodes it again and produces it, keyed as it came, to one
//! output topic per input. Same client settings as the services: the
//! consumer of `shared/runtime` (read_committed, range assignment, manual
//! commits) and its producer (`streams_runtime::delivery::Delivery`:
//! idempotent, lz4, linger 5 ms (1 ms at-least-once), murmur2 partitioning); under
//! `exactly_once_v2` outputs and input offsets commit in one transaction every
//! `--commit-interval` (100 ms), under `at_least_once` outputs are flushed,
//! then offsets committed synchronously. No state, no timers, no watermarks:
//! whatever a service spends beyond this is its processing.
//!
//! `--repartition-through TOPIC` (order-shipment-joiner only) moves the bytes
//! the joiner moves instead of copying each input: the orders are read and
//! decoded but not written (the joiner keeps them in state), the shipments
//! are re-keyed by order id into `TOPIC` (the wire-format bytes unchanged,
//! as the joiner's `shipments-by-order` repartition topic), read back by the
//! same consumer in the same transactions, decoded and written as one row per
//! shipment to the second output. That copy is the joiner's ceiling.
//!
//! Runs until killed.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bench_loadgen::kafka::Cluster;
use bench_loadgen::records::{
    HumidityReading, MarketplaceOrder, Order, Shipment, TemperatureReading, UserEvent,
};
use bench_loadgen::UseCase;
use clap::Parser;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::{Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use serde::Serialize;
use streams_runtime::avro::{leak_schema, AvroDecoder, AvroEncoder, Registry};
use streams_runtime::config::ProcessingGuarantee;
use streams_runtime::delivery::{Delivery, Outgoing, UNTRACKED};
use streams_runtime::metrics::PhaseTimes;
use streams_runtime::HumanDuration;

#[derive(Parser)]
#[command(
    name = "rawcopy",
    about = "Consume, decode, encode, produce: the physical limit"
)]
struct Args {
    #[command(flatten)]
    cluster: Cluster,
    #[arg(long, value_enum)]
    use_case: UseCase,
    /// Input topics, in the use case's order.
    #[arg(long, value_delimiter = ',', required = true)]
    inputs: Vec<String>,
    /// One output topic per input.
    #[arg(long, value_delimiter = ',', required = true)]
    outputs: Vec<String>,
    /// Consumer group and transactional id prefix.
    #[arg(long)]
    application_id: String,
    #[arg(long, value_enum, default_value = "exactly_once_v2")]
    processing_guarantee: ProcessingGuarantee,
    #[arg(long, default_value = "100ms")]
    commit_interval: HumanDuration,
    /// order-shipment-joiner only: re-key the shipments by order id through
    /// this topic (which must exist) and copy them from there; the orders
    /// are decoded and not written.
    #[arg(long)]
    repartition_through: Option<String>,
}

/// Where a consumed record goes.
#[derive(Clone, Copy)]
enum Route {
    /// Decoded, encoded and written to this output.
    Copy(usize),
    /// Decoded and dropped (the joiner's orders, which it keeps in state).
    Decode(usize),
    /// Decoded for its new key and forwarded unchanged to the repartition topic.
    Rekey,
}

/// Decodes one input's values and encodes them for its output.
trait Lane {
    fn copy(&mut self, registry: &Registry, bytes: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()>;
    /// Decodes only, as a service decodes what it keeps in state.
    fn decode(&mut self, registry: &Registry, bytes: &[u8]) -> anyhow::Result<()>;
}

struct TypedLane<T> {
    decoder: AvroDecoder<T>,
    encoder: AvroEncoder,
}

impl<T: DeserializeOwned + Serialize> Lane for TypedLane<T> {
    fn copy(&mut self, registry: &Registry, bytes: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        let record = self
            .decoder
            .decode(registry, bytes, &|| false)
            .map_err(|e| anyhow::anyhow!("undecodable input: {e}"))?;
        out.clear();
        self.encoder.append_to(&record, out)
    }

    fn decode(&mut self, registry: &Registry, bytes: &[u8]) -> anyhow::Result<()> {
        self.decoder
            .decode(registry, bytes, &|| false)
            .map_err(|e| anyhow::anyhow!("undecodable input: {e}"))?;
        Ok(())
    }
}

fn lane<T: DeserializeOwned + Serialize + 'static>(
    registry: &Registry,
    schema: &str,
    output: &str,
) -> anyhow::Result<Box<dyn Lane>> {
    let schema_ref = leak_schema(schema)?;
    let id = registry
        .register(&format!("{output}-value"), schema)
        .map_err(|e| anyhow::anyhow!("registering the schema of {output}: {e}"))?;
    Ok(Box::new(TypedLane::<T> {
        decoder: AvroDecoder::new(schema_ref),
        encoder: AvroEncoder::new(schema_ref, id)?,
    }))
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rawcopy: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let schemas = args.use_case.input_schemas();
    anyhow::ensure!(
        args.inputs.len() == schemas.len() && args.outputs.len() == schemas.len(),
        "{} takes {} inputs and as many outputs",
        args.use_case.name(),
        schemas.len()
    );
    let runtime = bench_loadgen::kafka::runtime()?;
    let registry = args.cluster.registry(&runtime)?;
    let mut lanes: Vec<Box<dyn Lane>> = Vec::new();
    for (index, output) in args.outputs.iter().enumerate() {
        let schema = schemas[index];
        lanes.push(match (args.use_case, index) {
            (UseCase::Sessionizer, _) => lane::<UserEvent>(&registry, schema, output)?,
            (UseCase::OrderShipmentJoiner, 0) => lane::<Order>(&registry, schema, output)?,
            (UseCase::OrderShipmentJoiner, _) => lane::<Shipment>(&registry, schema, output)?,
            (UseCase::SensorFusion, 0) => lane::<TemperatureReading>(&registry, schema, output)?,
            (UseCase::SensorFusion, _) => lane::<HumidityReading>(&registry, schema, output)?,
            (UseCase::WindowAggregator, _) => lane::<MarketplaceOrder>(&registry, schema, output)?,
        });
    }

    // Every subscribed topic's route, and the re-keying decoder of the joiner
    // shape (the joiner decodes a shipment for its key, then again after the
    // repartition topic).
    let mut topics: Vec<&str> = args.inputs.iter().map(String::as_str).collect();
    let mut routes: Vec<Route> = (0..topics.len()).map(Route::Copy).collect();
    let mut rekey = None;
    if let Some(through) = &args.repartition_through {
        anyhow::ensure!(
            args.use_case == UseCase::OrderShipmentJoiner,
            "--repartition-through is the joiner's shape: order-shipment-joiner only"
        );
        routes = vec![Route::Decode(0), Route::Rekey, Route::Copy(1)];
        topics.push(through);
        rekey = Some(AvroDecoder::<Shipment>::new(leak_schema(schemas[1])?));
    }

    // The services' consumer settings (shared/runtime/src/startup.rs).
    let mut consumer_config = args.cluster.client_config();
    consumer_config
        .set("group.id", &args.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("partition.assignment.strategy", "range")
        .set("fetch.queue.backoff.ms", "5")
        .set("fetch.wait.max.ms", "20")
        .set("max.partition.fetch.bytes", "262144")
        .set("queued.min.messages", "10000");
    let consumer: BaseConsumer = consumer_config.create()?;
    consumer.subscribe(&topics)?;

    let exactly_once = args.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2;
    let transactional_id = format!("{}-rawcopy", args.application_id);
    let mut delivery = Delivery::new(
        args.cluster.client_config(),
        exactly_once.then_some(transactional_id.as_str()),
        None,
    )?;
    let interval = args.commit_interval.as_std();
    let mut phases = PhaseTimes::default();
    let mut offsets: HashMap<(usize, i32), i64> = HashMap::new();
    let mut payload = Vec::with_capacity(256);
    let mut key = String::new();
    let mut rekeyed_max: HashMap<i32, i64> = HashMap::new();
    let mut last_commit = Instant::now();
    loop {
        let mut timeout = Duration::from_millis(20);
        for _ in 0..10_000 {
            let Some(polled) = consumer.poll(timeout) else {
                break;
            };
            timeout = Duration::ZERO;
            let message = polled?;
            let input = topics
                .iter()
                .position(|t| *t == message.topic())
                .ok_or_else(|| anyhow::anyhow!("unexpected topic {}", message.topic()))?;
            let bytes = message.payload().unwrap_or_default();
            match routes[input] {
                Route::Copy(lane) => {
                    lanes[lane].copy(&registry, bytes, &mut payload)?;
                    delivery.send(Outgoing {
                        topic: &args.outputs[lane],
                        partition: None,
                        key: message.key(),
                        payload: Some(&payload),
                        headers: None,
                        tag: UNTRACKED,
                    });
                }
                Route::Decode(lane) => lanes[lane].decode(&registry, bytes)?,
                Route::Rekey => {
                    let through = args
                        .repartition_through
                        .as_deref()
                        .expect("a re-keyed route has a repartition topic");
                    let shipment = rekey
                        .as_mut()
                        .expect("a re-keyed route has a decoder")
                        .decode(&registry, bytes, &|| false)
                        .map_err(|e| anyhow::anyhow!("undecodable input: {e}"))?;
                    key.clear();
                    write!(key, "{}", shipment.order_id)?;
                    // The joiner's stamp on each re-keyed record: its source
                    // partition's watermark, the same headers and sizes.
                    let max = rekeyed_max.entry(message.partition()).or_insert(i64::MIN);
                    *max = (*max).max(shipment.ship_ts_raw.saturating_mul(1000));
                    let stamp = OwnedHeaders::new_with_capacity(2)
                        .insert(Header {
                            key: "streams.watermark",
                            value: Some(&max.to_be_bytes()[..]),
                        })
                        .insert(Header {
                            key: "streams.source",
                            value: Some(&(message.partition() as u32).to_be_bytes()[..]),
                        });
                    delivery.send(Outgoing {
                        topic: through,
                        partition: None,
                        key: Some(key.as_bytes()),
                        payload: Some(bytes),
                        headers: Some(stamp),
                        tag: UNTRACKED,
                    });
                }
            }
            offsets.insert((input, message.partition()), message.offset() + 1);
            if last_commit.elapsed() >= interval {
                break;
            }
        }
        delivery.poll();
        if last_commit.elapsed() < interval {
            continue;
        }
        last_commit = Instant::now();
        if offsets.is_empty() {
            continue;
        }
        let mut committed = TopicPartitionList::new();
        for ((input, partition), offset) in offsets.drain() {
            committed.add_partition_offset(topics[input], partition, Offset::Offset(offset))?;
        }
        // A synchronous commit: the copy waits for its records like the
        // simplest client would.
        let generation = delivery.seal();
        if exactly_once {
            let group = consumer.group_metadata();
            delivery
                .commit(generation, &committed, group, &mut phases)
                .map_err(|e| anyhow::anyhow!("commit: {e}"))?;
        } else {
            delivery
                .commit(generation, &TopicPartitionList::new(), None, &mut phases)
                .map_err(|e| anyhow::anyhow!("flush: {e}"))?;
            consumer.commit(&committed, CommitMode::Sync)?;
        }
    }
}
