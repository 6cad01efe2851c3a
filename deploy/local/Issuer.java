// A small OAuth 2 / OIDC token issuer for the secured local cluster (deploy/local/cluster.sh):
// the client_credentials grant, RS256 JWTs and their JWKS, over HTTPS. JDK classes only, run
// as a single source file:
//
//   java Issuer.java <issuer.properties>
//
// The properties (none of them secret) name everything else:
//
//   host, port               where it listens (HTTPS)
//   issuer                   the tokens' "iss" (its own base URL)
//   audience                 the tokens' "aud"
//   scopes                   the scopes a client may ask for (space-separated); the default scope
//                            is the first
//   lifetime.seconds         a token's lifetime ("exp" - "iat")
//   tls.certificate          PEM certificate (chain) it serves, tls.key its PKCS#8 PEM key
//   signing.key              PKCS#8 PEM RSA key the tokens are signed with (kept across restarts,
//                            so tokens issued before one stay valid)
//   clients                  client ids (space-separated): a token's "sub" is its client id
//   client.secrets.dir       directory of one file per client, <client>.oidc-secret (mode 0600),
//                            holding its secret: the secrets never pass through argv
//
// Endpoints:
//
//   POST /token              grant_type=client_credentials [&scope=...]; the client authenticates
//                            with HTTP basic (client id and secret) or with client_id and
//                            client_secret in the form. 200 {"access_token", "token_type",
//                            "expires_in", "scope"}; 401 invalid_client for an unknown client or a
//                            wrong secret, 400 for another grant type or an unknown scope.
//   GET  /jwks               the signing key as a JWK set (kid, RS256)
//   GET  /.well-known/openid-configuration   issuer, token_endpoint, jwks_uri
//
// It logs one line per request (client id, status), never a secret or a token.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.Reader;
import java.math.BigInteger;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.interfaces.RSAPrivateCrtKey;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.Executors;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

public class Issuer {
    private static final int MAX_BODY = 64 * 1024;
    private static final Base64.Encoder URL = Base64.getUrlEncoder().withoutPadding();

    private final String issuer;
    private final String audience;
    private final List<String> scopes;
    private final long lifetime;
    private final RSAPrivateCrtKey signingKey;
    private final String kid;
    private final Map<String, byte[]> secrets;

    private Issuer(Properties conf) throws Exception {
        issuer = required(conf, "issuer");
        audience = required(conf, "audience");
        scopes = words(required(conf, "scopes"));
        lifetime = Long.parseLong(conf.getProperty("lifetime.seconds", "3600"));
        signingKey = (RSAPrivateCrtKey) readKey(Path.of(required(conf, "signing.key")));
        // The key id: a digest of the public key, so it changes only with the key.
        byte[] digest = MessageDigest.getInstance("SHA-256").digest(unsigned(signingKey.getModulus()));
        kid = URL.encodeToString(Arrays.copyOf(digest, 12));
        secrets = new HashMap<>();
        Path dir = Path.of(required(conf, "client.secrets.dir"));
        for (String client : words(required(conf, "clients"))) {
            String secret = Files.readString(dir.resolve(client + ".oidc-secret")).trim();
            if (secret.isEmpty()) throw new IllegalArgumentException("empty secret for client " + client);
            secrets.put(client, secret.getBytes(StandardCharsets.UTF_8));
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: java Issuer.java <issuer.properties>");
            System.exit(2);
        }
        Properties conf = new Properties();
        try (Reader reader = Files.newBufferedReader(Path.of(args[0]))) {
            conf.load(reader);
        }
        Issuer issuer = new Issuer(conf);
        String host = required(conf, "host");
        int port = Integer.parseInt(required(conf, "port"));
        HttpsServer server = HttpsServer.create(new InetSocketAddress(host, port), 32);
        server.setHttpsConfigurator(new HttpsConfigurator(tls(
                Path.of(required(conf, "tls.certificate")), Path.of(required(conf, "tls.key")))));
        server.createContext("/token", exchange -> issuer.serve(exchange, issuer::token));
        server.createContext("/jwks", exchange -> issuer.serve(exchange, issuer::jwks));
        server.createContext("/.well-known/openid-configuration",
                exchange -> issuer.serve(exchange, issuer::discovery));
        server.createContext("/", exchange -> issuer.serve(exchange,
                e -> new Answer(404, "{\"error\":\"not_found\"}", "unknown path")));
        server.setExecutor(Executors.newFixedThreadPool(4));
        server.start();
        log("listening on https://" + host + ":" + port + " as " + issuer.issuer + " (kid "
                + issuer.kid + ", clients " + String.join(" ", issuer.secrets.keySet()) + ")");
    }

    /** A response: status, JSON body, and what the log line says about it. */
    private record Answer(int status, String json, String note) {}

    private interface Handler {
        Answer handle(HttpExchange exchange) throws IOException;
    }

    private void serve(HttpExchange exchange, Handler handler) throws IOException {
        Answer answer;
        try {
            answer = handler.handle(exchange);
        } catch (RuntimeException | IOException e) {
            answer = new Answer(500, "{\"error\":\"server_error\"}", "failed: " + e);
        }
        byte[] body = answer.json().getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", "application/json");
        exchange.getResponseHeaders().set("Cache-Control", "no-store");
        if (answer.status() == 401) {
            exchange.getResponseHeaders().set("WWW-Authenticate", "Basic realm=\"" + issuer + "\"");
        }
        exchange.sendResponseHeaders(answer.status(), body.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(body);
        }
        log(exchange.getRequestMethod() + " " + exchange.getRequestURI().getPath() + " -> "
                + answer.status() + " " + answer.note());
    }

    private Answer token(HttpExchange exchange) throws IOException {
        if (!exchange.getRequestMethod().equals("POST")) {
            return new Answer(405, "{\"error\":\"invalid_request\"}", "not a POST");
        }
        Map<String, String> form = form(readBody(exchange));
        String client = form.get("client_id");
        String secret = form.get("client_secret");
        String authorization = exchange.getRequestHeaders().getFirst("Authorization");
        if (authorization != null && authorization.regionMatches(true, 0, "Basic ", 0, 6)) {
            String pair;
            try {
                pair = new String(Base64.getDecoder().decode(authorization.substring(6).trim()),
                        StandardCharsets.UTF_8);
            } catch (IllegalArgumentException e) {
                return error(401, "invalid_client", "malformed basic credentials");
            }
            int colon = pair.indexOf(':');
            if (colon < 0) return error(401, "invalid_client", "malformed basic credentials");
            // RFC 6749 2.3.1: both halves are form-encoded before they are joined.
            client = decode(pair.substring(0, colon));
            secret = decode(pair.substring(colon + 1));
        }
        if (client == null || secret == null) {
            return error(401, "invalid_client", "no client credentials");
        }
        byte[] expected = secrets.get(client);
        byte[] given = secret.getBytes(StandardCharsets.UTF_8);
        // Compared in constant time, and a wrong secret looks like an unknown client.
        boolean known = expected != null;
        if (!MessageDigest.isEqual(known ? expected : new byte[given.length], given) || !known) {
            return error(401, "invalid_client",
                    "client " + printable(client) + ": " + (known ? "wrong secret" : "unknown client"));
        }
        String grant = form.get("grant_type");
        if (!"client_credentials".equals(grant)) {
            return error(400, "unsupported_grant_type", "client " + client + ": grant_type " + printable(grant));
        }
        List<String> asked = form.containsKey("scope") ? words(form.get("scope")) : List.of();
        if (asked.isEmpty()) asked = List.of(scopes.get(0));
        for (String scope : asked) {
            if (!scopes.contains(scope)) {
                return error(400, "invalid_scope", "client " + client + ": scope " + printable(scope));
            }
        }
        String scope = String.join(" ", new LinkedHashSet<>(asked));
        long now = Instant.now().getEpochSecond();
        String header = json("alg", "RS256", "typ", "JWT", "kid", kid);
        String claims = "{" + pair("iss", issuer) + "," + pair("sub", client) + "," + pair("aud", audience)
                + ",\"iat\":" + now + ",\"nbf\":" + now + ",\"exp\":" + (now + lifetime) + ","
                + pair("scope", scope) + "," + pair("client_id", client) + ","
                + pair("jti", UUID.randomUUID().toString()) + "}";
        String token;
        try {
            token = sign(header, claims);
        } catch (Exception e) {
            return new Answer(500, "{\"error\":\"server_error\"}", "signing failed: " + e);
        }
        return new Answer(200, "{" + pair("access_token", token) + "," + pair("token_type", "Bearer")
                + ",\"expires_in\":" + lifetime + "," + pair("scope", scope) + "}",
                "token for " + client + " (scope " + scope + ", " + lifetime + " s)");
    }

    private Answer jwks(HttpExchange exchange) {
        String key = json("kty", "RSA", "use", "sig", "alg", "RS256", "kid", kid,
                "n", URL.encodeToString(unsigned(signingKey.getModulus())),
                "e", URL.encodeToString(unsigned(signingKey.getPublicExponent())));
        return new Answer(200, "{\"keys\":[" + key + "]}", "kid " + kid);
    }

    private Answer discovery(HttpExchange exchange) {
        return new Answer(200, "{" + pair("issuer", issuer) + "," + pair("token_endpoint", issuer + "/token")
                + "," + pair("jwks_uri", issuer + "/jwks")
                + ",\"grant_types_supported\":[\"client_credentials\"]"
                + ",\"token_endpoint_auth_methods_supported\":[\"client_secret_basic\",\"client_secret_post\"]"
                + ",\"id_token_signing_alg_values_supported\":[\"RS256\"]"
                + ",\"scopes_supported\":[" + String.join(",", scopes.stream().map(Issuer::quote).toList())
                + "]}", "");
    }

    private static Answer error(int status, String code, String note) {
        return new Answer(status, "{" + pair("error", code) + "}", note);
    }

    private String sign(String header, String claims) throws Exception {
        String input = URL.encodeToString(header.getBytes(StandardCharsets.UTF_8)) + "."
                + URL.encodeToString(claims.getBytes(StandardCharsets.UTF_8));
        Signature rsa = Signature.getInstance("SHA256withRSA");
        rsa.initSign(signingKey);
        rsa.update(input.getBytes(StandardCharsets.US_ASCII));
        return input + "." + URL.encodeToString(rsa.sign());
    }

    // ---- TLS and PEM -----------------------------------------------------------------------

    private static SSLContext tls(Path certificate, Path key) throws Exception {
        List<Certificate> chain = new ArrayList<>();
        try (InputStream in = Files.newInputStream(certificate)) {
            chain.addAll(CertificateFactory.getInstance("X.509").generateCertificates(in));
        }
        char[] password = UUID.randomUUID().toString().toCharArray();
        KeyStore store = KeyStore.getInstance("PKCS12");
        store.load(null, null);
        store.setKeyEntry("server", readKey(key), password, chain.toArray(new Certificate[0]));
        KeyManagerFactory keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        keys.init(store, password);
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(keys.getKeyManagers(), null, null);
        return context;
    }

    /** An unencrypted PKCS#8 PEM private key ("BEGIN PRIVATE KEY"). */
    private static PrivateKey readKey(Path path) throws Exception {
        String pem = Files.readString(path);
        int begin = pem.indexOf("-----BEGIN PRIVATE KEY-----");
        int end = pem.indexOf("-----END PRIVATE KEY-----");
        if (begin < 0 || end < 0) {
            throw new IllegalArgumentException(path + ": not a PKCS#8 PEM key (BEGIN PRIVATE KEY)");
        }
        String body = pem.substring(begin + "-----BEGIN PRIVATE KEY-----".length(), end);
        byte[] der = Base64.getMimeDecoder().decode(body);
        return KeyFactory.getInstance("RSA").generatePrivate(new PKCS8EncodedKeySpec(der));
    }

    // ---- small helpers ---------------------------------------------------------------------

    private static String readBody(HttpExchange exchange) throws IOException {
        try (InputStream in = exchange.getRequestBody()) {
            byte[] body = in.readNBytes(MAX_BODY + 1);
            if (body.length > MAX_BODY) throw new IOException("request body over " + MAX_BODY + " bytes");
            return new String(body, StandardCharsets.UTF_8);
        }
    }

    private static Map<String, String> form(String body) {
        Map<String, String> out = new HashMap<>();
        for (String field : body.split("&")) {
            if (field.isEmpty()) continue;
            int eq = field.indexOf('=');
            String name = decode(eq < 0 ? field : field.substring(0, eq));
            out.putIfAbsent(name, eq < 0 ? "" : decode(field.substring(eq + 1)));
        }
        return out;
    }

    private static String decode(String text) {
        try {
            return URLDecoder.decode(text, StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            return text;
        }
    }

    private static byte[] unsigned(BigInteger n) {
        byte[] bytes = n.toByteArray();
        return bytes.length > 1 && bytes[0] == 0 ? Arrays.copyOfRange(bytes, 1, bytes.length) : bytes;
    }

    private static List<String> words(String text) {
        List<String> out = new ArrayList<>();
        for (String word : text.trim().split("[\\s,]+")) {
            if (!word.isEmpty()) out.add(word);
        }
        return out;
    }

    private static String required(Properties conf, String key) {
        String value = conf.getProperty(key);
        if (value == null || value.isBlank()) throw new IllegalArgumentException("issuer config: " + key + " is not set");
        return value.trim();
    }

    /** A client id or scope as the log may show it: short, printable ASCII. */
    private static String printable(String text) {
        if (text == null) return "(none)";
        String cut = text.length() > 64 ? text.substring(0, 64) + "..." : text;
        return cut.replaceAll("[^\\x21-\\x7e]", "?");
    }

    private static String json(String... pairs) {
        StringBuilder out = new StringBuilder("{");
        for (int i = 0; i < pairs.length; i += 2) {
            if (i > 0) out.append(',');
            out.append(pair(pairs[i], pairs[i + 1]));
        }
        return out.append('}').toString();
    }

    private static String pair(String name, String value) {
        return quote(name) + ":" + quote(value);
    }

    private static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                default -> {
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
                }
            }
        }
        return out.append('"').toString();
    }

    private static void log(String line) {
        System.out.println(Instant.now() + " " + line);
        System.out.flush();
    }
}
