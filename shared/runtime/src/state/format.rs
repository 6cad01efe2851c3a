//! The state format: the encoding of a task's stores (keys, values, column
//! families, checkpoints), which a binary must know before it reads them.
//!
//! One number covers a task's RocksDB directory and its changelog records
//! alike, since a restore copies changelog values into RocksDB byte for
//! byte. It is carried as:
//!
//! * a marker file, [`MARKER`], in every task directory, written when the
//!   store is created. A directory without one was written before markers
//!   existed: format 1.
//! * a header on every changelog record, [`HEADER`] with the format as one
//!   byte. A record without it was written before headers existed: format 1.
//!
//! A format newer than this build's stops the service with
//! [`UnknownFormat`] before it reads a byte of such state (a directory is
//! checked before RocksDB opens it, a record before it is applied). An older
//! one is brought up to date: local stores by `MIGRATIONS` when they open,
//! and a changelog record as it is, since a store reads every older layout
//! it holds (a restore copies records byte for byte). docs/architecture.md,
//! "State format", says when a change needs a new format.
//!
//! A build writes [`STATE_FORMAT`] unless told to write an older one
//! ([`WriteFormat`]: `--upgrade-from-format`), the first step of a two-step
//! upgrade: while pods of the older release run beside it, and may keep a
//! standby of its tasks or take them over, it writes only what they read.
//!
//! Each value also starts with its own encoding byte ([`super::codec`]);
//! the state format covers what that byte cannot: keys, the stores and what
//! their values mean, the checkpoints, and it is checked before any of it is
//! read rather than value by value while processing.

use std::io::Write;
use std::path::Path;

use rdkafka::message::{Header, Headers, OwnedHeaders};
use rocksdb::DB;

/// The newest format, which this build writes unless told otherwise: the
/// first, plus one per migration.
pub const STATE_FORMAT: u8 = FIRST_FORMAT + MIGRATIONS.len() as u8;

/// The format of state written before formats were marked.
const FIRST_FORMAT: u8 = 1;

/// The formats this build reads.
const READABLE: std::ops::RangeInclusive<u8> = FIRST_FORMAT..=STATE_FORMAT;

/// A migration of a task's local store from one format to the next.
type Migration = fn(&DB) -> anyhow::Result<()>;

/// `MIGRATIONS[n - 1]` takes a store of format `n` to `n + 1`; adding one
/// raises [`STATE_FORMAT`]. The marker is written after the last step, so
/// a step interrupted by a crash runs again: each must be safe to repeat
/// (one `WriteBatch` per step is). Every format a step leaves behind keeps
/// its writer too, for [`WriteFormat`].
///
/// 2: the progress store keeps a task's clocks and watermark in one entry
/// (`progress_layout`).
const MIGRATIONS: &[Migration] = &[super::progress_layout::fold_clocks];

/// The state format a build writes: [`STATE_FORMAT`], or an older one
/// during a two-step upgrade (docs/deploy.md, "Upgrades and rollback").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteFormat(u8);

impl WriteFormat {
    /// The newest format.
    pub const NEWEST: WriteFormat = WriteFormat(STATE_FORMAT);

    /// The format to write while pods that write `format` still run beside
    /// this build: `format` itself, if this build knows it and it is older
    /// than its own.
    pub fn upgrading_from(format: u8) -> anyhow::Result<WriteFormat> {
        anyhow::ensure!(
            format != STATE_FORMAT,
            "--upgrade-from-format {format} is the format this build writes: drop the flag"
        );
        anyhow::ensure!(
            (FIRST_FORMAT..STATE_FORMAT).contains(&format),
            "--upgrade-from-format {format}: this build writes formats \
             {FIRST_FORMAT}..={STATE_FORMAT}, so it upgrades from {FIRST_FORMAT}..={}",
            STATE_FORMAT - 1
        );
        Ok(WriteFormat(format))
    }

    pub fn number(self) -> u8 {
        self.0
    }
}

/// The marker file of a task directory: the format as a decimal number.
pub const MARKER: &str = "STATE_FORMAT";

/// The changelog record header holding the format (one byte): short, since
/// every changelog record carries it.
pub const HEADER: &str = "sf";

/// State of a format this build cannot read.
#[derive(Debug, thiserror::Error)]
#[error(
    "state in {place} has format {found}, this build reads formats {FIRST_FORMAT}..={STATE_FORMAT}: \
     roll back to a release that wrote it, or {remedy}"
)]
pub struct UnknownFormat {
    place: String,
    found: u8,
    remedy: &'static str,
}

impl UnknownFormat {
    fn in_directory(dir: &Path, found: u8) -> Self {
        UnknownFormat {
            place: dir.display().to_string(),
            found,
            remedy: "wipe the directory or use a new application id",
        }
    }
}

/// The format of the state in a task directory, as found before opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredFormat {
    /// No database yet: the store is created in [`STATE_FORMAT`].
    New,
    /// A database without a marker, from before markers existed.
    Unmarked,
    Marked(u8),
}

/// The format of the task store in `dir`, or [`UnknownFormat`] if this
/// build cannot read it. Reads only the marker; touches nothing.
pub(crate) fn check_task_dir(dir: &Path) -> anyhow::Result<StoredFormat> {
    let path = dir.join(MARKER);
    let stored = match std::fs::read_to_string(&path) {
        Ok(text) => StoredFormat::Marked(text.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "unreadable state format marker {}: {:?} is not a format number",
                path.display(),
                text.trim()
            )
        })?),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            // RocksDB's own `CURRENT` file names a database's manifest.
            if dir.join("CURRENT").exists() {
                StoredFormat::Unmarked
            } else {
                StoredFormat::New
            }
        }
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    };
    match stored {
        StoredFormat::Marked(found) if !READABLE.contains(&found) => {
            Err(UnknownFormat::in_directory(dir, found).into())
        }
        stored => Ok(stored),
    }
}

/// Checks every task directory of a stage's state directory (see
/// [`check_task_dir`]), so that state this build cannot read stops the
/// service at startup, before it joins its group.
pub(crate) fn check_stage_dir(stage_dir: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(stage_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => anyhow::bail!("cannot read {}: {error}", stage_dir.display()),
    };
    let mut task_dirs = Vec::new();
    for entry in entries {
        let entry = entry?;
        let is_task = entry.file_name().to_string_lossy().starts_with("task-");
        if is_task && entry.file_type()?.is_dir() {
            task_dirs.push(entry.path());
        }
    }
    // In order, so that the error names the same directory every time.
    task_dirs.sort();
    for dir in task_dirs {
        check_task_dir(&dir)?;
    }
    Ok(())
}

/// Brings the store just opened from `dir`, found as `stored`, to the
/// format `writing`: runs the migrations it needs, then marks it. A store
/// already past `writing` stays as it is (its marker too): this build
/// reads it, and an older release must not. Returns the format marked.
pub(crate) fn settle(
    db: &DB,
    dir: &Path,
    stored: StoredFormat,
    writing: WriteFormat,
) -> anyhow::Result<u8> {
    let target = writing.number();
    let from = match stored {
        StoredFormat::Marked(format) if format >= target => return Ok(format),
        StoredFormat::New => target,
        StoredFormat::Unmarked => FIRST_FORMAT,
        StoredFormat::Marked(format) => format,
    };
    let steps = usize::from(target - FIRST_FORMAT);
    migrate(db, dir, from, &MIGRATIONS[..steps])?;
    write_marker(dir, target)?;
    Ok(target)
}

/// Runs the steps of `migrations` that take a store of format `from` to
/// the last format.
fn migrate(db: &DB, dir: &Path, from: u8, migrations: &[Migration]) -> anyhow::Result<()> {
    let done = usize::from(from - FIRST_FORMAT);
    for (step, migration) in migrations.iter().enumerate().skip(done) {
        let to = usize::from(FIRST_FORMAT) + step + 1;
        migration(db).map_err(|e| {
            e.context(format!(
                "migrating the state in {} to format {to}",
                dir.display()
            ))
        })?;
        tracing::info!(dir = %dir.display(), format = to, "state migrated");
    }
    Ok(())
}

/// Writes [`MARKER`] saying `format`: a new file renamed over the old, so
/// that a crash leaves one or the other, whole.
pub(crate) fn write_marker(dir: &Path, format: u8) -> anyhow::Result<()> {
    let path = dir.join(MARKER);
    let partial = dir.join(format!("{MARKER}.partial"));
    let written = std::fs::File::create(&partial).and_then(|mut file| {
        writeln!(file, "{format}")?;
        file.sync_all()
    });
    written
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// The headers of a changelog record written in `format`: [`HEADER`].
pub(crate) fn changelog_headers(format: WriteFormat) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(1).insert(Header {
        key: HEADER,
        value: Some(&[format.number()][..]),
    })
}

/// The format of a changelog record of `topic`-`partition` at `offset`
/// with `headers`, or [`UnknownFormat`] if this build cannot read it.
/// A record of an older format is applied as it is: a store reads every
/// older layout it holds.
pub(crate) fn changelog_record_format(
    headers: Option<&impl Headers>,
    topic: &str,
    partition: i32,
    offset: i64,
) -> anyhow::Result<u8> {
    let value = headers.and_then(|headers| {
        headers
            .iter()
            .find(|header| header.key == HEADER)
            .map(|header| header.value.unwrap_or_default())
    });
    let place = || format!("changelog {topic} partition {partition} (offset {offset})");
    match value {
        None => Ok(FIRST_FORMAT),
        Some(&[found]) if READABLE.contains(&found) => Ok(found),
        Some(&[found]) => Err(UnknownFormat {
            place: place(),
            found,
            remedy: "use a new application id",
        }
        .into()),
        Some(other) => anyhow::bail!(
            "unreadable state format header in {}: {other:?} is not one byte",
            place()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::tests::temp_store;
    use crate::state::store::{StateResources, TaskStore};

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "state-format-test-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_is_new_unmarked_or_marked_and_a_newer_marker_is_refused() {
        let dir = temp_dir("dir");
        assert_eq!(check_task_dir(&dir).unwrap(), StoredFormat::New);
        std::fs::write(dir.join("CURRENT"), "MANIFEST-000001\n").unwrap();
        assert_eq!(check_task_dir(&dir).unwrap(), StoredFormat::Unmarked);
        std::fs::write(dir.join(MARKER), format!("{STATE_FORMAT}\n")).unwrap();
        assert_eq!(
            check_task_dir(&dir).unwrap(),
            StoredFormat::Marked(STATE_FORMAT)
        );
        let future = STATE_FORMAT + 1;
        std::fs::write(dir.join(MARKER), format!("{future}\n")).unwrap();
        let refused = check_task_dir(&dir).unwrap_err();
        assert!(refused.is::<UnknownFormat>());
        assert_eq!(
            refused.to_string(),
            format!(
                "state in {} has format {future}, this build reads formats 1..={STATE_FORMAT}: \
                 roll back to a release that wrote it, or wipe the directory or use a new \
                 application id",
                dir.display()
            )
        );
        std::fs::write(dir.join(MARKER), "two\n").unwrap();
        let unreadable = check_task_dir(&dir).unwrap_err().to_string();
        assert!(
            unreadable.contains("\"two\" is not a format number"),
            "{unreadable}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_stage_directory_is_refused_for_any_task_of_a_newer_format() {
        let stage = temp_dir("stage");
        check_stage_dir(&stage.join("absent")).unwrap();
        for task in ["task-0", "task-1"] {
            std::fs::create_dir_all(stage.join(task)).unwrap();
        }
        std::fs::write(stage.join("instance.id"), "x").unwrap();
        check_stage_dir(&stage).unwrap();
        std::fs::write(stage.join("task-1").join(MARKER), "200").unwrap();
        let refused = check_stage_dir(&stage).unwrap_err();
        assert!(
            refused.to_string().contains("task-1 has format 200"),
            "{refused}"
        );
        std::fs::remove_dir_all(stage).unwrap();
    }

    #[test]
    fn changelog_records_without_the_header_are_format_1_and_newer_ones_are_refused() {
        let format = |headers: Option<OwnedHeaders>| {
            changelog_record_format(headers.as_ref(), "app-sessions-changelog", 3, 42)
        };
        assert_eq!(format(None).unwrap(), 1);
        assert_eq!(format(Some(OwnedHeaders::new())).unwrap(), 1);
        assert_eq!(
            format(Some(changelog_headers(WriteFormat::NEWEST))).unwrap(),
            STATE_FORMAT
        );
        let previous = WriteFormat::upgrading_from(STATE_FORMAT - 1).unwrap();
        assert_eq!(
            format(Some(changelog_headers(previous))).unwrap(),
            STATE_FORMAT - 1
        );
        let with = |value: &[u8]| {
            Some(OwnedHeaders::new().insert(Header {
                key: HEADER,
                value: Some(value),
            }))
        };
        let future = STATE_FORMAT + 1;
        let refused = format(with(&[future])).unwrap_err();
        assert!(refused.is::<UnknownFormat>());
        assert_eq!(
            refused.to_string(),
            format!(
                "state in changelog app-sessions-changelog partition 3 (offset 42) has format \
                 {future}, this build reads formats 1..={STATE_FORMAT}: roll back to a release \
                 that wrote it, or use a new application id"
            )
        );
        assert!(format(with(&[])).is_err());
        assert!(format(with(&[1, 0])).is_err());
    }

    /// The names, sizes and modification times of the files in `dir`.
    fn listing(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let metadata = entry.metadata().unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                (name, metadata.len(), metadata.modified().unwrap())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_store_is_marked_when_opened_and_one_of_a_newer_format_is_left_untouched() {
        let (store, dir) = temp_store(&["a"]);
        let marker = || std::fs::read_to_string(dir.join(MARKER)).ok();
        assert_eq!(
            marker(),
            Some(format!("{STATE_FORMAT}\n")),
            "marked when created"
        );
        drop(store);
        let names = ["a".to_string()];
        let resources = StateResources::new(8 << 20, 1);
        std::fs::remove_file(dir.join(MARKER)).unwrap();
        drop(TaskStore::open(&dir, &names, &resources).unwrap());
        assert_eq!(
            marker(),
            Some(format!("{STATE_FORMAT}\n")),
            "marked when unmarked"
        );
        std::fs::write(dir.join(MARKER), format!("{}\n", STATE_FORMAT + 1)).unwrap();
        let before = listing(&dir);
        let refused = TaskStore::open(&dir, &names, &resources).err().unwrap();
        assert!(refused.is::<UnknownFormat>(), "{refused:#}");
        assert_eq!(listing(&dir), before, "nothing touched");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_upgrade_writes_only_formats_this_build_knows_older_than_its_own() {
        assert_eq!(WriteFormat::upgrading_from(1).unwrap().number(), 1);
        let own = WriteFormat::upgrading_from(STATE_FORMAT).unwrap_err();
        assert_eq!(
            own.to_string(),
            format!(
                "--upgrade-from-format {STATE_FORMAT} is the format this build writes: drop the flag"
            )
        );
        for unknown in [0, STATE_FORMAT + 1] {
            assert!(
                WriteFormat::upgrading_from(unknown).is_err(),
                "{unknown} refused"
            );
        }
    }

    #[test]
    fn a_store_written_in_an_older_format_stays_in_it_until_this_builds_format_is_written() {
        let names = ["a".to_string()];
        let previous = WriteFormat::upgrading_from(STATE_FORMAT - 1).unwrap();
        let upgrading = StateResources::new(8 << 20, 1).writing(previous);
        let dir = temp_dir("two-step");
        let marker = || std::fs::read_to_string(dir.join(MARKER)).unwrap();
        let store = TaskStore::open(&dir, &names, &upgrading).unwrap();
        assert_eq!(store.write_format(), previous);
        drop(store);
        assert_eq!(marker(), format!("{}\n", STATE_FORMAT - 1), "created in it");
        // The second step: migrated and marked.
        let newest = StateResources::new(8 << 20, 1);
        drop(TaskStore::open(&dir, &names, &newest).unwrap());
        assert_eq!(marker(), format!("{STATE_FORMAT}\n"));
        // Back to the first step (a rollback of the second): the store
        // holds the newest format, and says so, whatever it writes next.
        let mut store = TaskStore::open(&dir, &names, &upgrading).unwrap();
        assert_eq!(marker(), format!("{STATE_FORMAT}\n"));
        drop(store);
        // A store in the older format that a restore or a standby writes a
        // newer record into is marked with it before the record is applied.
        std::fs::remove_dir_all(&dir).unwrap();
        store = TaskStore::open(&dir, &names, &upgrading).unwrap();
        store.applying_format(STATE_FORMAT - 1).unwrap();
        assert_eq!(marker(), format!("{}\n", STATE_FORMAT - 1));
        store.applying_format(STATE_FORMAT).unwrap();
        assert_eq!(marker(), format!("{STATE_FORMAT}\n"));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn migrations_run_from_the_stored_format_on() {
        let dir = temp_dir("migrations");
        let db = DB::open_default(&dir).unwrap();
        fn append(db: &DB, step: u8) -> anyhow::Result<()> {
            let mut steps = db.get(b"steps")?.unwrap_or_default();
            steps.push(step);
            Ok(db.put(b"steps", steps)?)
        }
        let steps: [Migration; 3] = [|db| append(db, 1), |db| append(db, 2), |db| append(db, 3)];
        migrate(&db, &dir, 2, &steps).unwrap();
        assert_eq!(
            db.get(b"steps").unwrap(),
            Some(vec![2, 3]),
            "2 to 3, 3 to 4"
        );
        migrate(&db, &dir, 4, &steps).unwrap();
        assert_eq!(
            db.get(b"steps").unwrap(),
            Some(vec![2, 3]),
            "none for the last"
        );
        drop(db);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
