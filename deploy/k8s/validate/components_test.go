package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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

// loginServices are the services whose per-service Secrets the login
// components name; TestLoginComponentSecretsCoverEveryService keeps the
// list in step with services/.
var loginServices = []string{"embed-batcher", "order-shipment-joiner", "sensor-fusion", "sessionizer", "window-aggregator"}

// kafkaCredentialsSuffix: components/kafka-sasl mounts the Secret
// <service>-kafka-credentials into each service's pods.
const kafkaCredentialsSuffix = "-kafka-credentials"

func init() {
	// Created outside git, one per service and login (README.md "Deploying
	// on Kubernetes").
	for _, service := range loginServices {
		for _, suffix := range []string{kafkaCredentialsSuffix, "-kafka-tls", "-kafka-oidc"} {
			externalSecrets[service+suffix] = true
		}
	}
	externalSecrets["streams-query-token"] = true
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

// ownSecretProblems: one Kafka principal per service. Every Secret whose
// name ends with suffix that a StatefulSet's pods name is the service's own,
// <service><suffix>, and no such Secret is named by two StatefulSets.
func ownSecretProblems(r *Rendered, suffix string) []string {
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
			shared = append(shared, fmt.Sprintf("the Secret %s is shared by %s: one Kafka principal for several services", name, strings.Join(stss, ", ")))
		}
	}
	sort.Strings(shared)
	return append(problems, shared...)
}

// kafkaCredentialsProblems checks one StatefulSet of components/kafka-sasl:
// KAFKA_CONFIG_FILE is the key client.properties of the service's own
// Secret <service>-kafka-credentials, mounted read-only, with a mode
// readable by owner and group only.
func kafkaCredentialsProblems(sts *appsv1.StatefulSet) []string {
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	own := sts.Name + kafkaCredentialsSuffix
	configFile := ""
	for _, e := range c.Env {
		if e.Name == "KAFKA_CONFIG_FILE" {
			configFile = e.Value
		}
	}
	if configFile == "" {
		return []string{"KAFKA_CONFIG_FILE is not set (as a literal value)"}
	}
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name != v.Name || !strings.HasPrefix(configFile, m.MountPath+"/") {
				continue
			}
			var problems []string
			if v.Secret.SecretName != own {
				problems = append(problems, fmt.Sprintf("KAFKA_CONFIG_FILE %q is a file of the Secret %s; want the service's own %s", configFile, v.Secret.SecretName, own))
			}
			if configFile != m.MountPath+"/client.properties" {
				problems = append(problems, fmt.Sprintf("KAFKA_CONFIG_FILE %q is not the key client.properties of the Secret mounted at %s", configFile, m.MountPath))
			}
			if !m.ReadOnly {
				problems = append(problems, fmt.Sprintf("mount %s is not read-only", m.MountPath))
			}
			if mode := v.Secret.DefaultMode; mode == nil || *mode&0o007 != 0 || *mode&0o222 != 0 {
				problems = append(problems, fmt.Sprintf("Secret volume %s mode %v: want readable by owner and group only, not writable", v.Name, mode))
			}
			return problems
		}
	}
	return []string{fmt.Sprintf("KAFKA_CONFIG_FILE (%q) is not a file of a mounted Secret; want the key client.properties of %s", configFile, own)}
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
			for _, obj := range r.validatable() {
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
	for _, p := range ownSecretProblems(r, "-kafka-tls") {
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
	for _, p := range ownSecretProblems(r, "-kafka-oidc") {
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
// all five services (one principal), and with one service mounting another's.
func TestKafkaCredentialsChecksRejectASharedSecret(t *testing.T) {
	prod := render(t, "prod")
	problems := ownSecretProblems(prod, kafkaCredentialsSuffix)
	for _, sts := range prod.StatefulSets {
		problems = append(problems, kafkaCredentialsProblems(sts)...)
	}
	if len(problems) > 0 {
		t.Fatalf("prod as rendered is refused (reported by TestOverlayDifferences): %v", problems)
	}
	// rename gives the credentials volume of the StatefulSets named (all
	// when none is) the Secret `secret`, in a copy of prod.
	rename := func(secret string, names ...string) *Rendered {
		out := *prod
		out.StatefulSets = nil
		for _, sts := range prod.StatefulSets {
			sts = sts.DeepCopy()
			if len(names) == 0 || contains(names, sts.Name) {
				for i, v := range sts.Spec.Template.Spec.Volumes {
					if v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, kafkaCredentialsSuffix) {
						sts.Spec.Template.Spec.Volumes[i].Secret.SecretName = secret
					}
				}
			}
			out.StatefulSets = append(out.StatefulSets, sts)
		}
		return &out
	}
	for _, c := range []struct {
		name string
		r    *Rendered
		want []string // each in some problem
	}{
		{"one Secret for all five", rename("streams-kafka-credentials"),
			[]string{"want the service's own sessionizer-kafka-credentials", "the Secret streams-kafka-credentials is shared by embed-batcher, order-shipment-joiner, sensor-fusion, sessionizer, window-aggregator"}},
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
		problems = append(problems, ownSecretProblems(c.r, kafkaCredentialsSuffix)...)
		joined := strings.Join(problems, "\n")
		for _, want := range c.want {
			if !strings.Contains(joined, want) {
				t.Errorf("%s: no problem containing %q; got:\n%s", c.name, want, joined)
			}
		}
	}
}

// The per-service Secrets the components name cover every service.
func TestLoginComponentSecretsCoverEveryService(t *testing.T) {
	if got, want := strings.Join(loginServices, " "), strings.Join(serviceNames(t), " "); got != want {
		t.Errorf("loginServices %s; services/ has %s", got, want)
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

// Queries: the listener's port is the container's port `query` and the
// Service's, the advertised URL names the pod under its own headless
// Service at that port (INSTANCE_ID defined before it, so that Kubernetes
// expands it), and the token is a file of the Secret streams-query-token,
// mounted read-only and readable by no one but the pod's user and group.
func TestQueriesComponent(t *testing.T) {
	r := renderComponent(t, "queries")
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

			mountPath := secretMount(t, pod, c, "streams-query-token")
			if tokenFile := env["QUERY_TOKEN_FILE"].Value; tokenFile != mountPath+"/token" {
				t.Errorf("QUERY_TOKEN_FILE %q is not the key token of the Secret streams-query-token (mounted at %s)", tokenFile, mountPath)
			}
		})
	}
}
