package proxyconfig_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

// A program that embeds the whole proxy: cidproxy's file, its own backend
// source for services that name none, the library's Pipeline, SIGHUP to
// re-read the backend and key files. (Compiled, not run: it binds the
// file's addresses.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := proxyconfig.Load(ctx, "cidproxy.json")
	if err != nil {
		log.Fatal(err)
	}
	regs, err := cfg.Build(proxyconfig.Options{Source: mySource})
	if err != nil {
		log.Fatal(err)
	}
	defer regs.Close()
	pipe, err := cidroute.New(cidroute.Config{Services: regs.Services()})
	if err != nil {
		log.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			regs.Reload()
		}
	}()
	go regs.Run(ctx)
	if err := pipe.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// mySource stands for the program's own discovery (Consul, etcd, DNS…).
func mySource(s proxyconfig.Service, log *slog.Logger) (registry.Source, error) {
	if s.Backends != nil || s.BackendsFile != "" {
		return nil, nil // the file's backends
	}
	return registry.Static{{Ordinal: 7, Addr: netip.MustParseAddrPort("10.0.0.7:4433")}}, nil
}

func ExampleConfig_Build() {
	cfg, err := proxyconfig.Parse(strings.NewReader(`{
		"hrw_seed": 42,
		"services": [
			{"name": "coaps", "protocol": "dtls", "listen": "0.0.0.0:5684",
			 "backends": [{"ordinal": 0, "address": "10.0.0.10:5684"}]},
			{"name": "h3", "protocol": "quic", "listen": "[::]:443", "workers": 2}
		]
	}`))
	if err != nil {
		log.Fatal(err)
	}
	regs, err := cfg.Build(proxyconfig.Options{Source: mySource, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer regs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { regs.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for _, s := range regs.Services() {
		fmt.Println(s.Name, s.Protocol, s.Listen, "CID length", s.CIDLen, "workers", s.Workers)
	}
	coaps, _ := regs.Registry("coaps")
	b, _ := coaps.Snapshot().Serving(0)
	fmt.Println("coaps ordinal 0:", b.Addr)
	// Output:
	// coaps dtls 0.0.0.0:5684 CID length 8 workers 0
	// h3 quic [::]:443 CID length 12 workers 2
	// coaps ordinal 0: 10.0.0.10:5684
}
