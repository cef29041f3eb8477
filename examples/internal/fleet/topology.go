package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cidroute/cidroute/examples/internal/lwm2m"
	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// The proxies' health checks: a draining or stopped server is taken out
// of new sessions' choices within three probes, 1.5 s; the timeout is
// generous because a loaded machine answers late, and a backend marked
// down by mistake moves the handshakes begun on it.
const (
	probeInterval = "500ms"
	probeTimeout  = "450ms"
	probeFall     = 3
	probeRise     = 2
	probeWait     = 3 * time.Second // for a restarted server to be probed up
)

// A serverSlot is one replica of the LwM2M server: an ordinal and an
// address that outlive the processes serving them (a StatefulSet's pod).
type serverSlot struct {
	ordinal uint8
	addr    netip.AddrPort
	cfg     lwm2m.ServerConfig

	mu   sync.Mutex
	cur  *lwm2m.Server
	past []lwm2m.Stats // of the instances that ended
}

func (s *serverSlot) start() error {
	cfg := s.cfg
	cfg.Listen = s.addr
	var err error
	for try := 0; try < 50; try++ { // the previous instance's socket is closing
		var srv *lwm2m.Server
		if srv, err = lwm2m.Listen(cfg); err == nil {
			if !s.addr.IsValid() {
				s.addr = srv.Addr()
			}
			s.mu.Lock()
			s.cur = srv
			s.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// stop drains the server for drain and closes it; 0 closes it at once
// (close_notify to every session), below 0 kills it (no close_notify).
func (s *serverSlot) stop(drain time.Duration) {
	s.mu.Lock()
	srv := s.cur
	s.mu.Unlock()
	if srv == nil {
		return
	}
	switch {
	case drain > 0:
		ctx, cancel := context.WithTimeout(context.Background(), drain)
		srv.Drain(ctx)
		cancel()
		srv.Close()
	case drain < 0:
		srv.Kill()
	default:
		srv.Close()
	}
	s.mu.Lock()
	s.past = append(s.past, srv.Stats())
	s.cur = nil
	s.mu.Unlock()
}

// stats sums the counters of every instance the slot ran.
func (s *serverSlot) stats() lwm2m.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := append([]lwm2m.Stats(nil), s.past...)
	if s.cur != nil {
		all = append(all, s.cur.Stats())
	}
	return sumStats(all)
}

func sumStats(all []lwm2m.Stats) lwm2m.Stats {
	var t lwm2m.Stats
	for _, st := range all {
		t.Handshakes += st.Handshakes
		t.HandshakeFailed += st.HandshakeFailed
		t.Sessions += st.Sessions
		t.Registrations += st.Registrations
		t.ReRegistrations += st.ReRegistrations
		t.Updates += st.Updates
		t.UpdatesUnknown += st.UpdatesUnknown
		t.Deregistrations += st.Deregistrations
		t.Expired += st.Expired
		t.Registered += st.Registered
		t.Observations += st.Observations
		t.ObserveFailed += st.ObserveFailed
		t.Notifications += st.Notifications
		t.Duplicates += st.Duplicates
		t.BadRequests += st.BadRequests
		t.DroppedNoSess += st.DroppedNoSess
		t.DroppedForeign += st.DroppedForeign
		t.Cut += st.Cut
	}
	return t
}

// A proxySlot is one cidproxy replica (examples/internal/proxyapp, what
// the cidproxy command runs), in this process: its listen address, its
// handover socket, and the instance serving now.
type proxySlot struct {
	addr     netip.AddrPort
	args     []string
	logw     io.Writer
	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan int
	restarts int
}

func (p *proxySlot) start() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- proxyapp.Run(ctx, p.args, io.Discard, p.logw, proxyapp.Options{}) }()
	p.mu.Lock()
	p.cancel, p.done = cancel, done
	p.mu.Unlock()
	// Up when its port is taken (the replica binds it with SO_REUSEPORT;
	// a plain socket then cannot).
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case rc := <-done:
			return fmt.Errorf("proxy replica %v exited with status %d", p.addr, rc)
		default:
		}
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(p.addr))
		if err != nil {
			return nil
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	return fmt.Errorf("proxy replica %v did not start", p.addr)
}

// restart replaces the replica by a new instance that takes its sockets
// over (proxyapp's restart handover): the old one exits once it has.
func (p *proxySlot) restart() error {
	p.mu.Lock()
	oldCancel, oldDone := p.cancel, p.done
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- proxyapp.Run(ctx, p.args, io.Discard, p.logw, proxyapp.Options{}) }()
	select {
	case <-oldDone:
	case rc := <-done:
		cancel()
		return fmt.Errorf("proxy replica %v: the new instance exited with status %d", p.addr, rc)
	case <-time.After(60 * time.Second):
		cancel()
		return fmt.Errorf("proxy replica %v: no handover within 60 s", p.addr)
	}
	oldCancel()
	p.mu.Lock()
	p.cancel, p.done = cancel, done
	p.restarts++
	p.mu.Unlock()
	return nil
}

// kill stops the replica without a successor.
func (p *proxySlot) kill() {
	p.mu.Lock()
	cancel, done := p.cancel, p.done
	p.cancel = nil
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// A balancer stands for the load balancer in front of the proxy
// replicas (a cloud NLB): it picks a replica by a hash of the client's
// address among those it considers alive.
type balancer struct {
	seed maphash.Seed
	mu   sync.RWMutex
	live []netip.AddrPort
}

func (b *balancer) pick(client netip.AddrPort) netip.AddrPort {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if len(b.live) == 0 {
		return netip.AddrPort{}
	}
	return b.live[maphash.Comparable(b.seed, client)%uint64(len(b.live))]
}

func (b *balancer) remove(a netip.AddrPort) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, l := range b.live {
		if l == a {
			b.live = append(b.live[:i:i], b.live[i+1:]...)
			return
		}
	}
}

// topology is the servers and proxies of one run.
type topology struct {
	dir     string
	servers []*serverSlot
	proxies []*proxySlot
	lb      *balancer
	public  netip.AddrPort
	stats   []string // external servers' /stats URLs
}

// psk is every device's key (the identities differ).
var psk = []byte("cidroute fleet key")

func startTopology(cfg *Config) (_ *topology, err error) {
	dir, err := os.MkdirTemp("", "cidroute-fleet-")
	if err != nil {
		return nil, err
	}
	t := &topology{dir: dir, lb: &balancer{seed: maphash.MakeSeed()}, public: netip.MustParseAddrPort("127.0.0.2:5684")}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	type fileBackend struct {
		Ordinal uint8  `json:"ordinal"`
		Address string `json:"address"`
		State   string `json:"state"`
	}
	var backends []fileBackend
	for i := range cfg.Servers {
		s := &serverSlot{ordinal: uint8(i), cfg: lwm2m.ServerConfig{
			Ordinal: uint8(i), PSK: psk, TrustedProxies: loopback, Direct: backend.DirectDrop,
			ACKTimeout: cfg.ACKTimeout, MaxRetransmit: cfg.MaxRetransmit, RouteIdle: cfg.RouteIdle,
			HandshakeTimeout: cfg.HandshakeTimeout,
		}}
		if err := s.start(); err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
		t.servers = append(t.servers, s)
		backends = append(backends, fileBackend{Ordinal: uint8(i), Address: s.addr.String(), State: "ready"})
	}
	for i := range cfg.Proxies {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		conf := map[string]any{
			"hrw_seed":  42,
			"log_level": "warn",
			"services": []any{map[string]any{
				"name": "lwm2m", "protocol": "dtls", "listen": addr.String(),
				"cid_length": 8, "workers": 1, "backends": backends,
				"health_check": map[string]any{"interval": probeInterval, "timeout": probeTimeout, "fall": probeFall, "rise": probeRise},
			}},
		}
		b, _ := json.MarshalIndent(conf, "", "  ")
		path := filepath.Join(dir, fmt.Sprintf("proxy-%d.json", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
		p := &proxySlot{addr: addr, logw: cfg.Log,
			args: []string{"-config", path, "-handover", filepath.Join(dir, fmt.Sprintf("proxy-%d.sock", i))}}
		if err := p.start(); err != nil {
			return nil, err
		}
		t.proxies = append(t.proxies, p)
		t.lb.live = append(t.lb.live, addr)
	}
	return t, nil
}

func freePort() (uint16, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port(), nil
}

func (t *topology) close() {
	for _, p := range t.proxies {
		p.kill()
	}
	for _, s := range t.servers {
		s.stop(0)
	}
	if t.dir != "" {
		os.RemoveAll(t.dir)
	}
}

// externalTopology is the proxies of cfg.Connect, started by someone
// else.
func externalTopology(cfg *Config) *topology {
	t := &topology{lb: &balancer{seed: maphash.MakeSeed()}, public: netip.MustParseAddrPort("127.0.0.2:5684"), stats: cfg.ServerStats}
	t.lb.live = append(t.lb.live, cfg.Connect...)
	return t
}

func (t *topology) serverStats() []lwm2m.Stats {
	var out []lwm2m.Stats
	for _, u := range t.stats {
		var st lwm2m.Stats
		cl := http.Client{Timeout: 5 * time.Second}
		resp, err := cl.Get(u)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
		if err == nil {
			out = append(out, st)
		}
	}
	for _, s := range t.servers {
		st := s.stats()
		st.Ordinal = s.ordinal
		out = append(out, st)
	}
	return out
}
