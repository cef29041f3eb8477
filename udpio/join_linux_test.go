//go:build linux

package udpio

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestListenGroupRefusesForeignGroup: a second group on the address of a
// running one (another instance, say, with other backends) is refused with
// ErrInUse, whatever the sizes; it joins only with JoinExisting, and then
// the kernel spreads datagrams over both.
func TestListenGroupRefusesForeignGroup(t *testing.T) {
	for _, sizes := range [][2]int{{2, 2}, {4, 1}, {1, 2}} {
		old, err := ListenGroup("udp4", "127.0.0.1:0", sizes[0], ListenConfig{Joinable: true})
		require.NoError(t, err)
		addr := addrOf(old[0]).String()

		_, err = ListenGroup("udp4", addr, sizes[1], ListenConfig{})
		require.ErrorIs(t, err, ErrInUse, "sizes %v", sizes)
		assert.Contains(t, err.Error(), "JoinExisting")
		_, err = ListenGroup("udp4", addr, sizes[1], ListenConfig{Joinable: true})
		require.ErrorIs(t, err, ErrInUse, "Joinable does not join")

		joined, err := ListenGroup("udp4", addr, sizes[1], ListenConfig{JoinExisting: true})
		require.NoError(t, err, "sizes %v", sizes)
		assert.True(t, spreads(t, old, joined, addrOf(old[0])), "datagrams reach both processes' sockets, sizes %v", sizes)
		closeAll(old)
		closeAll(joined)
	}
}

// TestListenGroupWildcardOverlap: a specific address on a port that a
// wildcard group holds is refused too (the kernel would otherwise give the
// more specific socket all its traffic).
func TestListenGroupWildcardOverlap(t *testing.T) {
	g, err := ListenGroup("udp4", "0.0.0.0:0", 2, ListenConfig{})
	require.NoError(t, err)
	defer closeAll(g)
	_, err = ListenGroup("udp4", "127.0.0.1:"+strconv.Itoa(int(addrOf(g[0]).Port())), 2, ListenConfig{})
	require.ErrorIs(t, err, ErrInUse)
}

// TestListenGroupNotJoinable: a group of one without Joinable has no
// SO_REUSEPORT, so even JoinExisting cannot join it; the upstream sockets of
// a proxy are such groups.
func TestListenGroupNotJoinable(t *testing.T) {
	c := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	_, err := ListenGroup("udp4", addrOf(c).String(), 2, ListenConfig{JoinExisting: true})
	require.ErrorIs(t, err, ErrInUse)
	assert.NotContains(t, err.Error(), "set ListenConfig.JoinExisting", "the hint is for the other case")
}

// spreads sends from 64 source ports to addr and reports whether both the
// old sockets and the joined ones (two processes, in production) received
// some of them.
func spreads(t *testing.T, old, joined []*net.UDPConn, addr netip.AddrPort) bool {
	t.Helper()
	for i := range 64 {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
		require.NoError(t, err)
		_, err = c.Write([]byte{byte(i)})
		require.NoError(t, err)
		c.Close()
	}
	received := func(socks []*net.UDPConn) bool {
		buf := make([]byte, 16)
		got := false
		for _, s := range socks {
			s.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, _, err := s.ReadFromUDPAddrPort(buf); err == nil {
				got = true
			}
		}
		return got
	}
	return received(old) && received(joined)
}
