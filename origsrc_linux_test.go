//go:build linux

package cidroute

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/registry"
)

const noCapEnv = "CIDROUTE_TEST_NO_NET_ADMIN"

// TestOriginalSourceWithoutCapability: a process without CAP_NET_ADMIN
// (or CAP_NET_RAW) cannot bind sockets to its clients' addresses; New fails at once, naming
// the capability, instead of dropping every datagram later. The test runs
// itself again without the capability (setpriv); as a user without it in
// the first place it checks in place.
func TestOriginalSourceWithoutCapability(t *testing.T) {
	if os.Getenv(noCapEnv) == "" && os.Geteuid() == 0 {
		setpriv := testtool.Look(t, "util-linux", "setpriv")
		if err := exec.Command(os.Args[0], "-test.run=^$").Run(); errors.Is(err, syscall.ENOEXEC) {
			// CI's qemu-user run: the kernel cannot start this binary,
			// so setpriv cannot either (it would hand it to a shell).
			t.Skipf("the test binary does not run natively (%v): it cannot run itself again under setpriv", err)
		}
		cmd := exec.Command(setpriv, "--bounding-set=-net_admin,-net_raw", "--inh-caps=-net_admin,-net_raw", "--",
			os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), noCapEnv+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("without CAP_NET_ADMIN:\n%s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "--- PASS: "+t.Name())
		return
	}
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		reg := newRegistry(t, 1, backend(0, "192.0.2.10:5684", registry.Ready))
		_, err := New(Config{Services: []Service{{Name: "svc", Listen: netip.MustParseAddrPort(listen), Workers: 1,
			RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg, Transparent: true}, OriginalSource: true}}})
		require.ErrorIs(t, err, ErrOriginalSource, listen)
		require.ErrorContains(t, err, "CAP_NET_ADMIN", listen)
		t.Logf("%s: %v", listen, err)
	}
}

// TestReturnRouteLocalBackend: a backend on the proxy's own host is
// refused (its replies would not cross the routing the mode relies on);
// the kernel's answer comes over rtnetlink, which needs no privilege.
func TestReturnRouteLocalBackend(t *testing.T) {
	for _, b := range []string{"127.0.0.1:5684", "[::1]:5684"} {
		err := checkReturnRoute(netip.MustParseAddrPort(b))
		if err != nil && strings.Contains(err.Error(), "no route to it") {
			t.Logf("%s: %v (no such loopback here)", b, err)
			continue
		}
		require.ErrorIs(t, err, ErrOriginalSource, b)
		require.ErrorContains(t, err, "on the proxy's own host", b)
	}
	a, err := routeGet(routeQuery{dst: netip.MustParseAddr("127.0.0.1")})
	require.NoError(t, err)
	require.Equal(t, uint8(unix.RTN_LOCAL), a.typ)
	require.NotZero(t, a.oif, "the loopback interface")
}
