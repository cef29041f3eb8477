package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
)

// transparentSServer is an `openssl s_server -dtls1_2` with a fresh
// self-signed P-256 certificate: a DTLS backend that knows nothing of PROXY
// protocol or connection IDs. It serves one client at a time and prints
// what it receives.
type transparentSServer struct {
	*transparentProc
	addr netip.AddrPort
}

func startTransparentSServer(t *testing.T, openssl, name string) *transparentSServer {
	t.Helper()
	dir := t.TempDir()
	key, cert := filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem")
	out, err := exec.Command(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-subj", "/CN=x", "-days", "1", "-keyout", key, "-out", cert).CombinedOutput()
	require.NoError(t, err, "openssl req: %s", out)
	// Not -quiet: the ACCEPT line tells the port the kernel picked.
	p := startTransparentProc(t, name, openssl, "s_server", "-dtls1_2", "-accept", "127.0.0.1:0",
		"-cert", cert, "-key", key)
	line := p.waitFor(t, "ACCEPT ")
	addr, err := netip.ParseAddrPort(strings.TrimSpace(strings.TrimPrefix(line, "ACCEPT")))
	require.NoError(t, err, "ACCEPT line %q", line)
	return &transparentSServer{transparentProc: p, addr: addr}
}

// startTransparentSClient starts `openssl s_client -dtls1_2` from bind
// (zero: a port the kernel picks) to the proxy at via. It prints only
// what it receives and closes the session (close_notify) when its stdin
// closes.
func startTransparentSClient(t *testing.T, openssl, name string, via, bind netip.AddrPort) *transparentProc {
	t.Helper()
	args := []string{"s_client", "-dtls1_2", "-quiet", "-no_ign_eof", "-connect", via.String()}
	if bind.IsValid() {
		args = append(args, "-bind", bind.String())
	}
	return startTransparentProc(t, name, openssl, args...)
}

// TestTransparentOpenSSL: OpenSSL's DTLS 1.2 client and server, neither of
// which knows PROXY protocol or connection IDs, complete a certificate
// handshake through a transparent replica and exchange lines both ways.
// The server sees the replica's upstream socket for this client, not the
// client.
func TestTransparentOpenSSL(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	srv := startTransparentSServer(t, openssl, "s_server")
	rs := startTransparent(t, 1, netip.AddrPort{}, transparentBackends(srv.addr))

	cli := startTransparentSClient(t, openssl, "s_client", rs[0].addr, netip.AddrPort{})
	// s_client reads stdin once the handshake is done; a line written
	// earlier waits in the pipe.
	up := transparentLine("client", 1)
	cli.send(t, up)
	srv.waitFor(t, up)
	down := transparentLine("server", 1)
	srv.send(t, down)
	cli.waitFor(t, down)
	assert.Equal(t, 1, rs[0].sessions(), "one client address, one upstream socket")

	require.NoError(t, cli.stdin.Close())
	cli.waitExit(t)
	srv.waitFor(t, "DONE") // the close_notify arrived
}

// TestTransparentOpenSSLSpread: two s_server backends behind two
// transparent replicas; s_clients from chosen loopback addresses land on
// the backend HRW names for their address (the same on either replica),
// and both backends get clients. s_server serves one client at a time, so
// the clients take turns.
func TestTransparentOpenSSLSpread(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	srvs := []*transparentSServer{
		startTransparentSServer(t, openssl, "s_server 0"),
		startTransparentSServer(t, openssl, "s_server 1"),
	}
	// The replicas share a public address, as behind a load balancer.
	rs := startTransparent(t, 2, public, transparentBackends(srvs[0].addr, srvs[1].addr))

	// Pick client addresses until each backend is HRW's choice for three.
	const perBackend = 3
	type client struct {
		bind netip.AddrPort
		ord  int
	}
	var clients []client
	count := map[int]int{}
	for host := byte(10); len(clients) < 2*perBackend; host++ {
		require.Less(t, host, byte(250), "HRW never chose one of the backends")
		bind := transparentFreePort(t, netip.AddrFrom4([4]byte{127, 0, 1, host}))
		b, ok := rs[0].reg.Snapshot().PickNewAddrs(bind, public)
		require.True(t, ok)
		if ord := int(b.Ordinal); count[ord] < perBackend {
			count[ord]++
			clients = append(clients, client{bind, ord})
		}
	}

	served := map[int]int{}
	for i, c := range clients {
		via := rs[i%2]
		cli := startTransparentSClient(t, openssl, fmt.Sprintf("s_client %d", i), via.addr, c.bind)
		up := transparentLine(fmt.Sprintf("client %d", i), i)
		cli.send(t, up)
		srvs[c.ord].waitFor(t, up)
		down := transparentLine(fmt.Sprintf("server %d", c.ord), i)
		srvs[c.ord].send(t, down)
		cli.waitFor(t, down)
		// The next client may start once this one's close_notify has
		// reached its server; s_client itself lingers for half a second.
		require.NoError(t, cli.stdin.Close())
		served[c.ord]++
		srvs[c.ord].waitForNth(t, "DONE", served[c.ord])
		t.Logf("client %d from %v via replica %s: backend %d", i, c.bind, via.name, c.ord)
	}
	for ord, srv := range srvs {
		for i, c := range clients {
			if c.ord != ord {
				assert.NotContains(t, srv.out.String(), transparentLine(fmt.Sprintf("client %d", i), i),
					"client %d reached backend %d, HRW chose %d", i, ord, c.ord)
			}
		}
	}
	assert.Equal(t, len(clients), rs[0].sessions()+rs[1].sessions(), "one session per client address, kept until idle")
}
