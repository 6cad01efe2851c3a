//! `send_offsets_to_transaction` on a thread of its own, with a deadline.
//!
//! librdkafka (2.12) can wait in this call forever, whatever its timeout
//! says: it looks the group coordinator up again only when some broker's
//! connection changes state, so a cached coordinator whose broker was
//! killed, left the metadata (its broker thread decommissioned) and came
//! back is never looked up again (confluentinc/librdkafka#5456 and #5511;
//! seen here when the leader-loss test killed the group coordinator's broker
//! during a commit). So the call runs on a thread of its own, and when it
//! outlives its deadline the caller gives the producer up to that thread
//! and replaces it: the new producer's `init_transactions` fences the old
//! one and has the coordinator abort its transaction.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaResult;
use rdkafka::producer::Producer;
use rdkafka::TopicPartitionList;

use super::TransactionalProducer;

/// How much longer than its own timeout the call may take before the
/// producer is given up.
const GRACE: Duration = Duration::from_secs(1);

/// One call to make.
struct Request {
    producer: Arc<TransactionalProducer>,
    offsets: TopicPartitionList,
    group: ConsumerGroupMetadata,
    timeout: Duration,
}

/// What became of a call.
pub(super) enum Sent {
    /// librdkafka returned, with this result.
    Returned(KafkaResult<()>),
    /// librdkafka did not return by the deadline; the producer is still in
    /// the call and must not be used again.
    Stuck,
}

/// The thread that makes the calls, one at a time.
pub(super) struct OffsetsSender {
    requests: SyncSender<Request>,
    outcomes: Receiver<KafkaResult<()>>,
}

impl OffsetsSender {
    pub fn start() -> std::io::Result<OffsetsSender> {
        let (requests, incoming) = mpsc::sync_channel::<Request>(1);
        let (reply, outcomes) = mpsc::sync_channel(1);
        // Ends when the sender is dropped; a thread given up on ends once
        // librdkafka returns, dropping the old producer with it.
        std::thread::Builder::new()
            .name("txn-offsets".into())
            .spawn(move || {
                for request in incoming {
                    let outcome = request.producer.send_offsets_to_transaction(
                        &request.offsets,
                        &request.group,
                        request.timeout,
                    );
                    if reply.send(outcome).is_err() {
                        break;
                    }
                }
            })?;
        Ok(OffsetsSender { requests, outcomes })
    }

    /// Adds `offsets` of `group` to `producer`'s transaction, waiting
    /// `timeout` and [`GRACE`] at most. After [`Sent::Stuck`] this sender
    /// is of no more use.
    pub fn send(
        &self,
        producer: &Arc<TransactionalProducer>,
        offsets: &TopicPartitionList,
        group: ConsumerGroupMetadata,
        timeout: Duration,
    ) -> Sent {
        let request = Request {
            producer: Arc::clone(producer),
            offsets: offsets.clone(),
            group,
            timeout,
        };
        if self.requests.send(request).is_err() {
            return Sent::Stuck;
        }
        match self.outcomes.recv_timeout(timeout + GRACE) {
            Ok(outcome) => Sent::Returned(outcome),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Sent::Stuck,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;

    /// A transactional producer whose brokers do not exist: the call fails
    /// (no transaction in progress) and the answer comes back.
    #[test]
    fn a_call_that_returns_gives_its_outcome() {
        let producer: TransactionalProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("transactional.id", "offsets-sender-test")
            .create_with_context(Default::default())
            .unwrap();
        let sender = OffsetsSender::start().unwrap();
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("t", 0, rdkafka::Offset::Offset(1))
            .unwrap();
        let group = group_metadata();
        match sender.send(&Arc::new(producer), &offsets, group, Duration::from_secs(1)) {
            Sent::Returned(outcome) => assert!(outcome.is_err()),
            Sent::Stuck => panic!("a failing call was reported stuck"),
        }
    }

    fn group_metadata() -> ConsumerGroupMetadata {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "offsets-sender-test")
            .create()
            .unwrap();
        consumer.group_metadata().unwrap()
    }
}
