//! Delivery reports: which commit's generation each record belongs to, the
//! offsets its tracked records reached, and the first failure.
//!
//! A record's opaque is its tag shifted left by [`GENERATION_BITS`], with its
//! generation in the low bits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;

use crate::client::statistics::ClientStatistics;

/// Tag for records whose delivery offset nobody needs.
pub const UNTRACKED: usize = 0;

/// Low bits of a record's opaque that carry its generation.
pub(super) const GENERATION_BITS: u32 = 8;

/// Generations in use before a slot is reused: far more than can be in
/// flight (one commit at a time), so a late report never counts for a
/// younger generation.
pub(super) const GENERATIONS: usize = 1 << GENERATION_BITS;

/// A commit's records, as told apart in delivery reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(pub(super) usize);

/// Receives delivery reports.
pub struct DeliveryReports {
    /// Highest delivered offset per tracked tag.
    pub(super) offsets: Mutex<HashMap<usize, i64>>,
    /// The first delivery failure since the last commit.
    pub(super) failure: Mutex<Option<KafkaError>>,
    /// Reports served (delivered or failed), per generation.
    pub(super) reported: [AtomicU64; GENERATIONS],
    /// What the broker refused for want of an ACL, once: retrying cannot
    /// help, so the next commit fails for good with it.
    pub(super) denied: Mutex<Option<String>>,
    /// The producer's last librdkafka statistics.
    pub(super) statistics: ClientStatistics,
}

impl Default for DeliveryReports {
    fn default() -> Self {
        DeliveryReports {
            offsets: Mutex::default(),
            failure: Mutex::default(),
            reported: std::array::from_fn(|_| AtomicU64::new(0)),
            denied: Mutex::default(),
            statistics: ClientStatistics::default(),
        }
    }
}

impl DeliveryReports {
    fn deny(&self, what: String) {
        self.denied.lock().unwrap().get_or_insert(what);
    }
}

impl ClientContext for DeliveryReports {
    fn stats(&self, statistics: Statistics) {
        self.statistics.record(&statistics);
    }

    /// librdkafka's log, as rdkafka's default forwards it; a transaction
    /// that a missing ACL made abortable shows only here ("Failed to add
    /// partition ... to transaction: Broker: Topic authorization failed"),
    /// and later sends fail with a bare "Erroneous state".
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if message.contains("authorization failed") {
            self.deny(message.to_string());
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
        }
    }
}

impl ProducerContext for DeliveryReports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        self.reported[opaque % GENERATIONS].fetch_add(1, Ordering::Relaxed);
        let tag = opaque >> GENERATION_BITS;
        match result {
            Ok(message) if tag != UNTRACKED => {
                let mut offsets = self.offsets.lock().unwrap();
                let offset = offsets.entry(tag).or_insert(-1);
                *offset = (*offset).max(message.offset());
            }
            Ok(_) => {}
            Err((error, message)) => {
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
                    self.deny(format!(
                        "cannot write to topic {}: {error}",
                        message.topic()
                    ));
                }
                self.failure
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| error.clone());
            }
        }
    }
}
