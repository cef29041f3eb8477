package cidroutetest

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// A Proxy is one running proxy replica of one service.
type Proxy struct {
	// Pipeline is the replica: Stats, Router, UpstreamAddrs.
	*cidroute.Pipeline
	// Addr is where clients send: the service's bound address.
	Addr netip.AddrPort
	// Registry is the replica's own registry of backends; Update it to add,
	// drain or remove one.
	Registry *registry.Registry

	errc chan error
	once sync.Once
	err  error
}

// New starts one replica of svc in front of bs, with HRW seed seed, and
// returns it running. Name, Listen and Workers default to "svc",
// 127.0.0.1:0 and 1, and the public address to Listen; svc.Backends is
// replaced by the replica's own registry holding bs. It logs nothing:
// tests read its Stats. Close stops it.
func New(seed uint64, svc cidroute.Service, bs ...registry.Backend) (*Proxy, error) {
	if svc.Name == "" {
		svc.Name = "svc"
	}
	if !svc.Listen.IsValid() && len(svc.Conns) == 0 {
		svc.Listen = netip.MustParseAddrPort("127.0.0.1:0")
	}
	if svc.Workers == 0 && len(svc.Conns) == 0 {
		svc.Workers = 1
	}
	quiet := slog.New(slog.DiscardHandler)
	reg, err := registry.NewStatic(registry.Config{Service: svc.Name, Seed: seed, Logger: quiet}, bs)
	if err != nil {
		return nil, err
	}
	svc.Backends = reg
	p, err := cidroute.New(cidroute.Config{Services: []cidroute.Service{svc}, Logger: quiet})
	if err != nil {
		reg.Close()
		return nil, err
	}
	pr := &Proxy{Pipeline: p, Registry: reg, errc: make(chan error, 1)}
	pr.Addr, _ = p.Addr(svc.Name)
	go func() { pr.errc <- p.Run(context.Background()) }()
	return pr, nil
}

// Close stops the replica, waits for it and returns what its Run returned
// (nil after a clean stop). It is idempotent.
func (p *Proxy) Close() error {
	p.once.Do(func() {
		p.err = p.Pipeline.Close()
		// ErrClosed: Close came before Run had started, and Run never ran.
		if err := <-p.errc; p.err == nil && !errors.Is(err, cidroute.ErrClosed) {
			p.err = err
		}
		p.Registry.Close()
	})
	return p.err
}

// Start is New for a test: it fails t at once if the replica cannot
// start, and closes it when the test ends, failing t unless it stopped
// cleanly.
func Start(t testing.TB, seed uint64, svc cidroute.Service, bs ...registry.Backend) *Proxy {
	t.Helper()
	p, err := New(seed, svc, bs...)
	if err != nil {
		t.Fatalf("cidroutetest: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("cidroutetest: proxy %v: %v", p.Addr, err)
		}
	})
	return p
}
