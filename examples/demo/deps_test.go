package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemoBuildsOnlyWhatItShows: the demo's first `go run` compiles the
// standard library, the core module, pion/dtls v3 and the pion adapter,
// nothing else: no Prometheus, protobuf, eBPF, quic-go or Kubernetes code,
// which made a cold `cidproxy -demo` take a minute and more.
func TestDemoBuildsOnlyWhatItShows(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Module.Path}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	allowed := []string{
		"github.com/cidroute/cidroute",               // the core
		"github.com/cidroute/cidroute/dtls/piondtls", // the pion adapter
		"github.com/cidroute/cidroute/examples",      // this command and examples/internal/demo
		"github.com/pion/dtls/v3", "github.com/pion/logging", "github.com/pion/transport/v5",
		"github.com/cespare/xxhash/v2", "golang.org/x/crypto", "golang.org/x/net", "golang.org/x/sys",
	}
	var pkgs int
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		require.Contains(t, allowed, mod, "package %s of module %s", pkg, mod)
		if mod == "github.com/cidroute/cidroute/examples" {
			require.True(t, pkg == "github.com/cidroute/cidroute/examples/demo" || pkg == "github.com/cidroute/cidroute/examples/internal/demo", "package %s: the demo imports no other example code", pkg)
		}
		for _, heavy := range []string{"prometheus", "protobuf", "cilium", "ebpf", "quic-go", "k8s.io", "yaml"} {
			require.NotContains(t, pkg, heavy)
		}
		pkgs++
	}
	require.Greater(t, pkgs, 10, "go list printed too little: %s", out)
}
