//go:build linux

package udpio

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type arrival struct {
	socket int
	b      []byte
}

// collect reads every socket of g in its own goroutine until want
// datagrams arrived in total, then returns them.
func collect(t *testing.T, g []*net.UDPConn, want int, send func()) []arrival {
	t.Helper()
	var mu sync.Mutex
	var got []arrival
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range g {
		cn := newConn(t, c, 16)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms := make([]Message, 16)
			for j := range ms {
				ms[j].Buf = make([]byte, 2048)
			}
			for {
				n, err := cn.ReadBatch(ms)
				if err != nil {
					return // deadline or the reset below
				}
				mu.Lock()
				for _, m := range ms[:n] {
					got = append(got, arrival{i, bytes.Clone(m.Buf[:m.N])})
				}
				if len(got) == want {
					close(done)
				}
				mu.Unlock()
			}
		}()
	}
	send()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	for _, c := range g {
		c.SetReadDeadline(time.Now()) // unblock the readers
	}
	wg.Wait()
	for _, c := range g {
		c.SetReadDeadline(time.Time{})
	}
	require.Len(t, got, want, "datagrams arrived")
	return got
}

func TestSteeringKernel(t *testing.T) {
	const sockets, clients = 4, 16
	g, err := ListenGroup("udp4", "127.0.0.1:0", sockets, ListenConfig{RecvBuffer: 1 << 20})
	require.NoError(t, err)
	defer closeAll(g)
	s := Steering{DTLS: true, QUIC: true, CIDLen: 8, OrdinalOffset: 1}
	require.NoError(t, AttachSteering(g, s))
	dst := addrOf(g[0])

	type kind struct {
		name  string
		build func(ordinal byte) []byte
		steer bool
	}
	kinds := []kind{
		{"dtls tls12_cid", func(k byte) []byte { return dtlsCIDRecord(cidWith(8, 1, k)) }, true},
		{"quic short", func(k byte) []byte { return quicShort(cidWith(8, 1, k)) }, true},
		{"quic long, server dcid", func(k byte) []byte { return quicLong(cidWith(8, 1, k)) }, true},
		{"quic long, client dcid", func(k byte) []byte { return quicLong(cidWith(12, 1, k)) }, false},
		{"dtls handshake", func(k byte) []byte { return append([]byte{22}, dtlsCIDRecord(cidWith(8, 1, k))[1:]...) }, false},
		{"ordinal beyond group", func(k byte) []byte { return quicShort(cidWith(8, 1, sockets+k)) }, false},
		{"too short for cid", func(k byte) []byte { return []byte{0x41, 0xee, 0, 0xee} }, false},
		{"junk", func(k byte) []byte { return []byte("\x00\x01junk") }, false},
	}
	// Every datagram ends with a tag: kind, ordinal, client.
	var msgs [][]Message
	want := 0
	conns := make([]*Conn, clients)
	for c := range clients {
		conns[c] = newConn(t, listen(t, "udp4", "127.0.0.1:0", ListenConfig{}), 64)
		var ms []Message
		for ki, k := range kinds {
			for ord := range byte(sockets) {
				ms = append(ms, Message{Buf: append(k.build(ord), byte(ki), ord, byte(c)), Addr: dst})
			}
		}
		msgs = append(msgs, ms)
		want += len(ms)
	}
	got := collect(t, g, want, func() {
		for c, cn := range conns {
			n, err := cn.WriteBatch(msgs[c])
			require.NoError(t, err)
			require.Equal(t, len(msgs[c]), n)
		}
	})

	perKind := make([][sockets]int, len(kinds))
	for _, a := range got {
		tag := a.b[len(a.b)-3:]
		k, ord := kinds[tag[0]], int(tag[1])
		perKind[tag[0]][a.socket]++
		if k.steer {
			assert.Equal(t, ord, a.socket, "%s with ordinal %d from client %d", k.name, ord, tag[2])
		}
	}
	for i, k := range kinds {
		t.Logf("%-24s per socket %v", k.name, perKind[i])
		if !k.steer { // fell back to the 4-tuple hash: spread, not pinned to 0
			used := 0
			for _, n := range perKind[i] {
				if n > 0 {
					used++
				}
			}
			assert.Greater(t, used, 1, "%s from %d clients lands on several sockets", k.name, clients)
		}
	}
}

func TestSteeringKernelV6(t *testing.T) {
	const sockets = 3
	g, err := ListenGroup("udp6", "[::1]:0", sockets, ListenConfig{})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer closeAll(g)
	require.NoError(t, AttachSteering(g, Steering{QUIC: true, CIDLen: 4}))
	cn := newConn(t, listen(t, "udp6", "[::1]:0", ListenConfig{}), 0)
	var ms []Message
	for round := range 5 {
		for k := range byte(sockets) {
			ms = append(ms, Message{Buf: quicShort([]byte{k, byte(round), 0, 0}), Addr: addrOf(g[0])})
		}
	}
	got := collect(t, g, len(ms), func() {
		_, err := cn.WriteBatch(ms)
		require.NoError(t, err)
	})
	for _, a := range got {
		assert.Equal(t, int(a.b[1]), a.socket, fmt.Sprintf("%x", a.b))
	}
}

func TestAttachSteeringErrors(t *testing.T) {
	assert.ErrorIs(t, AttachSteering(nil, Steering{QUIC: true, CIDLen: 8}), ErrConfig)
	g, err := ListenGroup("udp4", "127.0.0.1:0", 2, ListenConfig{})
	require.NoError(t, err)
	defer closeAll(g)
	assert.ErrorIs(t, AttachSteering(g, Steering{QUIC: true, CIDLen: 30}), ErrConfig)
}
