//! What librdkafka's statistics say of a client's brokers, for the metrics:
//! request round trips and throttling, per broker, and request timeouts.
//!
//! librdkafka sends them every [`STATISTICS_INTERVAL_MS`] to the client's
//! context, which keeps the last of them here; the processing thread puts
//! them into its snapshot when it publishes one.

use std::collections::BTreeMap;
use std::sync::Mutex;

use rdkafka::statistics::Statistics;
use rdkafka::ClientConfig;

use crate::metrics::{self, Snapshot};

/// How often librdkafka reports, unless `statistics.interval.ms` is given.
const STATISTICS_INTERVAL_MS: &str = "15000";

/// Asks librdkafka for statistics on a client whose context keeps them.
pub(crate) fn enable(config: &mut ClientConfig) {
    if config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
}

/// One broker, as the last statistics saw it.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct BrokerFigures {
    rtt_p50_us: i64,
    rtt_p99_us: i64,
    throttle_max_ms: i64,
}

/// The last statistics of one client, by broker id, and its request
/// timeouts so far.
#[derive(Debug, Default)]
pub(crate) struct ClientStatistics {
    last: Mutex<(BTreeMap<i32, BrokerFigures>, u64)>,
}

impl ClientStatistics {
    /// Keeps what matters of `statistics`. The bootstrap connections
    /// (broker id -1) are left out: they are not brokers of the cluster.
    pub fn record(&self, statistics: &Statistics) {
        let mut brokers = BTreeMap::new();
        let mut timeouts = 0;
        for broker in statistics.brokers.values() {
            timeouts += broker.req_timeouts;
            if broker.nodeid < 0 {
                continue;
            }
            let rtt = broker.rtt.clone().unwrap_or_default();
            brokers.insert(
                broker.nodeid,
                BrokerFigures {
                    rtt_p50_us: rtt.p50,
                    rtt_p99_us: rtt.p99,
                    throttle_max_ms: broker.throttle.as_ref().map_or(0, |window| window.max),
                },
            );
        }
        *self.last.lock().unwrap() = (brokers, timeouts);
    }

    /// Sets the series of this client, `client` (`consumer`, `producer`).
    pub fn export(&self, client: &'static str, snapshot: &mut Snapshot) {
        let (brokers, timeouts) = &*self.last.lock().unwrap();
        for (broker, figures) in brokers {
            let labels = |quantile: Option<&str>| {
                let mut labels = vec![
                    ("client", client.to_string()),
                    ("broker", broker.to_string()),
                ];
                if let Some(quantile) = quantile {
                    labels.push(("quantile", quantile.to_string()));
                }
                labels
            };
            for (quantile, micros) in [("0.5", figures.rtt_p50_us), ("0.99", figures.rtt_p99_us)] {
                snapshot.set(
                    metrics::KAFKA_REQUEST_LATENCY,
                    labels(Some(quantile)),
                    micros as f64 / 1e6,
                );
            }
            snapshot.set(
                metrics::KAFKA_THROTTLE_MAX,
                labels(None),
                figures.throttle_max_ms as f64 / 1e3,
            );
        }
        snapshot.add(
            metrics::KAFKA_REQUEST_TIMEOUTS,
            vec![("client", client.to_string())],
            *timeouts,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_round_trips_and_throttling_are_kept_and_bootstrap_left_out() {
        use rdkafka::statistics::{Broker, Window};
        let broker = |nodeid, timeouts, rtt: Option<Window>, throttle: Option<Window>| Broker {
            nodeid,
            req_timeouts: timeouts,
            rtt,
            throttle,
            ..Broker::default()
        };
        let rtt = Window {
            p50: 1_200,
            p99: 8_500,
            ..Window::default()
        };
        let throttle = Window {
            max: 250,
            ..Window::default()
        };
        let statistics = Statistics {
            brokers: [
                (
                    "127.0.0.1:9092/1".to_string(),
                    broker(1, 2, Some(rtt), Some(throttle)),
                ),
                (
                    "127.0.0.1:9092/bootstrap".to_string(),
                    broker(-1, 1, None, None),
                ),
            ]
            .into(),
            ..Statistics::default()
        };
        let kept = ClientStatistics::default();
        kept.record(&statistics);
        let mut snapshot = Snapshot::default();
        kept.export("producer", &mut snapshot);
        let latency = |quantile| {
            snapshot.gauge(
                metrics::KAFKA_REQUEST_LATENCY,
                &[
                    ("client", "producer"),
                    ("broker", "1"),
                    ("quantile", quantile),
                ],
            )
        };
        assert_eq!(latency("0.5"), 0.0012);
        assert_eq!(latency("0.99"), 0.0085);
        assert_eq!(
            snapshot.gauge(metrics::KAFKA_THROTTLE_MAX, &[("broker", "1")]),
            0.25
        );
        assert_eq!(
            snapshot.gauge(metrics::KAFKA_REQUEST_LATENCY, &[("broker", "-1")]),
            0.0,
            "no series of the bootstrap connection"
        );
        assert_eq!(snapshot.counter(metrics::KAFKA_REQUEST_TIMEOUTS, &[]), 3);
    }
}
