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

use super::placement::Member;
use super::REFRESH;
use crate::client::brokers::rebootstrap_if_cut_off;
use crate::client::kafka::{group_describer, member_id, parse_client_id};
use crate::native_admin::describe_classic_groups;

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
        Ok(GroupWatcher {
            client: group_describer(base, group, "standby-watch")?,
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
    /// rebalancing or cannot be described (an assignment that is not the
    /// consumer protocol's included).
    fn members(&self) -> Option<Vec<Member>> {
        let mut described =
            match describe_classic_groups(self.client.client(), &[&self.group], ROUND_TRIP_TIMEOUT)
            {
                Ok(described) => described,
                Err(error) => {
                    tracing::warn!("standby: {error:#}");
                    return None;
                }
            };
        let group = described.remove(&self.group)?;
        if !group.stable || group.undecoded {
            return None;
        }
        let members = group.members.into_iter().map(|member| {
            let tasks = (member.assignment.iter())
                .filter(|(topic, _)| self.task_topics.contains(topic))
                .map(|(_, partition)| *partition)
                .collect();
            let (instance, order) = match parse_client_id(&member.client_id) {
                Some((instance, thread)) if self.static_members => {
                    (instance.to_string(), member_id(instance, thread))
                }
                Some((instance, _)) => (instance.to_string(), member.member_id.clone()),
                None => (member.client_id.clone(), member.member_id.clone()),
            };
            Member {
                order,
                instance,
                tasks,
            }
        });
        Some(members.collect())
    }
}
