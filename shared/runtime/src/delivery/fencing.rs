//! Fencing the transactions of members that leave a stage's group.
//!
//! An instance killed in the middle of a transaction leaves it open, and the
//! open transaction holds back every read_committed reader of the partitions
//! it wrote: the output's consumers, and the restore of the instance's tasks
//! wherever the group moves them. Its transaction coordinator aborts it only
//! `transaction.timeout.ms` after it began, at its next check for expired
//! transactions (every 10 s by default): under load, 10–20 s after the
//! crash, when the group has long given the tasks away. An instance that
//! comes back fences its predecessor at once (the same transactional id,
//! `init_transactions`); one that does not come back has no successor.
//!
//! So under exactly-once each instance watches its stage's group, and when a
//! member leaves, the instance first by name among those that remain takes
//! the departed member's transactional id and initialises it: the
//! coordinator aborts the open transaction and bumps the id's epoch. A
//! departed member that is still alive (cut off, and dropped by the group)
//! can commit nothing more: its next commit is refused as fenced, and it
//! rolls back and rejoins ([`super::Delivery::commit`]).
//!
//! Classic groups only: the classic DescribeGroups request reports a KIP-848
//! group as dead, and the request that describes one aborts the process when
//! the coordinator's connection drops (see [`crate::native_admin`]).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

use crate::client::brokers::rebootstrap_if_cut_off;
use crate::client::kafka::{group_describer, parse_client_id, transactional_id};
use crate::native_admin::describe_classic_groups;

/// How often the group is described.
const REFRESH: Duration = Duration::from_secs(1);

/// How long one description of the group may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long fencing one transactional id may take: the coordinator first
/// writes the abort markers of the open transaction.
const FENCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Watches a stage's group and fences the transactional ids of the members
/// that leave it.
pub(crate) struct DepartedMemberFencer {
    client: BaseConsumer,
    /// The shared client settings, for the fencing producers.
    producer_config: ClientConfig,
    group: String,
    /// This instance's name, as its members' client ids carry it.
    instance: String,
    shutdown: Arc<AtomicBool>,
}

impl DepartedMemberFencer {
    pub fn new(
        base: &ClientConfig,
        group: &str,
        instance: &str,
        shutdown: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        Ok(DepartedMemberFencer {
            client: group_describer(base, group, "fencer")?,
            producer_config: base.clone(),
            group: group.to_string(),
            instance: instance.to_string(),
            shutdown,
        })
    }

    /// Watches until shutdown. Never fails: without it a failover waits for
    /// the transaction timeout, as it would anyway.
    pub fn run(self) {
        let mut members: Option<BTreeSet<String>> = None;
        while !self.shutdown.load(Ordering::Relaxed) {
            let started = Instant::now();
            if let Some(now) = self.members() {
                if let Some(before) = &members {
                    for id in to_fence(&self.group, before, &now, &self.instance) {
                        self.fence(&id);
                    }
                }
                members = Some(now);
            }
            while started.elapsed() < REFRESH && !self.shutdown.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The client ids of the group's members; `None` if the group cannot be
    /// described now (a broker away: the last members seen stay the ones
    /// to compare with).
    fn members(&self) -> Option<BTreeSet<String>> {
        rebootstrap_if_cut_off(self.client.client());
        let described =
            describe_classic_groups(self.client.client(), &[&self.group], DESCRIBE_TIMEOUT);
        match described {
            Ok(mut described) => {
                let group = described.remove(&self.group)?;
                Some(group.members.into_iter().map(|m| m.client_id).collect())
            }
            Err(error) => {
                tracing::debug!("fencing: {error:#}");
                None
            }
        }
    }

    /// Initialises a producer with `transactional_id`, which aborts its open
    /// transaction and fences its last owner.
    fn fence(&self, transactional_id: &str) {
        let started = Instant::now();
        let fenced = self
            .producer_config
            .clone()
            .set("transactional.id", transactional_id)
            .create::<BaseProducer>()
            .map_err(anyhow::Error::from)
            .and_then(|producer| Ok(producer.init_transactions(FENCE_TIMEOUT)?));
        match fenced {
            Ok(()) => tracing::info!(
                transactional_id,
                took_ms = started.elapsed().as_millis() as u64,
                "a member left the group: fenced its transactional id, so that its open \
                 transaction is aborted now rather than at its timeout"
            ),
            Err(error) => tracing::warn!(
                transactional_id,
                "a member left the group, and fencing its transactional id failed ({error:#}): \
                 its open transaction, if any, ends at its timeout"
            ),
        }
    }
}

/// The transactional ids to fence when the members of `group` (their
/// client ids) went from `before` to `now`, as instance `me` sees it: those
/// of the members that left, if `me` is the first instance by name that
/// remains, so that one instance fences each; else none. Members of `me`
/// itself are never fenced here (its own threads rejoin), nor members whose
/// client id is not a processing thread's.
fn to_fence(
    group: &str,
    before: &BTreeSet<String>,
    now: &BTreeSet<String>,
    me: &str,
) -> Vec<String> {
    let first_remaining = now
        .iter()
        .filter_map(|client_id| parse_client_id(client_id))
        .map(|(instance, _)| instance)
        .min();
    if first_remaining != Some(me) {
        return Vec::new();
    }
    before
        .difference(now)
        .filter_map(|client_id| parse_client_id(client_id))
        .filter(|(instance, _)| *instance != me)
        .map(|(instance, thread)| transactional_id(group, instance, thread))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    #[test]
    fn the_first_remaining_instance_fences_each_thread_that_left() {
        let before = members(&["a/0", "b/0", "b/1", "c/0"]);
        let now = members(&["a/0", "c/0"]);
        assert_eq!(
            to_fence("app", &before, &now, "a"),
            vec!["app-b".to_string(), "app-b-1".to_string()]
        );
        assert!(to_fence("app", &before, &now, "c").is_empty());
    }

    #[test]
    fn nothing_is_fenced_when_no_member_left() {
        let before = members(&["a/0", "b/0"]);
        let joined = members(&["a/0", "b/0", "c/0"]);
        assert!(to_fence("app", &before, &before, "a").is_empty());
        assert!(to_fence("app", &before, &joined, "a").is_empty());
    }

    #[test]
    fn an_instance_outside_the_group_fences_nothing_and_never_itself() {
        let before = members(&["a/0", "b/0"]);
        // `a` rejoining: not a member now, so not the one to fence `b`.
        assert!(to_fence("app", &before, &members(&["c/0"]), "a").is_empty());
        // One of `a`'s own threads left: its thread rejoins by itself.
        let before = members(&["a/0", "a/1", "b/0"]);
        assert!(to_fence("app", &before, &members(&["a/0", "b/0"]), "a").is_empty());
    }

    #[test]
    fn members_of_other_clients_are_left_alone() {
        let before = members(&["a/0", "rdkafka", "tool-1"]);
        let now = members(&["a/0"]);
        assert!(to_fence("app", &before, &now, "a").is_empty());
    }
}
