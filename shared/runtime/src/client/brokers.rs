//! A librdkafka client that has dropped every broker it knew is given its
//! bootstrap servers again.
//!
//! librdkafka (2.10 on) drops the brokers a metadata response leaves out. A
//! response that names no broker at all, which a broker answers while it
//! shuts down when it is the only live one (a single-broker cluster
//! restarting), leaves the client with none: nothing to connect to, nothing
//! to ask for metadata, and its own re-bootstrap never starts
//! (confluentinc/librdkafka#5301). A group consumer then looks for its
//! coordinator forever: no fetch, no offset read, no commit. Adding the
//! bootstrap servers back is what that re-bootstrap would do; the first
//! metadata answer restores the broker list.

use std::ffi::{c_char, CString};
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

/// How often a client is checked.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long a client given its bootstrap servers has to reach a broker
/// before they are added again (librdkafka keeps a copy of the list per
/// call, so not every check).
const RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// Watches one client for the loss of every broker (see the module).
#[derive(Debug, Default)]
pub(crate) struct BrokerWatch {
    checked: Option<Instant>,
    /// When the bootstrap servers were last added, while cut off.
    rebootstrapped: Option<Instant>,
}

impl BrokerWatch {
    /// Checks `client` (at most every [`CHECK_INTERVAL`]) and gives it its
    /// bootstrap servers again if it knows no broker.
    pub fn check<C: ClientContext>(&mut self, client: &Client<C>) {
        if self
            .checked
            .is_some_and(|checked| checked.elapsed() < CHECK_INTERVAL)
        {
            return;
        }
        self.checked = Some(Instant::now());
        if !cut_off(client) {
            self.rebootstrapped = None;
            return;
        }
        if self
            .rebootstrapped
            .is_some_and(|added| added.elapsed() < RETRY_INTERVAL)
        {
            return;
        }
        self.rebootstrapped = Some(Instant::now());
        rebootstrap(client);
    }
}

/// Gives `client` its bootstrap servers again if it knows no broker, for a
/// client used now and then (a check per use).
pub(crate) fn rebootstrap_if_cut_off<C: ClientContext>(client: &Client<C>) {
    if cut_off(client) {
        rebootstrap(client);
    }
}

/// Adds `client`'s bootstrap servers to its brokers.
fn rebootstrap<C: ClientContext>(client: &Client<C>) {
    let Some(servers) = config_value(client, "bootstrap.servers") else {
        return;
    };
    tracing::warn!(
        client = %client_name(client),
        servers = %servers.to_string_lossy(),
        "the Kafka client has dropped every broker (a metadata answer named none); \
         connecting to the bootstrap servers again"
    );
    // SAFETY: `client` keeps its handle alive; librdkafka copies the list.
    unsafe { rd::rd_kafka_brokers_add(client.native_ptr(), servers.as_ptr()) };
}

/// Whether `client`, which has had metadata (it knows its cluster's id),
/// knows no broker from it any more (its bootstrap servers not counted).
fn cut_off<C: ClientContext>(client: &Client<C>) -> bool {
    let native = client.native_ptr();
    let mut learned = 0;
    // SAFETY: `client` keeps its handle alive; the id list and the cluster
    // id are librdkafka's copies, freed here (freeing null is a no-op).
    unsafe {
        let ids = rd::rd_kafka_brokers_learned_ids(native, &mut learned);
        rd::rd_kafka_mem_free(native, ids.cast());
        if learned > 0 {
            return false;
        }
        let cluster = rd::rd_kafka_clusterid(native, 0);
        rd::rd_kafka_mem_free(native, cluster.cast());
        !cluster.is_null()
    }
}

/// The value of property `name` in `client`'s configuration.
fn config_value<C: ClientContext>(client: &Client<C>, name: &str) -> Option<CString> {
    let name = CString::new(name).ok()?;
    let mut buffer = vec![0 as c_char; 1024];
    let mut size = buffer.len();
    // SAFETY: `client` keeps its handle and configuration alive; `size`
    // holds the buffer's length, and on return the value's, its NUL included.
    let found = unsafe {
        let conf = rd::rd_kafka_conf(client.native_ptr());
        let mut result = rd::rd_kafka_conf_get(conf, name.as_ptr(), buffer.as_mut_ptr(), &mut size);
        if result == rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK && size > buffer.len() {
            buffer.resize(size, 0);
            result = rd::rd_kafka_conf_get(conf, name.as_ptr(), buffer.as_mut_ptr(), &mut size);
        }
        result == rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK
    };
    if !found {
        return None;
    }
    let bytes: Vec<u8> = buffer
        .into_iter()
        .take_while(|&c| c != 0)
        .map(|c| c as u8)
        .collect();
    CString::new(bytes).ok().filter(|value| !value.is_empty())
}

/// The client's `rdkafka#consumer-1` name, for the log.
fn client_name<C: ClientContext>(client: &Client<C>) -> String {
    // SAFETY: `client` keeps its handle alive; the name is a NUL-terminated
    // string owned by it.
    unsafe { std::ffi::CStr::from_ptr(rd::rd_kafka_name(client.native_ptr())) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::ClientConfig;

    fn consumer(servers: &str) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", servers)
            .create()
            .unwrap()
    }

    #[test]
    fn a_client_reads_its_bootstrap_servers_back() {
        let short = consumer("127.0.0.1:1,127.0.0.1:2");
        let value = config_value(short.client(), "bootstrap.servers").unwrap();
        assert_eq!(value.to_str().unwrap(), "127.0.0.1:1,127.0.0.1:2");
        // Longer than the first buffer.
        let servers: Vec<String> = (1..200).map(|port| format!("127.0.0.1:{port}")).collect();
        let long = consumer(&servers.join(","));
        let value = config_value(long.client(), "bootstrap.servers").unwrap();
        assert_eq!(value.to_str().unwrap(), servers.join(","));
    }

    #[test]
    fn a_client_that_never_had_metadata_is_not_cut_off() {
        let client = consumer("127.0.0.1:1");
        assert!(!cut_off(client.client()));
    }
}
