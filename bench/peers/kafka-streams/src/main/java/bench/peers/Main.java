package bench.peers;

import java.io.File;
import java.io.IOException;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.processor.TimestampExtractor;

/**
 * The Kafka Streams peers of the benchmark.
 *
 * <pre>
 * java -jar ks-peer.jar &lt;use-case&gt; --application-id ID --inputs a[,b] --output OUT
 *     [--bootstrap-servers 127.0.0.1:9092] [--schema-registry-url http://127.0.0.1:8081]
 *     [--state-dir DIR] [--processing-guarantee exactly_once_v2|at_least_once]
 *     [--schemas-dir shared/schemas/avro] [--window-interval-ms 300000]
 *     [--group-by customer_id|product_id|order_id] [--standby-replicas 0]
 *     [--group-session-timeout-ms MS]
 * </pre>
 *
 * Use cases: sessionizer, order-shipment-joiner, sensor-fusion, window-aggregator (global, or
 * per group with --group-by).
 * One stream thread, commit.interval.ms=100, the producer settings of our runtime (linger.ms=5,
 * lz4) and max.task.idle.ms=1000 (our --max-task-idle default).
 */
public final class Main {
    /** What a topology needs. */
    static final class Config {
        final Registry registry;
        final File schemasDir;
        final List<String> inputs;
        final String output;
        final Map<String, String> options;

        Config(Registry registry, File schemasDir, List<String> inputs, String output,
                Map<String, String> options) {
            this.registry = registry;
            this.schemasDir = schemasDir;
            this.inputs = inputs;
            this.output = output;
            this.options = options;
        }

        Schema schema(String topic) {
            try {
                return new Schema.Parser().parse(new File(schemasDir, topic + ".avsc"));
            } catch (IOException e) {
                throw new IllegalStateException("schema of " + topic, e);
            }
        }

        AvroSerde serde(String topic) {
            return new AvroSerde(registry, schema(topic));
        }

        long option(String name, long fallback) {
            String value = options.get(name);
            return value == null ? fallback : Long.parseLong(value);
        }
    }

    /** Event time from a long field of the value (times {@code scale}). */
    static TimestampExtractor timeField(String field, long scale) {
        return (record, partitionTime) -> {
            Object value = record.value();
            if (value instanceof GenericRecord) {
                Object time = ((GenericRecord) value).get(field);
                if (time instanceof Number) {
                    return ((Number) time).longValue() * scale;
                }
            }
            return partitionTime;
        };
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: ks-peer <use-case> --application-id ID --inputs a[,b] --output OUT ...");
            System.exit(2);
        }
        String useCase = args[0];
        Map<String, String> options = new HashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --option, got " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        String applicationId = required(options, "application-id");
        Config config = new Config(
                new Registry(options.getOrDefault("schema-registry-url", "http://127.0.0.1:8081")),
                new File(options.getOrDefault("schemas-dir", "shared/schemas/avro")),
                Arrays.asList(required(options, "inputs").split(",")),
                required(options, "output"),
                options);

        Topology topology;
        switch (useCase) {
            case "sessionizer":
                topology = Sessionizer.topology(config);
                break;
            case "order-shipment-joiner":
                topology = Joiner.topology(config);
                break;
            case "sensor-fusion":
                topology = SensorFusion.topology(config);
                break;
            case "window-aggregator":
                topology = WindowAggregator.topology(config);
                break;
            default:
                throw new IllegalArgumentException("unknown use case " + useCase);
        }

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG,
                options.getOrDefault("bootstrap-servers", "127.0.0.1:9092"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                options.getOrDefault("processing-guarantee", StreamsConfig.EXACTLY_ONCE_V2));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG,
                Integer.parseInt(options.getOrDefault("stream-threads", "1")));
        props.put(StreamsConfig.MAX_TASK_IDLE_MS_CONFIG, 1000L);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.STATE_DIR_CONFIG,
                options.getOrDefault("state-dir", "/tmp/ks-peer-" + applicationId));
        props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // Rebalance benchmarks (make bench-pause): standbys, and how soon
        // the group notices a member killed.
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG,
                Integer.parseInt(options.getOrDefault("standby-replicas", "0")));
        if (options.containsKey("group-session-timeout-ms")) {
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG),
                    Integer.parseInt(options.get("group-session-timeout-ms")));
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        }

        KafkaStreams streams = new KafkaStreams(topology, props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setUncaughtExceptionHandler(error -> {
            error.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            stopped.countDown();
        }));
        System.err.println(topology.describe());
        streams.start();
        stopped.await();
        streams.close(Duration.ofSeconds(10));
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
    }

    private static String required(Map<String, String> options, String name) {
        String value = options.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    private Main() {}
}
