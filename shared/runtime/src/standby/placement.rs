//! Which instance keeps a standby of which task.
//!
//! Every instance reads the same group description (members, their client
//! ids and their assignments) and applies the same rule, so the instances
//! agree on the placement without talking to each other:
//!
//! > The first standby of a task goes to the instance that would get the
//! > task if the instance owning it left the group; the second to the one
//! > that would get it if that one left too; and so on.
//!
//! "Would get" is the range assignor's answer over the remaining members, in
//! its own member order (`group.instance.id` for static members, the member
//! id otherwise). So when an instance dies, each of its tasks moves to the
//! very instance that has kept it warm, and restores only the changelog tail.
//! Members of one process (its processing threads) leave together: the rule
//! removes an instance with all its members.

use std::collections::BTreeSet;

/// A member of a stage's consumer group, as the placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The range assignor's sort key for this member.
    pub order: String,
    /// The instance (process) the member belongs to.
    pub instance: String,
    /// The tasks (partitions of the task topics) it is assigned.
    pub tasks: BTreeSet<i32>,
}

/// The tasks whose standbys `instance` keeps, of a stage with `tasks` tasks,
/// with `replicas` standbys per task. Tasks that `instance` owns, or that
/// nobody owns right now (a rebalance in progress), have none here.
pub(crate) fn standby_tasks(
    members: &[Member],
    instance: &str,
    tasks: usize,
    replicas: usize,
) -> BTreeSet<i32> {
    let mut kept = BTreeSet::new();
    for task in 0..tasks as i32 {
        let Some(owner) = members.iter().find(|member| member.tasks.contains(&task)) else {
            continue;
        };
        let mut gone: BTreeSet<&str> = BTreeSet::from([owner.instance.as_str()]);
        for _ in 0..replicas {
            let mut remaining: Vec<&Member> = members
                .iter()
                .filter(|member| !gone.contains(member.instance.as_str()))
                .collect();
            if remaining.is_empty() {
                break;
            }
            remaining.sort_by(|a, b| a.order.cmp(&b.order));
            let heir = remaining[range_index(task as usize, tasks, remaining.len())];
            if heir.instance == instance {
                kept.insert(task);
            }
            gone.insert(heir.instance.as_str());
        }
    }
    kept
}

/// The index, among `members` sorted members, of the one the range assignor
/// gives `partition` of a topic with `partitions` partitions: each gets
/// `partitions / members` consecutive partitions, the first
/// `partitions % members` one more.
fn range_index(partition: usize, partitions: usize, members: usize) -> usize {
    let per_member = partitions / members;
    let with_extra = partitions % members;
    let boundary = with_extra * (per_member + 1);
    if partition < boundary {
        partition / (per_member + 1)
    } else {
        with_extra + (partition - boundary) / per_member.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(order: &str, instance: &str, tasks: &[i32]) -> Member {
        Member {
            order: order.to_string(),
            instance: instance.to_string(),
            tasks: tasks.iter().copied().collect(),
        }
    }

    /// What the range assignor gives each of `members` sorted members.
    fn range(partitions: usize, members: usize) -> Vec<Vec<usize>> {
        let mut owned = vec![Vec::new(); members];
        for partition in 0..partitions {
            owned[range_index(partition, partitions, members)].push(partition);
        }
        owned
    }

    #[test]
    fn range_gives_consecutive_partitions_and_the_extra_ones_to_the_first_members() {
        assert_eq!(range(6, 3), [vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(range(7, 3), [vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
        assert_eq!(range(2, 3), [vec![0], vec![1], vec![]]);
        assert_eq!(range(4, 1), [vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_task_s_standby_is_where_it_goes_when_its_owner_leaves() {
        // 6 tasks over a, b, c: a 0-1, b 2-3, c 4-5. Without b, range over
        // a and c gives a 0-2 and c 3-5: b's task 2 goes to a, 3 to c.
        // Without a, b gets 0-2; without c, b gets 3-5.
        let members = [
            member("a", "a", &[0, 1]),
            member("b", "b", &[2, 3]),
            member("c", "c", &[4, 5]),
        ];
        assert_eq!(standby_tasks(&members, "a", 6, 1), BTreeSet::from([2]));
        assert_eq!(
            standby_tasks(&members, "b", 6, 1),
            BTreeSet::from([0, 1, 4, 5])
        );
        assert_eq!(standby_tasks(&members, "c", 6, 1), BTreeSet::from([3]));
        // Every task has exactly one standby, never on its owner.
        let mut all: Vec<i32> = ["a", "b", "c"]
            .iter()
            .flat_map(|instance| standby_tasks(&members, instance, 6, 1))
            .collect();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn each_further_replica_goes_where_the_task_goes_when_the_previous_holder_leaves_too() {
        let members = [
            member("a", "a", &[0, 1]),
            member("b", "b", &[2, 3]),
            member("c", "c", &[4, 5]),
        ];
        // Two replicas over three instances: every instance but the owner.
        for instance in ["a", "b", "c"] {
            let owned: BTreeSet<i32> = members
                .iter()
                .find(|m| m.instance == instance)
                .unwrap()
                .tasks
                .clone();
            let expected: BTreeSet<i32> = (0..6).filter(|t| !owned.contains(t)).collect();
            assert_eq!(standby_tasks(&members, instance, 6, 2), expected);
        }
        // More replicas than other instances: as many as there are.
        assert_eq!(
            standby_tasks(&members, "a", 6, 5),
            BTreeSet::from([2, 3, 4, 5])
        );
    }

    #[test]
    fn the_threads_of_one_instance_leave_together() {
        // Instance x has two members (threads); y has one. Every task of x
        // can only go to y; y's tasks go to x's first member in order.
        let members = [
            member("x/0", "x", &[0, 1]),
            member("x/1", "x", &[2, 3]),
            member("y/0", "y", &[4, 5]),
        ];
        assert_eq!(
            standby_tasks(&members, "y", 6, 1),
            BTreeSet::from([0, 1, 2, 3])
        );
        assert_eq!(standby_tasks(&members, "x", 6, 1), BTreeSet::from([4, 5]));
    }

    #[test]
    fn tasks_nobody_owns_have_no_standby_and_an_instance_alone_keeps_none() {
        let members = [member("a", "a", &[0]), member("b", "b", &[])];
        assert_eq!(standby_tasks(&members, "b", 2, 1), BTreeSet::from([0]));
        assert_eq!(standby_tasks(&members, "a", 2, 1), BTreeSet::new());
        assert_eq!(
            standby_tasks(&[member("a", "a", &[0, 1])], "a", 2, 1),
            BTreeSet::new()
        );
    }
}
