package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// loginComponents are the Kafka logins that no overlay uses yet
// (components/kafka-sasl is prod's, checked with it in TestOverlayDifferences):
// mutual TLS and SASL/OAUTHBEARER with OIDC. Each is rendered here onto the
// base, as an overlay that uses it would be, and goes through the overlays'
// checks and its own.
var loginComponents = []string{"kafka-mtls", "kafka-oidc"}

// renderedComponents are the components that no overlay uses, rendered
// here onto the base: the logins above and interactive queries.
var renderedComponents = append(append([]string{}, loginComponents...), "queries")

// kafkaCredentialsSuffix: components/kafka-sasl mounts the Secret
// <service>-kafka-credentials into each service's pods.
const kafkaCredentialsSuffix = "-kafka-credentials"

// queryTokenSuffix: components/queries mounts the Secret
// <service>-query-token into each service's pods.
const queryTokenSuffix = "-query-token"

// externalSecret: the Secret is one that is created outside git for each
// service of the base, one per login (README.md "Deploying on Kubernetes")
// and one for queries (docs/deploy.md "Interactive queries"), as the login
// components and components/queries name them: references to it are
// expected to dangle in the render.
func externalSecret(t testing.TB, name string) bool {
	t.Helper()
	for _, service := range baseServices(t) {
		for _, suffix := range []string{kafkaCredentialsSuffix, "-kafka-tls", "-kafka-oidc", queryTokenSuffix} {
			if name == service+suffix {
				return true
			}
		}
	}
	return false
}

// podSecrets are the Secrets a pod template names: volumes (projected ones
// too), and its containers' secretKeyRef and envFrom.
func podSecrets(pod corev1.PodSpec) map[string]bool {
	out := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			out[v.Secret.SecretName] = true
		}
		if v.Projected != nil {
			for _, source := range v.Projected.Sources {
				if source.Secret != nil {
					out[source.Secret.Name] = true
				}
			}
		}
	}
	for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out[e.ValueFrom.SecretKeyRef.Name] = true
			}
		}
		for _, from := range c.EnvFrom {
			if from.SecretRef != nil {
				out[from.SecretRef.Name] = true
			}
		}
	}
	return out
}

// ownSecretProblems: one Secret per service (one Kafka principal, one query
// token). Every Secret whose name ends with suffix that a StatefulSet's pods
// name is the service's own, <service><suffix>, and no such Secret is named
// by two StatefulSets; why says what sharing one would mean.
func ownSecretProblems(r *Rendered, suffix, why string) []string {
	var problems []string
	users := map[string][]string{} // Secret -> the StatefulSets naming it
	for _, sts := range r.StatefulSets {
		own := sts.Name + suffix
		found := false
		for name := range podSecrets(sts.Spec.Template.Spec) {
			if !strings.HasSuffix(name, suffix) {
				continue
			}
			users[name] = append(users[name], sts.Name)
			if name == own {
				found = true
			} else {
				problems = append(problems, fmt.Sprintf("%s names the Secret %s; want only its own %s", sts.Name, name, own))
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s does not name its own Secret %s", sts.Name, own))
		}
	}
	var shared []string
	for name, stss := range users {
		if len(stss) > 1 {
			sort.Strings(stss)
			shared = append(shared, fmt.Sprintf("the Secret %s is shared by %s: %s", name, strings.Join(stss, ", "), why))
		}
	}
	sort.Strings(shared)
	return append(problems, shared...)
}

// Why a Secret must not be shared, for ownSecretProblems' messages.
const (
	sharedKafkaCredentials = "one Kafka principal for several services"
	sharedQueryToken       = "one service's token would read another's state"
)

// kafkaCredentialsProblems checks one StatefulSet of components/kafka-sasl:
// KAFKA_CONFIG_FILE is the key client.properties of the service's own
// Secret <service>-kafka-credentials, mounted read-only, with a mode
// readable by owner and group only.
func kafkaCredentialsProblems(sts *appsv1.StatefulSet) []string {
	return secretFileProblems(sts, "KAFKA_CONFIG_FILE", kafkaCredentialsSuffix, "client.properties")
}

// queryTokenProblems checks one StatefulSet of components/queries:
// QUERY_TOKEN_FILE is the key token of the service's own Secret
// <service>-query-token, mounted read-only, with a mode readable by owner
// and group only.
func queryTokenProblems(sts *appsv1.StatefulSet) []string {
	return secretFileProblems(sts, "QUERY_TOKEN_FILE", queryTokenSuffix, "token")
}

// secretFileProblems: the first container's variable envName (a literal
// value) is the file `key` of the service's own Secret <service><suffix>,
// mounted read-only, and the volume's modes (defaultMode and each item's)
// have no write and no other bits.
func secretFileProblems(sts *appsv1.StatefulSet, envName, suffix, key string) []string {
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	own := sts.Name + suffix
	file := ""
	for _, e := range c.Env {
		if e.Name == envName {
			file = e.Value
		}
	}
	if file == "" {
		return []string{envName + " is not set (as a literal value)"}
	}
	badMode := func(mode *int32) bool { return mode == nil || *mode&0o007 != 0 || *mode&0o222 != 0 }
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name != v.Name || !strings.HasPrefix(file, m.MountPath+"/") {
				continue
			}
			var problems []string
			if v.Secret.SecretName != own {
				problems = append(problems, fmt.Sprintf("%s %q is a file of the Secret %s; want the service's own %s", envName, file, v.Secret.SecretName, own))
			}
			if file != m.MountPath+"/"+key {
				problems = append(problems, fmt.Sprintf("%s %q is not the key %s of the Secret mounted at %s", envName, file, key, m.MountPath))
			}
			if !m.ReadOnly {
				problems = append(problems, fmt.Sprintf("mount %s is not read-only", m.MountPath))
			}
			if badMode(v.Secret.DefaultMode) {
				problems = append(problems, fmt.Sprintf("Secret volume %s mode %s: want readable by owner and group only, not writable", v.Name, modeString(v.Secret.DefaultMode)))
			}
			for _, item := range v.Secret.Items {
				if item.Mode != nil && badMode(item.Mode) {
					problems = append(problems, fmt.Sprintf("Secret volume %s item %s mode %s: want readable by owner and group only, not writable", v.Name, item.Key, modeString(item.Mode)))
				}
			}
			return problems
		}
	}
	return []string{fmt.Sprintf("%s (%q) is not a file of a mounted Secret; want the key %s of %s", envName, file, key, own)}
}

// modeString is a file mode as ls -l's octal, or "unset" (then the
// kubelet's default, 0644).
func modeString(mode *int32) string {
	if mode == nil {
		return "unset"
	}
	return fmt.Sprintf("%#o", *mode)
}

// renderComponent builds base + components/<component> through a
// kustomization written to a temporary directory, the way an overlay would
// (with an explicit image tag), and decodes it strictly like the overlays.
func renderComponent(t *testing.T, component string) *Rendered {
	t.Helper()
	root := repoRoot(t)
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "deploy", "k8s", "overlays", component)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: streams-%s
resources:
  - %s
components:
  - %s
images:
  - name: streams-services
    newTag: "0.1.0"
`, component, relative(t, dir, filepath.Join(root, "deploy/k8s/base")),
		relative(t, dir, filepath.Join(root, "deploy/k8s/components", component)))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := doRender(tmp, component)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// relative is target as seen from dir (kustomize takes no absolute paths).
func relative(t *testing.T, dir, target string) string {
	t.Helper()
	rel, err := filepath.Rel(dir, target)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// kafkaProperty is the librdkafka property an environment variable sets, by
// the runtime's rule (shared/runtime/src/client.rs, env_properties):
// KAFKA_PROPERTY_SSL_KEY_LOCATION is ssl.key.location, `__` is `_`.
func kafkaProperty(name string) (string, bool) {
	key, ok := strings.CutPrefix(name, "KAFKA_PROPERTY_")
	if !ok || key == "" {
		return "", false
	}
	parts := strings.Split(strings.ToLower(key), "__")
	for i, part := range parts {
		parts[i] = strings.ReplaceAll(part, "_", ".")
	}
	return strings.Join(parts, "_"), true
}

// kafkaProperties are the client properties a container's environment sets.
func kafkaProperties(env map[string]EnvVar) map[string]EnvVar {
	out := map[string]EnvVar{}
	for name, v := range env {
		if key, ok := kafkaProperty(name); ok {
			out[key] = v
		}
	}
	return out
}

// Each component renders onto the base, decodes strictly, keeps every
// StatefulSet invariant of the overlays, passes the API server's
// validation, and gives the binaries only flags and variables they read.
func TestComponentsRenderAndPassTheOverlayChecks(t *testing.T) {
	docker := parseDockerfile(t)
	for _, component := range renderedComponents {
		t.Run(component, func(t *testing.T) {
			r := renderComponent(t, component)
			if len(r.StatefulSets) != len(serviceNames(t)) {
				t.Fatalf("%d StatefulSets rendered; want one per service", len(r.StatefulSets))
			}
			for _, sts := range r.StatefulSets {
				t.Run(sts.Name, func(t *testing.T) { checkStatefulSet(t, r, sts, docker) })
			}
			objects := r.validatable()
			if want := r.Objects - len(r.Monitors) - len(r.Rules); len(objects) != want {
				t.Fatalf("%d objects gathered for validation, %d rendered (not counting ServiceMonitors and PrometheusRules)", len(objects), want)
			}
			for _, obj := range objects {
				errs, err := apiServerErrors(obj)
				if err != nil {
					t.Fatal(err)
				}
				if len(errs) > 0 {
					t.Errorf("%T %s is refused by the API server's validation: %v",
						obj, obj.(interface{ GetName() string }).GetName(), errs.ToAggregate())
				}
			}
			// The drift check, with the KAFKA_PROPERTY_* variables, which
			// are not options but client properties, checked below.
			for _, sts := range r.StatefulSets {
				c := sts.Spec.Template.Spec.Containers[0]
				env, _ := containerEnv(t, r, c)
				values := map[string]string{}
				for name, v := range env {
					if _, ok := kafkaProperty(name); !ok {
						values[name] = v.Value
					}
				}
				argv := append(append([]string{}, c.Command...), c.Args...)
				inv := Invocation{Where: fmt.Sprintf("k8s %s StatefulSet %s", component, sts.Name), Argv: argv, Env: values}
				for _, problem := range checkInvocation(t, inv) {
					t.Error(problem)
				}
			}
		})
	}
}

// checkLoginBasics: the properties a login component sets are known
// librdkafka ones, no credential is in args or a ConfigMap.
func checkLoginBasics(t *testing.T, r *Rendered, sts *appsv1.StatefulSet, props map[string]EnvVar) {
	t.Helper()
	c := sts.Spec.Template.Spec.Containers[0]
	if args := strings.Join(c.Args, " "); strings.Contains(args, "sasl.") || strings.Contains(args, "ssl.") {
		t.Errorf("login settings in args: %s", args)
	}
	for key, v := range props {
		if strings.Contains(key, "secret") || strings.Contains(key, "password") {
			if v.Secret == "" {
				t.Errorf("%s comes from %s, not from a Secret", key, v.Source)
			}
		}
	}
	for _, cm := range r.ConfigMaps {
		for key := range cm.Data {
			lower := strings.ToLower(key)
			if strings.Contains(lower, "secret") || strings.Contains(lower, "password") {
				t.Errorf("ConfigMap %s has a key %s: credentials belong in a Secret", cm.Name, key)
			}
		}
	}
}

func TestKafkaMTLSComponent(t *testing.T) {
	r := renderComponent(t, "kafka-mtls")
	for _, p := range ownSecretProblems(r, "-kafka-tls", sharedKafkaCredentials) {
		t.Error(p)
	}
	for _, sts := range r.StatefulSets {
		t.Run(sts.Name, func(t *testing.T) {
			pod := sts.Spec.Template.Spec
			c := pod.Containers[0]
			env, problems := containerEnv(t, r, c)
			for _, p := range problems {
				t.Error(p)
			}
			props := kafkaProperties(env)
			checkLoginBasics(t, r, sts, props)
			// The service's own kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt), read-only.
			mountPath := secretMount(t, pod, c, sts.Name+"-kafka-tls")
			want := map[string]string{
				"security.protocol":        "SSL",
				"ssl.certificate.location": mountPath + "/tls.crt",
				"ssl.key.location":         mountPath + "/tls.key",
				"ssl.ca.location":          mountPath + "/ca.crt",
			}
			checkProps(t, props, want)
			for key := range props {
				if strings.HasPrefix(key, "sasl.") {
					t.Errorf("%s set: mutual TLS needs no SASL", key)
				}
			}
		})
	}
}

func TestKafkaOIDCComponent(t *testing.T) {
	r := renderComponent(t, "kafka-oidc")
	for _, p := range ownSecretProblems(r, "-kafka-oidc", sharedKafkaCredentials) {
		t.Error(p)
	}
	for _, sts := range r.StatefulSets {
		t.Run(sts.Name, func(t *testing.T) {
			c := sts.Spec.Template.Spec.Containers[0]
			env, problems := containerEnv(t, r, c)
			for _, p := range problems {
				t.Error(p)
			}
			props := kafkaProperties(env)
			checkLoginBasics(t, r, sts, props)
			checkProps(t, props, map[string]string{
				"security.protocol":       "SASL_SSL",
				"sasl.mechanism":          "OAUTHBEARER",
				"sasl.oauthbearer.method": "oidc",
			})
			secret := props["sasl.oauthbearer.client.secret"]
			if secret.Secret != sts.Name+"-kafka-oidc" {
				t.Errorf("sasl.oauthbearer.client.secret from Secret %q; want the service's own %s-kafka-oidc", secret.Secret, sts.Name)
			}
			for _, e := range c.Env {
				if e.Name == "KAFKA_PROPERTY_SASL_OAUTHBEARER_CLIENT_SECRET" &&
					(e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != "client-secret") {
					t.Errorf("the client secret is not the key client-secret of a Secret: %+v", e)
				}
			}
			// The client id (the JWT's sub, so the Kafka user) is the service's name.
			id := props["sasl.oauthbearer.client.id"]
			label := strings.TrimSuffix(strings.TrimPrefix(id.FieldPath, "metadata.labels['"), "']")
			if label == id.FieldPath || sts.Spec.Template.Labels[label] != sts.Name {
				t.Errorf("sasl.oauthbearer.client.id from %q; want the pod label that holds %s", id.FieldPath, sts.Name)
			}
			endpoint := props["sasl.oauthbearer.token.endpoint.url"].Value
			if !strings.HasPrefix(endpoint, "https://") {
				t.Errorf("sasl.oauthbearer.token.endpoint.url %q: want https", endpoint)
			}
		})
	}
}

// secretMount is where container c of pod mounts the Secret `name`, whose
// volume must be readable by the owner and group only, not writable, and
// its mount read-only.
func secretMount(t *testing.T, pod corev1.PodSpec, c corev1.Container, name string) string {
	t.Helper()
	var volume *corev1.Volume
	for i := range pod.Volumes {
		if s := pod.Volumes[i].Secret; s != nil && s.SecretName == name {
			volume = &pod.Volumes[i]
		}
	}
	if volume == nil {
		t.Fatalf("no volume of the Secret %s", name)
	}
	if mode := volume.Secret.DefaultMode; mode == nil || *mode&0o007 != 0 || *mode&0o222 != 0 {
		t.Errorf("Secret volume mode %v: want readable by owner and group only, not writable", mode)
	}
	mountPath := ""
	for _, m := range c.VolumeMounts {
		if m.Name == volume.Name {
			if !m.ReadOnly {
				t.Errorf("mount %s is not read-only", m.MountPath)
			}
			mountPath = m.MountPath
		}
	}
	if mountPath == "" {
		t.Fatalf("volume %s is not mounted", volume.Name)
	}
	return mountPath
}

func checkProps(t *testing.T, props map[string]EnvVar, want map[string]string) {
	t.Helper()
	var keys []string
	for key := range want {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if got, ok := props[key]; !ok || got.Value != want[key] {
			t.Errorf("%s = %q (%s); want %q", key, got.Value, got.Source, want[key])
		}
	}
}

// The credentials checks refuse prod's StatefulSets with one Secret for
// every service (one principal), and with one service mounting another's.
func TestKafkaCredentialsChecksRejectASharedSecret(t *testing.T) {
	prod := render(t, "prod")
	problems := ownSecretProblems(prod, kafkaCredentialsSuffix, sharedKafkaCredentials)
	for _, sts := range prod.StatefulSets {
		problems = append(problems, kafkaCredentialsProblems(sts)...)
	}
	if len(problems) > 0 {
		t.Fatalf("prod as rendered is refused (reported by TestOverlayDifferences): %v", problems)
	}
	rename := func(secret string, names ...string) *Rendered {
		return withSecretVolume(prod, kafkaCredentialsSuffix, func(s *corev1.SecretVolumeSource, _ *corev1.VolumeMount) { s.SecretName = secret }, names...)
	}
	for _, c := range []struct {
		name string
		r    *Rendered
		want []string // each in some problem
	}{
		{"one Secret for all", rename("streams-kafka-credentials"),
			[]string{"want the service's own sessionizer-kafka-credentials", "the Secret streams-kafka-credentials is shared by " + strings.Join(baseServices(t), ", ")}},
		{"sessionizer mounts embed-batcher's", rename("embed-batcher-kafka-credentials", "sessionizer"),
			[]string{"is a file of the Secret embed-batcher-kafka-credentials; want the service's own sessionizer-kafka-credentials",
				"the Secret embed-batcher-kafka-credentials is shared by embed-batcher, sessionizer"}},
	} {
		var problems []string
		for _, sts := range c.r.StatefulSets {
			for _, p := range kafkaCredentialsProblems(sts) {
				problems = append(problems, sts.Name+": "+p)
			}
		}
		problems = append(problems, ownSecretProblems(c.r, kafkaCredentialsSuffix, sharedKafkaCredentials)...)
		joined := strings.Join(problems, "\n")
		for _, want := range c.want {
			if !strings.Contains(joined, want) {
				t.Errorf("%s: no problem containing %q; got:\n%s", c.name, want, joined)
			}
		}
	}
}

// The per-service Secrets the components name cover every service: the
// base, from services.toml, deploys every crate of services/.
func TestLoginComponentSecretsCoverEveryService(t *testing.T) {
	if got, want := strings.Join(baseServices(t), " "), strings.Join(serviceNames(t), " "); got != want {
		t.Errorf("deploy/k8s/base/kustomization.yaml lists %s; services/ has %s", got, want)
	}
}

// kafkaProperty follows the runtime's naming rule.
func TestKafkaPropertyNames(t *testing.T) {
	for name, want := range map[string]string{
		"KAFKA_PROPERTY_SASL_OAUTHBEARER_CLIENT_SECRET": "sasl.oauthbearer.client.secret",
		"KAFKA_PROPERTY_SSL_KEY_LOCATION":               "ssl.key.location",
		"KAFKA_PROPERTY_ENABLE_SSL__CERTIFICATE":        "enable.ssl_certificate",
	} {
		if got, ok := kafkaProperty(name); !ok || got != want {
			t.Errorf("%s: %q; want %q", name, got, want)
		}
	}
	if _, ok := kafkaProperty("KAFKA_BOOTSTRAP_SERVERS"); ok {
		t.Error("KAFKA_BOOTSTRAP_SERVERS read as a client property")
	}
}

// withSecretVolume is a copy of r in which change has been applied to the
// volume of a Secret whose name ends with suffix, and to its mount, in the
// StatefulSets named (all when none is).
func withSecretVolume(r *Rendered, suffix string, change func(*corev1.SecretVolumeSource, *corev1.VolumeMount), names ...string) *Rendered {
	out := *r
	out.StatefulSets = nil
	for _, sts := range r.StatefulSets {
		sts = sts.DeepCopy()
		if len(names) == 0 || contains(names, sts.Name) {
			pod := &sts.Spec.Template.Spec
			for i, v := range pod.Volumes {
				if v.Secret == nil || !strings.HasSuffix(v.Secret.SecretName, suffix) {
					continue
				}
				var mount *corev1.VolumeMount
				for j := range pod.Containers[0].VolumeMounts {
					if pod.Containers[0].VolumeMounts[j].Name == v.Name {
						mount = &pod.Containers[0].VolumeMounts[j]
					}
				}
				change(pod.Volumes[i].Secret, mount)
			}
		}
		out.StatefulSets = append(out.StatefulSets, sts)
	}
	return &out
}

// queryClientLabel marks the pods that may send queries to the services'
// pods (components/queries/networkpolicies.yaml), with the value "true".
const queryClientLabel = "streams.example/query-client"

// queryPolicyProblems checks the NetworkPolicies of components/queries.
// Every StatefulSet's pods are selected by exactly one NetworkPolicy, which
// selects no other service's pods and restricts ingress only (the pods
// reach Kafka, the registry and DNS). What the policies selecting the pods
// allow together (they add up):
//   - the port `query` only from the service's own pods (a selector holding
//     the StatefulSet's selector, perhaps narrowed: forwarded queries) and
//     from the pods of the namespace labelled queryClientLabel=true, and
//     from both; never from every source, an IP block, other namespaces or
//     other pods;
//   - every other container port (`http`: /metrics, which Prometheus
//     scrapes from its own namespace, and the probes) from every source.
func queryPolicyProblems(r *Rendered) []string {
	var problems []string
	add := func(sts *appsv1.StatefulSet, format string, args ...any) {
		problems = append(problems, sts.Name+": "+fmt.Sprintf(format, args...))
	}
	for _, np := range r.NetworkPolicies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			problems = append(problems, fmt.Sprintf("NetworkPolicy %s: bad podSelector: %v", np.Name, err))
			continue
		}
		var selected []string
		for _, sts := range r.StatefulSets {
			if np.Namespace == sts.Namespace && sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
				selected = append(selected, sts.Name)
			}
		}
		if len(selected) > 1 {
			sort.Strings(selected)
			problems = append(problems, fmt.Sprintf("NetworkPolicy %s selects the pods of %s: want one service's", np.Name, strings.Join(selected, ", ")))
		}
	}
	for _, sts := range r.StatefulSets {
		podLabels := labels.Set(sts.Spec.Template.Labels)
		var selecting []*networkingv1.NetworkPolicy
		for _, np := range r.NetworkPolicies {
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err == nil && np.Namespace == sts.Namespace && sel.Matches(podLabels) {
				selecting = append(selecting, np)
			}
		}
		if len(selecting) != 1 {
			var names []string
			for _, np := range selecting {
				names = append(names, np.Name)
			}
			add(sts, "selected by %d NetworkPolicies %v; want exactly one", len(selecting), names)
			if len(selecting) == 0 {
				continue
			}
		}
		// The rules that apply, each with where it comes from.
		type rule struct {
			networkingv1.NetworkPolicyIngressRule
			where string
		}
		var rules []rule
		for _, np := range selecting {
			types := np.Spec.PolicyTypes
			if len(types) == 0 { // the API server's default
				types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
				if len(np.Spec.Egress) > 0 {
					types = append(types, networkingv1.PolicyTypeEgress)
				}
			}
			ingress := false
			for _, pt := range types {
				switch pt {
				case networkingv1.PolicyTypeIngress:
					ingress = true
				case networkingv1.PolicyTypeEgress:
					add(sts, "NetworkPolicy %s restricts egress: the pods must reach Kafka, the schema registry and DNS", np.Name)
				}
			}
			if !ingress {
				add(sts, "NetworkPolicy %s does not restrict ingress", np.Name)
				continue
			}
			for i, in := range np.Spec.Ingress {
				rules = append(rules, rule{in, fmt.Sprintf("NetworkPolicy %s ingress[%d]", np.Name, i)})
			}
		}
		c := sts.Spec.Template.Spec.Containers[0]
		queryPort := false
		for _, port := range c.Ports {
			var matching []rule
			for _, in := range rules {
				if policyPortsAdmit(in.Ports, port) {
					matching = append(matching, in)
				}
			}
			if port.Name != "query" {
				open := false
				for _, in := range matching {
					if len(in.From) == 0 {
						open = true
					}
				}
				if !open {
					add(sts, "port %s (%d) is not open to every source: Prometheus scrapes /metrics from its own namespace", port.Name, port.ContainerPort)
				}
				continue
			}
			queryPort = true
			own, clients := false, false
			for _, in := range matching {
				if len(in.From) == 0 {
					add(sts, "port query (%d) is open to every source (%s)", port.ContainerPort, in.where)
					own, clients = true, true
				}
				for j, peer := range in.From {
					where := fmt.Sprintf("%s from[%d]", in.where, j)
					switch {
					case peer.IPBlock != nil:
						add(sts, "port query (%d) is open to the IP block %s (%s); want only the service's own pods and query clients", port.ContainerPort, peer.IPBlock.CIDR, where)
					case peer.NamespaceSelector != nil:
						add(sts, "port query (%d) is open to pods of %s (%s); want the pods of its own namespace only", port.ContainerPort, selectorString(peer.NamespaceSelector, "every namespace", "the namespaces"), where)
					case peer.PodSelector != nil && ownPodsSelector(r, sts, peer.PodSelector):
						own = true
					case peer.PodSelector != nil && peer.PodSelector.MatchLabels[queryClientLabel] == "true":
						clients = true
					default:
						add(sts, "port query (%d) is open to %s (%s): neither the service's own pods nor query clients (%s=true)", port.ContainerPort, selectorString(peer.PodSelector, "every pod of the namespace", "the pods"), where, queryClientLabel)
					}
				}
			}
			if !own {
				add(sts, "the service's own pods cannot reach the port query: forwarded queries would fail")
			}
			if !clients {
				add(sts, "no pod labelled %s=true can reach the port query", queryClientLabel)
			}
		}
		if !queryPort {
			add(sts, "no container port named query")
		}
	}
	return problems
}

// selectorString names what a label selector selects: all when it is empty,
// else what followed by the selector.
func selectorString(sel *metav1.LabelSelector, all, what string) string {
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return all
	}
	return what + " " + metav1.FormatLabelSelector(sel)
}

// policyPortsAdmit: a NetworkPolicy rule with these ports admits
// connections to the container port p (no ports: every port; a port by
// name or number, or a range up to endPort; the protocol TCP by default).
func policyPortsAdmit(ports []networkingv1.NetworkPolicyPort, p corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	protocol := p.Protocol
	if protocol == "" {
		protocol = corev1.ProtocolTCP
	}
	for _, np := range ports {
		npProtocol := corev1.ProtocolTCP
		if np.Protocol != nil {
			npProtocol = *np.Protocol
		}
		switch {
		case npProtocol != protocol:
		case np.Port == nil:
			return true
		case np.Port.Type == intstr.String:
			if np.Port.StrVal == p.Name {
				return true
			}
		case np.Port.IntVal == p.ContainerPort:
			return true
		case np.EndPort != nil && np.Port.IntVal <= p.ContainerPort && p.ContainerPort <= *np.EndPort:
			return true
		}
	}
	return false
}

// ownPodsSelector: sel selects the pods of sts and nothing its own selector
// does not (it holds every requirement of the StatefulSet's selector), so
// no pod of another service.
func ownPodsSelector(r *Rendered, sts *appsv1.StatefulSet, sel *metav1.LabelSelector) bool {
	for key, value := range sts.Spec.Selector.MatchLabels {
		if sel.MatchLabels[key] != value {
			return false
		}
	}
	for _, want := range sts.Spec.Selector.MatchExpressions {
		found := false
		for _, got := range sel.MatchExpressions {
			if reflect.DeepEqual(got, want) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || !selector.Matches(labels.Set(sts.Spec.Template.Labels)) {
		return false
	}
	for _, other := range r.StatefulSets {
		if other.Name != sts.Name && selector.Matches(labels.Set(other.Spec.Template.Labels)) {
			return false
		}
	}
	return true
}

// Queries: the listener's port is the container's port `query` and the
// Service's, the advertised URL names the pod under its own headless
// Service at that port (INSTANCE_ID defined before it, so that Kubernetes
// expands it), the token is a file of the service's own Secret
// <service>-query-token (no two services share one), mounted read-only and
// readable by no one but the pod's user and group, and the NetworkPolicies
// let only the service's own pods and the query clients reach the port.
func TestQueriesComponent(t *testing.T) {
	r := renderComponent(t, "queries")
	for _, p := range ownSecretProblems(r, queryTokenSuffix, sharedQueryToken) {
		t.Error(p)
	}
	for _, p := range queryPolicyProblems(r) {
		t.Error(p)
	}
	for _, sts := range r.StatefulSets {
		t.Run(sts.Name, func(t *testing.T) {
			pod := sts.Spec.Template.Spec
			c := pod.Containers[0]
			env, problems := containerEnv(t, r, c)
			for _, p := range problems {
				t.Error(p)
			}
			var port int32
			for _, p := range c.Ports {
				if p.Name == "query" {
					port = p.ContainerPort
				}
			}
			if port == 0 {
				t.Fatal("no container port named query")
			}
			if got, want := env["QUERY_ADDR"].Value, fmt.Sprintf("0.0.0.0:%d", port); got != want {
				t.Errorf("QUERY_ADDR %q; want %q (every interface, the port query)", got, want)
			}
			wantURL := fmt.Sprintf("http://$(INSTANCE_ID).%s:%d", sts.Spec.ServiceName, port)
			if got := env["QUERY_ADVERTISED_URL"].Value; got != wantURL {
				t.Errorf("QUERY_ADVERTISED_URL %q; want %q", got, wantURL)
			}
			instance, advertised := -1, -1
			for i, e := range c.Env {
				switch e.Name {
				case "INSTANCE_ID":
					instance = i
				case "QUERY_ADVERTISED_URL":
					advertised = i
				}
			}
			if instance < 0 || instance > advertised {
				t.Errorf("INSTANCE_ID (env #%d) is not defined before QUERY_ADVERTISED_URL (#%d): Kubernetes would not expand it", instance, advertised)
			}
			if id := env["INSTANCE_ID"].FieldPath; id != "metadata.name" {
				t.Errorf("INSTANCE_ID from %q; want the pod's name", id)
			}

			svc := r.service(sts.Spec.ServiceName)
			if svc == nil {
				t.Fatalf("no Service %s", sts.Spec.ServiceName)
			}
			served := false
			for _, p := range svc.Spec.Ports {
				if p.Name == "query" && p.Port == port && p.TargetPort.String() == "query" {
					served = true
				}
			}
			if !served {
				t.Errorf("Service %s has no port query %d to the container's port query", svc.Name, port)
			}

			for _, p := range queryTokenProblems(sts) {
				t.Error(p)
			}
		})
	}
}

// The query token checks refuse one Secret for every service (one
// service's token would read every other's state), a service mounting
// another's, a writable mode and a writable mount.
func TestQueryTokenChecksRejectASharedSecret(t *testing.T) {
	r := renderComponent(t, "queries")
	check := func(r *Rendered) string {
		var problems []string
		for _, sts := range r.StatefulSets {
			for _, p := range queryTokenProblems(sts) {
				problems = append(problems, sts.Name+": "+p)
			}
		}
		return strings.Join(append(problems, ownSecretProblems(r, queryTokenSuffix, sharedQueryToken)...), "\n")
	}
	if got := check(r); got != "" {
		t.Fatalf("components/queries as rendered is refused (reported by TestQueriesComponent):\n%s", got)
	}
	rename := func(secret string, names ...string) *Rendered {
		return withSecretVolume(r, queryTokenSuffix, func(s *corev1.SecretVolumeSource, _ *corev1.VolumeMount) { s.SecretName = secret }, names...)
	}
	mode := int32(0o644)
	for _, c := range []struct {
		name string
		r    *Rendered
		want []string // each in some problem
	}{
		{"one Secret for all", rename("streams-query-token"),
			[]string{"sessionizer: QUERY_TOKEN_FILE \"/etc/streams/query/token\" is a file of the Secret streams-query-token; want the service's own sessionizer-query-token",
				"the Secret streams-query-token is shared by " + strings.Join(baseServices(t), ", ") + ": " + sharedQueryToken}},
		{"sessionizer mounts embed-batcher's", rename("embed-batcher-query-token", "sessionizer"),
			[]string{"is a file of the Secret embed-batcher-query-token; want the service's own sessionizer-query-token",
				"the Secret embed-batcher-query-token is shared by embed-batcher, sessionizer"}},
		{"mode 0644", withSecretVolume(r, queryTokenSuffix, func(s *corev1.SecretVolumeSource, _ *corev1.VolumeMount) { s.DefaultMode = &mode }, "sessionizer"),
			[]string{"sessionizer: Secret volume query-token mode 0644: want readable by owner and group only, not writable"}},
		{"no mode (the kubelet's 0644)", withSecretVolume(r, queryTokenSuffix, func(s *corev1.SecretVolumeSource, _ *corev1.VolumeMount) { s.DefaultMode = nil }, "sessionizer"),
			[]string{"sessionizer: Secret volume query-token mode unset"}},
		{"an item of mode 0644", withSecretVolume(r, queryTokenSuffix, func(s *corev1.SecretVolumeSource, _ *corev1.VolumeMount) {
			s.Items = []corev1.KeyToPath{{Key: "token", Path: "token", Mode: &mode}}
		}, "sessionizer"),
			[]string{"sessionizer: Secret volume query-token item token mode 0644"}},
		{"a writable mount", withSecretVolume(r, queryTokenSuffix, func(_ *corev1.SecretVolumeSource, m *corev1.VolumeMount) { m.ReadOnly = false }, "sessionizer"),
			[]string{"sessionizer: mount /etc/streams/query is not read-only"}},
	} {
		got := check(c.r)
		for _, want := range c.want {
			if !strings.Contains(got, want) {
				t.Errorf("%s: no problem containing %q; got:\n%s", c.name, want, got)
			}
		}
	}
}

// The NetworkPolicy checks refuse policies that open the port query to
// everyone (or to anything but the service's own pods and the clients),
// that close the port http, and a service with no policy or two.
func TestQueryPolicyChecksRejectOpenPolicies(t *testing.T) {
	r := renderComponent(t, "queries")
	if problems := queryPolicyProblems(r); len(problems) > 0 {
		t.Fatalf("components/queries as rendered is refused (reported by TestQueriesComponent):\n%s", strings.Join(problems, "\n"))
	}
	// change runs on a copy of sessionizer's policy; its result (nil to drop
	// it, or several) replaces it in a copy of the render.
	change := func(f func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy) *Rendered {
		out := *r
		out.NetworkPolicies = nil
		for _, np := range r.NetworkPolicies {
			np = np.DeepCopy()
			if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] == "sessionizer" {
				out.NetworkPolicies = append(out.NetworkPolicies, f(np)...)
			} else {
				out.NetworkPolicies = append(out.NetworkPolicies, np)
			}
		}
		return &out
	}
	// ruleFor is the first ingress rule naming the port.
	ruleFor := func(np *networkingv1.NetworkPolicy, port string) *networkingv1.NetworkPolicyIngressRule {
		for i, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if p.Port != nil && p.Port.String() == port {
					return &np.Spec.Ingress[i]
				}
			}
		}
		t.Fatalf("NetworkPolicy %s has no rule for the port %s", np.Name, port)
		return nil
	}
	one := func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{np}
	}
	addPeer := func(peer networkingv1.NetworkPolicyPeer) *Rendered {
		return change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			in := ruleFor(np, "query")
			in.From = append(in.From, peer)
			return one(np)
		})
	}
	client := &metav1.LabelSelector{MatchLabels: map[string]string{queryClientLabel: "true"}}
	for _, c := range []struct {
		name string
		r    *Rendered
		want []string // each in some problem
	}{
		{"query from every source", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			ruleFor(np, "query").From = nil
			return one(np)
		}), []string{"sessionizer: port query (8090) is open to every source (NetworkPolicy sessionizer-query ingress[0])"}},
		{"every port from every source", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
			return one(np)
		}), []string{"sessionizer: port query (8090) is open to every source (NetworkPolicy sessionizer-query ingress[0])"}},
		{"query by number, from every source", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			port := intstr.FromInt32(8000)
			end := int32(8100)
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: &port, EndPort: &end}}})
			return one(np)
		}), []string{"sessionizer: port query (8090) is open to every source (NetworkPolicy sessionizer-query ingress[2])"}},
		{"query from every pod of the namespace", addPeer(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}}),
			[]string{"sessionizer: port query (8090) is open to every pod of the namespace (NetworkPolicy sessionizer-query ingress[0] from[2])"}},
		{"query from every streams service", addPeer(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/part-of": "streams-services"}}}),
			[]string{"is open to the pods app.kubernetes.io/part-of=streams-services"}},
		{"query from another service's pods", addPeer(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "window-aggregator"}}}),
			[]string{"is open to the pods app.kubernetes.io/name=window-aggregator"}},
		{"clients of every namespace", addPeer(networkingv1.NetworkPolicyPeer{PodSelector: client, NamespaceSelector: &metav1.LabelSelector{}}),
			[]string{"sessionizer: port query (8090) is open to pods of every namespace"}},
		{"query from an IP block", addPeer(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}),
			[]string{"sessionizer: port query (8090) is open to the IP block 0.0.0.0/0"}},
		{"no forwarding", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			ruleFor(np, "query").From = []networkingv1.NetworkPolicyPeer{{PodSelector: client}}
			return one(np)
		}), []string{"sessionizer: the service's own pods cannot reach the port query"}},
		{"no clients", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			in := ruleFor(np, "query")
			in.From = in.From[:1]
			return one(np)
		}), []string{"sessionizer: no pod labelled " + queryClientLabel + "=true can reach the port query"}},
		{"http from clients only", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			ruleFor(np, "http").From = []networkingv1.NetworkPolicyPeer{{PodSelector: client}}
			return one(np)
		}), []string{"sessionizer: port http (9090) is not open to every source"}},
		{"no rule for http", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{*ruleFor(np, "query")}
			return one(np)
		}), []string{"sessionizer: port http (9090) is not open to every source"}},
		{"egress restricted", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
			return one(np)
		}), []string{"sessionizer: NetworkPolicy sessionizer-query restricts egress"}},
		{"no policy", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return nil }),
			[]string{"sessionizer: selected by 0 NetworkPolicies [];"}},
		{"a second policy, open, over every service", change(func(np *networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			open := np.DeepCopy()
			open.Name = "streams-open"
			open.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/part-of": "streams-services"}}
			open.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
			return []*networkingv1.NetworkPolicy{np, open}
		}), []string{"sessionizer: selected by 2 NetworkPolicies [sessionizer-query streams-open]; want exactly one",
			"NetworkPolicy streams-open selects the pods of " + strings.Join(baseServices(t), ", ") + ": want one service's",
			"window-aggregator: port query (8090) is open to every source (NetworkPolicy streams-open ingress[0])"}},
	} {
		got := strings.Join(queryPolicyProblems(c.r), "\n")
		for _, want := range c.want {
			if !strings.Contains(got, want) {
				t.Errorf("%s: no problem containing %q; got:\n%s", c.name, want, got)
			}
		}
	}
}
