package validate

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// notFlags are environment variables a binary reads that are not clap
// options: RUST_LOG is tracing's filter.
var notFlags = map[string]bool{"RUST_LOG": true}

// Invocation is what a deployment file gives one binary.
type Invocation struct {
	Where string            // "compose sessionizer", "k8s prod StatefulSet sessionizer"
	Argv  []string          // command then args, $(VAR) unexpanded
	Env   map[string]string // name -> value ("" for references)
}

// binaryAndFlags splits argv into the binary, its sub-commands (streamctl
// topics create ...) and its flags with their values.
func binaryAndFlags(argv []string) (bin string, subcommands []string, flags [][2]string) {
	if len(argv) == 0 {
		return "", nil, nil
	}
	bin = argv[0]
	i := 1
	for ; i < len(argv) && !strings.HasPrefix(argv[i], "-"); i++ {
		subcommands = append(subcommands, argv[i])
	}
	for ; i < len(argv); i++ {
		arg := argv[i]
		if !strings.HasPrefix(arg, "--") {
			continue // a value or positional argument
		}
		name, value, hasValue := strings.Cut(arg, "=")
		if !hasValue && i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "--") {
			value, hasValue = argv[i+1], true
		}
		flags = append(flags, [2]string{name, value})
	}
	return bin, subcommands, flags
}

// checkInvocation lists every flag and environment variable of inv that the
// binary's --help does not know, and values outside an option's possible values.
func checkInvocation(t testing.TB, inv Invocation) []string {
	t.Helper()
	var problems []string
	report := func(format string, args ...any) {
		problems = append(problems, inv.Where+": "+fmt.Sprintf(format, args...))
	}
	bin, words, flags := binaryAndFlags(inv.Argv)
	if bin == "" {
		report("no command")
		return problems
	}
	// Sub-commands (streamctl topics create); a later word is a positional
	// argument.
	var subcommands []string
	help := helpOf(t, bin, nil)
	for _, word := range words {
		if !help.Commands[word] {
			break
		}
		subcommands = append(subcommands, word)
		help = helpOf(t, bin, subcommands)
	}
	referenced := map[string]bool{}
	for _, arg := range inv.Argv {
		for _, m := range varRef.FindAllStringSubmatch(arg, -1) {
			referenced[m[1]] = true
		}
	}
	for _, flag := range flags {
		option, ok := help.Flags[flag[0]]
		if !ok {
			report("`%s` has no flag %s", help.Command, flag[0])
			continue
		}
		if option.TakesArg && !strings.Contains(flag[1], "$(") {
			if why := checkValue(option, flag[1]); why != "" {
				report("%s=%s: %s", flag[0], flag[1], why)
			}
		}
	}
	var names []string
	for name := range inv.Env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		option, ok := help.Env[name]
		switch {
		case ok:
			if value := inv.Env[name]; value != "" {
				if why := checkValue(option, value); why != "" {
					report("%s=%s: %s", name, value, why)
				}
			}
		case notFlags[name], referenced[name]:
		default:
			report("`%s` reads no environment variable %s (a misspelt setting is silently ignored)", help.Command, name)
		}
	}
	return problems
}

func composeInvocations(t *testing.T) []Invocation {
	var out []Invocation
	for _, s := range loadCompose(t).AllServices() {
		if !strings.HasPrefix(s.Image, imageName) {
			continue // Kafka, the registry
		}
		env := map[string]string{}
		for name, value := range s.Environment {
			if value != nil {
				env[name] = *value
			} else {
				env[name] = ""
			}
		}
		argv := append(append([]string{}, s.Entrypoint...), s.Command...)
		out = append(out, Invocation{Where: "compose.yaml service " + s.Name, Argv: argv, Env: env})
	}
	return out
}

func k8sInvocations(t *testing.T, overlay string) []Invocation {
	r := render(t, overlay)
	var out []Invocation
	for _, sts := range r.StatefulSets {
		for _, c := range sts.Spec.Template.Spec.Containers {
			env, _ := containerEnv(t, r, c)
			values := map[string]string{}
			for name, v := range env {
				values[name] = v.Value
			}
			argv := append(append([]string{}, c.Command...), c.Args...)
			out = append(out, Invocation{Where: fmt.Sprintf("k8s %s StatefulSet %s", overlay, sts.Name), Argv: argv, Env: values})
		}
	}
	return out
}

// Drift check: every flag and environment variable that compose.yaml and the
// Kubernetes overlays give a binary is one that binary's --help lists.
func TestDeployFilesUseOnlyFlagsTheBinariesHave(t *testing.T) {
	invocations := composeInvocations(t)
	for _, overlay := range overlays {
		invocations = append(invocations, k8sInvocations(t, overlay)...)
	}
	if len(invocations) < 2*len(serviceNames(t)) {
		t.Fatalf("only %d invocations found", len(invocations))
	}
	for _, inv := range invocations {
		for _, problem := range checkInvocation(t, inv) {
			t.Error(problem)
		}
	}
}

// The help parser must see what the checks rely on; if clap's format changes
// these fail instead of the drift check passing vacuously.
func TestHelpParser(t *testing.T) {
	for _, service := range serviceNames(t) {
		help := helpOf(t, service, nil)
		for _, flag := range []string{"--bootstrap-servers", "--state-dir", "--instance-id", "--kafka", "--http-addr"} {
			if _, ok := help.Flags[flag]; !ok {
				t.Errorf("%s --help: %s not found (flags seen: %d)", service, flag, len(help.Flags))
			}
		}
		for _, env := range []string{"KAFKA_BOOTSTRAP_SERVERS", "STATE_DIR", "INSTANCE_ID", "HTTP_ADDR", "PROCESSING_GUARANTEE"} {
			if _, ok := help.Env[env]; !ok {
				t.Errorf("%s --help: [env: %s] not found", service, env)
			}
		}
		if got := help.Env["PROCESSING_GUARANTEE"].Values; strings.Join(got, ",") != "exactly_once_v2,at_least_once" {
			t.Errorf("%s: PROCESSING_GUARANTEE values %v", service, got)
		}
		if got := help.Env["LOG_FORMAT"].Values; strings.Join(got, ",") != "text,json" {
			t.Errorf("%s: LOG_FORMAT values %v", service, got)
		}
		if help.Flags["--kafka"].Env != "" || !help.Flags["--kafka"].TakesArg {
			t.Errorf("%s: --kafka parsed as %+v", service, help.Flags["--kafka"])
		}
	}
	bad := Invocation{Where: "self-test", Argv: []string{"sessionizer", "--no-such-flag=1", "--log-format=yaml"},
		Env: map[string]string{"SESION_TIMEOUT": "30s", "PROCESSING_GUARANTEE": "exactly_once", "SESSION_TIMEOUT": "30"}}
	errs := strings.Join(checkInvocation(t, bad), "\n")
	for _, want := range []string{"--no-such-flag", "--log-format=yaml", "SESION_TIMEOUT", "PROCESSING_GUARANTEE=exactly_once", "SESSION_TIMEOUT=30"} {
		if !strings.Contains(errs, want) {
			t.Errorf("the drift check did not report %s; it said:\n%s", want, errs)
		}
	}
	streamctl := Invocation{Where: "self-test", Argv: []string{"streamctl", "topics", "create", "orders", "--partitions", "3", "--config", "cleanup.policy=compact"}}
	if errs := checkInvocation(t, streamctl); len(errs) > 0 {
		t.Errorf("a valid streamctl invocation was refused: %v", errs)
	}
	if help := helpOf(t, "streamctl", []string{"topics", "create"}); help.Flags["--partitions"].Flag == "" {
		t.Error("streamctl topics create --help: --partitions not found")
	}
}
