//! The HTTP side of [`Registry`](super::Registry): `schema_registry_converter`'s
//! async client, driven from a processing thread through the runtime handle,
//! its failures classified, and a bearer token read from a file re-read when
//! the registry refuses it.
//!
//! A token file is re-read on a 401 (at most once per request, and used only
//! when its content changed): a token mounted from a Kubernetes Secret is
//! replaced in place when the Secret is updated (unless mounted with
//! `subPath`), so a rotated token is picked up without a restart. A 401 with
//! an unchanged file is the error it was.

use std::future::Future;
use std::sync::RwLock;

use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::error::SRCError;

use super::RegistryError;
use crate::client::RegistrySettings;

/// A remote registry's client.
pub(super) struct Remote {
    config: RegistrySettings,
    client: RwLock<Client>,
    runtime: tokio::runtime::Handle,
}

/// The client settings with the token they carry.
struct Client {
    settings: SrSettings,
    token: Option<String>,
}

impl Remote {
    /// Checks `config`, reads its files (token, CA, client certificate)
    /// and builds the client.
    pub fn new(config: &RegistrySettings, runtime: tokio::runtime::Handle) -> anyhow::Result<Self> {
        config.check()?;
        let token = config.bearer_token()?;
        let settings = config.client(token.as_deref())?;
        Ok(Remote {
            config: config.clone(),
            client: RwLock::new(Client { settings, token }),
            runtime,
        })
    }

    /// Runs `call` to completion on the runtime (blocking this thread); when
    /// the registry refuses a token read from a file whose content has
    /// changed since, once more with the new token.
    pub fn call<T, F, Fut>(&self, call: F) -> Result<T, RegistryError>
    where
        F: Fn(SrSettings) -> Fut,
        Fut: Future<Output = Result<T, SRCError>>,
    {
        let settings = self.settings();
        match self.runtime.block_on(call(settings)) {
            Ok(value) => Ok(value),
            Err(error) => {
                let error = self.classify(error);
                if matches!(error, RegistryError::Refused { status: 401, .. })
                    && self.reread_token()
                {
                    return self
                        .runtime
                        .block_on(call(self.settings()))
                        .map_err(|e| self.classify(e));
                }
                Err(error)
            }
        }
    }

    fn settings(&self) -> SrSettings {
        let client = self.client.read().unwrap_or_else(|e| e.into_inner());
        client.settings.clone()
    }

    /// Re-reads the token file; whether it held a new token (now in use).
    fn reread_token(&self) -> bool {
        let Some(path) = &self.config.bearer_token_location else {
            return false;
        };
        let token = match self.config.bearer_token() {
            Ok(token) => token,
            Err(error) => {
                tracing::warn!(error = %error, "cannot re-read the registry's bearer token");
                return false;
            }
        };
        let mut client = self.client.write().unwrap_or_else(|e| e.into_inner());
        if client.token == token {
            return false;
        }
        match self.config.client(token.as_deref()) {
            Ok(settings) => {
                tracing::info!(
                    file = %path.display(),
                    "the registry refused the bearer token: using the new one its file holds"
                );
                *client = Client { settings, token };
                true
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot rebuild the registry client");
                false
            }
        }
    }

    /// What a failed call means: not found, refused credentials, rejected,
    /// or unavailable (worth retrying).
    pub fn classify(&self, error: SRCError) -> RegistryError {
        let text = match &error.cause {
            Some(cause) => format!("{}: {cause}", error.error),
            None => error.error.clone(),
        };
        let url = self.config.url.trim_end_matches('/');
        if text.contains("status 401") {
            RegistryError::Refused {
                status: 401,
                message: format!(
                    "the schema registry at {url} refused {} (HTTP 401 Unauthorized): wrong, \
                     expired or unknown to the registry",
                    self.config.credentials()
                ),
            }
        } else if text.contains("status 403") {
            RegistryError::Refused {
                status: 403,
                message: format!(
                    "the schema registry at {url} accepted {} but does not allow the request \
                     (HTTP 403 Forbidden): the registry user lacks the permission ({text})",
                    self.config.credentials()
                ),
            }
        } else if text.contains("404") {
            RegistryError::NotFound(text)
        } else if text.contains("status 4") {
            RegistryError::Rejected(text)
        } else {
            RegistryError::Unavailable {
                url: url.to_string(),
                message: text,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::super::Registry;
    use super::*;

    /// A registry stand-in on `listener`: schema id 1 (`"string"`) for a
    /// request with `Bearer new-token`, 401 for any other; each request's
    /// `Authorization` header is kept in `seen`.
    fn serve(listener: TcpListener, seen: Arc<Mutex<Vec<String>>>) {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut authorization = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("authorization") {
                        authorization = value.trim().to_string();
                    }
                }
            }
            let (status, body) = if authorization == "Bearer new-token" {
                ("200 OK", r#"{"schema": "\"string\""}"#)
            } else {
                (
                    "401 Unauthorized",
                    r#"{"error_code": 401, "message": "Unauthorized"}"#,
                )
            };
            seen.lock().unwrap().push(authorization);
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    }

    #[test]
    fn a_refused_token_is_read_again_from_its_file_and_used_once_it_changed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let server_seen = seen.clone();
        std::thread::spawn(move || serve(listener, server_seen));
        let token = std::env::temp_dir().join(format!("registry-token-{}", std::process::id()));
        std::fs::write(&token, "old-token\n").unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let settings = RegistrySettings {
            url: url.clone(),
            bearer_token_location: Some(token.clone()),
            ..RegistrySettings::default()
        };
        let registry = Registry::new(&settings, runtime.handle().clone()).unwrap();

        // An unchanged file: the 401 stands, and nothing is sent twice.
        let refused = registry.schema_by_id(1).unwrap_err();
        assert!(
            matches!(refused, RegistryError::Refused { status: 401, .. }),
            "{refused:?}"
        );
        assert_eq!(
            refused.to_string(),
            format!(
                "the schema registry at {url} refused the credentials of \
                 schema.registry.bearer.auth.token.location (HTTP 401 Unauthorized): wrong, \
                 expired or unknown to the registry"
            )
        );
        assert_eq!(*seen.lock().unwrap(), ["Bearer old-token"]);

        // The Secret was updated: the next 401 reads the new token and retries.
        std::fs::write(&token, "new-token\n").unwrap();
        let schema = registry.schema_by_id(1).unwrap();
        assert_eq!(schema.canonical_form(), "\"string\"");
        assert_eq!(
            *seen.lock().unwrap(),
            ["Bearer old-token", "Bearer old-token", "Bearer new-token"]
        );
        std::fs::remove_file(&token).unwrap();
    }
}
