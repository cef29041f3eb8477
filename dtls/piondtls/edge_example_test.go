package piondtls_test

import (
	"context"
	"log"

	"github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/edge"
)

// A device gateway's session to a DTLS service reached through several
// edges: the name's addresses are ranked by full handshakes, the ranking
// is kept in a file, and the session stays on the best edge, moving
// between edges without a handshake, until it is closed.
func ExampleNewEdgeDialer() {
	key := []byte("the device's pre-shared key")
	d, err := piondtls.NewEdgeDialer(piondtls.EdgeConfig{
		DTLS: &dtls.Config{
			PSK:                   func([]byte) ([]byte, error) { return key, nil },
			PSKIdentityHint:       []byte("device-17"),
			CipherSuites:          []dtls.CipherSuiteID{dtls.TLS_PSK_WITH_AES_128_CCM_8},
			ConnectionIDGenerator: dtls.OnlySendCIDGenerator(),
		},
		Edge: edge.Config{
			Resolve: edge.LookupHost("edges.example.net", 5684),
			Store:   edge.FileStore("/var/lib/agent/edges.json"),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	c, err := d.Dial(ctx)
	if err != nil {
		log.Fatal(err) // no edge completed a handshake: back off and dial again
	}
	defer c.Close()
	log.Printf("session through %v", c.Edge())
	c.Write([]byte("</rd?ep=device-17>")) // and so on: c is a *dtls.Conn
}
