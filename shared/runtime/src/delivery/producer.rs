//! Creating the producer of [`Delivery`], with `init_transactions` asked
//! promptly under exactly-once.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

use super::{Delivery, DeliveryReports};

/// How long one `init_transactions` call may wait before it is asked again.
const INIT_TRANSACTIONS_ATTEMPT: Duration = Duration::from_millis(50);

/// `init_transactions`, asked again every [`INIT_TRANSACTIONS_ATTEMPT`]
/// until `timeout`. librdkafka asks for a producer id as soon as the
/// producer exists; when its connection to the transaction coordinator is
/// not up yet at that moment, it tries again only 500 ms later, so a new
/// process often started half a second late. Each call of
/// `init_transactions` asks at once.
/// A call that times out, or fails with a retriable error (the coordinator
/// moving or still loading, as after a broker restart), may be repeated:
/// librdkafka's documented contract, and what one long call would have
/// done inside.
/// With `shutdown`, gives up once it is set.
fn init_transactions_promptly(
    producer: &BaseProducer<DeliveryReports>,
    transactional_id: &str,
    timeout: Duration,
    shutdown: Option<&AtomicBool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(flag) = shutdown {
            crate::shutdown::check(flag)?;
        }
        let attempt_started = Instant::now();
        let left = deadline.saturating_duration_since(attempt_started);
        match producer.init_transactions(INIT_TRANSACTIONS_ATTEMPT.min(left)) {
            Err(KafkaError::Transaction(error))
                if (error.is_retriable()
                    || error.code() == RDKafkaErrorCode::OperationTimedOut)
                    && Instant::now() < deadline =>
            {
                // A failure reported at once is asked again after a pause,
                // not in a tight loop.
                std::thread::sleep(
                    INIT_TRANSACTIONS_ATTEMPT.saturating_sub(attempt_started.elapsed()),
                );
            }
            Err(error)
                if error.rdkafka_error_code()
                    == Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) =>
            {
                anyhow::bail!(
                    "not authorized to use transactional id {}: this user lacks the WRITE ACL \
                     on it ({error}); `<service> acls` lists what a service needs",
                    transactional_id
                );
            }
            result => {
                return result
                    .map_err(|e| anyhow::anyhow!("cannot initialise Kafka transactions: {e}"))
            }
        }
    }
}

impl Delivery {
    /// A producer for `config`; with `transactional`, its transactions
    /// initialised (fencing any previous incarnation), unless `shutdown` is
    /// set meanwhile.
    pub(super) fn create(
        config: &ClientConfig,
        transactional: bool,
        timeout: Duration,
        shutdown: Option<&AtomicBool>,
    ) -> anyhow::Result<BaseProducer<DeliveryReports>> {
        let producer: BaseProducer<DeliveryReports> = config
            .create_with_context(DeliveryReports::default())
            .map_err(|e| anyhow::anyhow!("cannot create the Kafka producer: {e}"))?;
        if transactional {
            let id = config.get("transactional.id").unwrap_or_default();
            init_transactions_promptly(&producer, id, timeout, shutdown)?;
        }
        Ok(producer)
    }
}
