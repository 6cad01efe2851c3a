//! The registry client's credentials and trust: HTTP basic authentication,
//! a bearer token (given, or read from a file such as a Kubernetes Secret's),
//! a client certificate (mutual TLS) and the CAs to trust, checked when the
//! properties are read and loaded into the HTTP client at start-up.
//!
//! Errors name the property (and, for a file, its path), never a secret value.

use std::path::Path;
use std::time::Duration;

use schema_registry_converter::async_impl::schema_registry::SrSettings;

use super::{remember_secret, RegistrySettings};

pub(crate) const BASIC: &str = "schema.registry.basic.auth.user.info";
pub(crate) const TOKEN: &str = "schema.registry.bearer.auth.token";
pub(crate) const TOKEN_LOCATION: &str = "schema.registry.bearer.auth.token.location";
pub(crate) const CA: &str = "schema.registry.ssl.ca.location";
pub(crate) const CERTIFICATE: &str = "schema.registry.ssl.certificate.location";
pub(crate) const KEY: &str = "schema.registry.ssl.key.location";

/// Every registry property, for the error about an unknown one.
pub(crate) const KNOWN: [&str; 6] = [BASIC, TOKEN, TOKEN_LOCATION, CA, CERTIFICATE, KEY];

/// How long one registry request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

impl RegistrySettings {
    /// Sets registry property `key` (without the `schema.registry.` prefix);
    /// an unknown key is an error that lists the known ones.
    pub(crate) fn set(&mut self, key: &str, value: String) -> anyhow::Result<()> {
        match key {
            "basic.auth.user.info" => {
                let (user, password) = value
                    .split_once(':')
                    .ok_or_else(|| anyhow::anyhow!("{BASIC} must be USER:PASSWORD"))?;
                self.basic_auth = Some((user.to_string(), password.to_string()));
            }
            "bearer.auth.token" => self.bearer_token = Some(value),
            "bearer.auth.token.location" => self.bearer_token_location = Some(value.into()),
            "ssl.ca.location" => self.ca_location = Some(value.into()),
            "ssl.certificate.location" => self.certificate_location = Some(value.into()),
            "ssl.key.location" => self.key_location = Some(value.into()),
            other => anyhow::bail!(
                "unknown registry property schema.registry.{other} (known: {})",
                KNOWN.join(", ")
            ),
        }
        Ok(())
    }

    /// Rejects combinations that cannot work. The message names the
    /// properties, never a value.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let token = self.bearer_token.is_some() || self.bearer_token_location.is_some();
        anyhow::ensure!(
            !(self.basic_auth.is_some() && token),
            "{BASIC} and {} are both set: a request carries one Authorization header, \
             basic or bearer; keep one of them",
            self.token_property()
        );
        anyhow::ensure!(
            !(self.bearer_token.is_some() && self.bearer_token_location.is_some()),
            "{TOKEN} and {TOKEN_LOCATION} are both set: keep one (the file, for a token \
             mounted from a secret)"
        );
        if let Some(token) = &self.bearer_token {
            check_token(token, TOKEN)?;
        }
        match (&self.certificate_location, &self.key_location) {
            (Some(_), None) => anyhow::bail!(
                "{CERTIFICATE} is set without {KEY}: a client certificate needs its \
                 private key (PEM, PKCS#8)"
            ),
            (None, Some(_)) => anyhow::bail!(
                "{KEY} is set without {CERTIFICATE}: the private key needs its client \
                 certificate (PEM)"
            ),
            _ => Ok(()),
        }
    }

    /// The bearer-token property in use.
    fn token_property(&self) -> &'static str {
        if self.bearer_token_location.is_some() {
            TOKEN_LOCATION
        } else {
            TOKEN
        }
    }

    /// The credential properties set, for messages about a refused request.
    pub(crate) fn credentials(&self) -> String {
        let mut set = Vec::new();
        if self.basic_auth.is_some() {
            set.push(BASIC);
        }
        if self.bearer_token.is_some() || self.bearer_token_location.is_some() {
            set.push(self.token_property());
        }
        if self.certificate_location.is_some() {
            set.push(CERTIFICATE);
        }
        match set.as_slice() {
            [] => format!(
                "no credentials are configured (none of {BASIC}, {TOKEN}, {TOKEN_LOCATION}, \
                 {CERTIFICATE})"
            ),
            _ => format!("the credentials of {}", set.join(" and ")),
        }
    }

    /// The bearer token: the given one, or the content of its file
    /// (surrounding whitespace removed), remembered as a secret.
    pub(crate) fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        if let Some(token) = &self.bearer_token {
            return Ok(Some(token.clone()));
        }
        let Some(path) = &self.bearer_token_location else {
            return Ok(None);
        };
        let bytes = read_file(TOKEN_LOCATION, path)?;
        let token = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("{TOKEN_LOCATION} {}: not text", path.display()))?
            .trim()
            .to_string();
        remember_secret(&token);
        anyhow::ensure!(
            !token.is_empty(),
            "{TOKEN_LOCATION} {} is empty",
            path.display()
        );
        check_token(&token, TOKEN_LOCATION)?;
        Ok(Some(token))
    }

    /// `schema_registry_converter`'s client settings: this registry, with
    /// `token` (see [`bearer_token`](Self::bearer_token)) or the basic
    /// credentials, the client certificate and the CAs.
    pub(crate) fn client(&self, token: Option<&str>) -> anyhow::Result<SrSettings> {
        let url = self.url.trim_end_matches('/');
        if self.certificate_location.is_some() {
            // schema_registry_converter reports a failed build without its
            // cause; building once here names what is wrong.
            self.http()?.build().map_err(|e| {
                anyhow::anyhow!(
                    "the client certificate ({CERTIFICATE}) and key ({KEY}) cannot be used \
                     together (does the key belong to the certificate?): {}",
                    error_chain(&e)
                )
            })?;
        }
        let mut builder = SrSettings::new_builder(url.to_string());
        builder.set_timeout(TIMEOUT);
        if let Some(token) = token {
            builder.set_token_authorization(token);
        } else if let Some((user, password)) = &self.basic_auth {
            builder.set_basic_authorization(user, Some(password));
        }
        builder
            .build_with(self.http()?)
            .map_err(|e| anyhow::anyhow!("schema registry client for {url}: {e}"))
    }

    /// The HTTP client's TLS settings: extra CAs and the client certificate.
    fn http(&self) -> anyhow::Result<reqwest::ClientBuilder> {
        let mut http = reqwest::Client::builder();
        if let Some(path) = &self.ca_location {
            let pem = read_file(CA, path)?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("{CA} {}: {}", path.display(), error_chain(&e)))?;
            anyhow::ensure!(
                !certificates.is_empty(),
                "{CA} {} holds no PEM certificate (BEGIN CERTIFICATE)",
                path.display()
            );
            for certificate in certificates {
                http = http.add_root_certificate(certificate);
            }
        }
        if let (Some(certificate), Some(key)) = (&self.certificate_location, &self.key_location) {
            http = http.identity(identity(certificate, key)?);
        }
        Ok(http)
    }
}

/// A token must fit into an HTTP header: printable ASCII without spaces.
fn check_token(token: &str, property: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!token.is_empty(), "{property} is empty");
    anyhow::ensure!(
        token.bytes().all(|b| b.is_ascii_graphic()),
        "{property}: the token holds a space, a line break or a character outside \
         printable ASCII, which an HTTP header cannot carry"
    );
    Ok(())
}

fn read_file(property: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read {property} {} ({e})", path.display()))
}

/// The client certificate (a PEM chain, leaf first) with its PKCS#8 key.
fn identity(certificate: &Path, key: &Path) -> anyhow::Result<reqwest::Identity> {
    let chain = read_file(CERTIFICATE, certificate)?;
    anyhow::ensure!(
        chain
            .windows(CERTIFICATE_BEGIN.len())
            .any(|w| w == CERTIFICATE_BEGIN.as_bytes()),
        "{CERTIFICATE} {} holds no PEM certificate (BEGIN CERTIFICATE)",
        certificate.display()
    );
    let key_pem = read_file(KEY, key)?;
    let key_block = pkcs8_block(&key_pem, key)?;
    reqwest::Identity::from_pkcs8_pem(&chain, key_block).map_err(|e| {
        anyhow::anyhow!(
            "the client certificate {} ({CERTIFICATE}) or its key {} ({KEY}) cannot be \
             read: {}",
            certificate.display(),
            key.display(),
            error_chain(&e)
        )
    })
}

const CERTIFICATE_BEGIN: &str = "-----BEGIN CERTIFICATE-----";

/// The `BEGIN PRIVATE KEY` block of a PEM file (native-tls wants it at the
/// very start); any other kind of key is explained, with how to convert it.
fn pkcs8_block<'a>(pem: &'a [u8], path: &Path) -> anyhow::Result<&'a [u8]> {
    const BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
    const END: &str = "-----END PRIVATE KEY-----";
    let shown = path.display();
    let Ok(text) = std::str::from_utf8(pem) else {
        anyhow::bail!(
            "{KEY} {shown} is not a PEM file (DER?); the registry client reads a PEM \
             PKCS#8 key: convert it with `openssl pkcs8 -topk8 -nocrypt -inform DER -in \
             {shown} -out {shown}.pem`"
        );
    };
    if let Some(start) = text.find(BEGIN) {
        let end = text[start..]
            .find(END)
            .map(|at| start + at + END.len())
            .ok_or_else(|| anyhow::anyhow!("{KEY} {shown}: BEGIN PRIVATE KEY without its END"))?;
        return Ok(&pem[start..end]);
    }
    let convert = format!(
        "convert it with `openssl pkcs8 -topk8 -nocrypt -in {shown} -out {shown}.pkcs8` \
         and point {KEY} at the new file"
    );
    if text.contains("-----BEGIN RSA PRIVATE KEY-----") {
        anyhow::bail!(
            "{KEY} {shown} is an RSA key in PKCS#1 format (BEGIN RSA PRIVATE KEY), but the \
             registry client reads PKCS#8 keys (BEGIN PRIVATE KEY): {convert}"
        );
    }
    if text.contains("-----BEGIN EC PRIVATE KEY-----") {
        anyhow::bail!(
            "{KEY} {shown} is an EC key in SEC1 format (BEGIN EC PRIVATE KEY), but the \
             registry client reads PKCS#8 keys (BEGIN PRIVATE KEY): {convert}"
        );
    }
    if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        anyhow::bail!(
            "{KEY} {shown} is encrypted (BEGIN ENCRYPTED PRIVATE KEY); the registry client \
             reads unencrypted PKCS#8 keys: decrypt it with `openssl pkcs8 -topk8 -nocrypt \
             -in {shown} -out {shown}.pkcs8` (it asks for the passphrase) and keep the new \
             file readable by the service's user only"
        );
    }
    anyhow::bail!("{KEY} {shown} holds no PEM private key (BEGIN PRIVATE KEY)")
}

/// An error with its causes, `a: b: c`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::{is_secret, redact, ClientArgs};
    use super::*;

    // A throwaway client certificate and keys, made for these tests with
    // `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes`
    // (and `openssl ec` for the SEC1 copy); they secure nothing.
    const CERTIFICATE_PEM: &str = include_str!("testdata/client-cert.pem");
    const KEY_PEM: &str = include_str!("testdata/client-key.pem");
    const SEC1_KEY_PEM: &str = include_str!("testdata/client-key-sec1.pem");
    const OTHER_KEY_PEM: &str = include_str!("testdata/other-key.pem");

    fn settings(properties: &[(&str, &str)]) -> anyhow::Result<RegistrySettings> {
        let args = ClientArgs {
            bootstrap_servers: "b:1".into(),
            schema_registry_url: "https://registry:8081".into(),
            kafka_config_file: None,
            kafka_properties: properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        args.settings(&[]).map(|settings| settings.registry)
    }

    fn error(properties: &[(&str, &str)]) -> String {
        format!("{:#}", settings(properties).unwrap_err())
    }

    /// A file in the temporary directory with `content`, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, content: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!(
                "registry-{}-{}-{name}",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::write(&path, content).unwrap();
            TempFile(path)
        }

        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    use std::path::PathBuf;

    #[test]
    fn the_registry_properties_are_read_into_the_settings() {
        let registry = settings(&[
            (TOKEN_LOCATION, "/var/run/secrets/registry/token"),
            (CA, "/ca.pem"),
            (CERTIFICATE, "/client.pem"),
            (KEY, "/client.key"),
        ])
        .unwrap();
        assert_eq!(
            registry.bearer_token_location,
            Some(PathBuf::from("/var/run/secrets/registry/token"))
        );
        assert_eq!(registry.ca_location, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            registry.certificate_location,
            Some(PathBuf::from("/client.pem"))
        );
        assert_eq!(registry.key_location, Some(PathBuf::from("/client.key")));
        assert_eq!(
            registry.credentials(),
            format!("the credentials of {TOKEN_LOCATION} and {CERTIFICATE}")
        );
        let unknown = error(&[("schema.registry.bearer.token", "x")]);
        assert!(
            unknown.starts_with("unknown registry property schema.registry.bearer.token"),
            "{unknown}"
        );
        for known in KNOWN {
            assert!(unknown.contains(known), "{unknown}");
        }
    }

    #[test]
    fn a_bearer_token_is_a_secret_kept_from_logs_and_debug_output() {
        assert!(is_secret(TOKEN));
        assert!(is_secret("bearer.auth.token"));
        for not_secret in [TOKEN_LOCATION, CERTIFICATE, KEY, CA] {
            assert!(!is_secret(not_secret), "{not_secret}");
        }
        let registry = settings(&[(TOKEN, "eyJ.token-secret-4711.sig")]).unwrap();
        assert_eq!(
            registry.bearer_token.as_deref(),
            Some("eyJ.token-secret-4711.sig")
        );
        assert!(!format!("{registry:?}").contains("token-secret-4711"));
        assert_eq!(
            redact("401 for Bearer eyJ.token-secret-4711.sig"),
            "401 for Bearer [redacted]"
        );
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_its_token_redacted() {
        let file = TempFile::new("token", "  eyJ.file-token-0815.sig\n");
        let registry = settings(&[(TOKEN_LOCATION, file.path())]).unwrap();
        assert_eq!(
            registry.bearer_token().unwrap().as_deref(),
            Some("eyJ.file-token-0815.sig")
        );
        assert_eq!(redact("got eyJ.file-token-0815.sig"), "got [redacted]");

        let empty = TempFile::new("empty", "\n");
        let registry = settings(&[(TOKEN_LOCATION, empty.path())]).unwrap();
        let message = registry.bearer_token().unwrap_err().to_string();
        assert_eq!(
            message,
            format!("{TOKEN_LOCATION} {} is empty", empty.path())
        );

        let broken = TempFile::new("broken", "eyJ.first-half\nsecond-half-9911\n");
        let registry = settings(&[(TOKEN_LOCATION, broken.path())]).unwrap();
        let message = registry.bearer_token().unwrap_err().to_string();
        assert!(message.starts_with(TOKEN_LOCATION), "{message}");
        assert!(message.contains("line break"), "{message}");
        assert!(!message.contains("half"), "{message}");

        let registry = settings(&[(TOKEN_LOCATION, "/nonexistent/token")]).unwrap();
        let message = registry.bearer_token().unwrap_err().to_string();
        assert!(
            message.starts_with(&format!(
                "cannot read {TOKEN_LOCATION} /nonexistent/token ("
            )),
            "{message}"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_named_without_their_values() {
        let both = error(&[(BASIC, "user:basic-secret-31"), (TOKEN, "token-secret-32")]);
        assert!(
            both.starts_with(&format!("{BASIC} and {TOKEN} are both set")),
            "{both}"
        );
        let both = error(&[(BASIC, "user:basic-secret-31"), (TOKEN_LOCATION, "/t")]);
        assert!(both.starts_with(&format!("{BASIC} and {TOKEN_LOCATION} are both set")));
        let two_tokens = error(&[(TOKEN, "token-secret-33"), (TOKEN_LOCATION, "/t")]);
        assert!(
            two_tokens.starts_with(&format!("{TOKEN} and {TOKEN_LOCATION} are both set")),
            "{two_tokens}"
        );
        let spaced = error(&[(TOKEN, "Bearer token-secret-34")]);
        assert!(spaced.starts_with(&format!("{TOKEN}: the token holds a space")));
        for message in [&both, &two_tokens, &spaced] {
            assert!(!message.contains("secret-3"), "{message}");
        }
        let no_key = error(&[(CERTIFICATE, "/client.pem")]);
        assert!(no_key.starts_with(&format!("{CERTIFICATE} is set without {KEY}")));
        let no_certificate = error(&[(KEY, "/client.key")]);
        assert!(no_certificate.starts_with(&format!("{KEY} is set without {CERTIFICATE}")));
    }

    /// The error of building a client with `certificate` and `key` (PEM texts).
    fn client_error(certificate: &str, key: &str) -> Option<String> {
        let certificate = TempFile::new("cert.pem", certificate);
        let key = TempFile::new("key.pem", key);
        let registry = settings(&[(CERTIFICATE, certificate.path()), (KEY, key.path())]).unwrap();
        registry.client(None).err().map(|e| format!("{e:#}"))
    }

    #[test]
    fn a_client_certificate_with_its_pkcs8_key_builds_a_client() {
        assert_eq!(client_error(CERTIFICATE_PEM, KEY_PEM), None);
        // What `openssl pkcs12 ... -nodes` writes: attributes before the key.
        let with_attributes = format!("Bag Attributes\n    localKeyID: 01\n{KEY_PEM}");
        assert_eq!(client_error(CERTIFICATE_PEM, &with_attributes), None);
        // The key and the certificate in one file, as for Kafka's PEM key store.
        let both = format!("{KEY_PEM}{CERTIFICATE_PEM}");
        assert_eq!(client_error(CERTIFICATE_PEM, &both), None);
    }

    #[test]
    fn keys_in_other_formats_are_explained_with_the_conversion() {
        let pkcs1 =
            "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAK\n-----END RSA PRIVATE KEY-----\n";
        let message = client_error(CERTIFICATE_PEM, pkcs1).unwrap();
        assert!(message.starts_with(KEY), "{message}");
        assert!(message.contains("PKCS#1"), "{message}");
        assert!(
            message.contains("openssl pkcs8 -topk8 -nocrypt -in "),
            "{message}"
        );
        let message = client_error(CERTIFICATE_PEM, SEC1_KEY_PEM).unwrap();
        assert!(message.contains("SEC1 format"), "{message}");
        assert!(
            message.contains("openssl pkcs8 -topk8 -nocrypt"),
            "{message}"
        );
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let message = client_error(CERTIFICATE_PEM, encrypted).unwrap();
        assert!(message.contains("is encrypted"), "{message}");
        let message = client_error(KEY_PEM, KEY_PEM).unwrap();
        assert!(message.starts_with(&format!("{CERTIFICATE} ")), "{message}");
        assert!(message.contains("no PEM certificate"), "{message}");
        for message in [
            client_error(CERTIFICATE_PEM, pkcs1).unwrap(),
            client_error(CERTIFICATE_PEM, encrypted).unwrap(),
        ] {
            assert!(!message.contains("MIIB"), "no key material: {message}");
        }
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_properties() {
        let message = client_error(CERTIFICATE_PEM, OTHER_KEY_PEM).unwrap();
        assert!(
            message.starts_with(&format!(
                "the client certificate ({CERTIFICATE}) and key ({KEY}) cannot be used together"
            )),
            "{message}"
        );
    }

    #[test]
    fn an_unreadable_certificate_or_ca_file_is_named() {
        let key = TempFile::new("key.pem", KEY_PEM);
        let registry =
            settings(&[(CERTIFICATE, "/nonexistent/client.pem"), (KEY, key.path())]).unwrap();
        let message = format!("{:#}", registry.client(None).unwrap_err());
        assert!(
            message.starts_with(&format!(
                "cannot read {CERTIFICATE} /nonexistent/client.pem ("
            )),
            "{message}"
        );
        let registry = settings(&[(CA, "/nonexistent/ca.pem")]).unwrap();
        let message = format!("{:#}", registry.client(None).unwrap_err());
        assert!(message.starts_with(&format!("cannot read {CA} /nonexistent/ca.pem (")));
        let not_pem = TempFile::new("ca.pem", "not a certificate\n");
        let registry = settings(&[(CA, not_pem.path())]).unwrap();
        let message = format!("{:#}", registry.client(None).unwrap_err());
        assert!(message.contains("holds no PEM certificate"), "{message}");
    }
}
