//! Earlier releases of the services, built from the git history, for the
//! upgrade tests (tests/tests/upgrade.rs).
//!
//! A release's service binary is built once per machine: its commit is
//! exported with `git archive` into `/var/tmp/streams-releases/<commit>/src`
//! (`STREAMS_RELEASES_DIR`), built there with this build's
//! `CARGO_TARGET_DIR` (so the third-party crates already built are reused)
//! and kept as `<commit>/bin/<service>`, which later runs take as it is.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::workspace;

/// A release: its version and the commit it was built from.
#[derive(Debug, Clone)]
pub struct Release {
    pub version: String,
    pub commit: String,
}

impl Release {
    /// The release before this checkout, as `tests/upgrade/previous-release`
    /// names it: the last to write state format 1.
    pub fn previous() -> Release {
        Self::named_in("previous-release")
    }

    /// The first release, as `tests/upgrade/first-release` names it: it
    /// wrote state format 1 before formats were marked and checked.
    pub fn first() -> Release {
        Self::named_in("first-release")
    }

    /// The release `tests/upgrade/<file>` names.
    fn named_in(file: &str) -> Release {
        let path = workspace().join("tests/upgrade").join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("{} names no {name}", path.display()))
                .trim()
                .to_string()
        };
        Release {
            version: field("version"),
            commit: field("commit"),
        }
    }

    /// This release's binary of `service`, built on first use: its own
    /// crates only, some seconds, when this checkout's build has left the
    /// third-party ones in the target directory. Concurrent callers, in
    /// this process or others, wait for the one that builds it.
    pub fn binary(&self, service: &str) -> PathBuf {
        let root = releases_dir().join(&self.commit);
        let binary = root.join("bin").join(service);
        if binary.exists() {
            return binary;
        }
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let lock = File::create(root.join("build.lock")).unwrap();
        lock.lock().expect("lock the release build");
        if !binary.exists() {
            let started = Instant::now();
            self.build(service, &root, &binary);
            eprintln!(
                "built {service} {} ({}) in {:.0?}",
                self.version,
                self.commit,
                started.elapsed()
            );
        }
        binary
    }

    /// Exports the release's sources into `root/src`, builds `service`
    /// there and copies it to `binary`.
    fn build(&self, service: &str, root: &Path, binary: &Path) {
        let repository = workspace();
        let known = Command::new("git")
            .arg("-C")
            .arg(&repository)
            .args(["cat-file", "-e", &format!("{}^{{commit}}", self.commit)])
            .output()
            .expect("run git");
        assert!(
            known.status.success(),
            "the previous release {} (commit {}, tests/upgrade/previous-release) is not in the \
             git repository at {}: the upgrade tests build it from the git history, so they \
             need a clone that has that commit (a shallow clone may not: `git fetch --unshallow`)\n{}",
            self.version,
            self.commit,
            repository.display(),
            String::from_utf8_lossy(&known.stderr)
        );
        let src = root.join("src");
        if src.exists() {
            // What a build interrupted before the binary was kept left.
            std::fs::remove_dir_all(&src).unwrap();
        }
        std::fs::create_dir_all(&src).unwrap();
        let archive = root.join("src.tar");
        run(Command::new("git")
            .arg("-C")
            .arg(&repository)
            .args(["archive", "--output"])
            .arg(&archive)
            .arg(&self.commit));
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&src));
        std::fs::remove_file(&archive).unwrap();

        let release = &self.commit[..12];
        set_own_versions(&src, release);
        // The binary under a name of its own: built into this checkout's
        // target directory, under its own name it would replace this
        // checkout's binary there.
        let renamed = format!("{service}-{release}");
        let manifest = src.join("services").join(service).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let text = text.replacen("[package]\n", "[package]\nautobins = false\n", 1);
        std::fs::write(
            &manifest,
            format!("{text}\n[[bin]]\nname = \"{renamed}\"\npath = \"src/main.rs\"\n"),
        )
        .unwrap();

        let target = target_dir();
        let log = root.join("build.log");
        let log_file = File::create(&log).unwrap();
        let status = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
            .args(["build", "--locked", "-p", service, "--bin", &renamed])
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", &target)
            // The jobserver of a `make test` that runs this is not this
            // child's to share.
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .env_remove("CARGO_MAKEFLAGS")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .status()
            .expect("run cargo");
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            status.success(),
            "building {service} {} failed ({}):\n{output}",
            self.version,
            log.display()
        );
        let built = target.join("debug").join(&renamed);
        let partial = binary.with_extension("partial");
        std::fs::copy(&built, &partial).unwrap();
        std::fs::rename(&partial, binary).unwrap();
        // Not this checkout's: out of its target directory.
        std::fs::remove_file(built.with_extension("d")).unwrap();
        std::fs::remove_file(built).unwrap();
    }
}

/// Gives the workspace crates of the sources in `src` the version
/// `<version>+<release>`, in their manifests and in `Cargo.lock`.
///
/// Cargo names a workspace crate's artifacts (and fingerprints) after its
/// name, version and path within the workspace, not the workspace's
/// location: built into this checkout's target directory as they are, the
/// release's crates would overwrite this checkout's artifacts of the same
/// name, and whichever build came next could take the other's as up to
/// date (cargo compares source times, and `git archive` dates the files at
/// the commit), linking one release's code into the other's binaries.
fn set_own_versions(src: &Path, release: &str) {
    let mut manifests = vec![src.join("Cargo.toml")];
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name() == Some("Cargo.toml".as_ref()) && path != manifests[0] {
                manifests.push(path);
            }
        }
    }
    for manifest in manifests {
        let text = std::fs::read_to_string(&manifest).unwrap();
        // `version = "…"` of `[package]`, or of `[workspace.package]` for
        // the members that inherit it.
        let mut section = "";
        let patched: Vec<String> = text
            .lines()
            .map(|line| {
                if line.starts_with('[') {
                    section = line.trim();
                }
                match line.strip_prefix("version = \"") {
                    Some(rest) if section == "[package]" || section == "[workspace.package]" => {
                        with_release(rest, release)
                    }
                    _ => line.to_string(),
                }
            })
            .collect();
        std::fs::write(&manifest, patched.join("\n") + "\n").unwrap();
    }
    // The lock's entries of workspace crates are those without a source.
    let lock = src.join("Cargo.lock");
    let text = std::fs::read_to_string(&lock).unwrap();
    let patched: Vec<String> = text
        .split("\n\n")
        .map(|entry| {
            if !entry.starts_with("[[package]]") || entry.contains("\nsource = ") {
                return entry.to_string();
            }
            let lines = entry
                .lines()
                .map(|line| match line.strip_prefix("version = \"") {
                    Some(rest) => with_release(rest, release),
                    None => line.to_string(),
                });
            lines.collect::<Vec<_>>().join("\n")
        })
        .collect();
    std::fs::write(&lock, patched.join("\n\n")).unwrap();
}

/// The line `version = "<rest>`, the version ending in `+<release>`.
fn with_release(rest: &str, release: &str) -> String {
    let (version, after) = rest.split_once('"').expect("a quoted version");
    format!("version = \"{version}+{release}\"{after}")
}

/// Where releases are built and kept: `STREAMS_RELEASES_DIR`, by default
/// `/var/tmp/streams-releases`, outside the checkout and kept across runs.
fn releases_dir() -> PathBuf {
    std::env::var_os("STREAMS_RELEASES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/streams-releases"))
}

/// The target directory this test executable was built in
/// (`<target>/debug/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("a test executable in <target>/debug/deps")
        .to_path_buf()
}

/// Runs `command`, failing the test with its output if it fails.
fn run(command: &mut Command) {
    let output = command.output().expect("run a command");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "the upgrade tests build it from the git history, so they need")]
    fn a_release_whose_commit_the_clone_lacks_fails_saying_so() {
        let release = Release {
            version: "0.0.0".into(),
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
        };
        let root = std::env::temp_dir().join(format!("release-test-{}", std::process::id()));
        release.build("sessionizer", &root, &root.join("bin/sessionizer"));
    }

    #[test]
    fn the_previous_release_names_a_version_and_a_full_commit() {
        let release = Release::previous();
        assert!(!release.version.is_empty());
        assert_eq!(release.commit.len(), 40, "{}", release.commit);
        assert!(release.commit.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
