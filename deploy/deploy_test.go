// Package deploy holds pinflow's deployment files: docker-compose.yml and
// Dockerfile, Kubernetes manifests in k8s/, the systemd unit in systemd/,
// and the dev stack scripts. Its tests parse each file and check what
// Docker, kubectl and systemd-analyze would refuse or silently ignore:
// structure, pinned images, probes against the worker's health endpoint,
// and every PINFLOW_* variable against the configuration.
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/pinflow/pinflow/config"
)

// knownVars are the variables the configuration reads.
func knownVars(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, v := range config.Reference() {
		vars[v.Name] = true
	}
	return vars
}

// checkVars fails for every PINFLOW_* name the configuration does not
// read: a misspelt variable is silently ignored at run time.
func checkVars(t *testing.T, where string, names []string) {
	t.Helper()
	known := knownVars(t)
	for _, n := range names {
		if strings.HasPrefix(n, config.Prefix+"_") && !known[n] {
			t.Errorf("%s: %s is not a pinflow variable; 'pinflow config' lists them", where, n)
		}
	}
}

// pinnedImage says whether image names a tag or digest other than latest.
func pinnedImage(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	i := strings.LastIndex(image, ":")
	return i > strings.LastIndex(image, "/") && image[i+1:] != "" && image[i+1:] != "latest"
}

func TestCompose(t *testing.T) {
	// Known fields only: a misspelt key is an error here, where Compose
	// would ignore it or refuse it only at deploy time.
	var doc struct {
		Name     string `yaml:"name"`
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Entrypoint  []string          `yaml:"entrypoint"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Ports       []string          `yaml:"ports"`
			Profiles    []string          `yaml:"profiles"`
			Deploy      struct {
				Replicas int `yaml:"replicas"`
			} `yaml:"deploy"`
			Healthcheck *struct {
				Test     []string `yaml:"test"`
				Interval string   `yaml:"interval"`
				Retries  int      `yaml:"retries"`
			} `yaml:"healthcheck"`
			Build *struct {
				Context    string `yaml:"context"`
				Dockerfile string `yaml:"dockerfile"`
			} `yaml:"build"`
			DependsOn any `yaml:"depends_on"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	b, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"postgresql", "temporal", "temporal-ui", "redis", "worker"} {
		if _, ok := doc.Services[name]; !ok {
			t.Errorf("docker-compose.yml: no service %q", name)
		}
	}
	for name, s := range doc.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("docker-compose.yml: service %s has neither image nor build", name)
		}
		if s.Image != "" && s.Build == nil && !pinnedImage(s.Image) {
			t.Errorf("docker-compose.yml: service %s image %q is not pinned to a tag", name, s.Image)
		}
		var vars []string
		for k := range s.Environment {
			vars = append(vars, k)
		}
		checkVars(t, "docker-compose.yml service "+name, vars)
		if s.Build != nil {
			df := filepath.Join(s.Build.Context, s.Build.Dockerfile)
			if _, err := os.Stat(df); err != nil {
				t.Errorf("docker-compose.yml: service %s builds %s: %v", name, df, err)
			}
		}
	}
	if got := strings.Join(doc.Services["redis"].Command, " "); !strings.Contains(got, "--appendonly yes") {
		t.Errorf("docker-compose.yml: redis runs %q, want the append-only file on (--appendonly yes)", got)
	}
	if got := doc.Services["temporal"].Environment["DB"]; got != "postgres12" {
		t.Errorf("docker-compose.yml: temporal DB=%q, want postgres12 (PostgreSQL persistence)", got)
	}
	w := doc.Services["worker"].Environment
	if w["PINFLOW_HEALTH_ADDR"] == "" || w["PINFLOW_REDIS_URL"] == "" || w["PINFLOW_TEMPORAL_ADDRESS"] == "" {
		t.Errorf("docker-compose.yml: worker environment %v lacks the Temporal address, Redis URL or health address", w)
	}
}

// k8sObject is the part of a manifest the test checks.
type k8sObject struct {
	APIVersion string                `yaml:"apiVersion"`
	Kind       string                `yaml:"kind"`
	Metadata   struct{ Name string } `yaml:"metadata"`
	Data       map[string]string     `yaml:"data"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []struct {
					Name    string `yaml:"name"`
					Image   string `yaml:"image"`
					EnvFrom []struct {
						ConfigMapRef struct{ Name string } `yaml:"configMapRef"`
					} `yaml:"envFrom"`
					Env []struct {
						Name string `yaml:"name"`
					} `yaml:"env"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					ReadinessProbe *probe `yaml:"readinessProbe"`
					LivenessProbe  *probe `yaml:"livenessProbe"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

func TestKubernetes(t *testing.T) {
	files, err := filepath.Glob("k8s/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in k8s/: %v", err)
	}
	objs := map[string]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: an object lacks apiVersion, kind or metadata.name: %+v", f, o)
			}
			objs[o.Kind] = o
		}
	}
	cm, ok := objs["ConfigMap"]
	if !ok {
		t.Fatal("k8s: no ConfigMap with the worker's PINFLOW_* settings")
	}
	var vars []string
	for k := range cm.Data {
		vars = append(vars, k)
	}
	checkVars(t, "ConfigMap "+cm.Metadata.Name, vars)

	d, ok := objs["Deployment"]
	if !ok || d.APIVersion != "apps/v1" {
		t.Fatalf("k8s: no apps/v1 Deployment")
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("Deployment: selector %s=%s does not match the pod labels %v", k, v, d.Spec.Template.Metadata.Labels)
		}
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want the worker alone", len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	if !pinnedImage(c.Image) {
		t.Errorf("Deployment: image %q is not pinned to a tag", c.Image)
	}
	vars = nil
	for _, e := range c.Env {
		vars = append(vars, e.Name)
	}
	checkVars(t, "Deployment env", vars)
	if len(c.EnvFrom) == 0 || c.EnvFrom[0].ConfigMapRef.Name != cm.Metadata.Name {
		t.Errorf("Deployment: the container does not take its environment from ConfigMap %s", cm.Metadata.Name)
	}
	// The probes reach the worker's health endpoint on its port.
	addr := cm.Data["PINFLOW_HEALTH_ADDR"]
	port := 0
	for _, p := range c.Ports {
		if p.Name == "health" {
			port = p.ContainerPort
		}
	}
	if addr == "" || port == 0 || !strings.HasSuffix(addr, ":"+itoa(port)) {
		t.Errorf("Deployment: health port %d does not match PINFLOW_HEALTH_ADDR %q", port, addr)
	}
	for _, pc := range []struct {
		name string
		p    *probe
		path string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/livez"}} {
		if pc.p == nil || pc.p.HTTPGet.Path != pc.path || (pc.p.HTTPGet.Port != "health" && pc.p.HTTPGet.Port != port) {
			t.Errorf("Deployment: %s is %+v, want GET %s on the health port", pc.name, pc.p, pc.path)
		}
	}
	if s, ok := objs["Service"]; ok {
		for k, v := range s.Spec.Selector.MatchLabels {
			t.Errorf("Service: selector uses matchLabels (%s=%s); a Service's selector is a plain map", k, v)
		}
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

// unitKeys are the keys a section of pinflow's unit may use; a key systemd
// does not know it only warns about, and then ignores.
var unitKeys = map[string]map[string]bool{
	"Unit": {"Description": true, "Documentation": true, "Wants": true, "After": true, "Requires": true, "Before": true},
	"Service": {"Type": true, "User": true, "Group": true, "EnvironmentFile": true, "Environment": true, "ExecStart": true,
		"KillSignal": true, "TimeoutStopSec": true, "Restart": true, "RestartSec": true, "NoNewPrivileges": true,
		"ProtectSystem": true, "ProtectHome": true, "PrivateTmp": true, "ProtectKernelTunables": true,
		"ProtectControlGroups": true, "RestrictAddressFamilies": true, "LimitNOFILE": true},
	"Install": {"WantedBy": true, "RequiredBy": true, "Alias": true},
}

func TestSystemdUnit(t *testing.T) {
	const file = "systemd/pinflow-worker.service"
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sections := map[string]map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			if unitKeys[section] == nil {
				t.Errorf("%s:%d: unknown section [%s]", file, n, section)
			}
			if sections[section] != nil {
				t.Errorf("%s:%d: section [%s] again", file, n, section)
			}
			sections[section] = map[string]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Errorf("%s:%d: %q is not KEY=VALUE inside a section", file, n, line)
				continue
			}
			if !unitKeys[section][k] {
				t.Errorf("%s:%d: %s is not a key of [%s]", file, n, k, section)
			}
			sections[section][k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	svc := sections["Service"]
	checks := []struct{ what, got, want string }{
		{"ExecStart", svc["ExecStart"], "/usr/local/bin/pinflow-worker"},
		{"KillSignal", svc["KillSignal"], "SIGTERM"},
		{"Restart", svc["Restart"], "on-failure"},
		{"WantedBy", sections["Install"]["WantedBy"], "multi-user.target"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %s=%q, want %q", file, c.what, c.got, c.want)
		}
	}
	if !filepath.IsAbs(svc["EnvironmentFile"]) {
		t.Errorf("%s: EnvironmentFile=%q, want an absolute path for the PINFLOW_* settings", file, svc["EnvironmentFile"])
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	from := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(string(b), -1)
	if len(from) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build and a runtime stage", len(from))
	}
	for _, m := range from {
		if !pinnedImage(m[1]) {
			t.Errorf("Dockerfile: FROM %s is not pinned to a tag", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`go build [^\n]*?(\./\S+)`).FindAllStringSubmatch(string(b), -1) {
		if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
			t.Errorf("Dockerfile builds %s: %v", m[1], err)
		}
	}
	var vars []string
	for _, m := range regexp.MustCompile(`(?m)^ENV\s+(PINFLOW_\w+)=`).FindAllStringSubmatch(string(b), -1) {
		vars = append(vars, m[1])
	}
	checkVars(t, "Dockerfile", vars)
	if !strings.Contains(string(b), `ENTRYPOINT ["/usr/local/bin/pinflow-worker"]`) {
		t.Errorf("Dockerfile: the entrypoint is not the worker")
	}
}
