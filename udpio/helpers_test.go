package udpio

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/addr"
)

func listen(t testing.TB, network, addr string, cfg ListenConfig) *net.UDPConn {
	t.Helper()
	g, err := ListenGroup(network, addr, 1, cfg)
	if err != nil {
		if network == "udp6" || addr[0] == '[' {
			t.Skipf("no IPv6 loopback: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { g[0].Close() })
	return g[0]
}

func newConn(t testing.TB, c *net.UDPConn, batch int) *Conn {
	t.Helper()
	cn, err := NewConn(c, batch)
	require.NoError(t, err)
	return cn
}

func addrOf(c *net.UDPConn) netip.AddrPort {
	return addr.Unmap(c.LocalAddr().(*net.UDPAddr).AddrPort())
}

// readAll reads until want datagrams arrived (or fails after 5 s), copying
// each datagram out.
func readAll(t testing.TB, cn *Conn, c *net.UDPConn, want int) []Message {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	defer c.SetReadDeadline(time.Time{})
	ms := make([]Message, 64)
	for i := range ms {
		ms[i].Buf = make([]byte, maxDatagram)
	}
	var got []Message
	for len(got) < want {
		n, err := cn.ReadBatch(ms)
		require.NoError(t, err, "after %d of %d datagrams", len(got), want)
		for _, m := range ms[:n] {
			m.Buf = bytes.Clone(m.Buf[:m.N])
			got = append(got, m)
		}
	}
	return got
}

// seqMsg is a payload of size bytes starting with a 4-byte sequence number.
func seqMsg(seq uint32, size int) []byte {
	b := make([]byte, max(size, 4))
	binary.BigEndian.PutUint32(b, seq)
	for i := 4; i < len(b); i++ {
		b[i] = byte(int(seq) + i)
	}
	return b
}
