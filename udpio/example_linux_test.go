//go:build linux

package udpio_test

import (
	"fmt"
	"log"
	"net"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

func ExampleAttachSteering() {
	// One socket per worker; CIDs are 8 bytes with the ordinal at offset 1
	// (a CIDCodec's Len and OrdinalOffset). The worker on group[k] issues
	// CIDs whose ordinal is k.
	group, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 4, udpio.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		for _, c := range group {
			c.Close()
		}
	}()
	err = udpio.AttachSteering(group, udpio.Steering{QUIC: true, DTLS: true, CIDLen: 8, OrdinalOffset: 1})
	if err != nil {
		log.Fatal(err)
	}

	// A QUIC short-header packet whose CID carries ordinal 2.
	cid := []byte{0xaa, 2, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x11}
	pkt := append([]byte{0x40}, cid...)
	client, err := net.DialUDP("udp4", nil, group[0].LocalAddr().(*net.UDPAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write(pkt); err != nil {
		log.Fatal(err)
	}

	buf := make([]byte, 64)
	for i, c := range group {
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		if n, _, err := c.ReadFromUDPAddrPort(buf); err == nil {
			fmt.Printf("socket %d got %d bytes\n", i, n)
		}
	}
	// Output:
	// socket 2 got 9 bytes
}
