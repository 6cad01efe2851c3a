//! Where a reset puts the input offsets: the position options, and the
//! offsets file `--from-file` reads.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;

use super::datetime::{iso_utc, parse_datetime, parse_lookback};
use crate::duration::HumanDuration;

/// Where the input offsets go; one at most (default `--to-earliest`).
#[derive(Debug, Clone, Args)]
#[group(multiple = false)]
pub struct PositionArgs {
    /// To the first record of each input partition (the default).
    #[arg(long)]
    pub to_earliest: bool,

    /// To the end of each input partition: skip everything written so far.
    #[arg(long)]
    pub to_latest: bool,

    /// To the first record written at or after this time (by record
    /// timestamp), e.g. `2026-12-01T00:00:00Z`; UTC unless an offset such as
    /// `+01:00` is given. Partitions with no such record go to their end.
    #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
    pub to_datetime: Option<i64>,

    /// To the first record written at most this long ago: `PT1H`, `P1DT12H`
    /// (ISO 8601) or `1h`, `90m`, `7d`.
    #[arg(long, value_name = "DURATION", value_parser = parse_lookback)]
    pub by_duration: Option<HumanDuration>,

    /// From each committed offset (or the partition's start, where none is
    /// committed) by this many records, forward or (negative) back,
    /// within the partition's records.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub shift_by: Option<i64>,

    /// To this offset on every input partition; a partition whose records
    /// start later goes to its first offset, one that ends before it to
    /// its end.
    #[arg(
        long,
        value_name = "OFFSET",
        value_parser = parse_offset,
        allow_negative_numbers = true
    )]
    pub to_offset: Option<i64>,

    /// To the offsets a CSV file gives: a `topic,partition,offset` line for
    /// every input partition (as `kafka-consumer-groups --reset-offsets
    /// --from-file` reads it), each kept within the partition's records.
    #[arg(long, value_name = "PATH", value_parser = OffsetsFile::read)]
    pub from_file: Option<OffsetsFile>,
}

/// Where a group's offsets on an input topic go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    /// The first record with a timestamp at or after this (ms since the epoch).
    Time(i64),
    /// The committed offset moved by this many records.
    Shift(i64),
    /// This offset on every partition.
    Offset(i64),
    /// The offset a file gives each partition.
    File(OffsetsFile),
}

impl PositionArgs {
    /// The target, with `--by-duration` taken back from `now` (ms since the
    /// epoch). A time before the epoch is the epoch: the broker's offset
    /// lookup reads a negative time as "latest" (-1) or "earliest" (-2).
    pub fn target(&self, now: i64) -> ResetTo {
        if self.to_latest {
            ResetTo::Latest
        } else if let Some(time) = self.to_datetime {
            ResetTo::Time(time.max(0))
        } else if let Some(lookback) = self.by_duration {
            ResetTo::Time(now.saturating_sub(lookback.as_millis_i64()).max(0))
        } else if let Some(records) = self.shift_by {
            ResetTo::Shift(records)
        } else if let Some(offset) = self.to_offset {
            ResetTo::Offset(offset)
        } else if let Some(file) = &self.from_file {
            ResetTo::File(file.clone())
        } else {
            ResetTo::Earliest
        }
    }
}

impl std::fmt::Display for ResetTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetTo::Earliest => write!(f, "to the earliest"),
            ResetTo::Latest => write!(f, "to the latest"),
            ResetTo::Time(time) => write!(f, "to the first record at or after {}", iso_utc(*time)),
            ResetTo::Shift(records) => write!(f, "shifted by {records:+}"),
            ResetTo::Offset(offset) => write!(f, "to offset {offset}"),
            ResetTo::File(file) => write!(f, "to the offsets of {}", file.path.display()),
        }
    }
}

/// An offset as `--to-offset` takes it: a whole number from 0.
fn parse_offset(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|offset| *offset >= 0)
        .ok_or_else(|| format!("invalid offset '{text}': expected a whole number from 0"))
}

/// The offsets `--from-file` read, by topic and partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetsFile {
    pub path: PathBuf,
    pub offsets: BTreeMap<(String, i32), i64>,
}

impl OffsetsFile {
    /// Reads and parses the file at `path` (see [`parse_offsets_csv`]).
    pub fn read(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read offsets file {path}: {e}"))?;
        let offsets =
            parse_offsets_csv(&text).map_err(|e| format!("invalid offsets file {path}: {e}"))?;
        Ok(OffsetsFile {
            path: PathBuf::from(path),
            offsets,
        })
    }
}

/// The offsets of a reset plan in CSV, one `topic,partition,offset` line
/// per partition, as `kafka-consumer-groups --reset-offsets --from-file`
/// reads it (and `--export` writes it for one group): fields trimmed of
/// blanks, no header. Blank lines are skipped, `\r\n` line ends accepted.
/// Unlike Kafka's tool it refuses a partition given twice (Kafka's takes
/// the last line) and a negative offset (Kafka's takes the partition's
/// start); the `group,topic,partition,offset` lines of several groups are
/// not read.
pub fn parse_offsets_csv(text: &str) -> Result<BTreeMap<(String, i32), i64>, String> {
    let mut offsets = BTreeMap::new();
    let mut lines_of = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [topic, partition, offset] = fields[..] else {
            return Err(format!(
                "line {number}: expected topic,partition,offset, found {} field(s): '{line}'",
                fields.len()
            ));
        };
        if topic.is_empty() {
            return Err(format!("line {number}: no topic: '{line}'"));
        }
        let partition: i32 = partition
            .parse()
            .ok()
            .filter(|partition| *partition >= 0)
            .ok_or_else(|| {
                format!(
                    "line {number}: invalid partition '{partition}': expected a whole number \
                     from 0"
                )
            })?;
        let offset = parse_offset(offset).map_err(|e| format!("line {number}: {e}"))?;
        let key = (topic.to_string(), partition);
        if let Some(first) = lines_of.insert(key.clone(), number) {
            return Err(format!(
                "line {number}: {topic} partition {partition} is given again (first on line \
                 {first})"
            ));
        }
        offsets.insert(key, offset);
    }
    if offsets.is_empty() {
        return Err("no topic,partition,offset line in it".to_string());
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reset::tests::parse;

    const NOW: i64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    /// A file in the temporary directory holding `text`, named after `name`.
    fn file_with(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("reset-{name}-{}.csv", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }

    #[test]
    fn a_time_before_the_epoch_is_the_epoch() {
        let target = |flags: &[&str]| parse(flags).unwrap().position.target(NOW);
        assert_eq!(
            target(&["--to-datetime", "1969-12-31T23:59:59.999Z"]),
            ResetTo::Time(0)
        );
        assert_eq!(target(&["--by-duration", "P25000D"]), ResetTo::Time(0));
    }

    #[test]
    fn one_position_at_most_and_the_earliest_by_default() {
        let target = |flags: &[&str]| parse(flags).unwrap().position.target(NOW);
        assert_eq!(target(&[]), ResetTo::Earliest);
        assert_eq!(target(&["--to-earliest"]), ResetTo::Earliest);
        assert_eq!(target(&["--to-latest"]), ResetTo::Latest);
        assert_eq!(
            target(&["--to-datetime", "2026-12-01T00:00:00Z"]),
            ResetTo::Time(NOW)
        );
        assert_eq!(
            target(&["--by-duration", "PT1H"]),
            ResetTo::Time(NOW - 3_600_000)
        );
        assert_eq!(
            target(&["--by-duration", "90m"]),
            ResetTo::Time(NOW - 5_400_000)
        );
        assert_eq!(target(&["--shift-by", "-2"]), ResetTo::Shift(-2));
        assert_eq!(target(&["--shift-by", "5"]), ResetTo::Shift(5));
        assert_eq!(target(&["--to-offset", "42"]), ResetTo::Offset(42));
        let path = file_with("one-position", "orders,0,7\n");
        let ResetTo::File(file) = target(&["--from-file", &path]) else {
            panic!("not a file");
        };
        assert_eq!(file.offsets, BTreeMap::from([(("orders".into(), 0), 7)]));
        assert_eq!(
            ResetTo::File(file).to_string(),
            format!("to the offsets of {path}")
        );
        for both in [
            &["--to-latest", "--shift-by", "1"][..],
            &["--to-offset", "1", "--to-earliest"],
            &["--from-file", &path, "--to-offset", "1"],
            &[
                "--from-file",
                &path,
                "--to-datetime",
                "2026-12-01T00:00:00Z",
            ],
            &["--by-duration", "1h", "--from-file", &path],
        ] {
            let error = parse(both).unwrap_err();
            assert!(error.to_string().contains("cannot be used with"), "{error}");
        }
        let options = parse(&["--dry-run", "--wipe-local-state"]).unwrap();
        assert!(options.dry_run && options.wipe_local_state);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn to_offset_takes_a_whole_number_from_zero() {
        assert_eq!(parse_offset("0"), Ok(0));
        assert_eq!(parse_offset("9000000000"), Ok(9_000_000_000));
        for bad in ["-1", "1.5", "", "ten"] {
            assert!(parse_offset(bad).is_err(), "{bad} is refused");
        }
        let error = parse(&["--to-offset", "-3"]).unwrap_err().to_string();
        assert!(
            error.contains("invalid offset '-3': expected a whole number from 0"),
            "{error}"
        );
    }

    #[test]
    fn an_offsets_file_is_read_as_kafkas_tool_reads_it() {
        let read =
            parse_offsets_csv(" orders , 0 , 5 \r\n\norders,1,0\nshipments,0,12\n").expect("valid");
        assert_eq!(
            read,
            BTreeMap::from([
                (("orders".into(), 0), 5),
                (("orders".into(), 1), 0),
                (("shipments".into(), 0), 12),
            ])
        );
        assert_eq!(
            parse_offsets_csv("orders,0,5"),
            Ok(BTreeMap::from([(("orders".into(), 0), 5)])),
            "no line end at the end"
        );
        for (text, error) in [
            ("", "no topic,partition,offset line in it"),
            ("\n \n", "no topic,partition,offset line in it"),
            (
                "orders,0",
                "line 1: expected topic,partition,offset, found 2 field(s): 'orders,0'",
            ),
            (
                "orders,0,1\nshop,orders,0,1",
                "line 2: expected topic,partition,offset, found 4 field(s): 'shop,orders,0,1'",
            ),
            (
                "topic,partition,offset",
                "line 1: invalid partition 'partition'",
            ),
            (",0,1", "line 1: no topic: ',0,1'"),
            ("orders,-1,1", "line 1: invalid partition '-1'"),
            (
                "orders,0,-5",
                "line 1: invalid offset '-5': expected a whole number from 0",
            ),
            ("orders,0,x", "line 1: invalid offset 'x'"),
            (
                "orders,0,1\norders,1,1\n orders ,0,2",
                "line 3: orders partition 0 is given again (first on line 1)",
            ),
        ] {
            let refused = parse_offsets_csv(text).unwrap_err();
            assert!(refused.starts_with(error), "{text:?}: {refused}");
        }
    }

    #[test]
    fn a_bad_offsets_file_is_a_flag_error() {
        let missing = parse(&["--from-file", "/nonexistent/offsets.csv"])
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("cannot read offsets file /nonexistent/offsets.csv"),
            "{missing}"
        );
        let path = file_with("bad", "orders,0,1\norders,zero,1\n");
        let invalid = parse(&["--from-file", &path]).unwrap_err().to_string();
        assert!(
            invalid.contains(&format!(
                "invalid offsets file {path}: line 2: invalid partition 'zero'"
            )),
            "{invalid}"
        );
        std::fs::remove_file(path).unwrap();
    }
}
