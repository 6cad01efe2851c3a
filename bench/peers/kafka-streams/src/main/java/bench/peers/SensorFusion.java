package bench.peers;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Arrays;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.WindowStore;

/**
 * sensor-fusion, --emit watermark (docs/services/sensor-fusion.md), in the DSL: both reading
 * topics merged (keyed by machine id), tumbling windows of --window-interval (5 min, grace 0),
 * the non-null values of each kind collected per window, and
 * {@code suppress(untilWindowCloses)} so that each machine's window is written once when
 * stream time reaches its end. Stream time is the task's largest event time over both topics
 * (ours: the smaller of the two topics' watermarks); with both topics merged in event-time
 * order the same windows close.
 */
final class SensorFusion {
    static Topology topology(Main.Config config) {
        long interval = config.option("window-interval-ms", 300_000);
        double temperatureThreshold = 75.0;
        double humidityThreshold = 80.0;
        Schema outSchema = config.schema("machine-maintenance");
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, double[]> temperatures = builder.stream(config.inputs.get(0),
                        Consumed.with(Serdes.String(), config.serde("temperature-readings"))
                                .withTimestampExtractor(Main.timeField("event_time", 1)))
                .mapValues(v -> reading(0, v.get("temperature")));
        KStream<String, double[]> humidities = builder.stream(config.inputs.get(1),
                        Consumed.with(Serdes.String(), config.serde("humidity-readings"))
                                .withTimestampExtractor(Main.timeField("event_time", 1)))
                .mapValues(v -> reading(1, v.get("humidity")));
        temperatures.merge(humidities)
                .groupByKey(Grouped.with(Serdes.String(), Serdes.serdeFrom(new ReadingSerializer(), new ReadingDeserializer())))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(interval), Duration.ZERO))
                .aggregate(Readings::new, (machine, reading, readings) -> readings.add(reading),
                        Materialized.<String, Readings, WindowStore<Bytes, byte[]>>as("window-readings")
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Readings.SERDE))
                .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                .toStream()
                .map((window, readings) -> {
                    Double temperature = readings.median(0);
                    Double humidity = readings.median(1);
                    GenericRecord out = new GenericData.Record(outSchema);
                    out.put("machine_id", window.key());
                    out.put("sensor_id", window.key());
                    out.put("window_start", window.window().start());
                    out.put("window_end", window.window().end());
                    out.put("median_temperature", temperature);
                    out.put("median_humidity", humidity);
                    out.put("temperature_count", readings.count[0]);
                    out.put("humidity_count", readings.count[1]);
                    out.put("needs_maintenance", temperature != null && humidity != null
                            && temperature > temperatureThreshold && humidity > humidityThreshold);
                    return KeyValue.pair(window.key(), out);
                })
                .to(config.output, Produced.with(Serdes.String(), new AvroSerde(config.registry, outSchema)));
        return builder.build();
    }

    /** {kind, value}; value NaN for a null measurement. */
    static double[] reading(int kind, Object value) {
        return new double[] {kind, value == null ? Double.NaN : ((Number) value).doubleValue()};
    }

    static final class ReadingSerializer implements Serializer<double[]> {
        @Override
        public byte[] serialize(String topic, double[] r) {
            return r == null ? null : ByteBuffer.allocate(16).putDouble(r[0]).putDouble(r[1]).array();
        }
    }

    static final class ReadingDeserializer implements Deserializer<double[]> {
        @Override
        public double[] deserialize(String topic, byte[] bytes) {
            if (bytes == null) {
                return null;
            }
            ByteBuffer b = ByteBuffer.wrap(bytes);
            return new double[] {b.getDouble(), b.getDouble()};
        }
    }

    /** The non-null temperatures [0] and humidities [1] of one machine's window. */
    static final class Readings {
        final double[][] values = {new double[8], new double[8]};
        final int[] count = new int[2];

        Readings add(double[] reading) {
            int kind = (int) reading[0];
            if (!Double.isNaN(reading[1])) {
                if (count[kind] == values[kind].length) {
                    values[kind] = Arrays.copyOf(values[kind], count[kind] * 2);
                }
                values[kind][count[kind]++] = reading[1];
            }
            return this;
        }

        Double median(int kind) {
            int n = count[kind];
            if (n == 0) {
                return null;
            }
            double[] sorted = Arrays.copyOf(values[kind], n);
            Arrays.sort(sorted);
            return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
        }

        static final Serde<Readings> SERDE = Serdes.serdeFrom(
                (topic, r) -> {
                    if (r == null) {
                        return null;
                    }
                    ByteBuffer b = ByteBuffer.allocate(8 + 8 * (r.count[0] + r.count[1]));
                    for (int kind = 0; kind < 2; kind++) {
                        b.putInt(r.count[kind]);
                        for (int i = 0; i < r.count[kind]; i++) {
                            b.putDouble(r.values[kind][i]);
                        }
                    }
                    return b.array();
                },
                (topic, bytes) -> {
                    if (bytes == null) {
                        return null;
                    }
                    ByteBuffer b = ByteBuffer.wrap(bytes);
                    Readings r = new Readings();
                    for (int kind = 0; kind < 2; kind++) {
                        int n = b.getInt();
                        r.values[kind] = new double[Math.max(8, n * 2)];
                        for (int i = 0; i < n; i++) {
                            r.values[kind][i] = b.getDouble();
                        }
                        r.count[kind] = n;
                    }
                    return r;
                });
    }

    private SensorFusion() {}
}
