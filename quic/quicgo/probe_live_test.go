package quicgo_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo"
)

// probeInitial is a health probe's QUIC payload (see the backend package's
// documentation): a long-header Initial with a version reserved for
// negotiation, random connection IDs, padded to size bytes.
func probeInitial(version uint32, dcid, scid []byte, size int) []byte {
	b := []byte{0xc0}
	b = binary.BigEndian.AppendUint32(b, version)
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	return append(b, make([]byte, size-len(b))...)
}

// A QUIC Initial with a reserved version under a PPv2 LOCAL header (a
// proxy's health probe) draws quic-go's Version Negotiation packet,
// straight back to the prober without a header; quic-go keeps no state
// and accepts no connection. A too-small probe, and any probe once the
// listener is closed (the backend drains), goes unanswered.
func TestQUICGoAnswersProbe(t *testing.T) {
	stc, _ := tlsPair(t)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies(),
		Direct: backend.DirectNoHandshake, Protocol: backend.QUIC})
	require.NoError(t, err)
	defer bc.Close()
	gen, err := quicgo.NewGenerator(nil, 3)
	require.NoError(t, err)
	tr := &quic.Transport{Conn: bc, ConnectionIDGenerator: gen}
	defer tr.Close()
	ln, err := tr.Listen(stc, &quic.Config{})
	require.NoError(t, err)
	accepted := make(chan struct{}, 1)
	go func() {
		if _, err := ln.Accept(context.Background()); err == nil {
			accepted <- struct{}{}
		}
	}()

	p, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer p.Close()
	to := bc.LocalAddr().(*net.UDPAddr).AddrPort()
	local, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Local})
	require.NoError(t, err)
	probe := func(payload []byte) ([]byte, bool) {
		_, err := p.WriteToUDPAddrPort(append(append([]byte(nil), local...), payload...), to)
		require.NoError(t, err)
		p.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 2048)
		n, err := p.Read(buf)
		if err != nil {
			return nil, false
		}
		return buf[:n], true
	}

	for _, version := range []uint32{0x1a2a3a4a, 0xfafafafa} {
		dcid, scid := make([]byte, 8), make([]byte, 5)
		rand.Read(dcid)
		rand.Read(scid)
		vn, ok := probe(probeInitial(version, dcid, scid, 1200))
		require.True(t, ok, "no answer to version %#x", version)
		assert.False(t, ppv2.Sniff(vn), "the answer to LOCAL carries no header")
		require.GreaterOrEqual(t, len(vn), 7)
		assert.NotZero(t, vn[0]&0x80, "long header")
		assert.Equal(t, uint32(0), binary.BigEndian.Uint32(vn[1:5]), "Version Negotiation")
		// Its DCID is the probe's SCID and its SCID the probe's DCID.
		require.Equal(t, len(scid), int(vn[5]))
		assert.Equal(t, scid, vn[6:6+len(scid)])
		rest := vn[6+len(scid):]
		require.Equal(t, len(dcid), int(rest[0]))
		assert.Equal(t, dcid, rest[1:1+len(dcid)])
		assert.True(t, bytes.Contains(rest[1+len(dcid):], []byte{0, 0, 0, 1}), "lists QUIC v1")
	}
	_, ok := probe(probeInitial(0x0a0a0a0a, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1100))
	assert.False(t, ok, "a probe under 1200 bytes is ignored")
	assert.Equal(t, uint64(3), bc.Stats().AcceptedLocal)
	select {
	case <-accepted:
		t.Fatal("a probe opened a connection")
	default:
	}

	// Draining: the listener is closed, the transport (and its
	// connections) runs on; probes go unanswered.
	require.NoError(t, ln.Close())
	_, ok = probe(probeInitial(0x0a0a0a0a, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200))
	assert.False(t, ok, "a draining backend answered a probe")
}
