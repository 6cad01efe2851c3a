//! The standby thread's eyes on the broker: the stage's group membership and
//! the ends of the changelog partitions it tails, read on a thread of their
//! own. Describing a group can take seconds while it rebalances, exactly
//! when the standby thread must hand a store over at once; so the standby
//! thread never waits on these round trips, it reads the last [`Observation`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use super::placement::{decode_assignment, Member};
use super::REFRESH;
use crate::client::brokers::rebootstrap_if_cut_off;
use crate::client::kafka::{member_id, parse_client_id};

/// How long one round trip of the watcher may take.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(2);

/// What the watcher saw last.
#[derive(Default, Clone)]
pub(super) struct Observation {
    /// The group's members with their tasks; `None` while the group
    /// rebalances or cannot be described.
    pub members: Option<Vec<Member>>,
    /// The end offset of each watched changelog partition.
    pub ends: HashMap<(String, i32), i64>,
    /// Counts observations, so that a reader can tell a new one.
    pub round: u64,
}

/// Reads the group and the changelog ends every [`REFRESH`].
pub(super) struct GroupWatcher {
    client: BaseConsumer,
    group: String,
    task_topics: Vec<String>,
    static_members: bool,
    /// The changelog partitions whose ends to read (the standbys').
    watched: Mutex<Vec<(String, i32)>>,
    observed: Mutex<Observation>,
}

impl GroupWatcher {
    pub fn new(
        base: &ClientConfig,
        group: &str,
        task_topics: Vec<String>,
        static_members: bool,
    ) -> anyhow::Result<Self> {
        let client = base
            .clone()
            .set("group.id", format!("{group}-standby-watch"))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the standby's group watcher: {e}"))?;
        Ok(GroupWatcher {
            client,
            group: group.to_string(),
            task_topics,
            static_members,
            watched: Mutex::default(),
            observed: Mutex::default(),
        })
    }

    /// Sets the changelog partitions whose ends to read.
    pub fn watch(&self, partitions: Vec<(String, i32)>) {
        *self.watched.lock().unwrap() = partitions;
    }

    /// The last observation.
    pub fn observed(&self) -> Observation {
        self.observed.lock().unwrap().clone()
    }

    /// Observes until `shutdown`.
    pub fn run(&self, shutdown: &AtomicBool) {
        while !shutdown.load(Ordering::Relaxed) {
            let started = Instant::now();
            rebootstrap_if_cut_off(self.client.client());
            let members = self.members();
            let watched = self.watched.lock().unwrap().clone();
            let ends = watched
                .into_iter()
                .filter_map(|(topic, partition)| {
                    let (_, high) = self
                        .client
                        .fetch_watermarks(&topic, partition, ROUND_TRIP_TIMEOUT)
                        .ok()?;
                    Some(((topic, partition), high))
                })
                .collect();
            {
                let mut observed = self.observed.lock().unwrap();
                observed.members = members;
                observed.ends = ends;
                observed.round += 1;
            }
            while started.elapsed() < REFRESH && !shutdown.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The group's members with their tasks, or `None` while the group is
    /// rebalancing or cannot be described.
    fn members(&self) -> Option<Vec<Member>> {
        let list = match self
            .client
            .fetch_group_list(Some(&self.group), ROUND_TRIP_TIMEOUT)
        {
            Ok(list) => list,
            Err(error) => {
                tracing::warn!(%error, "standby: cannot describe the consumer group");
                return None;
            }
        };
        let group = list.groups().first()?;
        if group.state() != "Stable" {
            return None;
        }
        group
            .members()
            .iter()
            .map(|member| {
                let assignment = decode_assignment(member.assignment().unwrap_or_default())?;
                let tasks = self
                    .task_topics
                    .iter()
                    .filter_map(|topic| assignment.get(topic))
                    .flatten()
                    .copied()
                    .collect();
                let (instance, order) = match parse_client_id(member.client_id()) {
                    Some((instance, thread)) if self.static_members => {
                        let order = member_id(instance, thread);
                        (instance.to_string(), order)
                    }
                    Some((instance, _)) => (instance.to_string(), member.id().to_string()),
                    None => (member.client_id().to_string(), member.id().to_string()),
                };
                Some(Member {
                    order,
                    instance,
                    tasks,
                })
            })
            .collect()
    }
}
