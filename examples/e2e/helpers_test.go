package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"

	"github.com/cidroute/cidroute/internal/testtool"
)

// The replicas' common public address, the VIP of a load balancer in
// production. No socket binds it: it is the HRW key's service half, the
// PPv2 destination the backends see, and what the clients believe they
// talk to.
var public = netip.MustParseAddrPort("127.0.0.2:5684")

// Backends trust PPv2 from loopback, where the replicas' upstream sockets
// are.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

var testPSK = []byte("cidroute-e2e-psk")

const hrwSeed = 42

// syncBuffer is a log sink shared by goroutines and the test.
type syncBuffer = testtool.SyncBuffer

// A replica is one in-process proxy: a Pipeline with its own registry.
// All replicas of a test share the seed, the backends and the public
// address, and nothing else.
type replica struct {
	name string
	pipe *cidroute.Pipeline
	reg  *registry.Registry
	addr netip.AddrPort // where clients send
}

// startReplicas starts n replicas of one service. When the test ends each
// is stopped and its counters must balance (received = forwarded + Σ
// dropped, per direction).
func startReplicas(t *testing.T, n int, proto cidroute.Protocol, bs []registry.Backend) []*replica {
	t.Helper()
	return startServiceReplicas(t, n, bs, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: proto, PublicAddr: public}})
}

// startServiceReplicas starts n replicas of svc (name, listen address,
// workers and registry filled in), each with its own registry holding bs.
func startServiceReplicas(t *testing.T, n int, bs []registry.Backend, svc cidroute.Service) []*replica {
	t.Helper()
	var rs []*replica
	for i := range n {
		reg, err := registry.New(registry.Config{Service: "svc", Seed: hrwSeed, Logger: quiet()})
		require.NoError(t, err)
		require.NoError(t, reg.Update(bs))
		s := svc
		s.Name, s.Listen, s.Workers, s.Backends = "svc", netip.MustParseAddrPort("127.0.0.1:0"), 1, reg
		p, err := cidroute.New(cidroute.Config{Services: []cidroute.Service{s}, Logger: quiet()})
		require.NoError(t, err)
		r := &replica{name: string(rune('A' + i)), pipe: p, reg: reg}
		r.addr, _ = p.Addr("svc")
		errc := make(chan error, 1)
		go func() { errc <- p.Run(context.Background()) }()
		t.Cleanup(func() {
			require.NoError(t, p.Close())
			require.NoError(t, <-errc)
			reg.Close()
			checkCounters(t, r)
		})
		rs = append(rs, r)
	}
	return rs
}

// checkCounters asserts the counter identity of a stopped replica.
func checkCounters(t *testing.T, r *replica) {
	t.Helper()
	for _, s := range r.pipe.Stats() {
		for dir, c := range map[string]cidroute.Counters{"forward": s.Forward, "reverse": s.Reverse} {
			require.True(t, c.Balanced(), "replica %s %s: received %d != forwarded %d + dropped %d",
				r.name, dir, c.Received, c.Forwarded, c.DroppedTotal())
			t.Logf("replica %s %s: received %d = forwarded %d + dropped %d %v", r.name, dir, c.Received, c.Forwarded, c.DroppedTotal(), dropList(&c))
		}
	}
}

func dropList(c *cidroute.Counters) map[string]uint64 {
	m := map[string]uint64{}
	for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
		if c.Dropped[r] > 0 {
			m[r.String()] = c.Dropped[r]
		}
	}
	return m
}

// forward sums the replicas' forward counters.
func forward(rs []*replica) cidroute.Counters {
	var sum cidroute.Counters
	for _, r := range rs {
		for _, s := range r.pipe.Stats() {
			sum.Received += s.Forward.Received
			sum.Forwarded += s.Forward.Forwarded
			for i := range sum.Dropped {
				sum.Dropped[i] += s.Forward.Dropped[i]
			}
		}
	}
	return sum
}

// setBackends publishes bs on every replica.
func setBackends(t *testing.T, rs []*replica, bs []registry.Backend) {
	t.Helper()
	for _, r := range rs {
		require.NoError(t, r.reg.Update(bs))
	}
}

// replicaOf returns the replica whose upstream socket sent as a (the
// measured proxy a backend reports). Upstream sockets bind the wildcard
// address, so the port tells them apart.
func replicaOf(rs []*replica, a netip.AddrPort) *replica {
	for _, r := range rs {
		ups, _ := r.pipe.UpstreamAddrs("svc")
		for _, up := range ups {
			if up.Port() == a.Port() && a.Addr().IsLoopback() {
				return r
			}
		}
	}
	return nil
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// dtlsBackend is a pion/dtls v3 echo server behind the PPv2 adapter. It
// answers m with "<ordinal>|m" and logs to logs. Direct ClientHellos are
// dropped, so no client reaches it without a proxy.
func dtlsBackend(t *testing.T, ord uint8, logs *syncBuffer) *dtlsecho.Server {
	t.Helper()
	cfg := dtlsecho.Config{Ordinal: ord, PSK: testPSK, TrustedProxies: loopback,
		Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", ord)}
	if logs != nil {
		cfg.Logger = newLogger(logs)
	}
	s, err := dtlsecho.Listen(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func dtlsBackends(t *testing.T, n int, logs *syncBuffer) ([]*dtlsecho.Server, []registry.Backend) {
	var srvs []*dtlsecho.Server
	var bs []registry.Backend
	for ord := range uint8(n) {
		s := dtlsBackend(t, ord, logs)
		srvs = append(srvs, s)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: s.Addr()})
	}
	return srvs, bs
}

// A dtlsClient is a pion/dtls v3 client with CID on a socket it can
// rebind. It believes it talks to the public address.
type dtlsClient struct {
	sock *cidroutetest.RebindConn
	conn *pion.Conn
}

func dialDTLS(ctx context.Context, via netip.AddrPort) (*dtlsClient, error) {
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	if err != nil {
		return nil, err
	}
	sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
	c, err := pion.Client(sock, net.UDPAddrFromAddrPort(public), dtlsecho.PSKClientConfig(testPSK, "e2e"))
	if err != nil {
		sock.Close()
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake via %v: %w", via, err)
	}
	return &dtlsClient{sock: sock, conn: c}, nil
}

func mustDialDTLS(t *testing.T, via netip.AddrPort) *dtlsClient {
	t.Helper()
	c, err := dialDTLS(context.Background(), via)
	require.NoError(t, err)
	t.Cleanup(func() { c.conn.Close() })
	return c
}

// errNoReply is returned by ask when every try timed out.
var errNoReply = errors.New("no reply")

// resent counts the records ask sent again after a timeout. On loopback
// nothing is lost, except for one pion/dtls v3.1.15 race: its read loop
// hands a record to the application before it moves the session's peer
// address to the record's source (RFC 9146 §6), so the echo of the first
// record after a rebinding can still be written to the old address, via
// the old replica to the closed old socket. The client then resends, as
// a CoAP client would.
var resent atomic.Int64

// replyWait is how long ask waits for an echo before resending; a round
// trip on loopback takes well under a millisecond, even under -race.
const replyWait = 500 * time.Millisecond

// ask sends msg and returns the reply; it tries `tries` times, waiting
// `wait` for each reply.
func (c *dtlsClient) ask(msg string, tries int, wait time.Duration) (string, error) {
	return ask(c.conn, msg, tries, wait)
}

// ask sends msg over a DTLS connection and returns the reply. A late
// reply to an earlier message (one that timed out and was sent again) is
// not the answer: it is passed over.
func ask(c net.Conn, msg string, tries int, wait time.Duration) (string, error) {
	buf := make([]byte, 2048)
	for try := range tries {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(wait))
		for {
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if try < tries-1 {
					resent.Add(1)
				}
				break
			}
			if err != nil {
				return "", err
			}
			if reply := string(buf[:n]); reply == msg || strings.HasSuffix(reply, "|"+msg) {
				return reply, nil
			}
		}
	}
	return "", errNoReply
}

// ordinal returns the backend ordinal in the session's CID (ordinal-first:
// byte 0), or -1 before the client has sent a tls12_cid record.
func (c *dtlsClient) ordinal() int {
	if cid := c.sock.CID(); len(cid) > 0 {
		return int(cid[0])
	}
	return -1
}

// within runs f in parallel over n indexes, at most par at a time, and
// returns the first error.
func within(n, par int, f func(i int) error) error {
	sem := make(chan struct{}, par)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
