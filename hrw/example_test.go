package hrw_test

import (
	"fmt"
	"net/netip"

	"github.com/cidroute/cidroute/hrw"
)

func Example() {
	// One table per backend snapshot; every replica with the same seed and
	// candidates builds the same table. Only backends that take new
	// sessions are candidates: ordinal 2, draining, is left out (its CID
	// sessions are routed by their ordinal, not by the table).
	t, err := hrw.New(0x5eed, []hrw.Candidate{
		{Ordinal: 0, Weight: 1},
		{Ordinal: 1, Weight: 2},
	})
	if err != nil {
		panic(err)
	}
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	service := netip.MustParseAddrPort("203.0.113.10:5684")
	ord, ok := t.PickAddrs(client, service)
	fmt.Println(ord, ok, t.Len())

	// Spread over many clients, shares follow the weights.
	var count [3]int
	for i := range 3000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 40000)
		o, _ := t.PickAddrs(c, service)
		count[o]++
	}
	fmt.Println(count)
	// Output:
	// 1 true 2
	// [991 2009 0]
}

func ExampleAppendAddr() {
	key := hrw.AppendAddr(nil, netip.MustParseAddrPort("192.0.2.1:5684"))
	fmt.Printf("% x\n", key)
	// Output: 00 00 00 00 00 00 00 00 00 00 ff ff c0 00 02 01 16 34
}
