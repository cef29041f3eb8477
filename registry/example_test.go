package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/registry"
)

func Example() {
	r, err := registry.New(registry.Config{Service: "coap", Seed: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	backends, err := registry.DecodeBackends(strings.NewReader(`[
		{"ordinal": 0, "address": "10.0.0.10:5684"},
		{"ordinal": 1, "address": "10.0.0.11:5684", "state": "draining"},
		{"ordinal": 2, "address": "10.0.0.12:5684", "state": "gone"}
	]`))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Update(backends); err != nil {
		log.Fatal(err)
	}

	// One snapshot per datagram: every answer comes from the same view.
	s := r.Snapshot()
	for o := range uint8(4) {
		b, ok := s.Serving(o)
		fmt.Printf("CID ordinal %d: serving=%v", o, ok)
		if b != nil {
			fmt.Printf(" (%v)", b.State)
		}
		fmt.Println()
	}
	b, _ := s.PickNew([]byte("client DCID")) // only ready backends
	fmt.Println("new session →", b.Ordinal, b.Addr)
	fmt.Println("reply from draining backend accepted:", s.IsBackend(netip.MustParseAddrPort("10.0.0.11:5684")))
	fmt.Println("reply from gone backend accepted:", s.IsBackend(netip.MustParseAddrPort("10.0.0.12:5684")))

	err = r.Update([]registry.Backend{
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.10:5684")},
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.20:5684")},
	})
	fmt.Println("duplicate rejected:", errors.Is(err, registry.ErrDuplicateOrdinal), "version still", r.Snapshot().Version())
	// Output:
	// CID ordinal 0: serving=true (ready)
	// CID ordinal 1: serving=true (draining)
	// CID ordinal 2: serving=false (gone)
	// CID ordinal 3: serving=false
	// new session → 0 10.0.0.10:5684
	// reply from draining backend accepted: true
	// reply from gone backend accepted: false
	// duplicate rejected: true version still 1
}

// A registry fed by a JSON file, reloaded on SIGHUP, stale (new sessions
// refused) when the file has not been readable for 30 seconds.
func ExampleFile() {
	r, err := registry.New(registry.Config{Service: "coap", MaxAge: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	src := &registry.File{Path: "/etc/cidproxy/coap-backends.json"}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			src.Reload()
		}
	}()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_ = src.Run(ctx, r) // until interrupted
}

func ExampleStatic() {
	r, err := registry.New(registry.Config{Service: "quic"})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- registry.Static{
			{Ordinal: 0, Addr: netip.MustParseAddrPort("[fd00::10]:443"), Weight: 2},
			{Ordinal: 1, Addr: netip.MustParseAddrPort("[fd00::11]:443")},
		}.Run(ctx, r)
	}()
	for r.Snapshot().Version() == 0 {
		time.Sleep(time.Millisecond)
	}
	fmt.Println(r.Snapshot().Backends())
	cancel()
	fmt.Println(<-done)
	// Output:
	// [{0 [fd00::10]:443 2 ready} {1 [fd00::11]:443 1 ready}]
	// <nil>
}

// A fixed list in one call: what a program with its own loop, or a test,
// routes by when it has no file or watch to follow.
func ExampleNewStatic() {
	r, err := registry.NewStatic(registry.Config{Service: "coap", Seed: 42}, []registry.Backend{
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.10:5684")},
		{Ordinal: 1, Addr: netip.MustParseAddrPort("10.0.0.11:5684"), Weight: 2},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	b, _ := r.Snapshot().Serving(1)
	fmt.Println(b.Addr, b.Weight, b.State)
	// Output: 10.0.0.11:5684 2 ready
}

// A backend's ordinal: the -ordinal flag when given, else the suffix of
// its pod's name (HOSTNAME in Kubernetes, ds-2 → 2), parsed as the proxies'
// Kubernetes source parses it.
func ExampleOwnOrdinal() {
	flag := -1 // -ordinal not given
	ord, from, err := registry.OwnOrdinal(flag)
	if err != nil {
		log.Fatal(err) // "registry: no usable ordinal" outside a StatefulSet
	}
	log.Printf("ordinal %d (from %s)", ord, from)
}
