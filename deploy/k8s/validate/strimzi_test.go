package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"
)

// Strimzi's KafkaUser CRD, vendored in testdata/ (testdata/README.md): the
// current release, which serves kafka.strimzi.io/v1 only, and the last
// release that serves v1beta2 too.
const (
	strimziCurrentCRD = "testdata/strimzi-1.2.0/044-Crd-kafkauser.yaml"
	strimziV1beta2CRD = "testdata/strimzi-0.51.0/044-Crd-kafkauser.yaml"
)

// strimziCluster is the `--strimzi-cluster` the tests give.
const strimziCluster = "my-cluster"

// customResourceType is what an API server holds for one installed CRD: for
// each served version, the structural schema and its OpenAPI validator.
type customResourceType struct {
	crd        *apiextensionsv1.CustomResourceDefinition
	structural map[string]*structuralschema.Structural
	validators map[string]*validate.SchemaValidator
}

// installCRD reads a CRD as the API server takes one in: strict decoding,
// each version's schema converted to the internal type and made structural
// (refused if it is not, as the server refuses such a CRD).
func installCRD(t testing.TB, rel string) *customResourceType {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict([]byte(readRepoFile(t, filepath.Join("deploy/k8s/validate", rel))), &crd); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	c := &customResourceType{
		crd:        &crd,
		structural: map[string]*structuralschema.Structural{},
		validators: map[string]*validate.SchemaValidator{},
	}
	for _, version := range crd.Spec.Versions {
		if !version.Served || version.Schema == nil {
			continue
		}
		internal := &apiextensionsinternal.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(version.Schema, internal, nil); err != nil {
			t.Fatalf("%s %s: %v", rel, version.Name, err)
		}
		s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
		if err != nil {
			t.Fatalf("%s %s: not a structural schema: %v", rel, version.Name, err)
		}
		if errs := structuralschema.ValidateStructural(nil, s); len(errs) > 0 {
			t.Fatalf("%s %s: not a structural schema: %v", rel, version.Name, errs.ToAggregate())
		}
		c.structural[version.Name] = s
		c.validators[version.Name] = validate.NewSchemaValidator(s.ToKubeOpenAPI(), nil, "", strfmt.Default)
	}
	if len(c.structural) == 0 {
		t.Fatalf("%s: no served version with a schema", rel)
	}
	return c
}

// The CEL rules (x-kubernetes-validations) of the KafkaUser CRDs: each holds
// whenever spec.authentication has neither validityDays nor renewalDays,
// which createErrors checks instead of evaluating them (the CEL
// interpreter is not among this module's dependencies). A rule not listed
// here fails the test, to be looked at.
var kafkaUserCELRulesWithoutDays = map[string]bool{
	"self.type == 'tls' || (!has(self.validityDays) && !has(self.renewalDays))":                                       true,
	"self.type != 'tls' || (has(self.renewalDays) == has(self.validityDays))":                                         true,
	"self.type != 'tls' || !has(self.renewalDays) || !has(self.validityDays) || self.renewalDays < self.validityDays": true,
}

// celRules lists every x-kubernetes-validations rule of s, by path.
func celRules(path string, s *structuralschema.Structural, out map[string][]string) {
	if s == nil {
		return
	}
	for _, rule := range s.XValidations {
		out[path] = append(out[path], rule.Rule)
	}
	for name, property := range s.Properties {
		celRules(path+"."+name, &property, out)
	}
	celRules(path+"[*]", s.Items, out)
	if s.AdditionalProperties != nil {
		celRules(path+"[*]", s.AdditionalProperties.Structural, out)
	}
}

// createErrors is what an API server answers to a create of the custom
// resource object in namespace, as kubectl sends it (strict field
// validation): the group, version and kind it serves, no field the schema
// does not know, the metadata, the OpenAPI schema, embedded resources and
// list types, and the CRD's CEL rules as kafkaUserCELRulesWithoutDays says.
func (c *customResourceType) createErrors(object map[string]any, namespace string) []string {
	u := &unstructured.Unstructured{Object: object}
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		return []string{err.Error()}
	}
	if gv.Group != c.crd.Spec.Group || u.GetKind() != c.crd.Spec.Names.Kind {
		return []string{fmt.Sprintf("no matches for kind %q in group %q (this CRD serves %s in %s)", u.GetKind(), gv.Group, c.crd.Spec.Names.Kind, c.crd.Spec.Group)}
	}
	s, served := c.structural[gv.Version]
	if !served {
		var versions []string
		for version := range c.structural {
			versions = append(versions, version)
		}
		sort.Strings(versions)
		return []string{fmt.Sprintf("no matches for kind %q in version %q: the CRD serves %v", u.GetKind(), u.GetAPIVersion(), versions)}
	}
	var problems []string
	// Unknown fields: the server drops them, and kubectl's strict field
	// validation (its default) turns each into an error.
	_, _, unknownMeta, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		return []string{err.Error()}
	}
	unknown := append(unknownMeta, structuralpruning.PruneWithOptions(u.Object, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
	for _, path := range unknown {
		problems = append(problems, fmt.Sprintf("unknown field %q", path))
	}
	if err, _ := schemaobjectmeta.CoerceWithOptions(nil, u.Object, s, false, schemaobjectmeta.CoerceOptions{}); err != nil {
		problems = append(problems, err.Error())
	}
	if c.crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
		u.SetNamespace(namespace)
	}
	var errs field.ErrorList
	errs = append(errs, metavalidation.ValidateObjectMetaAccessor(u, c.crd.Spec.Scope == apiextensionsv1.NamespaceScoped, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, schemaobjectmeta.Validate(nil, u.Object, s, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, s, u.Object)...)
	for _, e := range errs {
		problems = append(problems, e.Error())
	}
	for _, e := range c.validators[gv.Version].Validate(u.Object).Errors {
		problems = append(problems, e.Error())
	}
	rules := map[string][]string{}
	celRules("", s, rules)
	for path, pathRules := range rules {
		for _, rule := range pathRules {
			if !kafkaUserCELRulesWithoutDays[rule] {
				problems = append(problems, fmt.Sprintf("the CRD has a CEL rule at %s this test does not know: %s", path, rule))
			}
		}
	}
	for _, days := range []string{"validityDays", "renewalDays"} {
		if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "authentication", days); found {
			problems = append(problems, "spec.authentication."+days+" is set: the CRD's CEL rules on it are not evaluated here")
		}
	}
	return problems
}

// userOperatorErrors are what Strimzi's User Operator checks besides the
// schema (user-operator: UserOperatorConfig, KafkaUserModel): it takes up
// only the KafkaUsers labelled with its cluster, a tls user's name is a
// certificate's CN (at most 64 characters); and what the flags asked for.
func userOperatorErrors(object map[string]any, authentication string) []string {
	u := &unstructured.Unstructured{Object: object}
	var problems []string
	if got := u.GetLabels()["strimzi.io/cluster"]; got != strimziCluster {
		problems = append(problems, fmt.Sprintf("label strimzi.io/cluster is %q, want %q: the User Operator ignores the KafkaUser", got, strimziCluster))
	}
	got, found, _ := unstructured.NestedString(u.Object, "spec", "authentication", "type")
	switch {
	case authentication == "none" && found:
		problems = append(problems, "spec.authentication.type "+got+" with --strimzi-authentication none")
	case authentication != "none" && got != authentication:
		problems = append(problems, fmt.Sprintf("spec.authentication.type is %q, want %q", got, authentication))
	}
	if got == "tls" && len(u.GetName()) > 64 {
		problems = append(problems, "a tls user's name is longer than 64 characters")
	}
	if kind, _, _ := unstructured.NestedString(u.Object, "spec", "authorization", "type"); kind != "simple" {
		problems = append(problems, "spec.authorization.type is "+kind)
	}
	return problems
}

// runAcls runs `<service> acls <args>` with the service's defaults.
func runAcls(t testing.TB, service string, args ...string) []byte {
	t.Helper()
	path := filepath.Join(binDir(), service)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is not built (looked in %s; set STREAMS_BIN_DIR or CARGO_TARGET_DIR, or run `make build`): %v", service, binDir(), err)
	}
	cmd := exec.Command(path, append([]string{"acls"}, args...)...)
	// A service reads its flags from the environment too: none here.
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = string(exit.Stderr)
		}
		t.Fatalf("%s acls %s: %v\n%s", service, strings.Join(args, " "), err, stderr)
	}
	return out
}

// decodeYAML decodes one YAML document as the API server decodes JSON
// (integers stay integers), refusing duplicate keys.
func decodeYAML(t testing.TB, text []byte) map[string]any {
	t.Helper()
	data, err := yaml.YAMLToJSONStrict(text)
	if err != nil {
		t.Fatalf("not YAML: %v\n%s", err, text)
	}
	var object map[string]any
	if err := utiljson.Unmarshal(data, &object); err != nil {
		t.Fatalf("not an object: %v\n%s", err, text)
	}
	return object
}

// The ACLs of a KafkaUser, as "type name patternType operations".
func kafkaUserACLs(t testing.TB, object map[string]any) []string {
	t.Helper()
	acls, _, _ := unstructured.NestedSlice(object, "spec", "authorization", "acls")
	var out []string
	for _, acl := range acls {
		rule := acl.(map[string]any)
		resource := rule["resource"].(map[string]any)
		var operations []string
		for _, operation := range rule["operations"].([]any) {
			operations = append(operations, operation.(string))
		}
		out = append(out, fmt.Sprintf("%v %v %v %s", resource["type"], resource["name"], resource["patternType"], strings.Join(operations, ",")))
	}
	return out
}

// The ACLs `acls --format json` lists, in a KafkaUser's terms.
func listedACLs(t testing.TB, service string, args []string) []string {
	t.Helper()
	var listing struct {
		ACLs []struct {
			ResourceType string   `json:"resource_type"`
			Name         string   `json:"name"`
			PatternType  string   `json:"pattern_type"`
			Operations   []string `json:"operations"`
		} `json:"acls"`
	}
	if err := json.Unmarshal(runAcls(t, service, append([]string{"--format", "json"}, args...)...), &listing); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"Topic": "topic", "Group": "group", "TransactionalId": "transactionalId"}
	patterns := map[string]string{"literal": "literal", "prefixed": "prefix"}
	var out []string
	for _, acl := range listing.ACLs {
		out = append(out, fmt.Sprintf("%s %s %s %s", kinds[acl.ResourceType], acl.Name, patterns[acl.PatternType], strings.Join(acl.Operations, ",")))
	}
	return out
}

// Every service's `acls --format strimzi`, for each authentication type,
// for a run and for a reset, is a KafkaUser the current Strimzi release's
// CRD accepts (as the API server checks a create) and its User Operator
// takes up, holding the ACLs `acls --format json` lists; with
// `--strimzi-api-version v1beta2`, one the last release serving v1beta2
// accepts.
func TestAclsFormatStrimziIsAKafkaUserStrimziAccepts(t *testing.T) {
	crds := map[string]*customResourceType{
		"v1":      installCRD(t, strimziCurrentCRD),
		"v1beta2": installCRD(t, strimziV1beta2CRD),
	}
	type variant struct {
		apiVersion, authentication, purpose string
	}
	var variants []variant
	for _, authentication := range []string{"", "scram-sha-512", "tls", "tls-external", "none"} {
		for _, purpose := range []string{"run", "reset"} {
			variants = append(variants, variant{"", authentication, purpose})
		}
	}
	variants = append(variants, variant{"v1beta2", "", "run"}, variant{"v1", "tls", "reset"})
	for _, service := range serviceNames(t) {
		for _, v := range variants {
			args := []string{"--for", v.purpose, "--strimzi-cluster", strimziCluster}
			authentication, apiVersion := v.authentication, v.apiVersion
			if authentication != "" {
				args = append(args, "--strimzi-authentication", authentication)
			} else {
				authentication = "scram-sha-512" // the default
			}
			if apiVersion != "" {
				args = append(args, "--strimzi-api-version", apiVersion)
			} else {
				apiVersion = "v1" // the default
			}
			name := service + " " + strings.Join(args, " ")
			t.Run(name, func(t *testing.T) {
				text := runAcls(t, service, append([]string{"--format", "strimzi"}, args...)...)
				object := decodeYAML(t, text)
				if want := "kafka.strimzi.io/" + apiVersion; object["apiVersion"] != want {
					t.Errorf("apiVersion %v, want %s", object["apiVersion"], want)
				}
				problems := crds[apiVersion].createErrors(object, "kafka")
				problems = append(problems, userOperatorErrors(object, authentication)...)
				if len(problems) > 0 {
					t.Errorf("refused:\n  %s\n%s", strings.Join(problems, "\n  "), text)
				}
				got := kafkaUserACLs(t, object)
				want := listedACLs(t, service, []string{"--for", v.purpose})
				if strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("the KafkaUser's ACLs:\n  %s\n`acls --format json` lists:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
				}
			})
		}
	}
}

// The checks above refuse what Strimzi refuses, or that test proves
// nothing: each breakage of a good KafkaUser is refused.
func TestKafkaUserChecksRefuseBrokenKafkaUsers(t *testing.T) {
	current := installCRD(t, strimziCurrentCRD)
	good := runAcls(t, "sessionizer", "--format", "strimzi", "--strimzi-cluster", strimziCluster)
	check := func(object map[string]any) []string {
		return append(current.createErrors(object, "kafka"), userOperatorErrors(object, "scram-sha-512")...)
	}
	if problems := check(decodeYAML(t, good)); len(problems) > 0 {
		t.Fatalf("the good KafkaUser is refused: %v", problems)
	}
	acl := func(o map[string]any) map[string]any {
		return o["spec"].(map[string]any)["authorization"].(map[string]any)["acls"].([]any)[0].(map[string]any)
	}
	breakages := map[string]func(map[string]any){
		// What `acls --format strimzi` printed before it took --strimzi-*.
		"v1beta2, no cluster label, no authentication": func(o map[string]any) {
			o["apiVersion"] = "kafka.strimzi.io/v1beta2"
			delete(o["metadata"].(map[string]any), "labels")
			delete(o["spec"].(map[string]any), "authentication")
		},
		"apiVersion v1beta2 (not served since Strimzi 1.0)": func(o map[string]any) {
			o["apiVersion"] = "kafka.strimzi.io/v1beta2"
		},
		"no strimzi.io/cluster label": func(o map[string]any) {
			delete(o["metadata"].(map[string]any), "labels")
		},
		"no spec.authentication": func(o map[string]any) {
			delete(o["spec"].(map[string]any), "authentication")
		},
		"authentication type scram-sha-256": func(o map[string]any) {
			o["spec"].(map[string]any)["authentication"].(map[string]any)["type"] = "scram-sha-256"
		},
		"patternType prefixed (Kafka's word, not Strimzi's)": func(o map[string]any) {
			acl(o)["resource"].(map[string]any)["patternType"] = "prefixed"
		},
		"an ACL without operations": func(o map[string]any) {
			delete(acl(o), "operations")
		},
		"an unknown field": func(o map[string]any) {
			acl(o)["resource"].(map[string]any)["pattern"] = "literal"
		},
		"metadata.name Sessionizer_1": func(o map[string]any) {
			o["metadata"].(map[string]any)["name"] = "Sessionizer_1"
		},
		"kind KafkaUsers": func(o map[string]any) {
			o["kind"] = "KafkaUsers"
		},
		"validityDays with scram-sha-512": func(o map[string]any) {
			o["spec"].(map[string]any)["authentication"].(map[string]any)["validityDays"] = int64(30)
		},
	}
	var names []string
	for name := range breakages {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		object := decodeYAML(t, good)
		breakages[name](object)
		if problems := check(object); len(problems) == 0 {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %s", name, strings.Join(problems, "; "))
		}
	}
}
