package validate

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// EnvVar is one variable of a container as Kubernetes would set it.
type EnvVar struct {
	Name      string
	Value     string // literal or from a ConfigMap; "" for references
	FieldPath string // downward API
	Secret    string // Secret name, for secretKeyRef
	Source    string // where it is defined, for messages
}

// containerEnv resolves env and envFrom (ConfigMaps from the render).
func containerEnv(t testing.TB, r *Rendered, c corev1.Container) (map[string]EnvVar, []string) {
	t.Helper()
	env := map[string]EnvVar{}
	var problems []string
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm := r.configMap(from.ConfigMapRef.Name)
			if cm == nil {
				problems = append(problems, fmt.Sprintf("envFrom ConfigMap %q is not in the render", from.ConfigMapRef.Name))
				continue
			}
			for key, value := range cm.Data {
				env[from.Prefix+key] = EnvVar{Name: from.Prefix + key, Value: value, Source: "ConfigMap " + cm.Name}
			}
		case from.SecretRef != nil:
			problems = append(problems, "envFrom a Secret: its keys cannot be checked; use secretKeyRef")
		}
	}
	for _, e := range c.Env {
		v := EnvVar{Name: e.Name, Value: e.Value, Source: "env"}
		if e.ValueFrom != nil {
			switch {
			case e.ValueFrom.FieldRef != nil:
				v.FieldPath = e.ValueFrom.FieldRef.FieldPath
			case e.ValueFrom.SecretKeyRef != nil:
				ref := e.ValueFrom.SecretKeyRef
				v.Secret = ref.Name
				optional := ref.Optional != nil && *ref.Optional
				if r.secret(ref.Name) == nil && !externalSecret(t, ref.Name) && !optional {
					problems = append(problems, fmt.Sprintf("env %s: Secret %q is neither rendered, nor optional, nor a documented external Secret", e.Name, ref.Name))
				}
			case e.ValueFrom.ConfigMapKeyRef != nil:
				ref := e.ValueFrom.ConfigMapKeyRef
				cm := r.configMap(ref.Name)
				if cm == nil {
					problems = append(problems, fmt.Sprintf("env %s: ConfigMap %q is not in the render", e.Name, ref.Name))
				} else if value, ok := cm.Data[ref.Key]; !ok {
					problems = append(problems, fmt.Sprintf("env %s: ConfigMap %q has no key %q", e.Name, ref.Name, ref.Key))
				} else {
					v.Value = value
				}
			default:
				problems = append(problems, fmt.Sprintf("env %s: unsupported valueFrom", e.Name))
			}
		}
		env[e.Name] = v
	}
	return env, problems
}

func (r *Rendered) configMap(name string) *corev1.ConfigMap {
	for _, cm := range r.ConfigMaps {
		if cm.Name == name {
			return cm
		}
	}
	return nil
}

func (r *Rendered) secret(name string) *corev1.Secret {
	for _, s := range r.Secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// parseDuration reads the services' durations (30s, 5m, 7d, 250ms).
func parseDuration(s string) (time.Duration, error) {
	if strings.HasSuffix(s, "d") && !strings.HasSuffix(s, "ms") {
		days, err := strconv.Atoi(strings.TrimSuffix(s, "d"))
		return time.Duration(days) * 24 * time.Hour, err
	}
	return time.ParseDuration(s)
}

// instanceIDRe is the runtime's rule for --instance-id (docs/fault-tolerance.md).
var instanceIDRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,200}$`)

func TestStatefulSetInvariants(t *testing.T) {
	docker := parseDockerfile(t)
	for _, overlay := range overlays {
		r := render(t, overlay)
		names := map[string]bool{}
		for _, sts := range r.StatefulSets {
			names[sts.Name] = true
		}
		for _, service := range serviceNames(t) {
			if !names[service] {
				t.Errorf("%s: no StatefulSet for service %s", overlay, service)
			}
		}
		for _, sts := range r.StatefulSets {
			sts := sts
			t.Run(overlay+"/"+sts.Name, func(t *testing.T) {
				checkStatefulSet(t, r, sts, docker)
			})
		}
	}
}

func checkStatefulSet(t *testing.T, r *Rendered, sts *appsv1.StatefulSet, docker Dockerfile) {
	spec := sts.Spec
	pod := spec.Template.Spec
	podLabels := labels.Set(spec.Template.Labels)

	// Selector, replicas, pod names usable as INSTANCE_ID.
	if spec.Selector == nil {
		t.Fatal("no selector")
	}
	selector, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil || selector.Empty() || !selector.Matches(podLabels) {
		t.Errorf("selector %v does not select the pod template labels %v (%v)", spec.Selector, podLabels, err)
	}
	if spec.Replicas == nil || *spec.Replicas < 1 {
		t.Errorf("replicas %v: want at least 1", spec.Replicas)
	} else if !instanceIDRe.MatchString(fmt.Sprintf("%s-%d", sts.Name, *spec.Replicas-1)) {
		t.Errorf("pod names %s-N are not valid --instance-id values", sts.Name)
	}

	// Headless Service.
	svc := r.service(spec.ServiceName)
	switch {
	case spec.ServiceName == "":
		t.Error("serviceName is empty")
	case svc == nil:
		t.Errorf("serviceName %q: no such Service", spec.ServiceName)
	default:
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service %s is not headless (clusterIP %q)", svc.Name, svc.Spec.ClusterIP)
		}
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s selector %v does not select the pods", svc.Name, svc.Spec.Selector)
		}
		for _, other := range r.StatefulSets {
			if other.Name != sts.Name && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(other.Spec.Template.Labels)) {
				t.Errorf("Service %s also selects the pods of %s", svc.Name, other.Name)
			}
		}
	}

	// PodDisruptionBudget: exactly one selects these pods, none selects others too.
	pdbs := 0
	for _, pdb := range r.PDBs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("PDB %s: bad or empty selector (%v)", pdb.Name, err)
			continue
		}
		if sel.Matches(podLabels) {
			pdbs++
			if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
				t.Errorf("PDB %s sets neither maxUnavailable nor minAvailable", pdb.Name)
			}
			for _, other := range r.StatefulSets {
				if other.Name != sts.Name && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
					t.Errorf("PDB %s also selects the pods of %s", pdb.Name, other.Name)
				}
			}
		}
	}
	if pdbs != 1 {
		t.Errorf("%d PodDisruptionBudgets select the pods; want 1", pdbs)
	}

	// The container.
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers; want the service's only", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Command) == 0 || !docker.Binaries[c.Command[0]] {
		t.Errorf("command %v: the first element must be a binary the image has (%v)", c.Command, keys(docker.Binaries))
	}
	if c.Image == "" || strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image[strings.LastIndex(c.Image, "/")+1:], ":") {
		t.Errorf("image %q: want an explicit tag other than latest", c.Image)
	}
	env, problems := containerEnv(t, r, c)
	for _, p := range problems {
		t.Error(p)
	}
	// Secret volumes: like secretKeyRef, a rendered, optional or documented
	// external Secret (a misspelt name leaves the pod ContainerCreating).
	for _, v := range pod.Volumes {
		if s := v.Secret; s != nil && r.secret(s.SecretName) == nil && !externalSecret(t, s.SecretName) && (s.Optional == nil || !*s.Optional) {
			t.Errorf("volume %s: Secret %q is neither rendered, nor optional, nor a documented external Secret", v.Name, s.SecretName)
		}
	}

	// $(VAR) in command and args: Kubernetes leaves an undefined one as is,
	// which would reach librdkafka literally.
	for _, arg := range append(append([]string{}, c.Command...), c.Args...) {
		for _, m := range varRef.FindAllStringSubmatch(arg, -1) {
			if _, ok := env[m[1]]; !ok {
				t.Errorf("arg %q uses $(%s), which the container's environment does not define", arg, m[1])
			}
		}
	}

	// INSTANCE_ID from the pod name (downward API).
	if id, ok := env["INSTANCE_ID"]; !ok || id.FieldPath != "metadata.name" {
		t.Errorf("INSTANCE_ID must come from fieldRef metadata.name (got %+v)", id)
	}

	// HTTP listener, port and probes.
	httpPort := int32(9090)
	if addr, ok := env["HTTP_ADDR"]; ok {
		_, port, err := net.SplitHostPort(addr.Value)
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			t.Errorf("HTTP_ADDR %q is not host:port", addr.Value)
		} else {
			httpPort = int32(p)
		}
		if host, _, _ := net.SplitHostPort(addr.Value); host == "127.0.0.1" || host == "localhost" {
			t.Errorf("HTTP_ADDR %q listens on loopback: the kubelet cannot probe it", addr.Value)
		}
	} else {
		t.Error("HTTP_ADDR is not set: with the implicit default a taken port disables /healthz silently")
	}
	if httpPort != docker.ExposedPort {
		t.Errorf("HTTP port %d differs from the Dockerfile's EXPOSE %d", httpPort, docker.ExposedPort)
	}
	resolvePort := func(port intstr.IntOrString) int32 {
		if port.Type == intstr.Int {
			return port.IntVal
		}
		for _, p := range c.Ports {
			if p.Name == port.StrVal {
				return p.ContainerPort
			}
		}
		t.Errorf("probe port %q is not a named container port", port.StrVal)
		return -1
	}
	checkProbe := func(kind string, probe *corev1.Probe, path string) {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("%s probe: want httpGet %s", kind, path)
			return
		}
		if probe.HTTPGet.Path != path {
			t.Errorf("%s probe path %q; want %s", kind, probe.HTTPGet.Path, path)
		}
		if port := resolvePort(probe.HTTPGet.Port); port != httpPort {
			t.Errorf("%s probe port %d; the service listens on %d", kind, port, httpPort)
		}
	}
	checkProbe("liveness", c.LivenessProbe, "/healthz")
	checkProbe("readiness", c.ReadinessProbe, "/readyz")
	checkProbe("startup", c.StartupProbe, "/healthz")
	if svc != nil {
		found := false
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			if resolvePort(target) == httpPort {
				found = true
			}
		}
		if !found {
			t.Errorf("Service %s exposes no port to %d", svc.Name, httpPort)
		}
	}
	// The listener starts only after the startup checks, which wait up to
	// TOPIC_WAIT for the input topics (plus ~10 s to reach the broker).
	if c.StartupProbe != nil {
		budget := time.Duration(c.StartupProbe.InitialDelaySeconds+c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold) * time.Second
		wait := 60 * time.Second // the binary's default
		if v, ok := env["TOPIC_WAIT"]; ok {
			if d, err := parseDuration(v.Value); err == nil {
				wait = d
			} else {
				t.Errorf("TOPIC_WAIT %q: %v", v.Value, err)
			}
		}
		if budget < wait+30*time.Second {
			t.Errorf("startup probe allows %s; the service may spend TOPIC_WAIT (%s) + 30 s before it listens", budget, wait)
		}
	}

	// State directory on the PersistentVolumeClaim.
	stateDir, ok := env["STATE_DIR"]
	if !ok {
		t.Error("STATE_DIR is not set (the default ./state is in the read-only image)")
	} else {
		if stateDir.Value != docker.StateDir {
			t.Errorf("STATE_DIR %q differs from the image's %q", stateDir.Value, docker.StateDir)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == stateDir.Value {
				for _, claim := range spec.VolumeClaimTemplates {
					if claim.Name == m.Name {
						mounted = true
						storage := claim.Spec.Resources.Requests[corev1.ResourceStorage]
						if storage.IsZero() {
							t.Errorf("volumeClaimTemplate %s requests no storage", claim.Name)
						}
						if len(claim.Spec.AccessModes) != 1 || claim.Spec.AccessModes[0] != corev1.ReadWriteOnce {
							t.Errorf("volumeClaimTemplate %s: want accessModes [ReadWriteOnce]", claim.Name)
						}
					}
				}
			}
		}
		if !mounted {
			t.Errorf("STATE_DIR %s is not the mount of a volumeClaimTemplate", stateDir.Value)
		}
	}

	// Resources: requests and limits, requests <= limits, memory for RocksDB.
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := c.Resources.Requests[name]
		lim, hasLim := c.Resources.Limits[name]
		if !hasReq || !hasLim {
			t.Errorf("resources: want a request and a limit for %s", name)
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("resources: %s request %s exceeds its limit %s", name, req.String(), lim.String())
		}
	}
	stateMiB := int64(256)
	if v, ok := env["STATE_MEMORY_LIMIT_MB"]; ok {
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			t.Errorf("STATE_MEMORY_LIMIT_MB %q: %v", v.Value, err)
		}
		stateMiB = n
	}
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		need := resource.NewQuantity((stateMiB+256)<<20, resource.BinarySI)
		if lim.Cmp(*need) < 0 {
			t.Errorf("memory limit %s: RocksDB alone may use STATE_MEMORY_LIMIT_MB=%d MiB; want at least %s", lim.String(), stateMiB, need.String())
		}
	}

	// Graceful stop: the final commit may wait 30 s for the broker, after an
	// embedding request of up to EMBEDDER_TIMEOUT.
	grace := int64(30)
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	need := 60 * time.Second
	if v, ok := env["EMBEDDER_TIMEOUT"]; ok {
		if d, err := parseDuration(v.Value); err == nil && d+30*time.Second > need {
			need = d + 30*time.Second
		}
	}
	if time.Duration(grace)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %d; want at least %s", grace, need)
	}

	// Runs as the image's user; the volume is writable by it.
	sc := pod.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pod securityContext: want runAsNonRoot")
	}
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != docker.UID {
		t.Errorf("pod securityContext runAsUser: want the image's USER %d", docker.UID)
	}
	if sc == nil || sc.FSGroup == nil || *sc.FSGroup != docker.GID {
		t.Errorf("pod securityContext fsGroup: want the image's group %d (writable state volume)", docker.GID)
	}
	if c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem {
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/tmp" {
				return
			}
		}
		t.Error("readOnlyRootFilesystem without a writable /tmp")
	}
}

func (r *Rendered) service(name string) *corev1.Service {
	for _, s := range r.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestOverlayDifferences(t *testing.T) {
	dev, prod := render(t, "dev"), render(t, "prod")
	if len(dev.Namespaces) != 1 || len(prod.Namespaces) != 1 || dev.Namespaces[0].Name == prod.Namespaces[0].Name {
		t.Error("dev and prod: want one Namespace each, different")
	}
	for _, sts := range prod.StatefulSets {
		if *sts.Spec.Replicas < 2 {
			t.Errorf("prod %s: %d replicas; a PodDisruptionBudget of maxUnavailable 1 then allows a full outage", sts.Name, *sts.Spec.Replicas)
		}
		// Credentials come from a mounted Secret, never from args (visible to every user of the node).
		container := sts.Spec.Template.Spec.Containers[0]
		if args := strings.Join(container.Args, " "); strings.Contains(args, "sasl.") {
			t.Errorf("prod %s: SASL settings in args: %s", sts.Name, args)
		}
		for _, p := range kafkaCredentialsProblems(sts) {
			t.Errorf("prod %s: %s", sts.Name, p)
		}
	}
	// One Kafka principal per service: no pod mounts another service's
	// credentials, no two share one Secret.
	for _, p := range ownSecretProblems(prod, kafkaCredentialsSuffix, sharedKafkaCredentials) {
		t.Errorf("prod: %s", p)
	}
	if len(prod.Monitors) == 0 {
		t.Error("prod: no ServiceMonitor")
	}
	if len(prod.Rules) == 0 {
		t.Error("prod: no PrometheusRule")
	}
}
