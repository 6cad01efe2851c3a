package validate

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Dockerfile is what the other checks need to know of deploy/docker/Dockerfile.
type Dockerfile struct {
	RustVersion [2]int          // FROM rust:<major>.<minor>-...
	Binaries    map[string]bool // copied from target/release
	UID, GID    int64           // USER uid:gid
	StateDir    string          // ENV STATE_DIR
	ExposedPort int32           // EXPOSE
}

var (
	rustFromRe = regexp.MustCompile(`(?m)^FROM\s+rust:(\d+)\.(\d+)(?:\.\d+)?-\S+\s+AS\s+build\s*$`)
	releaseRe  = regexp.MustCompile(`target/release/([a-z0-9-]+)`)
	userRe     = regexp.MustCompile(`(?m)^USER\s+(\d+):(\d+)\s*$`)
	stateDirRe = regexp.MustCompile(`STATE_DIR=(\S+)`)
	exposeRe   = regexp.MustCompile(`(?m)^EXPOSE\s+(\d+)\s*$`)
)

func parseDockerfile(t testing.TB) Dockerfile {
	t.Helper()
	text := readRepoFile(t, "deploy/docker/Dockerfile")
	var d Dockerfile
	m := rustFromRe.FindStringSubmatch(text)
	if m == nil {
		t.Fatal("Dockerfile: no `FROM rust:<major>.<minor>-... AS build`")
	}
	d.RustVersion[0], _ = strconv.Atoi(m[1])
	d.RustVersion[1], _ = strconv.Atoi(m[2])
	d.Binaries = map[string]bool{}
	for _, m := range releaseRe.FindAllStringSubmatch(text, -1) {
		d.Binaries[m[1]] = true
	}
	u := userRe.FindStringSubmatch(text)
	if u == nil {
		t.Fatal("Dockerfile: want a numeric `USER uid:gid` (runAsNonRoot cannot check a name)")
	}
	d.UID, _ = strconv.ParseInt(u[1], 10, 64)
	d.GID, _ = strconv.ParseInt(u[2], 10, 64)
	if s := stateDirRe.FindStringSubmatch(text); s != nil {
		d.StateDir = s[1]
	} else {
		t.Fatal("Dockerfile: no ENV STATE_DIR")
	}
	e := exposeRe.FindStringSubmatch(text)
	if e == nil {
		t.Fatal("Dockerfile: no EXPOSE <port>")
	}
	port, _ := strconv.Atoi(e[1])
	d.ExposedPort = int32(port)
	if !strings.Contains(text, fmt.Sprintf("--uid %d", d.UID)) || !strings.Contains(text, fmt.Sprintf("--gid %d", d.GID)) {
		t.Errorf("Dockerfile: USER %d:%d is not the uid/gid the image creates", d.UID, d.GID)
	}
	return d
}

type cargoMetadata struct {
	Packages []struct {
		ID          string  `json:"id"`
		Name        string  `json:"name"`
		Version     string  `json:"version"`
		Source      *string `json:"source"`
		Manifest    string  `json:"manifest_path"`
		RustVersion *string `json:"rust_version"`
		Targets     []struct {
			Name string   `json:"name"`
			Kind []string `json:"kind"`
		} `json:"targets"`
	} `json:"packages"`
	Resolve struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
	} `json:"resolve"`
}

// cargoMetadataOf runs cargo metadata for Linux x86_64 on the lock file as it is.
func cargoMetadataOf(t testing.TB) cargoMetadata {
	t.Helper()
	run := func(extra ...string) ([]byte, error) {
		args := append([]string{"metadata", "--format-version", "1", "--locked", "--filter-platform", "x86_64-unknown-linux-gnu"}, extra...)
		cmd := exec.Command("cargo", args...)
		cmd.Dir = repoRoot(t)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("cargo %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out, nil
	}
	out, err := run("--offline")
	if err != nil {
		// Crates not downloaded yet (a fresh machine that has not built).
		out, err = run()
	}
	if err != nil {
		t.Fatal(err)
	}
	var meta cargoMetadata
	if err := json.Unmarshal(out, &meta); err != nil {
		t.Fatal(err)
	}
	return meta
}

func versionOf(s string) ([2]int, error) {
	parts := strings.Split(s, ".")
	var v [2]int
	if len(parts) < 2 {
		return v, fmt.Errorf("version %q", s)
	}
	var err error
	if v[0], err = strconv.Atoi(parts[0]); err != nil {
		return v, err
	}
	v[1], err = strconv.Atoi(parts[1])
	return v, err
}

func less(a, b [2]int) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }

// The image's Rust must build the lock file: cargo refuses a dependency whose
// rust-version is newer than the compiler.
func TestDockerfileRustBuildsTheLockedDependencies(t *testing.T) {
	d := parseDockerfile(t)
	meta := cargoMetadataOf(t)
	resolved := map[string]bool{}
	for _, n := range meta.Resolve.Nodes {
		resolved[n.ID] = true
	}
	var tooNew []string
	for _, p := range meta.Packages {
		if !resolved[p.ID] || p.RustVersion == nil {
			continue
		}
		v, err := versionOf(*p.RustVersion)
		if err != nil {
			t.Errorf("%s %s: %v", p.Name, p.Version, err)
			continue
		}
		if less(d.RustVersion, v) {
			tooNew = append(tooNew, fmt.Sprintf("%s %s needs Rust %s", p.Name, p.Version, *p.RustVersion))
		}
	}
	if len(tooNew) > 0 {
		sort.Strings(tooNew)
		t.Errorf("Dockerfile builds with rust:%d.%d, but:\n  %s", d.RustVersion[0], d.RustVersion[1], strings.Join(tooNew, "\n  "))
	}
}

// Every binary of the services and of shared/ (streamctl) is in the image;
// whatever it copies, the workspace builds. (Benchmark tools stay out.)
func TestDockerfileCopiesEveryBinary(t *testing.T) {
	d := parseDockerfile(t)
	meta := cargoMetadataOf(t)
	root := repoRoot(t)
	want, built := map[string]bool{}, map[string]bool{}
	for _, p := range meta.Packages {
		if p.Source != nil {
			continue // a dependency
		}
		rel, _ := filepath.Rel(root, p.Manifest)
		shipped := strings.HasPrefix(rel, "services/") || strings.HasPrefix(rel, "shared/")
		for _, target := range p.Targets {
			for _, kind := range target.Kind {
				if kind == "bin" {
					built[target.Name] = true
					if shipped {
						want[target.Name] = true
					}
				}
			}
		}
	}
	for bin := range want {
		if !d.Binaries[bin] {
			t.Errorf("binary %s is not copied into the image", bin)
		}
	}
	for bin := range d.Binaries {
		if !built[bin] {
			t.Errorf("the Dockerfile copies target/release/%s, which the workspace does not build", bin)
		}
	}
	for _, service := range serviceNames(t) {
		if !want[service] {
			t.Errorf("services/%s builds no binary of that name", service)
		}
	}
}
