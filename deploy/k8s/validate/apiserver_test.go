package validate

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/networking"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
	networkingvalidation "k8s.io/kubernetes/pkg/apis/networking/validation"
	"k8s.io/kubernetes/pkg/apis/policy"
	_ "k8s.io/kubernetes/pkg/apis/policy/install"
	policyvalidation "k8s.io/kubernetes/pkg/apis/policy/validation"
)

// apiServerErrors runs what the API server runs on a create: the versioned
// object is defaulted and converted to the internal type with the API
// server's own scheme (k8s.io/kubernetes, pinned in go.mod), then validated
// by the function its registry strategy calls (NetworkPolicies: those of
// components/queries). ServiceMonitors and
// PrometheusRules are custom resources, which a server checks against the
// CRD's schema; the strict decoding covers them (and promtool the rules,
// alerts_test.go).
// expectRefused fails the test unless the API server's validation refuses
// broken, the copy that breakage name made.
func expectRefused(t *testing.T, name string, broken runtime.Object) {
	t.Helper()
	errs, err := apiServerErrors(broken)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) == 0 {
		t.Errorf("%s: accepted", name)
	} else {
		t.Logf("%s: %v", name, errs.ToAggregate())
	}
}

func apiServerErrors(obj runtime.Object) (field.ErrorList, error) {
	versioned := obj.DeepCopyObject()
	legacyscheme.Scheme.Default(versioned)
	internal, err := legacyscheme.Scheme.ConvertToVersion(versioned, runtime.InternalGroupVersioner)
	if err != nil {
		return nil, err
	}
	switch o := internal.(type) {
	case *apps.StatefulSet:
		// As statefulSetStrategy.Validate does.
		return appsvalidation.ValidateStatefulSet(o, podutil.GetValidationOptionsFromPodTemplate(&o.Spec.Template, nil)), nil
	case *core.Service:
		// The service storage's create fills clusterIPs from clusterIP before
		// validating (normalizeClusterIPs in pkg/registry/core/service/storage).
		if o.Spec.ClusterIP != "" && len(o.Spec.ClusterIPs) == 0 {
			o.Spec.ClusterIPs = []string{o.Spec.ClusterIP}
		}
		return corevalidation.ValidateServiceCreate(o), nil
	case *core.ConfigMap:
		return corevalidation.ValidateConfigMap(o), nil
	case *core.Secret:
		return corevalidation.ValidateSecret(o), nil
	case *core.Namespace:
		return corevalidation.ValidateNamespace(o), nil
	case *policy.PodDisruptionBudget:
		return policyvalidation.ValidatePodDisruptionBudget(o, policyvalidation.PodDisruptionBudgetValidationOptions{}), nil
	case *networking.NetworkPolicy:
		// As networkPolicyStrategy.Validate does.
		return networkingvalidation.ValidateNetworkPolicy(o, networkingvalidation.ValidationOptionsForNetworking(o, nil)), nil
	}
	return nil, fmt.Errorf("no API server validation wired for %T", internal)
}

// The rendered objects the API server validates: all but ServiceMonitors and
// PrometheusRules (CRDs the API server here does not know).
func (r *Rendered) validatable() []runtime.Object {
	var objects []runtime.Object
	for _, o := range r.StatefulSets {
		objects = append(objects, o)
	}
	for _, o := range r.Services {
		objects = append(objects, o)
	}
	for _, o := range r.ConfigMaps {
		objects = append(objects, o)
	}
	for _, o := range r.Secrets {
		objects = append(objects, o)
	}
	for _, o := range r.PDBs {
		objects = append(objects, o)
	}
	for _, o := range r.NetworkPolicies {
		objects = append(objects, o)
	}
	for _, o := range r.Namespaces {
		objects = append(objects, o)
	}
	return objects
}

// Every rendered object of every overlay passes the API server's validation.
func TestOverlaysPassTheAPIServersValidation(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			objects := r.validatable()
			if want := r.Objects - len(r.Monitors) - len(r.Rules); len(objects) != want {
				t.Fatalf("%d objects gathered for validation, %d rendered (not counting ServiceMonitors and PrometheusRules)", len(objects), want)
			}
			for _, obj := range objects {
				errs, err := apiServerErrors(obj)
				if err != nil {
					t.Fatal(err)
				}
				meta := obj.(interface{ GetName() string })
				if len(errs) > 0 {
					lines := make([]string, len(errs))
					for i, e := range errs {
						lines[i] = e.Error()
					}
					t.Errorf("%s %T %s is refused by the API server's validation:\n  %s",
						overlay, obj, meta.GetName(), strings.Join(lines, "\n  "))
				}
			}
			t.Logf("%d objects validated", len(objects))
		})
	}
}

// The validation refuses what a real API server refused and the offline
// checks let through, or the test above proves nothing.
func TestAPIServersValidationRefusesBrokenStatefulSets(t *testing.T) {
	good := render(t, "dev").StatefulSets[0]
	breakages := map[string]func(*appsv1.StatefulSet){
		"container name Sessionizer_X": func(s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].Name = "Sessionizer_X"
		},
		"volumeMount naming no volume": func(s *appsv1.StatefulSet) {
			c := &s.Spec.Template.Spec.Containers[0]
			c.VolumeMounts[0].Name = "no-such-volume"
		},
	}
	for name, breakIt := range breakages {
		broken := good.DeepCopy()
		breakIt(broken)
		expectRefused(t, name, broken)
	}
}

// The NetworkPolicy validation is wired in: broken copies of a rendered
// policy of components/queries are refused.
func TestAPIServersValidationRefusesBrokenNetworkPolicies(t *testing.T) {
	policies := renderComponent(t, "queries").NetworkPolicies
	if len(policies) == 0 {
		t.Fatal("components/queries renders no NetworkPolicy")
	}
	good := policies[0]
	if errs, err := apiServerErrors(good); err != nil || len(errs) > 0 {
		t.Fatalf("%s as rendered is refused: %v %v", good.Name, err, errs.ToAggregate())
	}
	breakages := map[string]func(*networkingv1.NetworkPolicy){
		"port named query_token": func(np *networkingv1.NetworkPolicy) {
			port := intstr.FromString("query_token")
			np.Spec.Ingress[0].Ports[0].Port = &port
		},
		"protocol ICMP": func(np *networkingv1.NetworkPolicy) {
			protocol := corev1.Protocol("ICMP")
			np.Spec.Ingress[0].Ports[0].Protocol = &protocol
		},
		"a peer with an invalid label value": func(np *networkingv1.NetworkPolicy) {
			np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] = "not a value"
		},
		"an IP block that is no CIDR": func(np *networkingv1.NetworkPolicy) {
			np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}})
		},
	}
	for name, breakIt := range breakages {
		broken := good.DeepCopy()
		breakIt(broken)
		expectRefused(t, name, broken)
	}
}
