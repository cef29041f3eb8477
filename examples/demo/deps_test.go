package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemoBuildsOnlyWhatItShows: the demo's first `go run` compiles the
// standard library and the core module, nothing else: no TLS stack (pion
// and crypto/tls with X.509 were most of a 40 s first run), and no
// Prometheus, protobuf, eBPF, quic-go or Kubernetes code, which made a
// cold `cidproxy -demo` take a minute and more.
func TestDemoBuildsOnlyWhatItShows(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	allowed := []string{
		"github.com/cidroute/cidroute",          // the core
		"github.com/cidroute/cidroute/examples", // this command and examples/internal/demo
		"github.com/cespare/xxhash/v2", "golang.org/x/net", "golang.org/x/sys",
	}
	var pkgs int
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		if mod == "" { // the standard library
			require.False(t, strings.HasPrefix(pkg, "crypto/tls") || strings.HasPrefix(pkg, "crypto/x509"), "package %s", pkg)
			continue
		}
		require.Contains(t, allowed, mod, "package %s of module %s", pkg, mod)
		if mod == "github.com/cidroute/cidroute/examples" {
			require.True(t, pkg == "github.com/cidroute/cidroute/examples/demo" || pkg == "github.com/cidroute/cidroute/examples/internal/demo", "package %s: the demo imports no other example code", pkg)
		}
		pkgs++
	}
	require.Greater(t, pkgs, 10, "go list printed too little: %s", out)
}
