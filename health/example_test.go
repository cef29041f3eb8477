package health_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
)

// A Checker beside a service's registry: a backend that stops answering
// the DTLS probe is routed as draining until it answers again.
func ExampleNew() {
	reg, _ := registry.New(registry.Config{Service: "coaps", Seed: 42})
	defer reg.Close()
	reg.Update([]registry.Backend{
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.10:5684")},
		{Ordinal: 1, Addr: netip.MustParseAddrPort("10.0.0.11:5684")},
	})
	c, err := health.New(reg, health.Config{
		ProbeConfig: health.ProbeConfig{Protocol: cidroute.DTLS},
		Service:     "coaps",
		Interval:    2 * time.Second, Timeout: time.Second, Fall: 3, Rise: 2,
		Logger: slog.Default(),
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	// ... the pipeline routes by reg; c.Stats() feeds the metrics.
}

// The QUIC probe: a long header of a reserved version, padded to the
// smallest Initial datagram.
func ExampleAppendVersionProbe() {
	b := health.AppendVersionProbe(nil, 0x1a2a3a4a, []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{9, 9})
	fmt.Printf("% x ... (%d bytes)\n", b[:17], len(b))
	// Output: c0 1a 2a 3a 4a 08 01 02 03 04 05 06 07 08 02 09 09 ... (1200 bytes)
}

// One probe by hand, as the runbook does with cidproxy -probe-dtls.
func ExampleProbe() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rtt, err := health.Probe(ctx, netip.MustParseAddrPort("127.0.0.1:5684"), health.ProbeConfig{Protocol: cidroute.DTLS})
	if err != nil {
		fmt.Println("down:", health.ResultOf(err))
		return
	}
	fmt.Println("up in", rtt)
}
