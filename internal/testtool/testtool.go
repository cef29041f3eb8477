// Package testtool lets tests that need an external program (openssl, qemu,
// nginx, coap-client) skip on a machine without it, unless the environment
// says the tools are required (CI sets CIDROUTE_REQUIRE_TOOLS=1).
package testtool

import (
	"os"
	"os/exec"
	"testing"
)

// Required reports whether missing tools must fail tests instead of skipping
// them.
func Required() bool { return os.Getenv("CIDROUTE_REQUIRE_TOOLS") == "1" }

// Look returns the path of the first of names found on PATH. When none is
// found, the test is skipped with a message naming what to install, or
// failed when tools are required.
func Look(t testing.TB, pkg string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if Required() {
		t.Fatalf("%v not found on PATH and CIDROUTE_REQUIRE_TOOLS=1 (install Debian package %s)", names, pkg)
	}
	t.Skipf("%v not found on PATH: install Debian package %s (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)", names, pkg)
	return ""
}
