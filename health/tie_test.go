package health

import (
	"context"
	"encoding/binary"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/registry"
)

// hvrTo answers the ClientHello in (after a PPv2 LOCAL header) with a
// HelloVerifyRequest echoing its record sequence number, as RFC 6347
// §4.2.2 wants and cidroute's piondtls adapter does; nil for anything
// else.
func hvrTo(in []byte) []byte {
	p := stripLocal(in)
	r, _, err := dtls.ParseRecord(p, 8)
	if err != nil || !dtls.StartsSession(p, 8) {
		return nil
	}
	b, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10, Seq: r.Seq,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeHelloVerifyRequest, 0, []byte{0xfe, 0xff, 4, 1, 2, 3, 4})})
	return b
}

// Issue 35: a backend whose stack froze, kept "up" by HelloVerifyRequests
// forged from its address, goes down. The forger cannot see the probes,
// so its answers do not echo their random record sequence numbers; the
// backend's own answers did, so the checker takes untied ones for
// failures. Before the fix any HelloVerifyRequest from the backend's
// address passed and the backend stayed up.
func TestForgedAnswersKeepNoFrozenBackendUp(t *testing.T) {
	var frozen atomic.Bool
	peer := responder(t, func(in []byte) []byte {
		if frozen.Load() {
			if stripLocal(in) == nil {
				return nil
			}
			return hvr() // a forged answer: record sequence number 0
		}
		return hvrTo(in)
	})
	reg := newRegistry(t, []registry.Backend{{Ordinal: 0, Addr: peer}})
	c, err := New(reg, Config{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: 50 * time.Millisecond,
		Timeout: 40 * time.Millisecond, Jitter: -1, Fall: 2, Rise: 2, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	require.Eventually(t, func() bool {
		st := c.Stats()
		return len(st.Backends) == 1 && st.Backends[0].Results[OK] >= 2
	}, 10*time.Second, 5*time.Millisecond)
	require.False(t, reg.Snapshot().Down(0))
	frozen.Store(true)
	require.Eventually(t, func() bool { return reg.Snapshot().Down(0) }, 5*time.Second, 5*time.Millisecond,
		"forged answers kept the frozen backend up")
}

// The DTLS answer is checked against the ClientHello it answers: a
// HelloVerifyRequest echoing its record sequence number is tied to it;
// one that does not (pion/dtls's own) is untied; a ServerHello is
// untied, and must choose a suite the hello offered; implausible
// messages are bad answers.
func TestCheckDTLSReply(t *testing.T) {
	hello, err := AppendClientHello(nil, DefaultCipherSuites[:3])
	require.NoError(t, err)
	q, _, err := dtls.ParseRecord(hello, 8)
	require.NoError(t, err)
	hello2, _ := AppendClientHello(nil, DefaultCipherSuites[:3])
	q2, _, _ := dtls.ParseRecord(hello2, 8)
	require.NotEqual(t, q.Seq, q2.Seq, "a random record sequence number per probe")
	require.Equal(t, uint16(0), binary.BigEndian.Uint16(q.Fragment[4:]), "message_seq 0")

	rec := func(seq uint64, t dtls.HandshakeType, msgSeq uint16, body []byte) []byte {
		b, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10, Seq: seq,
			Fragment: dtls.AppendHandshake(nil, t, msgSeq, body)})
		return b
	}
	hvrBody := []byte{0xfe, 0xff, 4, 1, 2, 3, 4}
	sh := func(suite uint16, comp byte) []byte {
		b := append([]byte{0xfe, 0xfd}, make([]byte, 32)...)
		b = append(b, 0) // no session_id
		b = binary.BigEndian.AppendUint16(b, suite)
		return append(b, comp, 0, 0)
	}
	for _, c := range []struct {
		name   string
		answer []byte
		want   Match
	}{
		{"HelloVerifyRequest echoing the record sequence number", rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, hvrBody), Tied},
		{"HelloVerifyRequest of another record sequence number", rec(q.Seq^1, dtls.HandshakeHelloVerifyRequest, 0, hvrBody), Untied},
		{"ServerHello with an offered suite", rec(0, dtls.HandshakeServerHello, 0, sh(DefaultCipherSuites[2], 0)), Untied},
	} {
		m, err := CheckDTLSReply(c.answer, hello)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, m, c.name)
	}
	frag := rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, hvrBody)
	frag[13+11]-- // fragment_length below length
	for name, b := range map[string][]byte{
		"HelloVerifyRequest of message_seq 1":  rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 1, hvrBody),
		"empty cookie":                         rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, []byte{0xfe, 0xff, 0}),
		"bytes after the cookie":               rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, append(hvrBody, 9)),
		"TLS version":                          rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, []byte{3, 3, 1, 7}),
		"fragmented":                           frag,
		"ServerHello with a suite not offered": rec(0, dtls.HandshakeServerHello, 0, sh(0x1301, 0)),
		"ServerHello with compression":         rec(0, dtls.HandshakeServerHello, 0, sh(DefaultCipherSuites[0], 1)),
		"short ServerHello":                    rec(0, dtls.HandshakeServerHello, 0, sh(DefaultCipherSuites[0], 0)[:30]),
		"the ClientHello echoed":               hello,
	} {
		m, err := CheckDTLSReply(b, hello)
		require.ErrorIs(t, err, ErrBadAnswer, name)
		require.Equal(t, Untied, m, name)
	}
	_, err = CheckDTLSReply(rec(q.Seq, dtls.HandshakeHelloVerifyRequest, 0, hvrBody), []byte("no hello"))
	require.ErrorIs(t, err, ErrConfig)
}

// Probe over a socket: the answer's tie is reported; QUIC's Version
// Negotiation echoes both random connection IDs, always tied.
func TestProbeAnswerMatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, m, err := ProbeAnswer(ctx, responder(t, hvrTo), ProbeConfig{Protocol: cidroute.DTLS})
	require.NoError(t, err)
	require.Equal(t, Tied, m)
	_, m, err = ProbeAnswer(ctx, responder(t, func([]byte) []byte { return hvr() }), ProbeConfig{Protocol: cidroute.DTLS})
	require.NoError(t, err)
	require.Equal(t, Untied, m)
}

// QUIC: the Version Negotiation must echo the probe's connection IDs,
// swapped, and must not list the version the probe sent (RFC 9000 §6.2).
func TestQUICAnswerMatch(t *testing.T) {
	dcid, scid := []byte("0123456789abcdef"), []byte("srcid-01")
	p := &payload{proto: cidroute.QUIC, dcid: dcid, scid: scid, version: 0x1a2a3a4a}
	vn := func(versions ...uint32) []byte {
		b := append([]byte{0x80, 0, 0, 0, 0, byte(len(scid))}, scid...)
		b = append(append(b, byte(len(dcid))), dcid...)
		for _, v := range versions {
			b = binary.BigEndian.AppendUint32(b, v)
		}
		return b
	}
	m, err := p.check(vn(1, 0x6b3343cf))
	require.NoError(t, err)
	require.Equal(t, Tied, m)
	_, err = p.check(vn(1, 0x1a2a3a4a))
	require.ErrorIs(t, err, ErrBadAnswer)
}
