package udpio

import (
	"bytes"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The portable path is what Conn uses off Linux; it is exercised here on
// any platform.
func TestPortable(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newPortable(rc), newPortable(sc)
	dst := addrOf(rc)
	ms := []Message{
		{Prefix: []byte("pre-"), Buf: []byte("payload"), Addr: dst},
		{Buf: make([]byte, 70000), Addr: dst},            // EMSGSIZE
		{Buf: []byte("x"), Addr: dst, Local: dst.Addr()}, // no PKTINFO here
		{Buf: []byte("x")}, // no destination
		{Buf: bytes.Repeat([]byte{'y'}, 100), Addr: dst},                                                 // truncated on receive
		{Buf: []byte("last"), Addr: netip.AddrPortFrom(netip.AddrFrom16(dst.Addr().As16()), dst.Port())}, // mapped
	}
	n, err := s.writeBatch(ms)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.ErrorIs(t, ms[1].Err, syscall.EMSGSIZE)
	assert.ErrorIs(t, ms[2].Err, ErrNotSupported)
	assert.ErrorIs(t, ms[3].Err, ErrAddress)

	require.NoError(t, rc.SetReadDeadline(time.Now().Add(5*time.Second)))
	in := []Message{{Buf: make([]byte, 11)}, {Buf: make([]byte, 11)}}
	var got []string
	for range 3 {
		k, err := r.readBatch(in)
		require.NoError(t, err)
		require.Equal(t, 1, k, "one datagram per call")
		assert.Equal(t, addrOf(sc), in[0].Addr)
		got = append(got, string(in[0].Buf[:in[0].N]))
		if in[0].Buf[0] == 'y' {
			assert.ErrorIs(t, in[0].Err, ErrTruncated)
		} else {
			assert.NoError(t, in[0].Err)
		}
	}
	assert.Equal(t, []string{"pre-payload", "yyyyyyyyyyy", "last"}, got)

	sc.Close()
	ms = []Message{{Buf: []byte("a"), Addr: dst}, {Buf: []byte("b"), Addr: dst}}
	n, err = s.writeBatch(ms)
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.Zero(t, n)
	assert.ErrorIs(t, ms[1].Err, net.ErrClosed)
}
