//! Client configuration: where Kafka and the schema registry are, and the
//! properties every librdkafka client and the registry client get.
//!
//! Properties come from three places, later ones winning: a Java properties
//! file (`--kafka-config-file`, as Kafka Streams users keep them), the
//! environment (`KAFKA_PROPERTY_SASL_PASSWORD` is `sasl.password`) and
//! `--kafka KEY=VALUE`. A password on the command line shows in `ps` for
//! every user of the host; the file (mode 0600) and the environment do not.
//!
//! Keys starting with `schema.registry.` configure the registry client, not
//! librdkafka (see `registry`): `schema.registry.basic.auth.user.info=USER:PASSWORD`,
//! or a bearer token, `schema.registry.bearer.auth.token=TOKEN` or
//! `schema.registry.bearer.auth.token.location=PATH` (a file read at start-up
//! and again when the registry answers 401, e.g. a Kubernetes Secret's);
//! `schema.registry.ssl.ca.location=PATH` (a PEM file of CA certificates);
//! and for mutual TLS `schema.registry.ssl.certificate.location=PATH` (PEM)
//! with `schema.registry.ssl.key.location=PATH` (PEM, PKCS#8).
//!
//! The values of secret properties (passwords, secrets, keys) are kept
//! from every log line and error message: [`redact`] replaces them, and
//! the log writer ([`RedactingStderr`]) and the services' error output apply
//! it.

pub(crate) mod brokers;
pub(crate) mod kafka;
mod registry;
pub(crate) mod statistics;

pub use kafka::restore_reader_config;

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use clap::Args;
use rdkafka::ClientConfig;

/// Environment variables with this prefix are client properties.
pub const ENV_PREFIX: &str = "KAFKA_PROPERTY_";

/// Where the clients connect and how: the flags of every service and of
/// `streamctl`.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Kafka bootstrap servers.
    #[arg(
        long,
        global = true,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// Confluent-compatible schema registry URL.
    #[arg(
        long,
        global = true,
        env = "SCHEMA_REGISTRY_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub schema_registry_url: String,

    /// A Java properties file of client properties (librdkafka's, and
    /// `schema.registry.*`): the place for credentials. Environment variables
    /// `KAFKA_PROPERTY_<KEY>` (dots as `_`, `_` as `__`) and `--kafka` win
    /// over it.
    #[arg(long, global = true, env = "KAFKA_CONFIG_FILE", value_name = "PATH")]
    pub kafka_config_file: Option<PathBuf>,

    /// Any librdkafka property, passed to every client: `--kafka
    /// security.protocol=SASL_SSL`. Repeatable. Not for secrets: arguments
    /// are visible to every user of the host.
    #[arg(long = "kafka", global = true, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub kafka_properties: Vec<(String, String)>,
}

/// How to reach the schema registry.
#[derive(Clone, Default)]
pub struct RegistrySettings {
    pub url: String,
    /// User and password for HTTP basic authentication.
    pub basic_auth: Option<(String, String)>,
    /// A bearer token (`Authorization: Bearer ...`).
    pub bearer_token: Option<String>,
    /// A file holding the bearer token, read at start-up and again when the
    /// registry answers 401 (a token rotated in a mounted Secret).
    pub bearer_token_location: Option<PathBuf>,
    /// CA certificates (PEM) to trust besides the system's.
    pub ca_location: Option<PathBuf>,
    /// The client certificate (PEM, leaf first) for mutual TLS.
    pub certificate_location: Option<PathBuf>,
    /// The client certificate's private key (PEM, PKCS#8).
    pub key_location: Option<PathBuf>,
}

impl std::fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrySettings")
            .field("url", &self.url)
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|(user, _)| user),
            )
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "[redacted]"),
            )
            .field("bearer_token_location", &self.bearer_token_location)
            .field("ca_location", &self.ca_location)
            .field("certificate_location", &self.certificate_location)
            .field("key_location", &self.key_location)
            .finish()
    }
}

/// The resolved client configuration.
pub struct ClientSettings {
    /// What every librdkafka client of the process starts from.
    pub kafka: ClientConfig,
    pub registry: RegistrySettings,
    /// What the user gave that a service does not take as given, each
    /// with why: a property the runtime sets itself, or a
    /// `bootstrap.servers` that wins over `--bootstrap-servers`.
    pub notices: Vec<String>,
}

/// Properties the runtime sets on a service's clients over any value given
/// (its guarantees rest on them), with the flag that sets them where one
/// does.
const SET_BY_THE_RUNTIME: &[(&str, Option<&str>)] = &[
    ("group.id", Some("--application-id")),
    ("client.id", None),
    ("group.instance.id", Some("--instance-id")),
    ("enable.auto.commit", None),
    ("enable.auto.offset.store", None),
    ("auto.offset.reset", None),
    ("isolation.level", None),
    ("enable.partition.eof", None),
    ("partition.assignment.strategy", None),
    ("group.protocol", Some("--group-protocol")),
    ("enable.idempotence", None),
    ("partitioner", None),
    ("transactional.id", None),
    ("queue.buffering.max.messages", None),
    ("compression.type", Some("--compression-type")),
];

/// Why each of `properties` (given by the user) is not taken as given.
fn notices(properties: &[(String, String)], bootstrap_servers: &str) -> Vec<String> {
    let mut notices = Vec::new();
    for (key, value) in properties {
        if let Some((_, flag)) = SET_BY_THE_RUNTIME.iter().find(|(owned, _)| owned == key) {
            let instead = flag.map_or_else(String::new, |flag| format!("; set it with {flag}"));
            notices.push(format!(
                "the property {key} is ignored: the runtime sets it on its clients{instead}"
            ));
        }
        if key == "bootstrap.servers" && value != bootstrap_servers {
            notices.push(format!(
                "the property bootstrap.servers={value} wins over --bootstrap-servers \
                 {bootstrap_servers}"
            ));
        }
    }
    notices
}

impl ClientArgs {
    /// Reads the file and the environment, merges them with the flags over
    /// `defaults` (the caller's own librdkafka choices) and remembers the
    /// secret values for [`redact`].
    pub fn settings(&self, defaults: &[(&str, &str)]) -> anyhow::Result<ClientSettings> {
        let mut properties = Vec::new();
        if let Some(path) = &self.kafka_config_file {
            properties.extend(read_properties_file(path)?);
        }
        properties.extend(env_properties(std::env::vars()));
        properties.extend(self.kafka_properties.iter().cloned());
        remember_secrets(&properties);
        let notices = notices(&properties, &self.bootstrap_servers);

        let mut kafka = ClientConfig::new();
        kafka.set("bootstrap.servers", &self.bootstrap_servers);
        for (key, value) in defaults {
            kafka.set(*key, *value);
        }
        let mut registry = RegistrySettings {
            url: self.schema_registry_url.clone(),
            ..RegistrySettings::default()
        };
        for (key, value) in properties {
            match key.strip_prefix("schema.registry.") {
                Some(registry_key) => registry.set(registry_key, value)?,
                None => {
                    kafka.set(key, value);
                }
            }
        }
        registry.check()?;
        Ok(ClientSettings {
            kafka,
            registry,
            notices,
        })
    }
}

/// Parses `key=value` for `--kafka`.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(format!("expected KEY=VALUE, got '{text}'")),
    }
}

/// The properties of a Java properties file. Errors name the file and the
/// line, never a value.
fn read_properties_file(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read Kafka config file {} ({e})", path.display()))?;
    parse_properties(&text)
        .map_err(|line| anyhow::anyhow!("{} line {line}: expected KEY=VALUE", path.display()))
}

/// Java properties: `#`/`!` comments, `key=value`, `key: value` or
/// `key value`, a trailing `\` continuing the line, backslash escapes.
/// Returns the number of a line without a key on error.
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, usize> {
    let mut properties = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let mut logical = line.trim_start().to_string();
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        while ends_in_continuation(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_property(&logical);
        if key.is_empty() {
            return Err(index + 1);
        }
        properties.push((unescape(key), unescape(value)));
    }
    Ok(properties)
}

/// Whether a line ends in an odd number of backslashes.
fn ends_in_continuation(line: &str) -> bool {
    line.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

/// The key (up to the first unescaped `=`, `:` or whitespace) and the value.
fn split_property(line: &str) -> (&str, &str) {
    let mut escaped = false;
    for (at, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || c.is_whitespace() {
            let rest = line[at..].trim_start();
            let rest = if c.is_whitespace() {
                rest.strip_prefix(['=', ':']).unwrap_or(rest)
            } else {
                &rest[1..]
            };
            return (&line[..at], rest.trim_start());
        }
    }
    (line, "")
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(decoded) => out.push(decoded),
                    None => out.push_str(&hex),
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// `KAFKA_PROPERTY_SASL_PASSWORD=x` is `sasl.password=x`: lower case, `_`
/// for `.`, `__` for `_` (the convention of Confluent's images).
fn env_properties(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut properties: Vec<(String, String)> = vars
        .filter_map(|(name, value)| {
            let key = name.strip_prefix(ENV_PREFIX)?;
            let key = key
                .to_ascii_lowercase()
                .split("__")
                .map(|part| part.replace('_', "."))
                .collect::<Vec<_>>()
                .join("_");
            (!key.is_empty()).then_some((key, value))
        })
        .collect();
    // The environment has no order: sorted, the result does not depend on it.
    properties.sort();
    properties
}

/// Whether a property's value is a secret (librdkafka's sensitive
/// properties, and the registry's credentials).
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "user.info", "jaas.config", "key.pem"]
        .iter()
        .any(|marker| key.contains(marker))
        || key == "sasl.oauthbearer.config"
        || key == "ssl_key"
        || key.ends_with("bearer.auth.token")
}

/// The secret values seen by [`ClientArgs::settings`], longest first (so
/// that one containing another is replaced whole).
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

fn remember_secrets(properties: &[(String, String)]) {
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    for (key, value) in properties {
        if is_secret(key) && !value.is_empty() && !secrets.contains(value) {
            secrets.push(value.clone());
            // The password half of USER:PASSWORD may show alone.
            if let Some((_, password)) =
                value.split_once(':').filter(|_| key.ends_with("user.info"))
            {
                if !password.is_empty() {
                    secrets.push(password.to_string());
                }
            }
        }
    }
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
}

/// Remembers a secret this process read from elsewhere than a property
/// (a bearer token's file), for [`redact`].
pub(crate) fn remember_secret(value: &str) {
    if value.is_empty() {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|secret| secret == value) {
        secrets.push(value.to_string());
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    }
}

/// `text` with every secret value this process was configured with
/// replaced by `[redacted]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let mut text = Cow::Borrowed(text);
    for secret in secrets.iter() {
        if text.contains(secret.as_str()) {
            text = Cow::Owned(text.replace(secret.as_str(), "[redacted]"));
        }
    }
    text
}

/// Standard error with secrets redacted: the log writer. The formatter
/// writes each event in one call, so a secret is never split across calls.
pub struct RedactingStderr;

impl Write for RedactingStderr {
    fn write(&mut self, buffer: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buffer);
        std::io::stderr().write_all(redact(&text).as_bytes())?;
        Ok(buffer.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingStderr;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingStderr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_properties_with_comments_separators_continuations_and_escapes() {
        let text = "# credentials\n\
                    ! also a comment\n\
                    \n\
                    security.protocol=SASL_SSL\n\
                    \x20 sasl.mechanism : SCRAM-SHA-512\n\
                    sasl.username streams\n\
                    sasl.password=p=ss:w\\\\ord\\u0021\n\
                    ssl.ca.location=/etc/ssl/\\\n\
                    \x20   ca.pem\n\
                    key\\=with\\:escapes=v\n\
                    empty=\n";
        let properties = parse_properties(text).unwrap();
        let expected = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "streams"),
            ("sasl.password", "p=ss:w\\ord!"),
            ("ssl.ca.location", "/etc/ssl/ca.pem"),
            ("key=with:escapes", "v"),
            ("empty", ""),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(properties, expected);
        assert_eq!(parse_properties("a=1\n=nokey\n"), Err(2));
    }

    #[test]
    fn environment_variables_with_the_prefix_become_properties() {
        let vars = [
            ("KAFKA_PROPERTY_SASL_PASSWORD", "x"),
            ("KAFKA_PROPERTY_LOG__LEVEL", "7"),
            ("KAFKA_PROPERTY_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "u:p"),
            ("KAFKA_BOOTSTRAP_SERVERS", "ignored"),
            ("KAFKA_PROPERTY_", "ignored"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let properties = env_properties(vars.into_iter());
        let keys: Vec<&str> = properties.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "log_level",
                "sasl.password",
                "schema.registry.basic.auth.user.info"
            ]
        );
    }

    #[test]
    fn the_file_then_the_environment_then_flags_and_registry_keys_apart() {
        let path =
            std::env::temp_dir().join(format!("client-test-{}.properties", std::process::id()));
        std::fs::write(
            &path,
            "sasl.username=file\nsasl.password=file-secret-1\nlinger.ms=7\n\
             schema.registry.basic.auth.user.info=reg:reg-secret-2\n\
             schema.registry.ssl.ca.location=/ca.pem\n",
        )
        .unwrap();
        let args = ClientArgs {
            bootstrap_servers: "b:1".into(),
            schema_registry_url: "https://r".into(),
            kafka_config_file: Some(path.clone()),
            kafka_properties: vec![("sasl.username".into(), "flag".into())],
        };
        let settings = args
            .settings(&[("log_level", "3"), ("linger.ms", "1")])
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(settings.kafka.get("bootstrap.servers"), Some("b:1"));
        assert_eq!(settings.kafka.get("sasl.username"), Some("flag"));
        assert_eq!(settings.kafka.get("linger.ms"), Some("7"));
        assert_eq!(settings.kafka.get("log_level"), Some("3"));
        assert_eq!(settings.kafka.get("schema.registry.ssl.ca.location"), None);
        assert_eq!(
            settings.registry.basic_auth,
            Some(("reg".to_string(), "reg-secret-2".to_string()))
        );
        assert_eq!(
            settings.registry.ca_location,
            Some(PathBuf::from("/ca.pem"))
        );
        assert!(!format!("{:?}", settings.registry).contains("reg-secret-2"));

        let line = "auth with file-secret-1 and reg:reg-secret-2 or reg-secret-2 failed";
        assert_eq!(
            redact(line),
            "auth with [redacted] and [redacted] or [redacted] failed"
        );
        assert_eq!(redact("sasl.username=file"), "sasl.username=file");
    }

    #[test]
    fn properties_the_runtime_sets_and_a_second_bootstrap_are_noticed() {
        let args = ClientArgs {
            bootstrap_servers: "b:1".into(),
            schema_registry_url: "http://r".into(),
            kafka_config_file: None,
            kafka_properties: [
                ("compression.type", "gzip"),
                ("group.id", "mine"),
                ("linger.ms", "20"),
                ("bootstrap.servers", "c:2"),
            ]
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .into(),
        };
        let notices = args.settings(&[]).unwrap().notices;
        assert_eq!(notices.len(), 3, "{notices:?}");
        assert!(notices[0].contains("compression.type is ignored"));
        assert!(notices[0].ends_with("set it with --compression-type"));
        assert!(notices[1].contains("group.id is ignored"));
        assert!(notices[2].contains("bootstrap.servers=c:2 wins over --bootstrap-servers b:1"));
    }

    #[test]
    fn a_missing_or_malformed_file_is_named_without_its_values() {
        let missing = ClientArgs {
            bootstrap_servers: String::new(),
            schema_registry_url: String::new(),
            kafka_config_file: Some(PathBuf::from("/nonexistent/client.properties")),
            kafka_properties: Vec::new(),
        };
        let error = missing.settings(&[]).err().unwrap().to_string();
        assert!(error.contains("/nonexistent/client.properties"), "{error}");

        let path =
            std::env::temp_dir().join(format!("client-bad-{}.properties", std::process::id()));
        std::fs::write(&path, "sasl.password=hunter2\n:hunter3\n").unwrap();
        let bad = ClientArgs {
            kafka_config_file: Some(path.clone()),
            ..missing
        };
        let error = bad.settings(&[]).err().unwrap().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(error.ends_with("line 2: expected KEY=VALUE"), "{error}");
        assert!(!error.contains("hunter"), "{error}");
    }

    #[test]
    fn secret_keys() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "ssl.key.pem",
            "sasl.oauthbearer.config",
            "schema.registry.basic.auth.user.info",
        ] {
            assert!(is_secret(key), "{key}");
        }
        for key in ["sasl.username", "ssl.ca.location", "security.protocol"] {
            assert!(!is_secret(key), "{key}");
        }
    }
}
