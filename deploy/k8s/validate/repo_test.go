// Package validate checks deploy/: the Kubernetes overlays (rendered with
// kustomize's krusty, strict-decoded into the k8s.io/api types), the compose
// file (compose-spec schema), the Dockerfile's facts, the monitoring files, and
// that every flag and environment variable they give a binary exists in that
// binary's --help. Everything runs offline; see deploy/validate.sh and
// docs/deploy.md.
package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the checkout: this file is deploy/k8s/validate/repo_test.go.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

func readRepoFile(t testing.TB, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return string(data)
}

// serviceNames are the stream processors: one crate per directory in services/.
func serviceNames(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repoRoot(t), "services"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, entry := range entries {
		if entry.IsDir() {
			if _, err := os.Stat(filepath.Join(repoRoot(t), "services", entry.Name(), "Cargo.toml")); err == nil {
				names = append(names, entry.Name())
			}
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("no services found in services/")
	}
	return names
}

// baseServices are the services the kustomize base deploys, sorted: the
// resources of deploy/k8s/base/kustomization.yaml, which
// deploy/k8s/generate.py lists from services.toml.
func baseServices(t testing.TB) []string {
	t.Helper()
	const baseFile = "deploy/k8s/base/kustomization.yaml"
	var base struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, baseFile)), &base); err != nil {
		t.Fatalf("%s: %v", baseFile, err)
	}
	sort.Strings(base.Resources)
	return base.Resources
}

// binDir holds the built binaries: $STREAMS_BIN_DIR, else
// $CARGO_TARGET_DIR/debug, else the Makefile's default target directory.
func binDir() string {
	if dir := os.Getenv("STREAMS_BIN_DIR"); dir != "" {
		return dir
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = "/var/tmp/streams-target"
	}
	return filepath.Join(target, "debug")
}

// Help is what a binary's --help says about its options.
type Help struct {
	Flags    map[string]Option // "--state-dir" -> option
	Env      map[string]Option // "STATE_DIR" -> option
	Command  string            // "sessionizer" or "streamctl topics create"
	Commands map[string]bool   // sub-commands ("Commands:" section)
}

// Option is one option block of a clap long help.
type Option struct {
	Flag     string
	Env      string
	Values   []string // possible values, if the option is an enumeration
	Default  string
	TakesArg bool
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]*Help{}
)

// helpOf runs `<bin> <subcommands...> --help` once per test binary run.
func helpOf(t testing.TB, bin string, subcommands []string) *Help {
	t.Helper()
	key := strings.Join(append([]string{bin}, subcommands...), " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if help, ok := helpCache[key]; ok {
		return help
	}
	path := filepath.Join(binDir(), bin)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is not built (looked in %s; set STREAMS_BIN_DIR or CARGO_TARGET_DIR, or run `make build`): %v", bin, binDir(), err)
	}
	args := append(append([]string{}, subcommands...), "--help")
	cmd := exec.Command(path, args...)
	// The help must not depend on the caller's environment (clap prints
	// `[env: NAME=value]` when it is set).
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", key, err, out)
	}
	help := parseHelp(string(out))
	help.Command = key
	helpCache[key] = help
	return help
}

var (
	optionLine    = regexp.MustCompile(`^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)(?:[ =](<[^>]+>|\[[^\]]+\]))?`)
	envRe         = regexp.MustCompile(`\[env: ([A-Z0-9_]+)`)
	defaultRe     = regexp.MustCompile(`\[default: ([^\]]*)\]`)
	inlineValues  = regexp.MustCompile(`\[possible values: ([^\]]*)\]`)
	listedValueRe = regexp.MustCompile(`^\s+- ([A-Za-z0-9_.-]+):`)
)

// parseHelp reads clap's long help (`--help`) and short help (sub-commands)
// formats: an option line, then its description, `[env: ...]`, `[default: ...]`
// and possible values.
func parseHelp(text string) *Help {
	help := &Help{Flags: map[string]Option{}, Env: map[string]Option{}, Commands: map[string]bool{}}
	var current *Option
	inCommands := false
	flush := func() {
		if current == nil {
			return
		}
		help.Flags[current.Flag] = *current
		if current.Env != "" {
			help.Env[current.Env] = *current
		}
		current = nil
	}
	inValueList := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "Commands:") {
			inCommands = true
			continue
		}
		if inCommands {
			if fields := strings.Fields(line); strings.HasPrefix(line, "  ") && len(fields) > 0 {
				help.Commands[fields[0]] = true
				continue
			}
			inCommands = false
		}
		if m := optionLine.FindStringSubmatch(line); m != nil {
			flush()
			current = &Option{Flag: m[1], TakesArg: m[2] != ""}
			inValueList = false
		} else if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, " ") {
			// A section heading ("Options:", "Commands:", "Usage: ...").
			flush()
			inValueList = false
		}
		if current == nil {
			continue
		}
		if m := envRe.FindStringSubmatch(line); m != nil {
			current.Env = m[1]
		}
		if m := defaultRe.FindStringSubmatch(line); m != nil {
			current.Default = m[1]
		}
		if m := inlineValues.FindStringSubmatch(line); m != nil {
			for _, value := range strings.Split(m[1], ",") {
				current.Values = append(current.Values, strings.TrimSpace(value))
			}
		}
		if strings.TrimSpace(line) == "Possible values:" {
			inValueList = true
			continue
		}
		if inValueList {
			if m := listedValueRe.FindStringSubmatch(line); m != nil {
				current.Values = append(current.Values, m[1])
			} else if strings.TrimSpace(line) == "" || !strings.HasPrefix(strings.TrimSpace(line), "- ") {
				inValueList = false
			}
		}
	}
	flush()
	return help
}

// durationRe is the duration syntax of the services (README.md: 250ms, 30s, 5m, 2h, 7d).
var durationRe = regexp.MustCompile(`^[0-9]+(ms|s|m|h|d)$`)

// checkValue reports why value is not acceptable for option, or "".
func checkValue(option Option, value string) string {
	if len(option.Values) > 0 {
		for _, allowed := range option.Values {
			if value == allowed {
				return ""
			}
		}
		return "not one of " + strings.Join(option.Values, ", ")
	}
	if durationRe.MatchString(option.Default) && !durationRe.MatchString(value) {
		return "not a duration like " + option.Default
	}
	return ""
}
