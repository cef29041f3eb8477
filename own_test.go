package cidroute

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
)

func TestOwnAddrs(t *testing.T) {
	ap := netip.MustParseAddrPort
	o := NewOwnAddrs([]netip.AddrPort{ap("127.0.0.1:5684"), ap("0.0.0.0:40000"), ap("[::]:40001"), ap("192.0.2.7:6000")},
		[]netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("192.0.2.255")})
	for _, tc := range []struct {
		a    string
		want bool
	}{
		{"127.0.0.1:5684", true},
		{"127.0.0.2:5684", false}, // bound to one address only
		{"127.0.0.1:5685", false},
		{"192.0.2.7:6000", true},
		{"[::ffff:192.0.2.7]:6000", true}, // mapped form
		{"192.0.2.8:6000", false},
		{"127.0.0.1:40000", true}, // wildcard: loopback
		{"127.9.9.9:40000", true},
		{"0.0.0.0:40000", true},
		{"192.0.2.7:40000", true},   // wildcard: a host address
		{"192.0.2.255:40000", true}, // its subnet's broadcast
		{"[2001:db8::7]:40001", true},
		{"[::1]:40001", true},
		{"[fe80::1%eth0]:40000", false},
		{"198.51.100.1:40000", false}, // not the host's
		{"198.51.100.1:5684", false},
	} {
		assert.Equal(t, tc.want, o.Contains(ap(tc.a)), tc.a)
	}
	var none *OwnAddrs
	assert.False(t, none.Contains(ap("127.0.0.1:5684")))
	assert.True(t, none.IsHost(netip.MustParseAddr("127.0.0.1")))
	if n := testing.AllocsPerRun(100, func() { o.Contains(ap("192.0.2.7:40000")); o.Contains(ap("198.51.100.1:1")) }); n != 0 {
		t.Fatalf("Contains allocates %v", n)
	}
}

func TestLocalAddrs(t *testing.T) {
	addrs, err := LocalAddrs()
	require.NoError(t, err)
	assert.Contains(t, addrs, netip.MustParseAddr("127.0.0.1"))
}

// hostEnv marks the child process TestOwnAddrsTrackHost runs in its own
// network namespace.
const hostEnv = "CIDROUTE_TEST_OWN_NETNS"

// TestOwnAddrsTrackHost: an address the host gains while a Pipeline with a
// wildcard listener runs joins the pipeline's own addresses (rtnetlink
// notification), and leaves it when removed. It runs in a fresh network
// namespace, where adding an address disturbs nobody.
func TestOwnAddrsTrackHost(t *testing.T) {
	if os.Getenv(hostEnv) != "1" {
		unshare := testtool.Look(t, "util-linux", "unshare")
		testtool.Look(t, "iproute2", "ip")
		cmd := exec.Command(unshare, "--net", "--map-root-user", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
			os.Args[0], "-test.run=^TestOwnAddrsTrackHost$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), hostEnv+"=1")
		out, err := cmd.CombinedOutput()
		if !bytes.Contains(out, []byte("=== RUN")) {
			// As udpio's shaped-loopback test: no namespace here (no
			// privilege, or a test binary under qemu-user that cannot
			// be re-executed natively).
			t.Skipf("cannot create a network namespace (%v): %s", err, out)
		}
		t.Logf("in a network namespace:\n%s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "--- PASS: TestOwnAddrsTrackHost")
		return
	}
	ip := func(args ...string) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	reg := newRegistry(t, 1)
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "w", Listen: netip.MustParseAddrPort("0.0.0.0:0"), Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: netip.MustParseAddrPort("127.0.0.1:0"), Backends: reg}}}})
	require.NoError(t, err)
	l, _ := p.Addr("w")
	// An address gained between New's scan and Run's subscription sends
	// its notification to nobody: Run rescans once it has subscribed.
	early := netip.AddrPortFrom(netip.MustParseAddr("10.78.0.1"), l.Port())
	ip("addr", "add", "10.78.0.1/24", "dev", "lo")
	require.False(t, p.OwnAddrs().Contains(early))
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	defer func() { require.NoError(t, p.Close()); require.NoError(t, <-errc) }()
	require.Eventually(t, func() bool { return p.OwnAddrs().Contains(early) }, time.Second, time.Millisecond,
		"an address added before Run is in the set once Run has subscribed")
	gained := netip.AddrPortFrom(netip.MustParseAddr("10.77.0.1"), l.Port())
	require.False(t, p.OwnAddrs().Contains(gained))
	start := time.Now()
	ip("addr", "add", "10.77.0.1/24", "dev", "lo")
	require.Eventually(t, func() bool { return p.OwnAddrs().Contains(gained) }, time.Second, time.Millisecond,
		"a new host address joins the set (rtnetlink: well under the %v scan period)", hostScanInterval)
	t.Logf("new address in the set after %v", time.Since(start))
	assert.True(t, p.OwnAddrs().Contains(netip.AddrPortFrom(netip.MustParseAddr("10.77.0.255"), l.Port())), "and its subnet's broadcast")
	ip("addr", "del", "10.77.0.1/24", "dev", "lo")
	require.Eventually(t, func() bool { return !p.OwnAddrs().Contains(gained) }, time.Second, time.Millisecond)

	// AnyIP: a local route delivers every address of its prefix to the
	// host although no interface holds them. A reply aimed at one would
	// come back in at the wildcard service and loop; the reverse rule
	// refuses it once the route's notification is read.
	anyIP := netip.AddrPortFrom(netip.MustParseAddr("10.79.0.77"), l.Port())
	require.False(t, p.OwnAddrs().Contains(anyIP))
	ip("route", "add", "local", "10.79.0.0/24", "dev", "lo")
	require.Eventually(t, func() bool { return p.OwnAddrs().Contains(anyIP) }, time.Second, time.Millisecond,
		"an address of a local route joins the set")
	nets, err := LocalNets()
	require.NoError(t, err)
	assert.Contains(t, nets, netip.MustParsePrefix("10.79.0.0/24"))
	be := netip.MustParseAddrPort("127.0.0.1:15999")
	public := netip.MustParseAddrPort("10.78.0.1:5684")
	r, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: public, Backends: newRegistry(t, 1, backend(0, be.String(), registry.Ready))})
	require.NoError(t, err)
	hdr, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: public, Dst: anyIP})
	require.NoError(t, err)
	v := r.View(p.OwnAddrs())
	assert.Equal(t, BadDestination, r.Reverse(append(hdr, "reply"...), be, Session{}, &v).Reason)
	other := netip.AddrPortFrom(netip.MustParseAddr("10.80.0.9"), anyIP.Port()) // a client outside every local route
	v = r.View(p.OwnAddrs())
	ok := append(must(ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: public, Dst: other})), "reply"...)
	assert.Equal(t, Forwarded, r.Reverse(ok, be, Session{}, &v).Reason)
	ip("route", "del", "local", "10.79.0.0/24", "dev", "lo")
	require.Eventually(t, func() bool { return !p.OwnAddrs().Contains(anyIP) }, time.Second, time.Millisecond)
}
