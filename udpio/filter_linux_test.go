//go:build linux

package udpio

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAttachFilterKernel: the kernel keeps exactly what the reference
// keeps, counts what the filter dropped as the socket's drops, takes a
// new filter at once, and after a detach keeps everything.
func TestAttachFilterKernel(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer rx.Close()
	tx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	datagrams := [][]byte{
		dtlsCIDRecord(cidWith(8, 0, 0)), dtlsCIDRecord(cidWith(8, 0, 1)), dtlsCIDRecord(cidWith(8, 0, 255)),
		record(22, 0xfeff, 40), record(22, 0x0303, 40), append([]byte{0x3f}, make([]byte, 20)...),
		make([]byte, 40), {25, 0xfe},
	}
	// Each datagram is tagged with its index in its last byte.
	for i, d := range datagrams {
		d[len(d)-1] = byte(i)
	}
	// exchange sends every datagram and returns the tags that arrived.
	exchange := func() map[byte]bool {
		for _, d := range datagrams {
			_, err := tx.WriteToUDPAddrPort(d, to)
			require.NoError(t, err)
		}
		got := map[byte]bool{}
		buf := make([]byte, 256)
		for {
			rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := rx.ReadFromUDPAddrPort(buf)
			if err != nil {
				return got
			}
			got[buf[n-1]] = true
		}
	}
	want := func(f *Filter) map[byte]bool {
		m := map[byte]bool{}
		for i, d := range datagrams {
			if f == nil || f.accepts(d) {
				m[byte(i)] = true
			}
		}
		return m
	}
	drops := func() uint32 { n, err := KernelDrops(rx); require.NoError(t, err); return n }

	f := testFilter(0)
	require.NoError(t, AttachFilter(rx, f))
	d0 := drops()
	w := want(f)
	assert.Equal(t, w, exchange())
	assert.Equal(t, uint32(len(datagrams)-len(w)), drops()-d0, "the filter's drops are the socket's drops")

	f = testFilter(1)
	require.NoError(t, AttachFilter(rx, f))
	assert.Equal(t, want(f), exchange(), "a new filter replaces the old")

	require.NoError(t, AttachFilter(rx, nil))
	require.NoError(t, AttachFilter(rx, nil), "nothing to detach is not an error")
	assert.Equal(t, want(nil), exchange(), "no filter, no drop")
	require.ErrorIs(t, AttachFilter(rx, &Filter{CIDLen: 0}), ErrConfig)
}
