//! Interactive queries: the committed state of every store, over HTTP, from
//! any instance (Kafka Streams' IQv2, ksqlDB's pull queries).
//!
//! With `--query-addr`, each instance answers
//!
//! * `GET /stores`: the stores it can be asked about;
//! * `GET /stores/<stage>/<store>/keys/<key>`: one key;
//! * `GET /stores/<stage>/<store>/keys/<key>/windows?from=&to=`: a key's
//!   windows starting in a time range (windowed stores);
//! * `GET /stores/<stage>/<store>/range?from=&to=&prefix=&limit=`: keys in a
//!   range, from every task (or one, `partition=`), each task's answer apart.
//!
//! A key belongs to the task its partition (murmur2, as the producers'
//! partitioner) names. An instance that does not own it forwards the query
//! once to the owner ([`peers`]: the group's description says who owns
//! it, the endpoints topic where it answers); a forwarded query carries
//! [`server::HOP_HEADER`] and is never forwarded again. Every answer says the
//! changelog offset it reflects (`position`) and how far it is behind what
//! is known to be committed (`lag`); `min_position=`, `max_lag=` and
//! `standby=allow` ask for more or allow less. While a task is restored or
//! moves, the answer is 503 with `Retry-After`, never a stale value
//! presented as current. docs/queries.md has the whole contract.

mod json;
pub(crate) mod peers;
mod read;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use json::state_value_json;
pub(crate) use server::{serve, QueryServer};

use crate::processor::StoreSpec;

/// The flags of interactive queries (part of [`crate::RuntimeArgs`]).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct QueryArgs {
    /// Serve queries of the state on this address (off without it). A
    /// listener of its own, apart from `--http-addr`: it reads all of the
    /// application's state, so it is opened only when asked for.
    #[arg(long, env = "QUERY_ADDR")]
    pub query_addr: Option<SocketAddr>,

    /// The URL at which the other instances reach this one's queries.
    /// Default `http://<host name>:<port of --query-addr>` (`https` with
    /// `--query-tls-cert-file`).
    #[arg(long, env = "QUERY_ADVERTISED_URL")]
    pub query_advertised_url: Option<String>,

    /// A file holding the bearer token every query must present
    /// (`Authorization: Bearer <token>`); forwarded queries carry it too, so
    /// every instance of the application needs the same one.
    #[arg(long, env = "QUERY_TOKEN_FILE")]
    pub query_token_file: Option<PathBuf>,

    /// Serve queries over TLS with this certificate chain (PEM); needs
    /// `--query-tls-key-file`.
    #[arg(long, env = "QUERY_TLS_CERT_FILE", requires = "query_tls_key_file")]
    pub query_tls_cert_file: Option<PathBuf>,

    /// The private key of `--query-tls-cert-file` (PKCS#8 PEM).
    #[arg(long, env = "QUERY_TLS_KEY_FILE", requires = "query_tls_cert_file")]
    pub query_tls_key_file: Option<PathBuf>,

    /// A CA certificate (PEM) to trust, besides the system's, when a query
    /// is forwarded to another instance over TLS.
    #[arg(long, env = "QUERY_TLS_CA_FILE")]
    pub query_tls_ca_file: Option<PathBuf>,

    /// Serve queries on an address other hosts can reach without
    /// `--query-token-file`: anyone who reaches the port then reads every
    /// store. Refused without this flag.
    #[arg(long, env = "QUERY_ALLOW_UNAUTHENTICATED")]
    pub query_allow_unauthenticated: bool,

    /// Queries answered at once, at most; one more is answered 429 with
    /// `Retry-After`, so that a flood of queries cannot take the threads
    /// and memory that processing needs.
    #[arg(long, env = "QUERY_MAX_CONCURRENT", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub query_max_concurrent: u32,
}

impl QueryArgs {
    /// Refuses a listener that would serve every store, unauthenticated, to
    /// other hosts, unless `--query-allow-unauthenticated` says so.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let Some(address) = self.query_addr else {
            return Ok(());
        };
        anyhow::ensure!(
            self.query_token_file.is_some()
                || address.ip().is_loopback()
                || self.query_allow_unauthenticated,
            "--query-addr {address} can be reached from other hosts, and without \
             --query-token-file anyone who reaches it reads every store: set \
             --query-token-file (docs/queries.md), or --query-allow-unauthenticated \
             to serve it open all the same"
        );
        Ok(())
    }

    /// The URL this instance advertises, once `--query-addr` is set.
    pub(crate) fn advertised_url(&self) -> Option<String> {
        let address = self.query_addr?;
        Some(match &self.query_advertised_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let host = std::env::var("HOSTNAME")
                    .ok()
                    .filter(|name| !name.is_empty())
                    .or_else(host_name)
                    .unwrap_or_else(|| address.ip().to_string());
                let scheme = match self.query_tls_cert_file {
                    Some(_) => "https",
                    None => "http",
                };
                format!("{scheme}://{host}:{}", address.port())
            }
        })
    }

    /// The bearer token, read from its file.
    pub(crate) fn token(&self) -> anyhow::Result<Option<QueryToken>> {
        self.query_token_file
            .as_ref()
            .map(|path| QueryToken::read(path.clone()))
            .transpose()
    }

    /// The listener's TLS acceptor, with `--query-tls-cert-file`.
    pub(crate) fn tls_acceptor(&self) -> anyhow::Result<Option<tokio_native_tls::TlsAcceptor>> {
        let (Some(cert), Some(key)) = (&self.query_tls_cert_file, &self.query_tls_key_file) else {
            return Ok(None);
        };
        let read = |path: &PathBuf, flag: &str| {
            std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", path.display()))
        };
        let identity = native_tls::Identity::from_pkcs8(
            &read(cert, "--query-tls-cert-file")?,
            &read(key, "--query-tls-key-file")?,
        )
        .map_err(|e| {
            anyhow::anyhow!("--query-tls-cert-file and --query-tls-key-file (PKCS#8 PEM): {e}")
        })?;
        let acceptor = native_tls::TlsAcceptor::new(identity)
            .map_err(|e| anyhow::anyhow!("cannot set up TLS for queries: {e}"))?;
        Ok(Some(acceptor.into()))
    }

    /// The client that forwards queries to other instances.
    pub(crate) fn forwarding_client(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &self.query_tls_ca_file {
            let pem = std::fs::read(path).map_err(|e| {
                anyhow::anyhow!("cannot read --query-tls-ca-file {}: {e}", path.display())
            })?;
            let certificate = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| anyhow::anyhow!("--query-tls-ca-file {}: {e}", path.display()))?;
            builder = builder.add_root_certificate(certificate);
        }
        builder
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the query forwarding client: {e}"))
    }
}

/// The bearer token of `--query-token-file`, read again once the file
/// changes (a Kubernetes Secret updated in place), so that a new token
/// takes effect without a restart.
pub(crate) struct QueryToken {
    path: PathBuf,
    /// The token, with the modification time of the file it came from.
    current: std::sync::Mutex<(Option<std::time::SystemTime>, String)>,
}

impl QueryToken {
    fn read(path: PathBuf) -> anyhow::Result<Self> {
        let (modified, token) = Self::load(&path)?;
        Ok(QueryToken {
            path,
            current: std::sync::Mutex::new((modified, token)),
        })
    }

    fn load(path: &std::path::Path) -> anyhow::Result<(Option<std::time::SystemTime>, String)> {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let token = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("cannot read --query-token-file {}: {e}", path.display())
        })?;
        let token = token.trim().to_string();
        anyhow::ensure!(
            !token.is_empty(),
            "--query-token-file {} is empty",
            path.display()
        );
        Ok((modified, token))
    }

    /// The token now: the file's, read again if it changed since. A file
    /// that cannot be read, or is empty, keeps the token as it was (with a
    /// warning): a Secret being replaced is briefly neither.
    pub(crate) fn get(&self) -> String {
        let mut current = self.current.lock().unwrap();
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified != current.0 {
            match Self::load(&self.path) {
                Ok(loaded) => {
                    tracing::info!(path = %self.path.display(), "queries: the token file changed; its new token is in use");
                    *current = loaded;
                }
                Err(error) => tracing::warn!("queries: keeping the token: {error:#}"),
            }
        }
        current.1.clone()
    }
}

fn host_name() -> Option<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    (result == 0).then(|| {
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    })
}

/// The name of the topic where instances advertise their query URL.
pub(crate) fn endpoints_topic(application_id: &str) -> String {
    format!("{application_id}-query-endpoints")
}

/// A stage whose stores can be queried.
#[derive(Debug, Clone)]
pub(crate) struct QueryableStage {
    /// As `describe` names it (`main` for the first stage).
    pub name: String,
    pub group: peers::StageGroup,
    /// `<state-dir>/<stage application id>`: task *p* is in `task-<p>`.
    pub state_dir: PathBuf,
    /// The processor's stores, with their index in the task's database
    /// and their changelog topic.
    pub stores: Vec<(StoreSpec, usize, String)>,
}
