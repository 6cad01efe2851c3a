//! The process's CPU time, resident memory and start time, read from
//! `/proc/self` when `/metrics` is asked (the series the Prometheus client
//! libraries call `process_*`). Elsewhere than Linux the series are absent.

use crate::metrics::{Snapshot, PROCESS_CPU_SECONDS, PROCESS_RESIDENT_MEMORY, PROCESS_START_TIME};

/// Adds the process series to `snapshot`, those that can be read.
pub(crate) fn export(snapshot: &mut Snapshot) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some(times) = StatTimes::parse(&stat) else {
        return;
    };
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // SAFETY: as above.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    if ticks_per_second <= 0.0 || page_size <= 0.0 {
        return;
    }
    snapshot.add_f64(
        PROCESS_CPU_SECONDS,
        vec![],
        (times.user_ticks + times.system_ticks) as f64 / ticks_per_second,
    );
    snapshot.set(
        PROCESS_RESIDENT_MEMORY,
        vec![],
        times.resident_pages as f64 * page_size,
    );
    if let Some(boot) = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(boot_time)
    {
        snapshot.set(
            PROCESS_START_TIME,
            vec![],
            boot as f64 + times.start_ticks as f64 / ticks_per_second,
        );
    }
}

/// The fields of `/proc/self/stat` the series need (proc(5)).
#[derive(Debug, PartialEq)]
struct StatTimes {
    user_ticks: u64,
    system_ticks: u64,
    /// Clock ticks after boot.
    start_ticks: u64,
    resident_pages: u64,
}

impl StatTimes {
    /// Parses a `/proc/<pid>/stat` line. The second field, the command in
    /// parentheses, may hold spaces and parentheses itself: fields are
    /// counted from the last `)`.
    fn parse(stat: &str) -> Option<Self> {
        let after_command = &stat[stat.rfind(')')? + 1..];
        // Fields 3 onwards; field n is at index n - 3.
        let fields: Vec<&str> = after_command.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(StatTimes {
            user_ticks: field(14)?,
            system_ticks: field(15)?,
            start_ticks: field(22)?,
            resident_pages: field(24)?,
        })
    }
}

/// The `btime` line of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|seconds| seconds.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_are_counted_after_the_command_whatever_it_holds() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 50 0 0 20 0 9 0 123456 1000000 777 18446744073709551615";
        assert_eq!(
            StatTimes::parse(stat),
            Some(StatTimes {
                user_ticks: 250,
                system_ticks: 50,
                start_ticks: 123456,
                resident_pages: 777,
            })
        );
        assert_eq!(StatTimes::parse("4242 (truncated) S 1"), None);
    }

    #[test]
    fn the_boot_time_is_the_btime_line() {
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1764892800\nprocesses 9\n"),
            Some(1764892800)
        );
        assert_eq!(boot_time("cpu 1 2 3\n"), None);
    }

    #[test]
    fn this_process_reports_cpu_and_memory() {
        let mut snapshot = Snapshot::default();
        export(&mut snapshot);
        assert!(snapshot.gauge(PROCESS_RESIDENT_MEMORY, &[]) > 1_000_000.0);
        assert!(snapshot.gauge(PROCESS_START_TIME, &[]) > 1_600_000_000.0);
        assert!(snapshot
            .float_counters
            .contains_key(&(PROCESS_CPU_SECONDS, vec![])));
    }
}
