package bench.peers;

import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.StreamJoined;

/**
 * order-shipment-joiner (docs/services/order-shipment-joiner.md) in the DSL: shipments re-keyed
 * by order id through {@code <app>-shipments-by-order-repartition}, then a KStream-KStream inner
 * join with {@code JoinWindows.ofTimeDifferenceAndGrace(7 d, 1 d).before(0)}: a shipment joins
 * an order when order_ts <= ship_ts <= order_ts + 7 d, both bounds inclusive, each matching pair
 * once as soon as its second record arrives, duplicates joining as a multiset. Event times are
 * the *_ts_raw seconds times 1000.
 */
final class Joiner {
    private static final DateTimeFormatter FORMAT =
            DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss").withZone(ZoneOffset.UTC);

    static Topology topology(Main.Config config) {
        long window = config.option("join-window-ms", Duration.ofDays(7).toMillis());
        long grace = config.option("grace-ms", Duration.ofDays(1).toMillis());
        AvroSerde orderSerde = config.serde("orders");
        AvroSerde shipmentSerde = config.serde("shipments");
        Schema outSchema = config.schema("shipped-orders");
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, GenericRecord> orders = builder.stream(config.inputs.get(0),
                Consumed.with(Serdes.String(), orderSerde)
                        .withTimestampExtractor(Main.timeField("order_ts_raw", 1000)));
        KStream<String, GenericRecord> shipments = builder.stream(config.inputs.get(1),
                        Consumed.with(Serdes.String(), shipmentSerde)
                                .withTimestampExtractor(Main.timeField("ship_ts_raw", 1000)))
                .selectKey((key, shipment) -> String.valueOf(shipment.get("order_id")))
                .repartition(Repartitioned.<String, GenericRecord>as("shipments-by-order")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(shipmentSerde));
        orders.join(shipments,
                        (order, shipment) -> row(outSchema, order, shipment),
                        JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(window), Duration.ofMillis(grace))
                                .before(Duration.ZERO),
                        StreamJoined.with(Serdes.String(), orderSerde, shipmentSerde).withStoreName("join"))
                .to(config.output, Produced.with(Serdes.String(), new AvroSerde(config.registry, outSchema)));
        return builder.build();
    }

    static GenericRecord row(Schema schema, GenericRecord order, GenericRecord shipment) {
        long orderTs = (Long) order.get("order_ts_raw");
        long shipTs = (Long) shipment.get("ship_ts_raw");
        GenericRecord out = new GenericData.Record(schema);
        out.put("order_id", order.get("id"));
        out.put("order_ts", FORMAT.format(Instant.ofEpochSecond(orderTs)));
        out.put("total", order.get("total_amount"));
        out.put("customer", order.get("customer_name"));
        out.put("ship_id", shipment.get("id"));
        out.put("ship_ts", FORMAT.format(Instant.ofEpochSecond(shipTs)));
        out.put("warehouse", shipment.get("warehouse"));
        out.put("hr_to_ship", Math.floorDiv(shipTs - orderTs, 3600L));
        return out;
    }

    private Joiner() {}
}
