package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/internal/testtool"
)

// apiServer is a minimal Kubernetes API server that serves one Service's
// EndpointSlices: a plain list, and a watch that stays open without
// events. It refuses streaming lists (sendInitialEvents) as API servers
// without that feature do, so client-go falls back to list and watch.
func apiServer(t *testing.T, namespace string, slices ...map[string]any) *httptest.Server {
	path := "/apis/discovery.k8s.io/v1/namespaces/" + namespace + "/endpointslices"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case q.Get("sendInitialEvents") == "true":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`)
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			json.NewEncoder(w).Encode(map[string]any{
				"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
				"metadata": map[string]any{"resourceVersion": "1"},
				"items":    slices,
			})
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func endpointSlice(namespace, service, name string, pods map[string]string) map[string]any {
	var eps []map[string]any
	for pod, ip := range pods {
		eps = append(eps, map[string]any{
			"addresses":  []string{ip},
			"hostname":   pod,
			"conditions": map[string]any{"ready": true, "serving": true, "terminating": false},
			"targetRef":  map[string]any{"kind": "Pod", "name": pod, "namespace": namespace},
		})
	}
	return map[string]any{
		"metadata": map[string]any{"name": name, "namespace": namespace, "resourceVersion": "1",
			"labels": map[string]string{"kubernetes.io/service-name": service}},
		"addressType": "IPv4",
		"endpoints":   eps,
		"ports":       []map[string]any{{"name": "dtls", "port": 5684, "protocol": "UDP"}},
	}
}

// TestServeFromKubeconfig runs this build of cidproxy with a "kubernetes"
// service whose kubeconfig names a (fake) API server: the EndpointSlice
// source lists the Service's slices through client-go and the service's
// registry serves their endpoints.
func TestServeFromKubeconfig(t *testing.T) {
	dir := t.TempDir()
	api := apiServer(t, "iot", endpointSlice("iot", "dtls-backend", "dtls-backend-abc",
		map[string]string{"ds-0": "10.0.0.10", "ds-1": "10.0.0.11"}))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: u, user: {token: test}}]
contexts: [{name: fake, context: {cluster: fake, user: u}}]
current-context: fake
`, api.URL))
	metrics := fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))
	cfg := filepath.Join(dir, "cidproxy.json")
	writeFile(t, cfg, fmt.Sprintf(`{"hrw_seed": 1, "metrics_listen": %q, "services": [
		{"name": "k", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1, "max_registry_age": "10s",
		 "kubernetes": {"namespace": "iot", "service": "dtls-backend", "port_name": "dtls", "kubeconfig": %q}}]}`,
		metrics, testtool.FreePort(t, "udp"), kubeconfig))

	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testtool.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- proxyapp.Run(ctx, []string{"-config", cfg}, &stdout, &stderr, proxyapp.Options{Kubernetes: endpointSlices})
	}()
	defer func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("exit %d", c)
			}
		case <-time.After(5 * time.Second):
			t.Error("cidproxy did not stop")
		}
		if t.Failed() {
			t.Logf("cidproxy log:\n%s", stderr.String())
		}
	}()

	const ready = `cidroute_registry_backends{service="k",state="ready"} 2`
	deadline := time.Now().Add(20 * time.Second)
	for {
		body := scrape(metrics)
		if strings.Contains(body, ready) && strings.Contains(body, `cidroute_registry_stale{service="k"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the metrics:\n%s", ready, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "kubernetes: backends updated") {
		t.Errorf("no update logged:\n%s", stderr.String())
	}
}

func scrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
