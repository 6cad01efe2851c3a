package validate

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/promql/parser"
	yamlv2 "go.yaml.in/yaml/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
)

const monitoringDir = "deploy/k8s/components/monitoring/"

// documentedMetrics reads the table of docs/metrics.md: name -> labels.
func documentedMetrics(t testing.TB) map[string][]string {
	t.Helper()
	row := regexp.MustCompile("(?m)^\\| `((?:streams|process)_[a-z0-9_]+)` \\| [a-z]+ \\| ([^|]*)\\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	metrics := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(readRepoFile(t, "docs/metrics.md"), -1) {
		var names []string
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			names = append(names, l[1])
		}
		metrics[m[1]] = names
	}
	if len(metrics) < 10 {
		t.Fatalf("read only %d metrics from docs/metrics.md's table", len(metrics))
	}
	return metrics
}

// targetLabels are the labels every scraped series carries (ServiceMonitor
// defaults and prometheus-scrape.yaml's relabelling), plus the runtime's
// `stage` of a later stage (docs/metrics.md).
var targetLabels = map[string]bool{"namespace": true, "service": true, "pod": true, "container": true,
	"instance": true, "job": true, "endpoint": true, "stage": true}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// The dashboard: valid JSON, every query valid PromQL over documented
// metrics and labels, every documented metric shown, a sane layout.
func TestGrafanaDashboard(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal([]byte(readRepoFile(t, monitoringDir+"grafana-dashboard.json")), &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	documented := documentedMetrics(t)
	shown := map[string]bool{}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap", other, p.Title)
					x, y = 1<<30, 1<<30
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q: datasource %s is not the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			for _, m := range grafanaVar.FindAllStringSubmatch(target.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q: $%s is not a dashboard variable", p.Title, m[1])
				}
			}
			// Grafana substitutes its variables before Prometheus parses.
			expr := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h").Replace(target.Expr)
			expr = grafanaVar.ReplaceAllString(expr, "x")
			parsed, err := parser.ParseExpr(expr)
			if err != nil {
				t.Errorf("panel %q query %s: %v\n  %s", p.Title, target.RefID, err, target.Expr)
				continue
			}
			var metricsHere []string
			parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
				if vs, ok := node.(*parser.VectorSelector); ok {
					if vs.Name != "up" {
						if _, ok := documented[vs.Name]; !ok {
							t.Errorf("panel %q: %s is not in docs/metrics.md", p.Title, vs.Name)
						}
					}
					shown[vs.Name] = true
					metricsHere = append(metricsHere, vs.Name)
				}
				return nil
			})
			// Labels grouped by must exist on the series.
			parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
				agg, ok := node.(*parser.AggregateExpr)
				if !ok {
					return nil
				}
				for _, l := range agg.Grouping {
					if targetLabels[l] {
						continue
					}
					for _, metric := range metricsHere {
						if !contains(documented[metric], l) {
							t.Errorf("panel %q: %s has no label %q (docs/metrics.md)", p.Title, metric, l)
						}
					}
				}
				return nil
			})
		}
	}
	var missing []string
	for metric := range documented {
		if !shown[metric] {
			missing = append(missing, metric)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics of docs/metrics.md no panel shows: %v", missing)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Every name of docs/metrics.md is one the runtime defines (the dashboard
// would otherwise show an empty panel).
func TestDocumentedMetricsExist(t *testing.T) {
	source := readRepoFile(t, "shared/runtime/src/metrics.rs")
	for metric := range documentedMetrics(t) {
		if !strings.Contains(source, `"`+metric+`"`) {
			t.Errorf("%s (docs/metrics.md) is not defined in shared/runtime/src/metrics.rs", metric)
		}
	}
}

// Every metric the runtime defines (a `pub const` name in metrics.rs) is in
// docs/metrics.md's table: the other direction of TestDocumentedMetricsExist.
func TestDefinedMetricsAreDocumented(t *testing.T) {
	documented := documentedMetrics(t)
	defined := regexp.MustCompile(`pub const [A-Z0-9_]+: &str = "((?:streams|process)_[a-z0-9_]+)";`).
		FindAllStringSubmatch(readRepoFile(t, "shared/runtime/src/metrics.rs"), -1)
	if len(defined) < 10 {
		t.Fatalf("found only %d metric names in shared/runtime/src/metrics.rs", len(defined))
	}
	for _, m := range defined {
		if _, ok := documented[m[1]]; !ok {
			t.Errorf("%s (shared/runtime/src/metrics.rs) is not in docs/metrics.md", m[1])
		}
	}
}

// The ServiceMonitor selects every Service, by a port each one has.
func TestServiceMonitorCoversEveryService(t *testing.T) {
	r := render(t, "prod")
	if len(r.Monitors) != 1 {
		t.Fatalf("%d ServiceMonitors in prod; want 1", len(r.Monitors))
	}
	m := r.Monitors[0]
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("ServiceMonitor selector: %v", err)
	}
	if len(m.Spec.Endpoints) == 0 {
		t.Fatal("ServiceMonitor has no endpoints")
	}
	for _, ep := range m.Spec.Endpoints {
		if ep.Path != "" && ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor path %q; the services serve /metrics", ep.Path)
		}
	}
	for _, sts := range r.StatefulSets {
		svc := r.service(sts.Spec.ServiceName)
		if svc == nil {
			continue // reported by TestStatefulSetInvariants
		}
		if !sel.Matches(k8slabels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor does not select Service %s (labels %v)", svc.Name, svc.Labels)
		}
		for _, ep := range m.Spec.Endpoints {
			found := false
			for _, p := range svc.Spec.Ports {
				found = found || p.Name == ep.Port
			}
			if !found {
				t.Errorf("Service %s has no port named %q", svc.Name, ep.Port)
			}
		}
		if !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s hides not-ready pods: a restoring instance would not be scraped", svc.Name)
		}
	}
}

// scrapeFile mirrors the part of Prometheus' configuration that
// prometheus-scrape.yaml uses, with Prometheus' own types for durations and
// relabelling. (Prometheus' full config loader would bring its whole
// service-discovery dependency tree: minutes of downloads on a fresh machine.)
type scrapeFile struct {
	ScrapeConfigs []struct {
		JobName             string         `yaml:"job_name"`
		MetricsPath         string         `yaml:"metrics_path"`
		ScrapeInterval      model.Duration `yaml:"scrape_interval"`
		ScrapeTimeout       model.Duration `yaml:"scrape_timeout"`
		KubernetesSDConfigs []struct {
			Role string `yaml:"role"`
		} `yaml:"kubernetes_sd_configs"`
		RelabelConfigs []*relabel.Config `yaml:"relabel_configs"`
	} `yaml:"scrape_configs"`
}

// prometheus-scrape.yaml decodes strictly, its relabel rules are valid, and
// run on each pod's labels they keep port 9090 only and label the series as
// the dashboard expects.
func TestPrometheusScrapeConfig(t *testing.T) {
	var file scrapeFile
	if err := yamlv2.UnmarshalStrict([]byte(readRepoFile(t, monitoringDir+"prometheus-scrape.yaml")), &file); err != nil {
		t.Fatalf("prometheus-scrape.yaml: %v", err)
	}
	if len(file.ScrapeConfigs) != 1 {
		t.Fatalf("%d scrape configs; want 1", len(file.ScrapeConfigs))
	}
	sc := file.ScrapeConfigs[0]
	if sc.JobName == "" || sc.MetricsPath != "/metrics" {
		t.Errorf("job_name %q, metrics_path %q", sc.JobName, sc.MetricsPath)
	}
	if sc.ScrapeTimeout > sc.ScrapeInterval {
		t.Errorf("scrape_timeout %s exceeds scrape_interval %s (Prometheus refuses that)", sc.ScrapeTimeout, sc.ScrapeInterval)
	}
	if len(sc.KubernetesSDConfigs) != 1 || sc.KubernetesSDConfigs[0].Role != "pod" {
		t.Errorf("want one kubernetes_sd_configs entry of role pod")
	}
	for i, rc := range sc.RelabelConfigs {
		if err := rc.Validate(model.UTF8Validation); err != nil {
			t.Errorf("relabel_configs[%d]: %v", i, err)
		}
	}
	r := render(t, "prod")
	for _, sts := range r.StatefulSets {
		c := sts.Spec.Template.Spec.Containers[0]
		for _, port := range c.Ports {
			b := labels.NewBuilder(labels.EmptyLabels())
			b.Set("__address__", fmt.Sprintf("10.0.0.1:%d", port.ContainerPort))
			b.Set("__meta_kubernetes_namespace", "streams")
			b.Set("__meta_kubernetes_pod_name", sts.Name+"-0")
			b.Set("__meta_kubernetes_pod_container_name", c.Name)
			b.Set("__meta_kubernetes_pod_container_port_name", port.Name)
			for k, v := range sts.Spec.Template.Labels {
				b.Set("__meta_kubernetes_pod_label_"+sanitize(k), v)
			}
			keep := relabel.ProcessBuilder(b, sc.RelabelConfigs...)
			if port.ContainerPort != 9090 {
				if keep {
					t.Errorf("%s: port %s would be scraped too", sts.Name, port.Name)
				}
				continue
			}
			if !keep {
				t.Errorf("%s: the scrape config drops the pod", sts.Name)
				continue
			}
			got := b.Labels()
			for name, want := range map[string]string{"namespace": "streams", "service": sts.Name, "pod": sts.Name + "-0"} {
				if got.Get(name) != want {
					t.Errorf("%s: label %s=%q, want %q", sts.Name, name, got.Get(name), want)
				}
			}
		}
	}
}

var nonLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// sanitize turns a Kubernetes label name into the __meta_ label suffix.
func sanitize(s string) string { return nonLabelChar.ReplaceAllString(s, "_") }
