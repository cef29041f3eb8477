package udpio_test

import (
	"fmt"
	"log"
	"net"

	"github.com/cidroute/cidroute/udpio"
)

func Example() {
	// Two sockets on loopback; one sends, the other receives.
	server, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 1, udpio.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 1, udpio.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer server[0].Close()
	defer client[0].Close()
	dst := server[0].LocalAddr().(*net.UDPAddr).AddrPort()

	out, _ := udpio.NewConn(client[0], 0)
	in, _ := udpio.NewConn(server[0], 0)

	// A header and a payload leave as one datagram each, without a copy.
	hdr := []byte("HDR|")
	batch := []udpio.Message{
		{Prefix: hdr, Buf: []byte("first"), Addr: dst},
		{Prefix: hdr, Buf: []byte("second"), Addr: dst},
	}
	if _, err := out.WriteBatch(batch); err != nil {
		log.Fatal(err)
	}

	// Receive buffers are allocated once and reused for every batch.
	ms := make([]udpio.Message, 8)
	for i := range ms {
		ms[i].Buf = make([]byte, 1500)
	}
	for got := 0; got < len(batch); {
		n, err := in.ReadBatch(ms[got:]) // one datagram per call off Linux
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range ms[got : got+n] {
			fmt.Printf("%q from %v\n", m.Buf[:m.N], m.Addr.Addr())
		}
		got += n
	}
	// Output:
	// "HDR|first" from 127.0.0.1
	// "HDR|second" from 127.0.0.1
}
