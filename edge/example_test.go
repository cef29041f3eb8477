package edge_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cidroute/cidroute/edge"
)

// A Chooser over three edges. The probe here reads a table of round-trip
// times; a real one is a full handshake through the edge (the dialers in
// dtls/piondtls and quic/quicgo bring theirs). In a client, the resolver
// is edge.LookupHost("edges.example.net", 5684), and Run replaces the
// manual Steps.
func Example() {
	a := netip.MustParseAddrPort("192.0.2.1:5684")
	b := netip.MustParseAddrPort("192.0.2.2:5684")
	c := netip.MustParseAddrPort("192.0.2.3:5684")
	var mu sync.Mutex
	rtt := map[netip.AddrPort]time.Duration{a: 80 * time.Millisecond, b: 5 * time.Millisecond, c: 30 * time.Millisecond}

	ch, err := edge.New(edge.Config{
		Resolve: edge.Static(a, b, c),
		Probe: func(ctx context.Context, addr netip.AddrPort) (edge.Sample, error) {
			mu.Lock()
			defer mu.Unlock()
			return edge.Sample{RTT: rtt[addr]}, nil
		},
		MaxAge: time.Nanosecond, // every round measures everything, for the example
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	order, _ := ch.Order(ctx) // measures all three in parallel
	fmt.Println("order:", order)
	ch.Use(order[0]) // the dial through the first one succeeded

	// The best edge gets slow: the session moves only after two rounds
	// in a row show the 30 ms edge better by ≥ 20 ms and ≥ 25 %.
	mu.Lock()
	rtt[b] = 60 * time.Millisecond
	mu.Unlock()
	move := func(_ context.Context, sw edge.Switch) error {
		fmt.Printf("switch %v -> %v (%s, %v -> %v)\n", sw.From, sw.To, sw.Reason, sw.FromRTT, sw.ToRTT)
		return nil // a dialer reconnects here, or (DTLS with CID) just retargets
	}
	for round := 1; round <= 3; round++ {
		sw, _ := ch.Step(ctx, move)
		fmt.Printf("round %d: switched=%v, now on %v\n", round, sw != nil, ch.Current())
	}
	// Output:
	// order: [192.0.2.2:5684 192.0.2.3:5684 192.0.2.1:5684]
	// round 1: switched=false, now on 192.0.2.2:5684
	// switch 192.0.2.2:5684 -> 192.0.2.3:5684 (better, 60ms -> 30ms)
	// round 2: switched=true, now on 192.0.2.3:5684
	// round 3: switched=false, now on 192.0.2.3:5684
}
