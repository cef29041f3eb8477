package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/cidroute/cidroute/examples/internal/proxyapp"
)

// TestManifestConfig: the config.json of the example ConfigMap is a
// configuration this build accepts (-check), with its "kubernetes" service.
func TestManifestConfig(t *testing.T) {
	raw, err := os.ReadFile("../cidproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg string
	for _, doc := range strings.Split(string(raw), "\n---") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind == "ConfigMap" {
			cfg = cm.Data["config.json"]
		}
	}
	if cfg == "" {
		t.Fatal("no ConfigMap with config.json in ../cidproxy.yaml")
	}
	path := filepath.Join(t.TempDir(), "cidproxy.json")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := proxyapp.Run(context.Background(), []string{"-check", "-config", path}, &out, &errOut, proxyapp.Options{Kubernetes: endpointSlices})
	if code != 0 || !strings.Contains(out.String(), "EndpointSlices of") {
		t.Fatalf("-check: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
	// The plain build refuses it, naming this one.
	code = proxyapp.Run(context.Background(), []string{"-check", "-config", path}, &out, &errOut, proxyapp.Options{})
	if code == 0 || !strings.Contains(errOut.String(), "examples/kubernetes/cidproxy") {
		t.Fatalf("plain build: exit %d, stderr %s", code, errOut.String())
	}
}
