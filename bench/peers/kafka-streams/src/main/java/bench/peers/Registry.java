package bench.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.Schema;

/**
 * A minimal client of a Confluent-compatible schema registry (Confluent's own client is not on
 * Maven Central): registers schemas under a subject and fetches schemas by id, both cached for
 * the life of the process.
 */
public final class Registry {
    private static final String CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";

    private final String url;
    private final HttpClient http =
            HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
    private final ObjectMapper json = new ObjectMapper();
    private final Map<String, Integer> ids = new ConcurrentHashMap<>();
    private final Map<Integer, Schema> schemas = new ConcurrentHashMap<>();

    public Registry(String url) {
        this.url = url.replaceAll("/+$", "");
    }

    /** Registers {@code schema} under {@code subject} (or finds it there) and returns its id. */
    public int register(String subject, Schema schema) {
        String text = schema.toString();
        return ids.computeIfAbsent(subject + '\u0000' + text, key -> {
            String body = json.createObjectNode().put("schema", text).toString();
            HttpRequest request = HttpRequest.newBuilder(URI.create(url + "/subjects/"
                            + URLEncoder.encode(subject, StandardCharsets.UTF_8) + "/versions"))
                    .timeout(Duration.ofSeconds(10))
                    .header("Content-Type", CONTENT_TYPE)
                    .POST(HttpRequest.BodyPublishers.ofString(body))
                    .build();
            int id = call(request).get("id").asInt();
            schemas.putIfAbsent(id, schema);
            return id;
        });
    }

    /** The schema registered as {@code id}. */
    public Schema byId(int id) {
        return schemas.computeIfAbsent(id, key -> {
            HttpRequest request = HttpRequest.newBuilder(URI.create(url + "/schemas/ids/" + id))
                    .timeout(Duration.ofSeconds(10))
                    .GET()
                    .build();
            return new Schema.Parser().parse(call(request).get("schema").asText());
        });
    }

    private JsonNode call(HttpRequest request) {
        RuntimeException last = null;
        for (int attempt = 0; attempt < 10; attempt++) {
            try {
                HttpResponse<String> response =
                        http.send(request, HttpResponse.BodyHandlers.ofString());
                if (response.statusCode() / 100 == 2) {
                    return json.readTree(response.body());
                }
                if (response.statusCode() / 100 == 4) {
                    throw new IllegalStateException(request.uri() + ": " + response.statusCode()
                            + " " + response.body());
                }
                last = new IllegalStateException(request.uri() + ": " + response.statusCode());
            } catch (IOException e) {
                last = new IllegalStateException(request.uri() + ": " + e, e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
            try {
                Thread.sleep(200L << Math.min(attempt, 4));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
        throw last;
    }
}
