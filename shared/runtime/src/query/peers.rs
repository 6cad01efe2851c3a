//! Where each task of each stage is served: the stages' consumer groups say
//! which instance owns a task, and the endpoints topic says where an
//! instance answers queries.
//!
//! `<app-id>-query-endpoints` is a compacted topic of one partition: each
//! instance writes, per stage, `<group>/<instance>` -> its advertised URL
//! when it starts, and a tombstone when it stops cleanly. Ownership is not
//! written there: the group coordinator's description (DescribeGroups for
//! classic groups, DescribeConsumerGroups for KIP-848 ones: see
//! [`describe_classic_groups`]) is the authority, so a killed instance stops
//! owning tasks as soon as the group has rebalanced, whatever the topic
//! still says. See docs/queries.md for the alternatives considered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::client::brokers::rebootstrap_if_cut_off;
use crate::client::kafka::{member_id, parse_client_id, GroupProtocol};
use crate::native_admin::{describe_classic_groups, describe_groups, GroupDescription};
use crate::standby::placement::{standby_tasks, Member};

/// How often the groups are described.
const REFRESH: Duration = Duration::from_secs(1);
/// How long one description may take.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a query router needs to know of one stage.
#[derive(Debug, Clone)]
pub struct StageGroup {
    pub group: String,
    /// A topic whose partition *p* belongs to task *p*.
    pub task_topic: String,
    pub tasks: usize,
    /// This process's instance name in the group's client ids.
    pub instance: String,
    pub static_members: bool,
    pub standby_replicas: usize,
}

/// The endpoints and groups as last read.
#[derive(Default)]
struct View {
    endpoints: HashMap<String, String>,
    groups: HashMap<String, GroupDescription>,
}

/// Reads the endpoints topic and describes the groups, on a thread of its
/// own; queries read the last view.
pub struct Peers {
    topic: String,
    stages: Vec<StageGroup>,
    /// The stages' group protocol, which says how their groups are described.
    protocol: GroupProtocol,
    consumer: BaseConsumer,
    producer: BaseProducer,
    view: Mutex<View>,
}

/// An instance that can answer for a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub instance: String,
    pub url: String,
}

fn endpoint_key(group: &str, instance: &str) -> String {
    format!("{group}/{instance}")
}

impl Peers {
    pub fn new(
        base: &ClientConfig,
        topic: String,
        stages: Vec<StageGroup>,
        protocol: GroupProtocol,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = base
            .clone()
            // Never joins: the topic's one partition is assigned by hand.
            .set("group.id", format!("{topic}-reader"))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the query endpoints reader: {e}"))?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(&topic, 0, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let producer: BaseProducer = base
            .clone()
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the query endpoints writer: {e}"))?;
        Ok(Peers {
            topic,
            stages,
            protocol,
            consumer,
            producer,
            view: Mutex::default(),
        })
    }

    /// Writes (or, with `None`, withdraws) this instance's URL for every
    /// stage, and waits for the broker to have it.
    pub fn advertise(&self, url: Option<&str>) -> anyhow::Result<()> {
        rebootstrap_if_cut_off(self.producer.client());
        for stage in &self.stages {
            let key = endpoint_key(&stage.group, &stage.instance);
            let mut record = BaseRecord::<str, str>::to(&self.topic).key(&key);
            if let Some(url) = url {
                record = record.payload(url);
            }
            self.producer
                .send(record)
                .map_err(|(e, _)| anyhow::anyhow!("cannot write to {}: {e}", self.topic))?;
        }
        self.producer
            .flush(Duration::from_secs(10))
            .map_err(|e| anyhow::anyhow!("cannot write to {}: {e}", self.topic))
    }

    /// Reads the endpoints and describes the groups until `shutdown`.
    pub fn run(&self, shutdown: &AtomicBool) {
        let groups: Vec<&str> = self.stages.iter().map(|s| s.group.as_str()).collect();
        let mut described = Instant::now() - REFRESH;
        while !shutdown.load(Ordering::Relaxed) {
            if let Some(Ok(message)) = self.consumer.poll(Duration::from_millis(100)) {
                let key = message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned());
                let url = message
                    .payload()
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                let mut view = self.view.lock().unwrap();
                match (key, url) {
                    (Some(key), Some(url)) => view.endpoints.insert(key, url),
                    (Some(key), None) => view.endpoints.remove(&key),
                    _ => None,
                };
            }
            if described.elapsed() >= REFRESH {
                described = Instant::now();
                // A client used now and then: checked at each use (see
                // `client::brokers`).
                rebootstrap_if_cut_off(self.consumer.client());
                let client = self.consumer.client();
                let described = match self.protocol {
                    GroupProtocol::Classic => {
                        describe_classic_groups(client, &groups, ROUND_TRIP_TIMEOUT)
                    }
                    GroupProtocol::Consumer => describe_groups(client, &groups, ROUND_TRIP_TIMEOUT),
                };
                match described {
                    Ok(descriptions) => self.view.lock().unwrap().groups = descriptions,
                    Err(error) => {
                        tracing::warn!(%error, "queries: cannot describe the consumer groups");
                        self.view.lock().unwrap().groups.clear();
                    }
                }
            }
        }
    }

    /// The instance that owns `task` of `stage` and where it answers;
    /// `None` while the group rebalances or the endpoint is not known.
    pub fn owner(&self, stage: &StageGroup, task: i32) -> Option<Peer> {
        self.view.lock().unwrap().owner(stage, task)
    }

    /// The instances that keep a standby of `task` of `stage`, where known.
    pub fn standbys(&self, stage: &StageGroup, task: i32) -> Vec<Peer> {
        self.view.lock().unwrap().standbys(stage, task)
    }
}

impl View {
    fn owner(&self, stage: &StageGroup, task: i32) -> Option<Peer> {
        let group = self.groups.get(&stage.group).filter(|group| group.stable)?;
        let member = group.members.iter().find(|member| {
            (member.assignment.iter()).any(|(topic, p)| *topic == stage.task_topic && *p == task)
        })?;
        let (instance, _) = parse_client_id(&member.client_id)?;
        let url = self.endpoints.get(&endpoint_key(&stage.group, instance))?;
        Some(Peer {
            instance: instance.to_string(),
            url: url.clone(),
        })
    }

    fn standbys(&self, stage: &StageGroup, task: i32) -> Vec<Peer> {
        if stage.standby_replicas == 0 {
            return Vec::new();
        }
        let Some(group) = self.groups.get(&stage.group).filter(|group| group.stable) else {
            return Vec::new();
        };
        // The same rule the standby threads apply (standby::placement).
        let members: Vec<Member> = (group.members.iter())
            .filter_map(|member| {
                let (instance, thread) = parse_client_id(&member.client_id)?;
                let order = match stage.static_members {
                    true => member_id(instance, thread),
                    false => member.member_id.clone(),
                };
                let tasks = (member.assignment.iter())
                    .filter(|(topic, _)| *topic == stage.task_topic)
                    .map(|(_, p)| *p)
                    .collect();
                Some(Member {
                    order,
                    instance: instance.to_string(),
                    tasks,
                })
            })
            .collect();
        let mut instances: Vec<&str> = members.iter().map(|m| m.instance.as_str()).collect();
        instances.sort_unstable();
        instances.dedup();
        instances
            .into_iter()
            .filter(|instance| {
                standby_tasks(&members, instance, stage.tasks, stage.standby_replicas)
                    .contains(&task)
            })
            .filter_map(|instance| {
                let url = self.endpoints.get(&endpoint_key(&stage.group, instance))?;
                Some(Peer {
                    instance: instance.to_string(),
                    url: url.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native_admin::GroupMember;

    fn stage(standby_replicas: usize) -> StageGroup {
        StageGroup {
            group: "app".into(),
            task_topic: "input".into(),
            tasks: 3,
            instance: "a".into(),
            static_members: false,
            standby_replicas,
        }
    }

    fn member(id: &str, instance: &str, tasks: &[i32]) -> GroupMember {
        GroupMember {
            member_id: id.into(),
            client_id: format!("{instance}/0"),
            host: "/10.0.0.1".into(),
            assignment: (tasks.iter())
                .map(|task| ("input".to_string(), *task))
                .chain([("other".to_string(), 2)])
                .collect(),
        }
    }

    /// Instances `a` (tasks 0, 1) and `b` (task 2), both with endpoints.
    fn view(stable: bool) -> View {
        let members = vec![member("m1", "a", &[0, 1]), member("m2", "b", &[2])];
        View {
            endpoints: [("app/a", "http://a:1"), ("app/b", "http://b:1")]
                .map(|(key, url)| (key.to_string(), url.to_string()))
                .into(),
            groups: [(
                "app".to_string(),
                GroupDescription {
                    stable,
                    members,
                    undecoded: false,
                },
            )]
            .into(),
        }
    }

    fn peer(instance: &str) -> Peer {
        Peer {
            instance: instance.into(),
            url: format!("http://{instance}:1"),
        }
    }

    #[test]
    fn a_task_is_owned_by_the_member_assigned_its_partition_of_the_task_topic() {
        let view = view(true);
        assert_eq!(view.owner(&stage(0), 0), Some(peer("a")));
        assert_eq!(view.owner(&stage(0), 2), Some(peer("b")));
    }

    #[test]
    fn nobody_owns_a_task_while_the_group_rebalances_or_without_an_endpoint() {
        assert_eq!(view(false).owner(&stage(0), 0), None);
        let mut view = view(true);
        view.endpoints.remove("app/b");
        assert_eq!(view.owner(&stage(0), 2), None);
        assert_eq!(view.owner(&stage(0), 0), Some(peer("a")));
    }

    #[test]
    fn a_standby_is_where_the_placement_rule_puts_it() {
        let view = view(true);
        // With one replica each instance keeps the other's tasks: the one
        // that would get them if their owner left.
        assert_eq!(view.standbys(&stage(1), 2), vec![peer("a")]);
        assert_eq!(view.standbys(&stage(1), 0), vec![peer("b")]);
        assert_eq!(view.standbys(&stage(0), 0), vec![]);
    }
}
