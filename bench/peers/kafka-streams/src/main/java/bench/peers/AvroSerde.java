package bench.peers;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serializer;

/**
 * Avro values in the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro
 * binary), as Confluent's KafkaAvroSerde does with GenericRecord: the serializer registers its
 * schema under {@code <topic>-value}; the deserializer reads any writer schema by id and
 * resolves it into this serde's schema. A serializer or deserializer may be shared by the stream
 * threads ({@code num.stream.threads}): their caches are concurrent, their buffers per thread.
 */
public final class AvroSerde implements Serde<GenericRecord> {
    private final Registry registry;
    private final Schema schema;

    public AvroSerde(Registry registry, Schema schema) {
        this.registry = registry;
        this.schema = schema;
    }

    @Override
    public Serializer<GenericRecord> serializer() {
        return new Serializer<>() {
            private final GenericDatumWriter<GenericRecord> writer = new GenericDatumWriter<>(schema);
            private final Map<String, Integer> ids = new ConcurrentHashMap<>();
            private final ThreadLocal<ByteArrayOutputStream> buffers =
                    ThreadLocal.withInitial(() -> new ByteArrayOutputStream(256));
            private final ThreadLocal<BinaryEncoder> encoders = new ThreadLocal<>();

            @Override
            public byte[] serialize(String topic, GenericRecord record) {
                if (record == null) {
                    return null;
                }
                int id = ids.computeIfAbsent(topic, t -> registry.register(t + "-value", schema));
                ByteArrayOutputStream out = buffers.get();
                out.reset();
                out.write(0);
                out.write(id >>> 24);
                out.write(id >>> 16);
                out.write(id >>> 8);
                out.write(id);
                BinaryEncoder encoder = EncoderFactory.get().directBinaryEncoder(out, encoders.get());
                encoders.set(encoder);
                try {
                    writer.write(record, encoder);
                    encoder.flush();
                } catch (IOException e) {
                    throw new SerializationException("Avro encoding for " + topic, e);
                }
                return out.toByteArray();
            }
        };
    }

    @Override
    public Deserializer<GenericRecord> deserializer() {
        return new Deserializer<>() {
            private final Map<Integer, GenericDatumReader<GenericRecord>> readers = new ConcurrentHashMap<>();
            private final ThreadLocal<BinaryDecoder> decoders = new ThreadLocal<>();

            @Override
            public GenericRecord deserialize(String topic, byte[] bytes) {
                if (bytes == null) {
                    return null;
                }
                if (bytes.length < 5 || bytes[0] != 0) {
                    throw new SerializationException("not in the Confluent wire format: " + topic);
                }
                int id = ByteBuffer.wrap(bytes, 1, 4).getInt();
                GenericDatumReader<GenericRecord> reader = readers.computeIfAbsent(
                        id, i -> new GenericDatumReader<>(registry.byId(i), schema));
                BinaryDecoder decoder =
                        DecoderFactory.get().binaryDecoder(bytes, 5, bytes.length - 5, decoders.get());
                decoders.set(decoder);
                try {
                    return reader.read(null, decoder);
                } catch (IOException e) {
                    throw new SerializationException("Avro decoding of " + topic, e);
                }
            }
        };
    }
}
