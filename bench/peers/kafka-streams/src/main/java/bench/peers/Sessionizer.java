package bench.peers;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Comparator;
import java.util.TreeSet;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * sessionizer (docs/services/sessionizer.md) on the Processor API. The DSL's session windows
 * cannot end a session on LOGOUT, so this keeps one session per user in a key-value store
 * (RocksDB, cached, changelogged) and its own event-time clock: the partition's largest event
 * time (minus --max-out-of-orderness, 0) as watermark, saved in a store, late events (before
 * the watermark) dropped, and due timeouts fired <em>before</em> the event that moves the
 * watermark is processed, in order of deadline then user id, as the contract says. (Kafka
 * Streams' own stream-time punctuators would fire after the record, and only per punctuation
 * interval.) The timer index is in memory and rebuilt from the session store at startup: a
 * session's deadline is its latest event time plus the timeout.
 */
final class Sessionizer {
    static Topology topology(Main.Config config) {
        long timeout = config.option("session-timeout-ms", 30_000);
        Schema sessionSchema = config.schema("user-sessions");
        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                        Stores.persistentKeyValueStore("sessions"), Serdes.String(), Serdes.ByteArray())
                .withCachingEnabled());
        builder.addStateStore(Stores.keyValueStoreBuilder(
                        Stores.persistentKeyValueStore("clock"), Serdes.String(), Serdes.Long())
                .withCachingEnabled());
        builder.stream(config.inputs.get(0), Consumed.with(Serdes.String(), config.serde("user-events"))
                        .withTimestampExtractor(Main.timeField("event_time", 1)))
                .process(() -> new SessionProcessor(sessionSchema, timeout), "sessions", "clock")
                .to(config.output, Produced.with(Serdes.String(), new AvroSerde(config.registry, sessionSchema)));
        return builder.build();
    }

    /** A deadline of one user's open session. */
    record Timer(long deadline, String user) {}

    /** An open session. */
    static final class Session {
        long start;
        long latest;
        int count;
        String sequence;

        static Session decode(byte[] bytes) {
            ByteBuffer buffer = ByteBuffer.wrap(bytes);
            Session s = new Session();
            s.start = buffer.getLong();
            s.latest = buffer.getLong();
            s.count = buffer.getInt();
            s.sequence = new String(bytes, 20, bytes.length - 20, StandardCharsets.UTF_8);
            return s;
        }

        byte[] encode() {
            byte[] text = sequence.getBytes(StandardCharsets.UTF_8);
            return ByteBuffer.allocate(20 + text.length).putLong(start).putLong(latest)
                    .putInt(count).put(text).array();
        }
    }

    static final class SessionProcessor implements Processor<String, GenericRecord, String, GenericRecord> {
        private final Schema schema;
        private final long timeout;
        private final TreeSet<Timer> timers = new TreeSet<>(
                Comparator.comparingLong(Timer::deadline).thenComparing(Timer::user));
        private ProcessorContext<String, GenericRecord> context;
        private KeyValueStore<String, byte[]> sessions;
        private KeyValueStore<String, Long> clock;
        private long watermark = Long.MIN_VALUE;
        private long largest = Long.MIN_VALUE;

        SessionProcessor(Schema schema, long timeout) {
            this.schema = schema;
            this.timeout = timeout;
        }

        @Override
        public void init(ProcessorContext<String, GenericRecord> context) {
            this.context = context;
            sessions = context.getStateStore("sessions");
            clock = context.getStateStore("clock");
            Long saved = clock.get("watermark");
            watermark = saved == null ? Long.MIN_VALUE : saved;
            largest = watermark;
            try (KeyValueIterator<String, byte[]> all = sessions.all()) {
                while (all.hasNext()) {
                    KeyValue<String, byte[]> entry = all.next();
                    timers.add(new Timer(Session.decode(entry.value).latest + timeout, entry.key));
                }
            }
        }

        @Override
        public void process(Record<String, GenericRecord> record) {
            GenericRecord event = record.value();
            if (event == null) {
                return;
            }
            String user = event.get("user_id").toString();
            String type = event.get("event_type").toString();
            long time = (Long) event.get("event_time");
            if (watermark != Long.MIN_VALUE && time < watermark) {
                return; // late
            }
            if (time > largest) {
                largest = time;
            }
            if (largest > watermark) {
                watermark = largest;
                clock.put("watermark", watermark);
                fireDue(record.timestamp());
            }
            byte[] stored = sessions.get(user);
            Session session;
            if (stored == null) {
                session = new Session();
                session.start = time;
                session.latest = time;
                session.sequence = type;
            } else {
                session = Session.decode(stored);
                timers.remove(new Timer(session.latest + timeout, user));
                session.start = Math.min(session.start, time);
                session.latest = Math.max(session.latest, time);
                session.sequence = session.sequence + " > " + type;
            }
            session.count++;
            if ("LOGOUT".equals(type)) {
                emit(user, session, "COMPLETED", time, record.timestamp());
                sessions.delete(user);
            } else {
                sessions.put(user, session.encode());
                timers.add(new Timer(session.latest + timeout, user));
            }
        }

        private void fireDue(long timestamp) {
            while (!timers.isEmpty() && timers.first().deadline() <= watermark) {
                Timer timer = timers.pollFirst();
                byte[] stored = sessions.get(timer.user());
                if (stored != null) {
                    emit(timer.user(), Session.decode(stored), "TIMEOUT", timer.deadline(), timestamp);
                    sessions.delete(timer.user());
                }
            }
        }

        private void emit(String user, Session session, String status, long end, long timestamp) {
            GenericRecord out = new GenericData.Record(schema);
            out.put("user_id", user);
            out.put("status", status);
            out.put("duration_millis", end - session.start);
            out.put("event_count", session.count);
            out.put("event_sequence", session.sequence);
            out.put("session_start", session.start);
            out.put("session_end", end);
            context.forward(new Record<>(user, out, timestamp));
        }
    }

    private Sessionizer() {}
}
