// Package testproxy starts cidroute proxy replicas for tests of the
// packages around it (backend adapters, examples): one service on
// loopback, its own registry, stopped when the test ends.
package testproxy

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// Start runs one replica of svc in front of bs with HRW seed seed. Name,
// Listen and Workers default to "svc", 127.0.0.1:0 and 1; Backends is the
// replica's own registry. When the test ends the pipeline is closed and
// Run must have returned nil.
func Start(t testing.TB, seed uint64, bs []registry.Backend, svc cidroute.Service) (*cidroute.Pipeline, netip.AddrPort) {
	t.Helper()
	if svc.Name == "" {
		svc.Name = "svc"
	}
	if !svc.Listen.IsValid() {
		svc.Listen = netip.MustParseAddrPort("127.0.0.1:0")
	}
	if svc.Workers == 0 {
		svc.Workers = 1
	}
	reg, err := registry.New(registry.Config{Service: svc.Name, Seed: seed, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	if err := reg.Update(bs); err != nil {
		t.Fatal(err)
	}
	svc.Backends = reg
	p, err := cidroute.New(cidroute.Config{Services: []cidroute.Service{svc}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		if err := <-errc; err != nil {
			t.Error(err)
		}
	})
	addr, _ := p.Addr(svc.Name)
	return p, addr
}
