package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
)

const (
	transparentCoAPKey      = "cidroute-coap-psk"
	transparentCoAPIdentity = "cidroute-e2e"
)

// TestTransparentCoAP: libcoap's coap-client GETs resources of libcoap's
// coap-server over DTLS 1.2 with a PSK through a transparent replica.
// Neither reads PROXY protocol nor uses connection IDs (libcoap over
// OpenSSL 3.0 has none), so the replica routes by client address; the
// server sees the replica's upstream socket, one per client, never the
// client.
func TestTransparentCoAP(t *testing.T) {
	client := testtool.Look(t, "libcoap3-bin", "coap-client-openssl")
	server := testtool.Look(t, "libcoap3-bin", "coap-server-openssl")

	// coap-server listens for CoAP on -p and for DTLS on the port above; a
	// loopback address of its own keeps both free.
	host := netip.AddrFrom4([4]byte{127, 0, 2, 1})
	coap := transparentFreePort(t, host)
	dtls := netip.AddrPortFrom(host, coap.Port()+1)
	srv := startTransparentProc(t, "coap-server", server, "-A", host.String(), "-p", strconv.Itoa(int(coap.Port())),
		"-k", transparentCoAPKey, "-v", "7")
	srv.waitFor(t, "created DTLS endpoint "+dtls.String())
	rs := startTransparent(t, 1, netip.AddrPort{}, transparentBackends(dtls))

	for i, res := range []struct{ path, want string }{
		{"/", "This is a test server made with libcoap"},
		{"/.well-known/core", "</time>"},
	} {
		from := transparentFreePort(t, netip.AddrFrom4([4]byte{127, 0, 2, byte(10 + i)}))
		cli := startTransparentProc(t, fmt.Sprintf("coap-client %d", i), client,
			"-m", "get", "-B", "10", "-k", transparentCoAPKey, "-u", transparentCoAPIdentity,
			"-a", from.Addr().String(), "-p", strconv.Itoa(int(from.Port())),
			fmt.Sprintf("coaps://%v%s", rs[0].addr, res.path))
		cli.waitExit(t)
		require.Zero(t, cli.cmd.ProcessState.ExitCode(), "coap-client %d output:\n%s", i, cli.out.String())
		assert.Contains(t, cli.out.String(), res.want, "GET %s", res.path)
		// The server's session is with the replica, not the client.
		line := srv.waitForNth(t, "DTLS: session connected", i+1)
		assert.NotContains(t, line, from.String(), "the server sees the client's upstream socket")
		t.Logf("GET %s from %v: server %s", res.path, from, line)
	}
	assert.Contains(t, srv.out.String(), "got psk_identity: '"+transparentCoAPIdentity+"'")
	assert.Equal(t, 2, rs[0].sessions())
}
