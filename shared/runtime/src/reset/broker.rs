//! What a reset reads of, and commits to, the application's consumer
//! groups on the broker.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::plan::{GroupState, InputTopic, InternalTopic, OffsetMove, PartitionOffsets};
use super::position::ResetTo;
use crate::describe::StageDescription;
use crate::native_admin::{self, text, Owned};
use crate::topics::Admin;

/// How long a group request (describe, committed offsets, offsets for a
/// time, commit) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Fails, naming each group with members and the members, if any group of
/// the application has members: the instances must be stopped first.
pub(super) fn refuse_live_groups(admin: &Admin, groups: &[GroupClient]) -> anyhow::Result<()> {
    let names: Vec<&str> = groups.iter().map(|group| group.group.as_str()).collect();
    let members = admin.group_members(&names)?;
    let live: Vec<String> = names
        .iter()
        .filter_map(|group| {
            let members = members.get(*group).filter(|members| !members.is_empty())?;
            let members: Vec<String> = members
                .iter()
                .map(|member| {
                    let host = member.host.trim_start_matches('/');
                    format!("{} on {host}", member.client_id)
                })
                .collect();
            Some(format!("{group} ({})", members.join(", ")))
        })
        .collect();
    anyhow::ensure!(
        live.is_empty(),
        "consumer group(s) of the application have live members: {}; stop every instance \
         of the application first (an instance stopped with --instance-id stays a member until \
         its session times out)",
        live.join("; ")
    );
    Ok(())
}

/// A stage's consumer group, seen from outside: a consumer with its group
/// id that never joins it, which reads and commits the group's offsets
/// (the broker accepts such a commit only while the group has no members).
pub(super) struct GroupClient {
    pub group: String,
    consumer: BaseConsumer,
    /// The input topics the stage reads, and the internal ones.
    inputs: Vec<String>,
    internal: Vec<String>,
    stores: usize,
}

impl GroupClient {
    pub fn new(base: &ClientConfig, stage: &StageDescription) -> anyhow::Result<Self> {
        let mut config = base.clone();
        config
            .set("group.id", &stage.group_id)
            .set("enable.auto.commit", "false");
        let consumer = config
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create a consumer for the group: {e}"))?;
        let mut inputs = Vec::new();
        let mut internal = Vec::new();
        for source in &stage.sources {
            if source.internal {
                internal.push(source.topic.clone());
            } else {
                inputs.push(source.topic.clone());
            }
            internal.extend(source.repartition_topic.clone());
        }
        Ok(GroupClient {
            group: stage.group_id.clone(),
            consumer,
            inputs,
            internal,
            stores: stage.stores.len(),
        })
    }

    /// What the broker holds of the group: every partition of its input
    /// topics (for [`ResetTo::Time`] with the offset at the time), its
    /// committed offsets on the internal topics it reads that exist, and
    /// the topics it has committed offsets on.
    pub fn observe(&self, admin: &Admin, to: &ResetTo) -> anyhow::Result<GroupState> {
        let mut inputs = Vec::new();
        for topic in &self.inputs {
            // One that does not exist is refused with the plan, after the
            // check of the committed topics, which says more of wrong flags.
            if admin.partition_count(topic)?.is_none() {
                inputs.push(InputTopic {
                    topic: topic.clone(),
                    partitions: Vec::new(),
                });
                continue;
            }
            let partitions = admin.describe(topic)?;
            let ids: Vec<i32> = partitions.iter().map(|partition| partition.id).collect();
            let committed = self.committed(topic, &ids)?;
            let at_time = match to {
                ResetTo::Time(time) => self.offsets_for_time(topic, &ids, *time)?,
                _ => vec![None; ids.len()],
            };
            let partitions = (partitions.iter().zip(committed).zip(at_time))
                .map(|((partition, committed), at_time)| {
                    let offsets = PartitionOffsets {
                        low: partition.low,
                        high: partition.high,
                        committed,
                        at_time,
                        listed: None,
                    };
                    (partition.id, offsets)
                })
                .collect();
            inputs.push(InputTopic {
                topic: topic.clone(),
                partitions,
            });
        }
        let mut internal = Vec::new();
        for topic in &self.internal {
            let committed = match admin.partition_count(topic)? {
                None => None,
                Some(count) => {
                    let ids: Vec<i32> = (0..count as i32).collect();
                    let committed = self.committed(topic, &ids)?;
                    Some(ids.into_iter().zip(committed).collect())
                }
            };
            internal.push(InternalTopic {
                topic: topic.clone(),
                committed,
            });
        }
        Ok(GroupState {
            group: self.group.clone(),
            stores: self.stores,
            inputs,
            internal,
            committed_topics: committed_topics(self.consumer.client(), &self.group)?,
        })
    }

    /// The group's committed offset of each of `partitions` of `topic`.
    fn committed(&self, topic: &str, partitions: &[i32]) -> anyhow::Result<Vec<Option<i64>>> {
        let request = partition_list(topic, partitions, Offset::Invalid)?;
        let committed = self
            .consumer
            .committed_offsets(request, REQUEST_TIMEOUT)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot read the committed offsets of group {} on {topic}: {e}",
                    self.group
                )
            })?;
        Ok(offsets_of(&committed, topic, partitions))
    }

    /// The first offset at or after `time` of each of `partitions` of
    /// `topic`; `None` where no record is that late.
    fn offsets_for_time(
        &self,
        topic: &str,
        partitions: &[i32],
        time: i64,
    ) -> anyhow::Result<Vec<Option<i64>>> {
        let request = partition_list(topic, partitions, Offset::Offset(time))?;
        let found = self
            .consumer
            .offsets_for_times(request, REQUEST_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("cannot look up offsets by time on {topic}: {e}"))?;
        Ok(offsets_of(&found, topic, partitions))
    }

    /// Commits `moves` with `metadata`, without joining the group.
    pub fn commit(&self, moves: &[&OffsetMove], metadata: &str) -> anyhow::Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        let mut offsets = TopicPartitionList::new();
        for offset in moves {
            let mut element = offsets.add_partition(&offset.topic, offset.partition);
            element.set_offset(Offset::Offset(offset.new))?;
            element.set_metadata(metadata);
        }
        self.consumer
            .commit(&offsets, CommitMode::Sync)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot commit the offsets of consumer group {}: {e} (has an instance \
                     started meanwhile?)",
                    self.group
                )
            })
    }
}

/// `partitions` of `topic`, each at `offset`.
fn partition_list(
    topic: &str,
    partitions: &[i32],
    offset: Offset,
) -> anyhow::Result<TopicPartitionList> {
    let mut list = TopicPartitionList::new();
    for partition in partitions {
        list.add_partition_offset(topic, *partition, offset)?;
    }
    Ok(list)
}

/// The offset `list` holds for each of `partitions` of `topic`, if any.
fn offsets_of(list: &TopicPartitionList, topic: &str, partitions: &[i32]) -> Vec<Option<i64>> {
    partitions
        .iter()
        .map(
            |partition| match list.find_partition(topic, *partition)?.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            },
        )
        .collect()
}

/// The topics `group` has committed offsets on: librdkafka's
/// ListConsumerGroupOffsets (OffsetFetch) of all the group's partitions,
/// which rust-rdkafka does not wrap. A group that does not exist has none.
/// The broker leaves out topics the user may not describe.
fn committed_topics<C: ClientContext>(
    client: &Client<C>,
    group: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let what = format!("list the committed offsets of consumer group {group}");
    let failed = |cause: &str| anyhow::anyhow!("cannot {what}: {cause}");
    let name = CString::new(group)?;
    // No partitions: all the group has committed.
    // SAFETY: the request is made here and destroyed by its guard, after
    // the reply.
    let list = unsafe {
        Owned(
            rd::rd_kafka_ListConsumerGroupOffsets_new(name.as_ptr(), std::ptr::null()),
            rd::rd_kafka_ListConsumerGroupOffsets_destroy,
        )
    };
    let operation = rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS;
    let event = native_admin::request(
        client,
        operation,
        &what,
        REQUEST_TIMEOUT,
        |client, options, queue| {
            let mut requests = [list.0];
            // SAFETY: the request outlives the call, which copies it.
            unsafe {
                rd::rd_kafka_ListConsumerGroupOffsets(
                    client,
                    requests.as_mut_ptr(),
                    requests.len(),
                    options,
                    queue,
                )
            }
        },
    )?;
    // SAFETY: the results belong to `event`, alive throughout; what is
    // kept is copied out.
    unsafe {
        let result = rd::rd_kafka_event_ListConsumerGroupOffsets_result(event.0);
        let mut count = 0;
        let groups = rd::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count);
        let mut topics = BTreeSet::new();
        for index in 0..count {
            let found = *groups.add(index);
            let error = rd::rd_kafka_group_result_error(found);
            if !error.is_null() {
                if rd::rd_kafka_error_code(error)
                    == RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND
                {
                    continue;
                }
                return Err(failed(&text(rd::rd_kafka_error_string(error))));
            }
            let partitions = rd::rd_kafka_group_result_partitions(found);
            if partitions.is_null() {
                continue;
            }
            for element in 0..(*partitions).cnt as usize {
                let partition = &*(*partitions).elems.add(element);
                let topic = text(partition.topic);
                if partition.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let cause = text(rd::rd_kafka_err2str(partition.err));
                    return Err(failed(&format!(
                        "{topic} partition {}: {cause}",
                        partition.partition
                    )));
                }
                if partition.offset >= 0 {
                    topics.insert(topic);
                }
            }
        }
        Ok(topics)
    }
}
