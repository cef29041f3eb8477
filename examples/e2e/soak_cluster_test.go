package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// The soak harness's fixed addresses and keys. No socket binds the public
// addresses: they are what clients believe they talk to, the service half
// of the HRW key and the PPv2 destination, the same on every replica.
var (
	soakPublic     = netip.MustParseAddrPort("127.0.0.2:5684")
	soakQUICPublic = netip.MustParseAddrPort("127.0.0.2:4433")
	// soakVIP is a service whose public address is not loopback, so that
	// the reverse path's refusal to reflect toward loopback shows.
	soakVIP     = netip.MustParseAddrPort("198.51.100.10:5684")
	soakTrusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	soakPSK     = []byte("cidroute-soak-psk")
)

const (
	soakSeed   = 7
	soakCIDLen = cidroute.DefaultDTLSCIDLen
	// soakRogueOrd is the ordinal under which a raw socket is registered in
	// the flood scenario: a compromised backend forging replies.
	soakRogueOrd = 9
)

func soakQuiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// soakOpts shapes a cluster.
type soakOpts struct {
	Backends int           // DTLS backends, ordinals 0..Backends-1
	MaxAge   time.Duration // registry freshness limit (0 = 2 s)
	Limits   cidroute.Limits
	// QUIC adds a quic service (two quic-go echo backends, static
	// registry); QUICLimits are its admission limits.
	QUIC       bool
	QUICLimits cidroute.Limits
	// Rogue registers a raw socket as a draining DTLS backend, and adds
	// the "vip" service, whose only backend is that socket.
	Rogue bool
	// RecvBuffer is the replicas' socket receive buffer (0: the kernel's
	// default).
	RecvBuffer int
}

// A soakCluster is two proxy replicas (in-process Pipelines with the same
// seed, backends and public addresses), each with its own registries; the
// DTLS registry of each is fed by its own registry.File source reading one
// shared temporary file, as separate proxy processes mounting one
// ConfigMap would be. Backends are real pion/dtls v3 servers with CIDs.
type soakCluster struct {
	t    *testing.T
	opts soakOpts
	path string

	mu   sync.Mutex
	srvs map[uint8]*dtlsecho.Server // live DTLS backends
	old  []*dtlsecho.Server         // stopped ones, for their counters
	list []registry.Backend         // what the file says

	replicas [2]*soakReplica
	dead     []*soakReplica

	quicSrvs []*quicecho.Server
	quicList []registry.Backend
	rogue    *net.UDPConn
	closed   bool

	before soakMem   // the process before the cluster started (soakStart)
	begin  time.Time // when the scenario began
}

type soakReplica struct {
	name         string
	pipe         *cidroute.Pipeline
	reg          *registry.Registry // dtls, fed by src
	qreg, vreg   *registry.Registry // quic and vip (static), or nil
	src          *registry.File
	srcStop      context.CancelFunc
	srcDone      chan error
	addr         netip.AddrPort // dtls service
	qaddr, vaddr netip.AddrPort
	errc         chan error
	final        []cidroute.ServiceStats // after stop
}

func newSoakCluster(t *testing.T, o soakOpts) *soakCluster {
	t.Helper()
	if o.MaxAge == 0 {
		o.MaxAge = 2 * time.Second
	}
	cl := &soakCluster{t: t, opts: o, path: filepath.Join(t.TempDir(), "backends.json"),
		srvs: map[uint8]*dtlsecho.Server{}}
	t.Cleanup(func() { cl.close() })
	for ord := range uint8(o.Backends) {
		s := cl.listenBackend(ord, netip.AddrPort{})
		cl.list = append(cl.list, registry.Backend{Ordinal: ord, Addr: s.Addr()})
	}
	if o.Rogue {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		cl.rogue = c
		cl.list = append(cl.list, registry.Backend{Ordinal: soakRogueOrd, Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), State: registry.Draining})
	}
	if o.QUIC {
		for ord := range uint8(2) {
			s, err := quicecho.Listen(quicecho.Config{Ordinal: ord, TrustedProxies: soakTrusted, Direct: backend.DirectNoHandshake})
			require.NoError(t, err)
			cl.quicSrvs = append(cl.quicSrvs, s)
			cl.quicList = append(cl.quicList, registry.Backend{Ordinal: ord, Addr: s.Addr()})
		}
	}
	cl.writeList(cl.list)
	for i := range cl.replicas {
		cl.startReplica(i, netip.AddrPort{})
	}
	return cl
}

func (cl *soakCluster) listenBackend(ord uint8, at netip.AddrPort) *dtlsecho.Server {
	cl.t.Helper()
	cfg := dtlsecho.Config{Listen: at, Ordinal: ord, PSK: soakPSK, TrustedProxies: soakTrusted,
		Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", ord), HandshakeTimeout: 2 * time.Second}
	var s *dtlsecho.Server
	var err error
	for range 40 { // a restart on the same port: wait for it to be free
		if s, err = dtlsecho.Listen(cfg); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(cl.t, err)
	cl.mu.Lock()
	cl.srvs[ord] = s
	cl.mu.Unlock()
	return s
}

// backend returns the live DTLS backend of ord.
func (cl *soakCluster) backend(ord uint8) *dtlsecho.Server {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.srvs[ord]
}

// killBackend stops the process of ord (the registry still lists it).
func (cl *soakCluster) killBackend(ord uint8) netip.AddrPort {
	cl.mu.Lock()
	s := cl.srvs[ord]
	delete(cl.srvs, ord)
	cl.old = append(cl.old, s)
	cl.mu.Unlock()
	a := s.Addr()
	s.Close()
	return a
}

// writeList replaces the backend file atomically (temp file, rename).
func (cl *soakCluster) writeList(bs []registry.Backend) {
	cl.t.Helper()
	data, err := json.Marshal(bs)
	require.NoError(cl.t, err)
	cl.writeRaw(data)
	cl.mu.Lock()
	cl.list = slices.Clone(bs)
	cl.mu.Unlock()
}

func (cl *soakCluster) writeRaw(data []byte) {
	cl.t.Helper()
	tmp := cl.path + ".tmp"
	require.NoError(cl.t, os.WriteFile(tmp, data, 0o644))
	require.NoError(cl.t, os.Rename(tmp, cl.path))
}

// publish writes bs and waits until every live replica's registry holds it.
func (cl *soakCluster) publish(bs []registry.Backend) {
	cl.t.Helper()
	cl.writeList(bs)
	for _, r := range cl.replicas {
		cl.waitList(r.reg, bs)
	}
}

func (cl *soakCluster) waitList(reg *registry.Registry, bs []registry.Backend) {
	cl.t.Helper()
	want := soakNorm(bs)
	soakEventually(cl.t, 10*time.Second, func() bool {
		return slices.Equal(soakNorm(reg.Snapshot().Backends()), want)
	}, "registry never showed %v", bs)
}

func soakNorm(bs []registry.Backend) []string {
	var out []string
	for _, b := range bs {
		w := max(b.Weight, 1)
		out = append(out, fmt.Sprintf("%d %v %d %v", b.Ordinal, b.Addr, w, b.State))
	}
	slices.Sort(out)
	return out
}

// startReplica starts replica i, on the given DTLS listen address (zero:
// any port), with fresh registries and a fresh File source, as a
// restarted proxy process would have.
func (cl *soakCluster) startReplica(i int, listen netip.AddrPort) {
	t := cl.t
	t.Helper()
	o := cl.opts
	r := &soakReplica{name: fmt.Sprintf("%c%d", 'A'+i, len(cl.dead)), errc: make(chan error, 1)}
	var err error
	r.reg, err = registry.New(registry.Config{Service: "dtls", Seed: soakSeed, MaxAge: o.MaxAge, Logger: soakQuiet()})
	require.NoError(t, err)
	r.src = &registry.File{Path: cl.path, Interval: 20 * time.Millisecond, Logger: soakQuiet()}
	cl.startSource(r)
	cl.mu.Lock()
	list := slices.Clone(cl.list)
	cl.mu.Unlock()
	cl.waitList(r.reg, list)

	if !listen.IsValid() {
		listen = netip.MustParseAddrPort("127.0.0.1:0")
	}
	svcs := []cidroute.Service{{Name: "dtls", Listen: listen, Workers: 2, Limits: o.Limits, RecvBuffer: o.RecvBuffer, SendBuffer: o.RecvBuffer,
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: soakPublic, Backends: r.reg}}}
	if o.QUIC {
		r.qreg = soakStatic(t, "quic", cl.quicList)
		svcs = append(svcs, cidroute.Service{Name: "quic", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 2, Limits: o.QUICLimits, RecvBuffer: o.RecvBuffer, SendBuffer: o.RecvBuffer,
			RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC, PublicAddr: soakQUICPublic, Backends: r.qreg}})
	}
	if o.Rogue {
		r.vreg = soakStatic(t, "vip", []registry.Backend{{Ordinal: 0, Addr: cl.rogue.LocalAddr().(*net.UDPAddr).AddrPort()}})
		svcs = append(svcs, cidroute.Service{Name: "vip", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
			RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: soakVIP, Backends: r.vreg}})
	}
	var p *cidroute.Pipeline
	for range 40 { // a restart on the same port: wait for it to be free
		if p, err = cidroute.New(cidroute.Config{Services: svcs, Logger: soakQuiet()}); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	r.pipe = p
	r.addr, _ = p.Addr("dtls")
	r.qaddr, _ = p.Addr("quic")
	r.vaddr, _ = p.Addr("vip")
	go func() { r.errc <- p.Run(context.Background()) }()
	cl.replicas[i] = r
}

func soakStatic(t *testing.T, name string, bs []registry.Backend) *registry.Registry {
	reg, err := registry.New(registry.Config{Service: name, Seed: soakSeed, Logger: soakQuiet()})
	require.NoError(t, err)
	if len(bs) > 0 { // a new registry is empty; Update refuses an empty list
		require.NoError(t, reg.Update(bs))
	}
	return reg
}

func (cl *soakCluster) startSource(r *soakReplica) {
	ctx, cancel := context.WithCancel(context.Background())
	r.srcStop, r.srcDone = cancel, make(chan error, 1)
	go func() { r.srcDone <- r.src.Run(ctx, r.reg) }()
}

func (cl *soakCluster) stopSource(r *soakReplica) {
	cl.t.Helper()
	r.srcStop()
	require.NoError(cl.t, <-r.srcDone)
}

// stopReplica stops replica i (a proxy process dying): its sockets close,
// and its final counters must balance.
func (cl *soakCluster) stopReplica(i int) *soakReplica {
	t := cl.t
	t.Helper()
	r := cl.replicas[i]
	cl.replicas[i] = nil
	require.NoError(t, r.pipe.Close())
	require.NoError(t, <-r.errc, "replica %s stopped with an error", r.name)
	cl.stopSource(r)
	for _, reg := range []*registry.Registry{r.reg, r.qreg, r.vreg} {
		if reg != nil {
			reg.Close()
		}
	}
	r.final = r.pipe.Stats()
	soakCheckBalanced(t, r.name, r.final)
	cl.dead = append(cl.dead, r)
	return r
}

// close stops everything the cluster started and returns every replica
// incarnation's final counters.
func (cl *soakCluster) close() []*soakReplica {
	if cl.closed {
		return cl.dead
	}
	cl.closed = true
	for i, r := range cl.replicas {
		if r != nil {
			cl.stopReplica(i)
		}
	}
	cl.mu.Lock()
	for ord, s := range cl.srvs {
		s.Close()
		cl.old = append(cl.old, s)
		delete(cl.srvs, ord)
	}
	cl.mu.Unlock()
	for _, s := range cl.quicSrvs {
		s.Close()
	}
	if cl.rogue != nil {
		cl.rogue.Close()
	}
	return cl.dead
}

// proxyDrops is what the kernel dropped at the live replicas' sockets
// (service and upstream) for want of buffer space: datagrams sent to a
// replica that it never read, so never counted.
func (cl *soakCluster) proxyDrops() uint64 {
	ports := map[uint16]bool{}
	for _, r := range cl.live() {
		for _, a := range []netip.AddrPort{r.addr, r.qaddr, r.vaddr} {
			if a.IsValid() {
				ports[a.Port()] = true
			}
		}
		for _, svc := range []string{"dtls", "quic", "vip"} {
			ups, _ := r.pipe.UpstreamAddrs(svc)
			for _, u := range ups {
				ports[u.Port()] = true
			}
		}
	}
	return soakSockDrops(ports)
}

// soakOverflows are the kernel's socket-buffer drops at the cluster's
// sockets, by role.
type soakOverflows struct{ Proxy, Backend, Client uint64 }

func (o soakOverflows) Total() uint64 { return o.Proxy + o.Backend + o.Client }

func (o soakOverflows) String() string {
	return fmt.Sprintf("%d (proxies %d, backends %d, clients %d)", o.Total(), o.Proxy, o.Backend, o.Client)
}

// allDrops is proxyDrops, and the drops at the live backends' and the
// given clients' sockets.
func (cl *soakCluster) allDrops(clients ...[]*soakClient) soakOverflows {
	bports, cports := map[uint16]bool{}, map[uint16]bool{}
	cl.mu.Lock()
	for _, s := range cl.srvs {
		bports[s.Addr().Port()] = true
	}
	cl.mu.Unlock()
	for _, s := range cl.quicSrvs {
		bports[s.Addr().Port()] = true
	}
	for _, list := range clients {
		for _, c := range list {
			cports[c.sock.Local().Port()] = true
		}
	}
	return soakOverflows{Proxy: cl.proxyDrops(), Backend: soakSockDrops(bports), Client: soakSockDrops(cports)}
}

// release drops the closed cluster's references to pipelines and servers,
// so that the heap measured afterwards holds only what they left behind.
func (cl *soakCluster) release() {
	for _, r := range cl.dead {
		r.pipe, r.reg, r.qreg, r.vreg, r.src = nil, nil, nil, nil, nil
	}
	cl.mu.Lock()
	cl.old, cl.quicSrvs, cl.rogue = nil, nil, nil
	cl.mu.Unlock()
}

// live returns the running replicas.
func (cl *soakCluster) live() []*soakReplica {
	var out []*soakReplica
	for _, r := range cl.replicas {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}

// quiet waits until every running replica's counters stop moving and
// balance, and returns them by replica. Counters are flushed once per
// batch, so a reader during traffic may see received ahead of the rest.
func (cl *soakCluster) quiet() [][]cidroute.ServiceStats {
	cl.t.Helper()
	var out [][]cidroute.ServiceStats
	for _, r := range cl.live() {
		// Settled: unchanged and balanced over four reads 25 ms apart
		// (quic-go may still send a delayed ACK 25 ms after the rest).
		prev := r.pipe.Stats()
		settled, same := false, 0
		for range 400 {
			time.Sleep(25 * time.Millisecond)
			cur := r.pipe.Stats()
			if slices.EqualFunc(cur, prev, func(a, b cidroute.ServiceStats) bool { return a == b }) && soakBalanced(cur) {
				if same++; same == 4 {
					settled = true
					break
				}
			} else {
				same = 0
			}
			prev = cur
		}
		require.True(cl.t, settled, "replica %s: counters never settled: %+v", r.name, prev)
		soakCheckBalanced(cl.t, r.name, prev)
		out = append(out, prev)
	}
	return out
}

func soakBalanced(ss []cidroute.ServiceStats) bool {
	for _, s := range ss {
		if !s.Forward.Balanced() || !s.Reverse.Balanced() {
			return false
		}
	}
	return true
}

// soakCheckBalanced asserts received = forwarded + Σ dropped for every
// service and direction of one replica.
func soakCheckBalanced(t *testing.T, name string, ss []cidroute.ServiceStats) {
	t.Helper()
	for _, s := range ss {
		require.True(t, s.Forward.Balanced(), "replica %s %s forward: %+v", name, s.Name, s.Forward)
		require.True(t, s.Reverse.Balanced(), "replica %s %s reverse: %+v", name, s.Name, s.Reverse)
	}
}

// soakTotals sums one service's counters over replicas (live ones now,
// dead ones as they ended).
type soakTotals struct{ Fwd, Rev cidroute.Counters }

func (cl *soakCluster) totals(service string) soakTotals {
	var tot soakTotals
	for _, r := range cl.live() {
		tot.add(r.pipe.Stats(), service)
	}
	for _, r := range cl.dead {
		tot.add(r.final, service)
	}
	return tot
}

func (tot *soakTotals) add(ss []cidroute.ServiceStats, service string) {
	for _, s := range ss {
		if s.Name == service {
			soakAdd(&tot.Fwd, &s.Forward, 1)
			soakAdd(&tot.Rev, &s.Reverse, 1)
		}
	}
}

func soakAdd(c, o *cidroute.Counters, sign int) {
	s := uint64(sign) // two's complement: -1 subtracts
	c.Received += s * o.Received
	c.Forwarded += s * o.Forwarded
	for i := range c.Dropped {
		c.Dropped[i] += s * o.Dropped[i]
	}
}

// sub returns tot − before.
func (tot soakTotals) sub(before soakTotals) soakTotals {
	soakAdd(&tot.Fwd, &before.Fwd, -1)
	soakAdd(&tot.Rev, &before.Rev, -1)
	return tot
}

// soakDrops lists a counter's nonzero drop reasons.
func soakDrops(c cidroute.Counters) map[string]uint64 {
	m := map[string]uint64{}
	for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
		if c.Dropped[r] > 0 {
			m[r.String()] = c.Dropped[r]
		}
	}
	return m
}

// soakOnly asserts that no drop reason but the allowed ones moved.
func soakOnly(t *testing.T, what string, c cidroute.Counters, allowed ...cidroute.Reason) {
	t.Helper()
	for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
		if !slices.Contains(allowed, r) {
			require.Zero(t, c.Dropped[r], "%s: unexpected %s drops (all: %v)", what, r, soakDrops(c))
		}
	}
}

// backendStats sums the PPv2 adapters' and demultiplexers' counters of
// every DTLS backend the cluster ever ran.
func (cl *soakCluster) backendStats() (backend.Stats, soakDemux) {
	cl.mu.Lock()
	all := slices.Clone(cl.old)
	for _, s := range cl.srvs {
		all = append(all, s)
	}
	cl.mu.Unlock()
	var bs backend.Stats
	var dm soakDemux
	for _, s := range all {
		b, d := s.Stats()
		bs.AcceptedProxied += b.AcceptedProxied
		bs.WrittenProxied += b.WrittenProxied
		bs.DroppedUntrusted += b.DroppedUntrusted
		bs.DroppedBadHeader += b.DroppedBadHeader
		bs.DroppedDirectHandshake += b.DroppedDirectHandshake
		dm.NewSessions += d.NewSessions
		dm.NoSession += d.DroppedNoSession
		dm.Malformed += d.DroppedMalformed
		dm.Backlog += d.DroppedBacklog
		dm.Queue += d.DroppedQueue
	}
	return bs, dm
}

type soakDemux struct{ NewSessions, NoSession, Malformed, Backlog, Queue uint64 }

func soakEventually(t *testing.T, within time.Duration, ok func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
