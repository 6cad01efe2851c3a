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
// (components/kafka-sasl is prod's): mutual TLS and SASL/OAUTHBEARER with
// OIDC. Each is rendered here onto the base, as an overlay that uses it would
// be, and goes through the overlays' checks and its own.
var loginComponents = []string{"kafka-mtls", "kafka-oidc"}

// renderedComponents are the components that no overlay uses, rendered
// here onto the base: the logins above and interactive queries.
var renderedComponents = append(append([]string{}, loginComponents...), "queries")

// loginServices are the services whose per-service Secrets the login
// components name; TestLoginComponentSecretsCoverEveryService keeps the
// list in step with services/.
var loginServices = []string{"embed-batcher", "order-shipment-joiner", "sensor-fusion", "sessionizer", "window-aggregator"}

func init() {
	// Created outside git, one per service (README.md "Deploying on Kubernetes").
	for _, service := range loginServices {
		externalSecrets[service+"-kafka-oidc"] = true
	}
	externalSecrets["streams-query-token"] = true
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
