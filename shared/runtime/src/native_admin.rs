//! Admin requests of librdkafka that rust-rdkafka does not wrap, on any
//! client (an admin client, a consumer): consumer groups described with
//! their members, and topic ids; and the partition ends a consumer's
//! fetches saw.
//!
//! rust-rdkafka's `fetch_group_list` is the classic DescribeGroups, which
//! reports a KIP-848 `consumer` group as dead, whatever its members;
//! librdkafka's DescribeConsumerGroups describes both kinds, but aborts the
//! process when the coordinator's connection drops in the middle of one
//! (see [`describe_classic_groups`]): what describes groups again and again
//! while a service runs uses the classic request for classic groups. Topic ids
//! (Kafka 2.8 on) tell a topic from one deleted and created again under
//! its name, which metadata otherwise cannot.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::types::RDKafkaRespErr;

/// A member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub host: String,
    /// The partitions it is assigned, by topic.
    pub assignment: Vec<(String, i32)>,
}

/// A consumer group as its coordinator describes it.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupDescription {
    /// Whether the group is stable (not rebalancing, not empty or dead).
    pub stable: bool,
    pub members: Vec<GroupMember>,
    /// Whether some member's assignment could not be decoded (it is empty
    /// in `members`): not the consumer protocol's.
    pub undecoded: bool,
}

/// The members of each of `groups` (none for a group that does not exist),
/// by group.
pub fn group_members<C: ClientContext>(
    client: &Client<C>,
    groups: &[&str],
    timeout: Duration,
) -> anyhow::Result<HashMap<String, Vec<GroupMember>>> {
    Ok(describe_groups(client, groups, timeout)?
        .into_iter()
        .map(|(group, description)| (group, description.members))
        .collect())
}

/// [`describe_groups`] for groups of the classic protocol, through the
/// classic ListGroups and DescribeGroups requests (`rd_kafka_list_groups`).
///
/// DescribeConsumerGroups goes through librdkafka's coordinator-request
/// path, which frees a request it still uses when the request to the
/// coordinator fails (its connection dropped, as in a broker restart): the
/// process aborts with "rd_kafka_enq_once_del_source_return: Assertion
/// `eonce->refcnt > 0' failed" (confluentinc/librdkafka#4605; the fix,
/// confluentinc/librdkafka#5397, is not in 2.12.1). The classic requests
/// take another path.
pub(crate) fn describe_classic_groups<C: ClientContext>(
    client: &Client<C>,
    groups: &[&str],
    timeout: Duration,
) -> anyhow::Result<HashMap<String, GroupDescription>> {
    let mut described = HashMap::new();
    for &group in groups {
        let list = client
            .fetch_group_list(Some(group), timeout)
            .map_err(|e| anyhow::anyhow!("cannot describe consumer group {group}: {e}"))?;
        // A group that does not exist is listed as dead, with no members.
        let description = match list.groups().iter().find(|found| found.name() == group) {
            None => GroupDescription::default(),
            Some(found) => {
                let mut undecoded = false;
                let members = (found.members().iter())
                    .map(|member| {
                        let decoded = decode_assignment(member.assignment().unwrap_or_default());
                        undecoded |= decoded.is_none();
                        GroupMember {
                            member_id: member.id().to_string(),
                            client_id: member.client_id().to_string(),
                            host: member.client_host().to_string(),
                            assignment: (decoded.into_iter().flatten())
                                .flat_map(|(topic, partitions)| {
                                    partitions.into_iter().map(move |p| (topic.clone(), p))
                                })
                                .collect(),
                        }
                    })
                    .collect();
                GroupDescription {
                    stable: found.state() == "Stable",
                    members,
                    undecoded,
                }
            }
        };
        described.insert(group.to_string(), description);
    }
    Ok(described)
}

/// Each of `groups` described (an empty description for a group that does
/// not exist), by group.
pub(crate) fn describe_groups<C: ClientContext>(
    client: &Client<C>,
    groups: &[&str],
    timeout: Duration,
) -> anyhow::Result<HashMap<String, GroupDescription>> {
    let what = format!("describe consumer groups {}", groups.join(", "));
    let names = c_strings(groups)?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
    let operation = rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS;
    let event = request(
        client,
        operation,
        &what,
        timeout,
        |client, options, queue| {
            // SAFETY: the names outlive the call, which copies them.
            unsafe {
                rd::rd_kafka_DescribeConsumerGroups(
                    client,
                    pointers.as_mut_ptr(),
                    pointers.len(),
                    options,
                    queue,
                )
            }
        },
    )?;
    let mut members = HashMap::new();
    // SAFETY: the descriptions belong to `event`, alive throughout; what is
    // kept is copied out.
    unsafe {
        let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event.0);
        let mut count = 0;
        let descriptions = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
        for index in 0..count {
            let description = *descriptions.add(index);
            let group = text(rd::rd_kafka_ConsumerGroupDescription_group_id(description));
            let error = rd::rd_kafka_ConsumerGroupDescription_error(description);
            if !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND
            {
                anyhow::bail!(
                    "cannot describe consumer group {group}: {}",
                    text(rd::rd_kafka_error_string(error))
                );
            }
            let found = (0..rd::rd_kafka_ConsumerGroupDescription_member_count(description))
                .map(|member| {
                    let member = rd::rd_kafka_ConsumerGroupDescription_member(description, member);
                    let assigned = rd::rd_kafka_MemberAssignment_partitions(
                        rd::rd_kafka_MemberDescription_assignment(member),
                    );
                    let assignment = if assigned.is_null() {
                        Vec::new()
                    } else {
                        (0..(*assigned).cnt as usize)
                            .map(|index| {
                                let entry = &*(*assigned).elems.add(index);
                                (text(entry.topic), entry.partition)
                            })
                            .collect()
                    };
                    GroupMember {
                        member_id: text(rd::rd_kafka_MemberDescription_consumer_id(member)),
                        client_id: text(rd::rd_kafka_MemberDescription_client_id(member)),
                        host: text(rd::rd_kafka_MemberDescription_host(member)),
                        assignment,
                    }
                })
                .collect();
            let state = rd::rd_kafka_ConsumerGroupDescription_state(description);
            let stable =
                state == rd::rd_kafka_consumer_group_state_t::RD_KAFKA_CONSUMER_GROUP_STATE_STABLE;
            members.insert(
                group,
                GroupDescription {
                    stable,
                    members: found,
                    undecoded: false,
                },
            );
        }
    }
    Ok(members)
}

/// The topics and partitions of a member's assignment, decoded from the
/// consumer protocol's `Assignment` (version, then an array of topics, each
/// with an array of partitions; user data after that is ignored). `None`
/// when the bytes are not such an assignment.
fn decode_assignment(bytes: &[u8]) -> Option<BTreeMap<String, Vec<i32>>> {
    let mut reader = Reader { bytes };
    let _version = reader.i16()?;
    let topics = reader.i32()?;
    let mut assignment = BTreeMap::new();
    for _ in 0..topics.max(0) {
        let length = usize::try_from(reader.i16()?).ok()?;
        let topic = String::from_utf8(reader.take(length)?.to_vec()).ok()?;
        let count = reader.i32()?;
        let partitions = (0..count.max(0))
            .map(|_| reader.i32())
            .collect::<Option<Vec<i32>>>()?;
        assignment.insert(topic, partitions);
    }
    Some(assignment)
}

/// Big-endian reads off the front of a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Some(taken)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

/// The id of each of `topics` that exists, as 32 hex digits, by topic
/// (none for a topic that does not exist, or a broker without topic ids).
pub(crate) fn topic_ids<C: ClientContext>(
    client: &Client<C>,
    topics: &[String],
    timeout: Duration,
) -> anyhow::Result<HashMap<String, String>> {
    let what = format!("describe topics {}", topics.join(", "));
    let names = c_strings(topics)?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
    // SAFETY: the collection copies the names, and is destroyed by its guard.
    let collection = unsafe {
        Owned(
            rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len()),
            rd::rd_kafka_TopicCollection_destroy,
        )
    };
    let operation = rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS;
    let event = request(
        client,
        operation,
        &what,
        timeout,
        |client, options, queue| {
            // SAFETY: the collection outlives the call, which copies it.
            unsafe { rd::rd_kafka_DescribeTopics(client, collection.0, options, queue) }
        },
    )?;
    let mut ids = HashMap::new();
    // SAFETY: the descriptions belong to `event`, alive throughout; what is
    // kept is copied out.
    unsafe {
        let result = rd::rd_kafka_event_DescribeTopics_result(event.0);
        let mut count = 0;
        let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        for index in 0..count {
            let description = *descriptions.add(index);
            let name = text(rd::rd_kafka_TopicDescription_name(description));
            let error = rd::rd_kafka_TopicDescription_error(description);
            if !error.is_null() {
                match rd::rd_kafka_error_code(error) {
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => {}
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART => continue,
                    _ => anyhow::bail!(
                        "cannot describe topic {name}: {}",
                        text(rd::rd_kafka_error_string(error))
                    ),
                }
            }
            let id = rd::rd_kafka_TopicDescription_topic_id(description);
            if id.is_null() {
                continue;
            }
            let most = rd::rd_kafka_Uuid_most_significant_bits(id) as u64;
            let least = rd::rd_kafka_Uuid_least_significant_bits(id) as u64;
            if (most, least) != (0, 0) {
                ids.insert(name, format!("{most:016x}{least:016x}"));
            }
        }
    }
    Ok(ids)
}

/// The first and end offsets of a partition as the client's last fetch of
/// it saw them (librdkafka's cache: no request), `None` before any fetch.
pub(crate) fn cached_watermarks<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    partition: i32,
) -> Option<(i64, i64)> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1, -1);
    // SAFETY: the client is alive, the topic a NUL-terminated string for
    // the call, and the two offsets are written through valid pointers.
    let error = unsafe {
        rd::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (error == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some((low, high))
}

/// A librdkafka object, destroyed when dropped: the object and its
/// destructor.
pub(crate) struct Owned<T>(pub(crate) *mut T, pub(crate) unsafe extern "C" fn(*mut T));

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the object came from its constructor and is
            // destroyed once, here.
            unsafe { (self.1)(self.0) }
        }
    }
}

fn c_strings<S: AsRef<str>>(names: &[S]) -> anyhow::Result<Vec<CString>> {
    Ok(names
        .iter()
        .map(|name| CString::new(name.as_ref()))
        .collect::<Result<_, _>>()?)
}

/// A string librdkafka owns, copied (empty for none).
///
/// # Safety
/// `pointer` is null or a NUL-terminated string alive for the call.
pub(crate) unsafe fn text(pointer: *const c_char) -> String {
    if pointer.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(pointer) }
        .to_string_lossy()
        .into_owned()
}

/// Sends one admin request of `operation` on `client` (`send` starts it,
/// given the client, the request's options and the queue its reply goes
/// to) and waits up to `timeout` for the reply, which it returns, failed
/// unless the request succeeded as a whole. `what` says what is asked
/// (`describe topics a, b`), for errors: `cannot <what>: <cause>`.
pub(crate) fn request<C: ClientContext>(
    client: &Client<C>,
    operation: rd::rd_kafka_admin_op_t,
    what: &str,
    timeout: Duration,
    send: impl FnOnce(
        *mut rd::rd_kafka_t,
        *const rd::rd_kafka_AdminOptions_t,
        *mut rd::rd_kafka_queue_t,
    ),
) -> anyhow::Result<Owned<rd::rd_kafka_event_t>> {
    let native = client.native_ptr();
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the queue and the options are made here for `native`, which
    // `client` keeps alive, and destroyed by their guards after the reply.
    unsafe {
        let queue = Owned(rd::rd_kafka_queue_new(native), rd::rd_kafka_queue_destroy);
        let options = Owned(
            rd::rd_kafka_AdminOptions_new(native, operation),
            rd::rd_kafka_AdminOptions_destroy,
        );
        let mut error_text = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.0,
            timeout_ms,
            error_text.as_mut_ptr(),
            error_text.len(),
        );
        send(native, options.0, queue.0);
        let event = Owned(
            rd::rd_kafka_queue_poll(queue.0, timeout_ms.saturating_add(5_000)),
            rd::rd_kafka_event_destroy,
        );
        anyhow::ensure!(
            !event.0.is_null(),
            "cannot {what}: no answer within {}s",
            timeout.as_secs()
        );
        if rd::rd_kafka_event_error(event.0) != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            anyhow::bail!(
                "cannot {what}: {}",
                text(rd::rd_kafka_event_error_string(event.0))
            );
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_consumer_protocol_assignment_and_refuses_truncated_bytes() {
        let mut bytes = vec![0, 1]; // version 1
        bytes.extend(2i32.to_be_bytes());
        for (topic, partitions) in [("orders", vec![0i32, 3]), ("shipments", vec![3])] {
            bytes.extend((topic.len() as i16).to_be_bytes());
            bytes.extend(topic.as_bytes());
            bytes.extend((partitions.len() as i32).to_be_bytes());
            for partition in partitions {
                bytes.extend(partition.to_be_bytes());
            }
        }
        bytes.extend((-1i32).to_be_bytes()); // no user data
        let decoded = decode_assignment(&bytes).unwrap();
        assert_eq!(decoded["orders"], [0, 3]);
        assert_eq!(decoded["shipments"], [3]);
        assert_eq!(decode_assignment(&bytes[..bytes.len() - 9]), None);
    }
}
