package validate

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// overlays are the kustomizations a user applies.
var overlays = []string{"dev", "prod"}

// Rendered is one overlay, built and decoded.
type Rendered struct {
	Overlay         string
	StatefulSets    []*appsv1.StatefulSet
	Services        []*corev1.Service
	ConfigMaps      []*corev1.ConfigMap
	Secrets         []*corev1.Secret
	PDBs            []*policyv1.PodDisruptionBudget
	NetworkPolicies []*networkingv1.NetworkPolicy
	EndpointSlices  []*discoveryv1.EndpointSlice
	Namespaces      []*corev1.Namespace
	Monitors        []*monitoringv1.ServiceMonitor
	Rules           []*monitoringv1.PrometheusRule
	Objects         int
}

var (
	renderMu    sync.Mutex
	renderCache = map[string]*Rendered{}
	renderErr   = map[string]error{}
)

// scheme knows every kind the overlays may contain; anything else fails.
func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme,
		discoveryv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return scheme
}

// render builds deploy/k8s/overlays/<overlay> with kustomize's library (the
// same code as `kubectl kustomize`) and strict-decodes every object: an
// unknown or duplicated field, a wrong type or an unknown kind is an error.
func render(t testing.TB, overlay string) *Rendered {
	t.Helper()
	renderMu.Lock()
	defer renderMu.Unlock()
	if r, ok := renderCache[overlay]; ok {
		return r
	}
	if err, ok := renderErr[overlay]; ok {
		t.Fatal(err)
	}
	r, err := doRender(repoRoot(t), overlay)
	if err != nil {
		renderErr[overlay] = err
		t.Fatal(err)
	}
	renderCache[overlay] = r
	return r
}

func doRender(root, overlay string) (*Rendered, error) {
	return renderDir(filepath.Join(root, "deploy", "k8s", "overlays", overlay), overlay)
}

// renderDir builds the kustomization in dir, named overlay in messages.
func renderDir(dir, overlay string) (*Rendered, error) {
	kustomizer := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := kustomizer.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build overlays/%s: %w", overlay, err)
	}
	scheme := newScheme()
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: false, Pretty: false, Strict: true})
	out := &Rendered{Overlay: overlay}
	var errs []string
	for _, res := range resources.Resources() {
		data, err := res.MarshalJSON()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("%s %s/%s", overlay, res.GetKind(), res.GetName())
		gvk := schema.FromAPIVersionAndKind(res.GetApiVersion(), res.GetKind())
		if !scheme.Recognizes(gvk) {
			errs = append(errs, fmt.Sprintf("%s: kind %s is not one the validator knows (add its Go type)", id, gvk))
			continue
		}
		obj, _, err := strict.Decode(data, &gvk, nil)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		out.Objects++
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			out.StatefulSets = append(out.StatefulSets, o)
		case *corev1.Service:
			out.Services = append(out.Services, o)
		case *corev1.ConfigMap:
			out.ConfigMaps = append(out.ConfigMaps, o)
		case *corev1.Secret:
			out.Secrets = append(out.Secrets, o)
		case *policyv1.PodDisruptionBudget:
			out.PDBs = append(out.PDBs, o)
		case *networkingv1.NetworkPolicy:
			out.NetworkPolicies = append(out.NetworkPolicies, o)
		case *discoveryv1.EndpointSlice:
			out.EndpointSlices = append(out.EndpointSlices, o)
		case *corev1.Namespace:
			out.Namespaces = append(out.Namespaces, o)
		case *monitoringv1.ServiceMonitor:
			out.Monitors = append(out.Monitors, o)
		case *monitoringv1.PrometheusRule:
			out.Rules = append(out.Rules, o)
		default:
			errs = append(errs, fmt.Sprintf("%s: decoded to unexpected %T", id, obj))
		}
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, fmt.Errorf("overlays/%s does not decode strictly:\n  %s", overlay, strings.Join(errs, "\n  "))
	}
	return out, nil
}

func TestOverlaysRenderAndDecodeStrictly(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			if len(r.StatefulSets) == 0 {
				t.Fatal("no StatefulSet rendered")
			}
			t.Logf("%d objects: %d StatefulSets, %d Services, %d PDBs, %d NetworkPolicies, %d ConfigMaps, %d ServiceMonitors, %d PrometheusRules",
				r.Objects, len(r.StatefulSets), len(r.Services), len(r.PDBs), len(r.NetworkPolicies), len(r.ConfigMaps), len(r.Monitors), len(r.Rules))
		})
	}
}

// The overlays that `make k8s-test` applies to the cluster of
// deploy/k8s/cluster (not part of this check's CI run) render and decode
// too, and differ from the shipped ones as that directory says: the image
// of the node's containerd, never pulled.
func TestClusterOverlaysRenderAndDecodeStrictly(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r, err := renderDir(filepath.Join(repoRoot(t), "deploy", "k8s", "cluster", "overlays", overlay), "cluster/"+overlay)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(baseServices(t)); len(r.StatefulSets) != want {
				t.Fatalf("%d StatefulSets rendered, not %d (one per service)", len(r.StatefulSets), want)
			}
			for _, set := range r.StatefulSets {
				container := set.Spec.Template.Spec.Containers[0]
				if container.Image != "localhost/streams-services:latest" || container.ImagePullPolicy != corev1.PullNever {
					t.Errorf("%s: image %s, pull policy %s; want the node's localhost/streams-services:latest, never pulled",
						set.Name, container.Image, container.ImagePullPolicy)
				}
			}
		})
	}
}

// The strict decoder must reject what it is meant to reject, or the test above
// proves nothing.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	scheme := newScheme()
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Strict: true})
	bad := map[string]string{
		"unknown field":   `{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"x"},"spec":{"template":{"spec":{"containers":[{"name":"x","readinesProbe":{}}]}}}}`,
		"duplicate field": `{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"clusterIP":"None","clusterIP":"None"}}`,
		"bad quantity":    `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"},"spec":{"containers":[{"name":"x","resources":{"limits":{"memory":"1 GB"}}}]}}`,
	}
	for name, doc := range bad {
		if _, _, err := strict.Decode([]byte(doc), nil, nil); err == nil {
			t.Errorf("%s: accepted %s", name, doc)
		}
	}
}
