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
// configuration this build accepts (-check), with its "kubernetes" service
// and the CID key file of the example Secret (cid-keys.yaml), written
// where the config expects it, as the Secret volume would be.
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
	dir := t.TempDir()
	const keysAt = "/etc/cidroute-keys/cid-keys.json" // the Secret's mount in cidproxy.yaml
	if !strings.Contains(cfg, `"cid_keys_file": "`+keysAt+`"`) {
		t.Fatalf("config.json does not read the key Secret at %s", keysAt)
	}
	keys := filepath.Join(dir, "cid-keys.json")
	if err := os.WriteFile(keys, []byte(secretKeyFile(t)), 0o400); err != nil {
		t.Fatal(err)
	}
	cfg = strings.Replace(cfg, keysAt, keys, 1)
	path := filepath.Join(dir, "cidproxy.json")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := proxyapp.Run(context.Background(), []string{"-check", "-config", path}, &out, &errOut, proxyapp.Options{Kubernetes: endpointSlices})
	if code != 0 || !strings.Contains(out.String(), "EndpointSlices of") || !strings.Contains(out.String(), "quic-lb-encrypted") {
		t.Fatalf("-check: exit %d\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
	// The plain build refuses it, naming this one.
	code = proxyapp.Run(context.Background(), []string{"-check", "-config", path}, &out, &errOut, proxyapp.Options{})
	if code == 0 || !strings.Contains(errOut.String(), "examples/kubernetes/cidproxy") {
		t.Fatalf("plain build: exit %d, stderr %s", code, errOut.String())
	}
}

// secretKeyFile returns cid-keys.json of the Secret in ../cid-keys.yaml.
func secretKeyFile(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../cid-keys.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Kind       string            `json:"kind"`
		StringData map[string]string `json:"stringData"`
	}
	if err := yaml.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if s.Kind != "Secret" || s.StringData["cid-keys.json"] == "" {
		t.Fatal("no Secret with cid-keys.json in ../cid-keys.yaml")
	}
	return s.StringData["cid-keys.json"]
}
