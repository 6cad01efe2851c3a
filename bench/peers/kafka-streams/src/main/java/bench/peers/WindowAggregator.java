package bench.peers;

import java.nio.ByteBuffer;
import java.time.Duration;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.WindowStore;

/**
 * window-aggregator (docs/services/window-aggregator.md) in the DSL: every order re-keyed to its
 * group ({@code groupBy}, hence through the repartition topic
 * {@code <app>-orders-by-group-repartition}: the DSL has no local pre-aggregation), hopping
 * windows of 2 s every 1 s (grace 0), count of non-null customer ids, exact price sum (the same
 * Shewchuk partials as ours), min, max, mean over all orders, and
 * {@code suppress(untilWindowCloses)} so that each window of each group is written once. Without
 * --group-by all orders are one group, written with a null key; with {@code --group-by FIELD}
 * (customer_id, product_id, order_id) the key is the field's value, null for the null group.
 * The DSL drops records with a null key, so groups are keyed as ours keys them internally:
 * "=" + the value, and "" for the null group (or the one group of global windows).
 */
final class WindowAggregator {
    static Topology topology(Main.Config config) {
        long size = config.option("window-size-ms", 2_000);
        long advance = config.option("window-advance-ms", 1_000);
        String groupField = config.options.get("group-by");
        Schema outSchema = config.schema("order-window-counts");
        StreamsBuilder builder = new StreamsBuilder();
        AvroSerde orderSerde = config.serde("orders-marketplace");
        builder.stream(config.inputs.get(0), Consumed.with(Serdes.String(), orderSerde)
                        .withTimestampExtractor(Main.timeField("order_time", 1)))
                .groupBy((key, order) -> groupKey(order, groupField),
                        Grouped.with("orders-by-group", Serdes.String(), orderSerde))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(size), Duration.ZERO)
                        .advanceBy(Duration.ofMillis(advance)))
                .aggregate(Stats::new, (key, order, stats) -> stats.add(order),
                        Materialized.<String, Stats, WindowStore<Bytes, byte[]>>as("window-stats")
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Stats.SERDE))
                .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                .toStream()
                .map((window, stats) -> {
                    GenericRecord out = new GenericData.Record(outSchema);
                    double sum = stats.sum.value();
                    String group = window.key().isEmpty() ? null : window.key().substring(1);
                    out.put("window_start", window.window().start());
                    out.put("window_end", window.window().end());
                    out.put("group", group);
                    out.put("count", stats.count);
                    out.put("price_sum", sum);
                    out.put("price_min", stats.min);
                    out.put("price_max", stats.max);
                    out.put("price_mean", sum / stats.records);
                    return KeyValue.pair(group, out);
                })
                .to(config.output, Produced.with(Serdes.String(), new AvroSerde(config.registry, outSchema)));
        return builder.build();
    }

    /** The order's group as a non-null key: "" for the null group, "=" + the value otherwise. */
    static String groupKey(GenericRecord order, String groupField) {
        Object value = groupField == null ? null : order.get(groupField);
        return value == null ? "" : "=" + value;
    }

    /** What is kept per window. */
    static final class Stats {
        long count;
        long records;
        ExactSum sum = new ExactSum();
        double min = Double.POSITIVE_INFINITY;
        double max = Double.NEGATIVE_INFINITY;

        Stats add(GenericRecord order) {
            double price = (Double) order.get("price");
            if (order.get("customer_id") != null) {
                count++;
            }
            records++;
            sum.add(price);
            min = Math.min(min, price);
            max = Math.max(max, price);
            return this;
        }

        static final Serde<Stats> SERDE = Serdes.serdeFrom(
                (topic, s) -> {
                    if (s == null) {
                        return null;
                    }
                    ByteBuffer b = ByteBuffer.allocate(8 * 4 + 4 + 8 * s.sum.size + 9);
                    b.putLong(s.count).putLong(s.records).putDouble(s.min).putDouble(s.max);
                    b.putInt(s.sum.size);
                    for (int i = 0; i < s.sum.size; i++) {
                        b.putDouble(s.sum.parts[i]);
                    }
                    b.put((byte) (s.sum.hasNonFinite ? 1 : 0)).putDouble(s.sum.nonFinite);
                    return b.array();
                },
                (topic, bytes) -> {
                    if (bytes == null) {
                        return null;
                    }
                    ByteBuffer b = ByteBuffer.wrap(bytes);
                    Stats s = new Stats();
                    s.count = b.getLong();
                    s.records = b.getLong();
                    s.min = b.getDouble();
                    s.max = b.getDouble();
                    int n = b.getInt();
                    s.sum.parts = new double[Math.max(4, n + 1)];
                    for (int i = 0; i < n; i++) {
                        s.sum.parts[i] = b.getDouble();
                    }
                    s.sum.size = n;
                    s.sum.hasNonFinite = b.get() == 1;
                    s.sum.nonFinite = b.getDouble();
                    return s;
                });
    }

    private WindowAggregator() {}
}
