package quicgo_test

import (
	"fmt"

	"github.com/quic-go/quic-go"

	cidquic "github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo"
)

// A quic-go backend with ordinal 2 issues only CIDs that carry 2, so a
// cidroute proxy in front of it routes every later packet back to it.
func ExampleNewGenerator() {
	gen, err := quicgo.NewGenerator(cidquic.LB{}, 2)
	if err != nil {
		panic(err)
	}
	tr := &quic.Transport{
		// Conn: the backend's UDP socket (or a PROXY protocol adapter).
		ConnectionIDGenerator: gen,
	}
	_ = tr // tr.Listen(tlsConf, quicConf) ...

	id, _ := gen.GenerateConnectionID()
	ord, ok := cidquic.LB{}.Ordinal(id.Bytes())
	fmt.Println(id.Len(), ord, ok)
	// Output: 12 2 true
}
