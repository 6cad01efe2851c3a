package validate

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/schema"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

const imageName = "streams-services"

// loadCompose loads deploy/docker/compose.yaml the way `docker compose` does
// (compose-go: the compose-spec JSON schema, anchors and merge keys,
// interpolation, normalisation, consistency checks), every profile enabled.
func loadCompose(t testing.TB) *types.Project {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "docker")
	details := types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	}
	project, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("streams", true)
		o.Profiles = []string{"*"}
	})
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return project
}

func TestComposeMatchesTheSchema(t *testing.T) {
	// The schema alone, on the raw file, so that a loader default cannot hide
	// a violation.
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/docker/compose.yaml")), &raw); err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(raw); err != nil {
		t.Fatalf("compose.yaml against the compose-spec schema: %v", err)
	}
	loadCompose(t)
}

// The schema must reject what it is meant to reject.
func TestComposeSchemaRejectsUnknownKeys(t *testing.T) {
	var raw map[string]any
	if err := yaml.Unmarshal([]byte("services:\n  a:\n    image: x\n    comand: [oops]\n"), &raw); err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(raw); err == nil {
		t.Fatal("the compose schema accepted an unknown service key")
	}
}

func TestComposeInvariants(t *testing.T) {
	project := loadCompose(t)
	docker := parseDockerfile(t)
	byName := map[string]types.ServiceConfig{}
	for _, s := range project.AllServices() {
		byName[s.Name] = s
	}
	for _, service := range serviceNames(t) {
		s, ok := byName[service]
		if !ok {
			t.Errorf("compose.yaml has no service %s", service)
			continue
		}
		if !strings.HasPrefix(s.Image, imageName) {
			t.Errorf("%s: image %q, want %s", service, s.Image, imageName)
		}
		if len(s.Command) == 0 || s.Command[0] != service {
			t.Errorf("%s: command %v does not run the %s binary", service, []string(s.Command), service)
		}
		// State on a named volume at the image's STATE_DIR.
		onVolume := false
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeVolume && v.Target == docker.StateDir {
				onVolume = true
				if _, ok := project.Volumes[v.Source]; !ok {
					t.Errorf("%s: volume %s is not declared", service, v.Source)
				}
			}
		}
		if !onVolume {
			t.Errorf("%s: no named volume at STATE_DIR %s", service, docker.StateDir)
		}
	}
	published := map[string]string{}
	for _, s := range project.AllServices() {
		for _, p := range s.Ports {
			if p.Published == "" {
				continue
			}
			if other, ok := published[p.Published]; ok {
				t.Errorf("%s and %s both publish host port %s", s.Name, other, p.Published)
			}
			published[p.Published] = s.Name
		}
	}
}
