package validate

// The alerting rules, components/monitoring/prometheus-rules.yaml: the
// PrometheusRule as prod renders it goes through promtool (`check rules`,
// and `test rules` with prometheus-rules.test.yaml), and every alert uses
// only documented metrics and labels, selects the targets that the
// ServiceMonitor and prometheus-scrape.yaml produce, and names its runbook in
// docs/alerts.md. deploy/validate.sh builds promtool and sets PROMTOOL.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/promql/parser"
	yamlv2 "go.yaml.in/yaml/v2"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	rulesFile     = monitoringDir + "prometheus-rules.yaml"
	rulesTestFile = monitoringDir + "prometheus-rules.test.yaml"
	alertsDoc     = "docs/alerts.md"
)

// externalMetrics are series of other exporters that alerts may use (so
// docs/metrics.md does not list them), with their labels.
var externalMetrics = map[string][]string{
	// kube-state-metrics (kube-prometheus-stack has it)
	"kube_pod_container_resource_limits": {"namespace", "pod", "container", "node", "resource", "unit"},
}

// metricLabels are the labels of a metric's series besides seriesLabels
// (all of them for an external one); ok is false for a metric that is
// neither documented, nor `up` (Prometheus', per target), nor external.
func metricLabels(documented map[string][]string, name string) (own []string, ok, external bool) {
	if own, ok := externalMetrics[name]; ok {
		return own, true, true
	}
	if name == "up" {
		return nil, true, false
	}
	own, ok = documented[name]
	return own, ok, false
}

// seriesLabels are the labels a series of the services may carry besides
// its metric's own: the targets' (targetLabels) and a processing thread's
// (docs/metrics.md, `--stream-threads`).
func seriesLabels() map[string]bool {
	out := map[string]bool{"thread": true}
	for l := range targetLabels {
		out[l] = true
	}
	return out
}

// severities an alert may have: critical pages, warning does not.
var severities = map[string]bool{"critical": true, "warning": true}

// promtool is $PROMTOOL, which deploy/validate.sh builds and sets.
func promtool(t *testing.T) string {
	t.Helper()
	path := os.Getenv("PROMTOOL")
	if path == "" {
		t.Fatal("PROMTOOL is not set: run bash deploy/validate.sh (it builds promtool and sets PROMTOOL), " +
			"or PROMTOOL=/path/to/promtool go test ./...")
	}
	return path
}

// prometheusRule is the one PrometheusRule of prod.
func prometheusRule(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	r := render(t, "prod")
	if len(r.Rules) != 1 {
		t.Fatalf("%d PrometheusRules in prod; want 1 (%s)", len(r.Rules), rulesFile)
	}
	return r.Rules[0]
}

// writeRuleFile writes spec as the Prometheus rule file dir/rules.yaml,
// the file prometheus-rules.test.yaml names.
func writeRuleFile(t *testing.T, dir string, spec monitoringv1.PrometheusRuleSpec) string {
	t.Helper()
	data, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runPromtool runs promtool in dir and returns its output and whether it
// succeeded.
func runPromtool(t *testing.T, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("running %s: %v", cmd, err)
	}
	return string(out), err == nil
}

// promtool check rules, with every lint fatal.
func TestPromtoolCheckRules(t *testing.T) {
	dir := t.TempDir()
	writeRuleFile(t, dir, prometheusRule(t).Spec)
	out, ok := runPromtool(t, dir, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml")
	if !ok {
		t.Fatalf("promtool check rules refuses the spec of %s:\n%s", rulesFile, out)
	}
	t.Log(strings.TrimSpace(out))
}

// runRuleUnitTests runs prometheus-rules.test.yaml (withEveryServiceUp)
// against spec.
func runRuleUnitTests(t *testing.T, spec monitoringv1.PrometheusRuleSpec) (string, bool) {
	t.Helper()
	dir := t.TempDir()
	writeRuleFile(t, dir, spec)
	tests := withEveryServiceUp(t, readRepoFile(t, rulesTestFile))
	if err := os.WriteFile(filepath.Join(dir, "prometheus-rules.test.yaml"), []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	return runPromtool(t, dir, "test", "rules", "prometheus-rules.test.yaml")
}

// promtool test rules: the alerts fire, and stay silent, as the unit tests
// expect.
func TestPromtoolRuleUnitTests(t *testing.T) {
	out, ok := runRuleUnitTests(t, prometheusRule(t).Spec)
	if !ok {
		t.Fatalf("promtool test rules %s:\n%s", rulesTestFile, out)
	}
	t.Log(strings.TrimSpace(out))
}

// The unit tests bite: with a threshold changed they fail, naming the alert.
func TestPromtoolRuleUnitTestsCatchAChangedThreshold(t *testing.T) {
	spec := prometheusRule(t).Spec.DeepCopy()
	changed := false
	for g := range spec.Groups {
		for i, rule := range spec.Groups[g].Rules {
			if rule.Alert == "StreamsConsumerLagGrowing" && strings.Contains(rule.Expr.String(), "> 10000") {
				spec.Groups[g].Rules[i].Expr = intstr.FromString(strings.Replace(rule.Expr.String(), "> 10000", "> 50000", 1))
				changed = true
			}
		}
	}
	if !changed {
		t.Fatal("StreamsConsumerLagGrowing has no `> 10000` to change; update this self-test")
	}
	out, ok := runRuleUnitTests(t, *spec)
	if ok || !strings.Contains(out, "StreamsConsumerLagGrowing") {
		t.Fatalf("the unit tests passed with StreamsConsumerLagGrowing's threshold at 50000:\n%s", out)
	}
}

// The unit tests bite on StreamsServiceAbsent too: removing a service's
// selector, or a `for` too short to ride out a single-instance restart
// (5 minutes, against the test's gap of 7), fails them.
func TestPromtoolRuleUnitTestsCatchABrokenAbsenceAlert(t *testing.T) {
	short := monitoringv1.Duration("5m")
	for name, change := range map[string]func(*monitoringv1.Rule) bool{
		"without sessionizer's selector": func(r *monitoringv1.Rule) bool {
			const selector = `or absent(up{job="streams-services", service="sessionizer"})`
			if !strings.Contains(r.Expr.String(), selector) {
				return false
			}
			r.Expr = intstr.FromString(strings.Replace(r.Expr.String(), selector, "", 1))
			return true
		},
		"for: 5m": func(r *monitoringv1.Rule) bool { r.For = &short; return true },
	} {
		spec := prometheusRule(t).Spec.DeepCopy()
		changed := false
		for g := range spec.Groups {
			for i := range spec.Groups[g].Rules {
				if spec.Groups[g].Rules[i].Alert == "StreamsServiceAbsent" {
					changed = change(&spec.Groups[g].Rules[i])
				}
			}
		}
		if !changed {
			t.Errorf("%s: StreamsServiceAbsent has nothing to change; update this self-test", name)
			continue
		}
		out, ok := runRuleUnitTests(t, *spec)
		if ok || !strings.Contains(out, "StreamsServiceAbsent") {
			t.Errorf("the unit tests passed with StreamsServiceAbsent %s:\n%s", name, out)
		}
	}
}

// absenceAlert has one absent() per service of services.toml.
const absenceAlert = "StreamsServiceAbsent"

// withEveryServiceUp is the unit tests with an `up` series at 1 throughout,
// in each test of absenceAlert, for every service of the base that the test
// gives none: a service added to services.toml (and so to the alert) needs
// no edit of prometheus-rules.test.yaml to stay silent there.
func withEveryServiceUp(t *testing.T, file string) string {
	t.Helper()
	var typed ruleTests
	var raw struct {
		Tests []map[string]interface{} `yaml:"tests"`
		Rest  map[string]interface{}   `yaml:",inline"`
	}
	for _, into := range []interface{}{&typed, &raw} {
		if err := yamlv2.Unmarshal([]byte(file), into); err != nil {
			t.Fatalf("%s: %v", rulesTestFile, err)
		}
	}
	for i, test := range typed.Tests {
		var last model.Duration
		for _, art := range test.AlertRuleTests {
			if art.Alertname != absenceAlert {
				continue
			}
			at, err := model.ParseDuration(art.EvalTime)
			if err != nil {
				t.Fatalf("%s: test %q: eval_time %q: %v", rulesTestFile, test.Name, art.EvalTime, err)
			}
			last = max(last, at)
		}
		if last == 0 {
			continue
		}
		interval := model.Duration(time.Minute) // promtool's default
		if test.Interval != "" {
			var err error
			if interval, err = model.ParseDuration(test.Interval); err != nil {
				t.Fatalf("%s: test %q: interval %q: %v", rulesTestFile, test.Name, test.Interval, err)
			}
		}
		up := map[string]bool{}
		for _, in := range test.InputSeries {
			if series, err := parser.ParseMetric(in.Series); err == nil && series.Get(labels.MetricName) == "up" {
				up[series.Get("service")] = true
			}
		}
		series, _ := raw.Tests[i]["input_series"].([]interface{})
		for _, service := range baseServices(t) {
			if !up[service] {
				series = append(series, map[string]string{
					"series": fmt.Sprintf(`up{job="streams-services",namespace="streams",service=%q,pod="%s-0",container=%q,endpoint="http",instance="10.0.1.1:9090"}`,
						service, service, service),
					"values": fmt.Sprintf("1x%d", int64(last/interval)),
				})
			}
		}
		raw.Tests[i]["input_series"] = series
	}
	out, err := yamlv2.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// ruleTests is the part of promtool's unit-test format read here.
type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name        string `yaml:"name"`
		Interval    string `yaml:"interval"`
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTests []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// Every alert (each severity) has a case where it fires and one where it
// must not; the input series are documented metrics with their documented
// labels and the targets' labels.
func TestRuleUnitTestsCoverEveryAlert(t *testing.T) {
	var file ruleTests
	if err := yamlv2.Unmarshal([]byte(readRepoFile(t, rulesTestFile)), &file); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if len(file.RuleFiles) != 1 || file.RuleFiles[0] != "rules.yaml" {
		t.Errorf("%s: rule_files %v; want [rules.yaml], the file this test writes", rulesTestFile, file.RuleFiles)
	}
	fires := map[string]bool{}  // "alertname/severity"
	silent := map[string]bool{} // alertname
	documented := documentedMetrics(t)
	allowed := seriesLabels()
	for _, test := range file.Tests {
		for _, art := range test.AlertRuleTests {
			if len(art.ExpAlerts) == 0 {
				silent[art.Alertname] = true
			}
			for _, exp := range art.ExpAlerts {
				fires[art.Alertname+"/"+exp.ExpLabels["severity"]] = true
			}
		}
		for _, in := range test.InputSeries {
			series, err := parser.ParseMetric(in.Series)
			if err != nil {
				t.Errorf("test %q: series %s: %v", test.Name, in.Series, err)
				continue
			}
			name := series.Get(labels.MetricName)
			own, ok, _ := metricLabels(documented, name)
			if !ok {
				t.Errorf("test %q: %s is not in docs/metrics.md", test.Name, name)
				continue
			}
			series.Range(func(l labels.Label) {
				if l.Name != labels.MetricName && !allowed[l.Name] && !contains(own, l.Name) {
					t.Errorf("test %q: %s has no label %q (docs/metrics.md)", test.Name, name, l.Name)
				}
			})
		}
	}
	for _, group := range prometheusRule(t).Spec.Groups {
		for _, rule := range group.Rules {
			if rule.Alert == "" {
				continue
			}
			if key := rule.Alert + "/" + rule.Labels["severity"]; !fires[key] {
				t.Errorf("%s: no unit test where %s (severity %s) fires", rulesTestFile, rule.Alert, rule.Labels["severity"])
			}
			if !silent[rule.Alert] {
				t.Errorf("%s: no unit test where %s must not fire (exp_alerts: [])", rulesTestFile, rule.Alert)
			}
		}
	}
}

// scrapedTarget is the label set one setup gives a service's target.
type scrapedTarget struct {
	setup  string
	labels map[string]string
}

// scrapedTargets are the labels the ServiceMonitor (as the Prometheus
// Operator turns it into a scrape configuration: job from jobLabel, else the
// Service's name) and prometheus-scrape.yaml give each service's pods.
func scrapedTargets(t *testing.T) []scrapedTarget {
	t.Helper()
	r := render(t, "prod")
	if len(r.Monitors) != 1 {
		t.Fatalf("%d ServiceMonitors in prod; want 1", len(r.Monitors))
	}
	m := r.Monitors[0]
	var file scrapeFile
	if err := yamlv2.UnmarshalStrict([]byte(readRepoFile(t, monitoringDir+"prometheus-scrape.yaml")), &file); err != nil || len(file.ScrapeConfigs) != 1 {
		t.Fatalf("prometheus-scrape.yaml: %v (reported by TestPrometheusScrapeConfig)", err)
	}
	sc := file.ScrapeConfigs[0]
	for _, rc := range sc.RelabelConfigs {
		if err := rc.Validate(model.UTF8Validation); err != nil {
			t.Fatalf("prometheus-scrape.yaml: %v (reported by TestPrometheusScrapeConfig)", err)
		}
	}
	var out []scrapedTarget
	for _, sts := range r.StatefulSets {
		svc := r.service(sts.Spec.ServiceName)
		if svc == nil {
			continue
		}
		c := sts.Spec.Template.Spec.Containers[0]
		pod := sts.Name + "-0"
		job := svc.Name
		if value, ok := svc.Labels[m.Spec.JobLabel]; m.Spec.JobLabel != "" && ok {
			job = value
		}
		for _, ep := range m.Spec.Endpoints {
			out = append(out, scrapedTarget{
				setup: "ServiceMonitor " + m.Name,
				labels: map[string]string{"job": job, "namespace": sts.Namespace, "service": svc.Name,
					"pod": pod, "container": c.Name, "endpoint": ep.Port, "instance": "10.0.0.1:9090"},
			})
		}
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set("__address__", "10.0.0.1:9090")
		b.Set("__meta_kubernetes_namespace", sts.Namespace)
		b.Set("__meta_kubernetes_pod_name", pod)
		b.Set("__meta_kubernetes_pod_container_name", c.Name)
		b.Set("__meta_kubernetes_pod_container_port_name", "http")
		for k, v := range sts.Spec.Template.Labels {
			b.Set("__meta_kubernetes_pod_label_"+sanitize(k), v)
		}
		if !relabel.ProcessBuilder(b, sc.RelabelConfigs...) {
			continue // reported by TestPrometheusScrapeConfig
		}
		got := map[string]string{"job": sc.JobName, "instance": "10.0.0.1:9090"}
		b.Range(func(l labels.Label) {
			if !strings.HasPrefix(l.Name, "__") {
				got[l.Name] = l.Value
			}
		})
		out = append(out, scrapedTarget{setup: "prometheus-scrape.yaml job " + sc.JobName, labels: got})
	}
	if len(out) == 0 {
		t.Fatal("no scrape target derived from the render")
	}
	return out
}

// alertContext is what an alert is checked against.
type alertContext struct {
	documented map[string][]string
	targets    []scrapedTarget
}

var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// alertProblems checks one alerting rule: documented metrics only, label
// matchers and groupings on labels the series have, selectors on target
// labels that match every service's targets, annotations that use only
// labels the result has, a severity, a summary, a description and a
// runbook in docs/alerts.md at the alert's anchor.
func alertProblems(rule monitoringv1.Rule, ctx alertContext) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, rule.Alert+": "+fmt.Sprintf(format, args...))
	}
	if !severities[rule.Labels["severity"]] {
		add("severity %q; want critical or warning", rule.Labels["severity"])
	}
	for _, key := range []string{"summary", "description", "runbook"} {
		if strings.TrimSpace(rule.Annotations[key]) == "" {
			add("no %s annotation", key)
		}
	}
	if want := alertsDoc + "#" + strings.ToLower(rule.Alert); rule.Annotations["runbook"] != want {
		add("runbook %q; want %q", rule.Annotations["runbook"], want)
	}
	expr, err := parser.ParseExpr(rule.Expr.String())
	if err != nil {
		add("%v", err)
		return problems
	}
	allowed := seriesLabels()
	labelsOf := func(name string) ([]string, bool, bool) { return metricLabels(ctx.documented, name) }
	metricsUnder := func(node parser.Node) []string {
		var names []string
		parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				names = append(names, vs.Name)
			}
			return nil
		})
		return names
	}
	// hasLabel: every series of every metric under node may carry label.
	hasLabel := func(node parser.Node, label string) bool {
		for _, name := range metricsUnder(node) {
			own, _, external := labelsOf(name)
			if !contains(own, label) && (external || !allowed[label]) {
				return false
			}
		}
		return true
	}
	parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			own, ok, external := labelsOf(n.Name)
			if !ok {
				add("%s is not in docs/metrics.md (nor a known external series)", n.Name)
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != labels.MetricName && !contains(own, m.Name) && (external || !allowed[m.Name]) {
					add("%s has no label %q", n.Name, m.Name)
				}
			}
			if external {
				return nil // another job's targets
			}
			if underAbsent(path) {
				// absent() fires while its selector selects nothing, so it
				// may pick one service's targets, but must select some
				// target of each scrape setup, or it always fires.
				for _, setup := range targetSetups(ctx.targets) {
					if len(selectedServices(n, ctx.targets, setup)) == 0 {
						add("%s selects no target of the %s: absent() of it always fires", n, setup)
					}
				}
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				for _, target := range ctx.targets {
					if value, ok := target.labels[m.Name]; ok && !m.Matches(value) {
						add("%s{%s} does not select %s=%q, which the %s gives %s's targets",
							n.Name, m, m.Name, value, target.setup, target.labels["service"])
					}
				}
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				if !hasLabel(n.Expr, l) {
					add("groups by %q, a label some series of %v lack", l, metricsUnder(n.Expr))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil && n.VectorMatching.On {
				for _, l := range n.VectorMatching.MatchingLabels {
					for _, side := range []parser.Expr{n.LHS, n.RHS} {
						if _, known := outputLabels(side, labelsOf, allowed)[l]; !known {
							add("matches on %q, which %s does not have", l, side)
						}
					}
				}
			}
		}
		return nil
	})
	result := outputLabels(expr, labelsOf, allowed)
	for key, text := range rule.Annotations {
		for _, m := range templateLabel.FindAllStringSubmatch(text, -1) {
			if !result[m[1]] {
				add("annotation %s uses $labels.%s, which the expression's result does not have", key, m[1])
			}
		}
	}
	return problems
}

// absentFunctions return one series when their argument has none.
var absentFunctions = map[string]bool{"absent": true, "absent_over_time": true}

// underAbsent: path (a node's ancestors) passes through absent() or
// absent_over_time().
func underAbsent(path []parser.Node) bool {
	for _, node := range path {
		if call, ok := node.(*parser.Call); ok && absentFunctions[call.Func.Name] {
			return true
		}
	}
	return false
}

// targetSetups are the scrape setups of targets, sorted.
func targetSetups(targets []scrapedTarget) []string {
	seen := map[string]bool{}
	var out []string
	for _, target := range targets {
		if !seen[target.setup] {
			seen[target.setup] = true
			out = append(out, target.setup)
		}
	}
	sort.Strings(out)
	return out
}

// selectedServices are the services whose targets of setup the selector
// selects (every matcher but the metric name's matches the target's label,
// "" for a label it lacks).
func selectedServices(vs *parser.VectorSelector, targets []scrapedTarget, setup string) map[string]bool {
	out := map[string]bool{}
	for _, target := range targets {
		if target.setup != setup {
			continue
		}
		selected := true
		for _, m := range vs.LabelMatchers {
			if m.Name != labels.MetricName && !m.Matches(target.labels[m.Name]) {
				selected = false
			}
		}
		if selected {
			out[target.labels["service"]] = true
		}
	}
	return out
}

// absentLabels are the labels of absent()'s one series: those its argument,
// a selector, matches with `=` (each once); none for any other argument.
func absentLabels(arg parser.Expr) map[string]bool {
	var vs *parser.VectorSelector
	switch a := arg.(type) {
	case *parser.VectorSelector:
		vs = a
	case *parser.MatrixSelector:
		vs, _ = a.VectorSelector.(*parser.VectorSelector)
	}
	out := map[string]bool{}
	if vs == nil {
		return out
	}
	count := map[string]int{}
	for _, m := range vs.LabelMatchers {
		if m.Name != labels.MetricName && m.Type == labels.MatchEqual {
			count[m.Name]++
		}
	}
	for l, n := range count {
		if n == 1 {
			out[l] = true
		}
	}
	return out
}

// outputLabels are the labels an expression's result may carry.
func outputLabels(expr parser.Expr, labelsOf func(string) ([]string, bool, bool), allowed map[string]bool) map[string]bool {
	switch n := expr.(type) {
	case *parser.VectorSelector:
		out := map[string]bool{}
		own, _, external := labelsOf(n.Name)
		if !external {
			for l := range allowed {
				out[l] = true
			}
		}
		for _, l := range own {
			out[l] = true
		}
		return out
	case *parser.MatrixSelector:
		return outputLabels(n.VectorSelector, labelsOf, allowed)
	case *parser.SubqueryExpr:
		return outputLabels(n.Expr, labelsOf, allowed)
	case *parser.ParenExpr:
		return outputLabels(n.Expr, labelsOf, allowed)
	case *parser.StepInvariantExpr:
		return outputLabels(n.Expr, labelsOf, allowed)
	case *parser.UnaryExpr:
		return outputLabels(n.Expr, labelsOf, allowed)
	case *parser.Call:
		if absentFunctions[n.Func.Name] && len(n.Args) == 1 {
			return absentLabels(n.Args[0])
		}
		for _, arg := range n.Args {
			if t := arg.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
				return outputLabels(arg, labelsOf, allowed)
			}
		}
		return map[string]bool{}
	case *parser.AggregateExpr:
		out := map[string]bool{}
		if n.Without {
			for l := range outputLabels(n.Expr, labelsOf, allowed) {
				out[l] = !contains(n.Grouping, l)
			}
			return out
		}
		for _, l := range n.Grouping {
			out[l] = true
		}
		return out
	case *parser.BinaryExpr:
		lhs, rhs := n.LHS.Type() == parser.ValueTypeVector, n.RHS.Type() == parser.ValueTypeVector
		switch {
		case !lhs && !rhs:
			return map[string]bool{}
		case !lhs:
			return outputLabels(n.RHS, labelsOf, allowed)
		case !rhs:
			return outputLabels(n.LHS, labelsOf, allowed)
		}
		left, right := outputLabels(n.LHS, labelsOf, allowed), outputLabels(n.RHS, labelsOf, allowed)
		m := n.VectorMatching
		switch {
		case n.Op == parser.LAND || n.Op == parser.LUNLESS:
			return left
		case n.Op == parser.LOR:
			out := map[string]bool{}
			for l := range left {
				out[l] = left[l] && right[l]
			}
			return out
		case m.Card == parser.CardManyToOne || m.Card == parser.CardOneToMany:
			out := left
			if m.Card == parser.CardOneToMany {
				out = right
			}
			for _, l := range m.Include {
				out[l] = true
			}
			return out
		case m.On:
			out := map[string]bool{}
			for _, l := range m.MatchingLabels {
				out[l] = left[l]
			}
			return out
		default:
			for _, l := range m.MatchingLabels {
				delete(left, l)
			}
			return left
		}
	}
	return map[string]bool{}
}

// Every alert: documented metrics and labels, selectors that select the
// services' targets, annotations on labels the result has, severity,
// summary, description, runbook. Alert names are unique per severity.
func TestAlertsUseDocumentedMetricsAndLabels(t *testing.T) {
	ctx := alertContext{documented: documentedMetrics(t), targets: scrapedTargets(t)}
	seen := map[string]bool{}
	alerts := 0
	for _, group := range prometheusRule(t).Spec.Groups {
		for _, rule := range group.Rules {
			if rule.Alert == "" {
				continue
			}
			alerts++
			key := rule.Alert + "/" + rule.Labels["severity"]
			if seen[key] {
				t.Errorf("%s with severity %s twice", rule.Alert, rule.Labels["severity"])
			}
			seen[key] = true
			for _, p := range alertProblems(rule, ctx) {
				t.Error(p)
			}
		}
	}
	if alerts < 7 {
		t.Errorf("only %d alerts in %s", alerts, rulesFile)
	}
}

// Every service has an alert on the absence of its targets: absent() of
// an `up` selector that selects that service's targets, and only its, in
// each scrape setup. Without one, a service whose pods are all Pending
// without an IP, or whose StatefulSet has no pods, alerts nowhere (no
// `up` series for StreamsServiceDown).
func TestEveryServiceHasAnAbsenceAlert(t *testing.T) {
	targets := scrapedTargets(t)
	covered := map[string][]string{} // service -> alerts
	for _, group := range prometheusRule(t).Spec.Groups {
		for _, rule := range group.Rules {
			if rule.Alert == "" {
				continue
			}
			expr, err := parser.ParseExpr(rule.Expr.String())
			if err != nil {
				continue // reported by TestAlertsUseDocumentedMetricsAndLabels
			}
			parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
				vs, ok := node.(*parser.VectorSelector)
				if !ok || vs.Name != "up" || !underAbsent(path) {
					return nil
				}
				var service string
				for i, setup := range targetSetups(targets) {
					selected := selectedServices(vs, targets, setup)
					if len(selected) != 1 {
						return nil // several services or none: not one service's absence
					}
					for s := range selected {
						if i > 0 && s != service {
							return nil
						}
						service = s
					}
				}
				covered[service] = append(covered[service], rule.Alert)
				return nil
			})
		}
	}
	for _, service := range serviceNames(t) {
		if len(covered[service]) == 0 {
			t.Errorf("%s: no alert on absent(up{job=..., service=%q}): if every pod of %s is Pending without an IP, or it has no pods, nothing fires",
				rulesFile, service, service)
		}
	}
}

// The ServiceMonitor's targets and prometheus-scrape.yaml's carry the same
// job, so that the alerts select either.
func TestBothScrapeSetupsGiveOneJob(t *testing.T) {
	jobs := map[string][]string{}
	for _, target := range scrapedTargets(t) {
		jobs[target.labels["job"]] = append(jobs[target.labels["job"]], target.setup+" "+target.labels["service"])
	}
	if len(jobs) != 1 {
		t.Errorf("the targets' job labels differ: %v", jobs)
	}
}

// The checks reject what they are meant to reject.
func TestAlertChecksRejectBrokenRules(t *testing.T) {
	ctx := alertContext{documented: documentedMetrics(t), targets: scrapedTargets(t)}
	good := monitoringv1.Rule{
		Alert:  "StreamsDeadLetters",
		Expr:   intstr.FromString(`sum by (namespace, pod, topic) (increase(streams_records_dead_lettered_total[5m])) > 0`),
		Labels: map[string]string{"severity": "warning"},
		Annotations: map[string]string{"summary": "{{ $labels.pod }}", "description": "{{ $labels.topic }}",
			"runbook": "docs/alerts.md#streamsdeadletters"},
	}
	if problems := alertProblems(good, ctx); len(problems) > 0 {
		t.Fatalf("a good rule is refused: %v", problems)
	}
	broken := map[string]func(*monitoringv1.Rule){
		"is not in docs/metrics.md": func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`increase(streams_records_dead_letered_total[5m]) > 0`)
		},
		`groups by "store"`: func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`sum by (pod, store, topic) (increase(streams_records_dead_lettered_total[5m])) > 0`)
		},
		`has no label "partition"`: func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`increase(streams_records_dead_lettered_total{partition="0"}[5m]) > 0`)
		},
		`does not select job=`: func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`up{job="sessionizer", namespace="streams"} == 0`)
			r.Annotations["description"] = "{{ $labels.service }}"
		},
		"uses $labels.topic": func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`sum by (namespace, pod) (increase(streams_records_dead_lettered_total[5m])) > 0`)
		},
		`matches on "topic"`: func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`sum by (namespace, pod, topic) (increase(streams_records_dead_lettered_total[5m])) > 0 and on (pod, topic) streams_ready == 1`)
		},
		"selects no target of the ServiceMonitor": func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`absent(up{job="streams-services", service="sessionizr"})`)
			r.Annotations = map[string]string{"summary": "{{ $labels.service }}", "description": "{{ $labels.job }}",
				"runbook": "docs/alerts.md#streamsdeadletters"}
		},
		"uses $labels.namespace": func(r *monitoringv1.Rule) {
			r.Expr = intstr.FromString(`absent(up{job="streams-services", service="sessionizer"})`)
			r.Annotations = map[string]string{"summary": "{{ $labels.service }}", "description": "{{ $labels.namespace }}",
				"runbook": "docs/alerts.md#streamsdeadletters"}
		},
		"runbook":  func(r *monitoringv1.Rule) { r.Annotations["runbook"] = "docs/operations.md#streamsdeadletters" },
		"severity": func(r *monitoringv1.Rule) { r.Labels["severity"] = "page" },
	}
	var names []string
	for name := range broken {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, want := range names {
		rule := good
		rule.Labels = map[string]string{"severity": "warning"}
		rule.Annotations = map[string]string{}
		for k, v := range good.Annotations {
			rule.Annotations[k] = v
		}
		broken[want](&rule)
		problems := alertProblems(rule, ctx)
		if !strings.Contains(strings.Join(problems, "\n"), want) {
			t.Errorf("%s: want a problem containing %q, got %v", rule.Expr.String(), want, problems)
		}
	}
}

// headingAnchor is the anchor GitHub gives a Markdown heading.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// docs/alerts.md has a section for every alert (the runbook anchors) and
// none for an alert that does not exist.
func TestAlertsDocumented(t *testing.T) {
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(readRepoFile(t, alertsDoc), -1) {
		anchors[headingAnchor(m[1])] = true
	}
	alerts := map[string]bool{}
	for _, group := range prometheusRule(t).Spec.Groups {
		for _, rule := range group.Rules {
			if rule.Alert == "" {
				continue
			}
			alerts[strings.ToLower(rule.Alert)] = true
			anchor := strings.TrimPrefix(rule.Annotations["runbook"], alertsDoc+"#")
			if !anchors[anchor] {
				t.Errorf("%s: %s has no section with the anchor #%s", rule.Alert, alertsDoc, anchor)
			}
		}
	}
	for anchor := range anchors {
		if strings.HasPrefix(anchor, "streams") && !alerts[anchor] {
			t.Errorf("%s: section #%s is about no alert of %s", alertsDoc, anchor, rulesFile)
		}
	}
}
