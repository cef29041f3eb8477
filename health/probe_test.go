package health

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
)

// The DTLS probe is a ClientHello as the router and the backend adapter
// classify it: one epoch-0 record that starts a session, DTLS 1.2 inside,
// every suite offered.
func TestClientHello(t *testing.T) {
	b, err := AppendClientHello(nil, DefaultCipherSuites)
	require.NoError(t, err)
	assert.True(t, dtls.StartsSession(b, 8), "classified as a ClientHello")
	r, n, err := dtls.ParseRecord(b, 8)
	require.NoError(t, err)
	require.Equal(t, len(b), n, "one record")
	assert.Equal(t, dtls.Handshake, r.Type)
	assert.Equal(t, uint16(0), r.Epoch)
	f := r.Fragment
	require.Equal(t, byte(dtls.HandshakeClientHello), f[0])
	bodyLen := int(f[1])<<16 | int(f[2])<<8 | int(f[3])
	require.Equal(t, len(f)-12, bodyLen, "unfragmented")
	body := f[12:]
	assert.Equal(t, dtls.VersionDTLS12, binary.BigEndian.Uint16(body))
	p := 2 + 32
	assert.Equal(t, []byte{0, 0}, body[p:p+2], "no session ID, no cookie")
	p += 2
	ns := int(binary.BigEndian.Uint16(body[p:]))
	require.Equal(t, 2*len(DefaultCipherSuites), ns)
	for i, s := range DefaultCipherSuites {
		assert.Equal(t, s, binary.BigEndian.Uint16(body[p+2+2*i:]))
	}
	p += 2 + ns
	assert.Equal(t, []byte{1, 0}, body[p:p+2], "null compression")
	p += 2
	require.Equal(t, len(body)-p-2, int(binary.BigEndian.Uint16(body[p:])), "extensions fill the rest")

	b2, err := AppendClientHello(nil, DefaultCipherSuites)
	require.NoError(t, err)
	assert.NotEqual(t, b, b2, "a fresh random each time")
	_, err = AppendClientHello(nil, nil)
	assert.ErrorIs(t, err, ErrConfig)
}

func hvr() []byte {
	body := []byte{0xfe, 0xff, 4, 1, 2, 3, 4} // server_version, cookie
	b, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeHelloVerifyRequest, 0, body)})
	return b
}

func TestCheckDTLSAnswer(t *testing.T) {
	assert.NoError(t, CheckDTLSAnswer(hvr()))
	sh, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeServerHello, 1, make([]byte, 40))})
	assert.NoError(t, CheckDTLSAnswer(append(sh, sh...)), "a ServerHello flight")
	hello, _ := AppendClientHello(nil, DefaultCipherSuites)
	alert, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Alert, Fragment: []byte{2, 40}})
	epoch1, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Epoch: 1, Fragment: hvr()[13:]})
	for name, b := range map[string][]byte{
		"alert (no shared suite)": alert,
		"the ClientHello echoed":  hello,
		"epoch 1":                 epoch1,
		"short handshake":         hvr()[:20],
		"garbage":                 []byte("HTTP/1.1 400 Bad Request\r\n"),
		"empty":                   nil,
	} {
		assert.ErrorIs(t, CheckDTLSAnswer(b), ErrBadAnswer, name)
	}
}

// The QUIC probe is a long header of a reserved version, padded to 1200
// bytes: the router sees a new handshake of an unknown version; its answer
// is the Version Negotiation for its CIDs, swapped.
func TestVersionProbe(t *testing.T) {
	dcid, scid := []byte("0123456789abcdef"), []byte("srcid-01")
	for range 20 {
		v := reservedVersion()
		require.Equal(t, uint32(0x0a0a0a0a), v&0x0f0f0f0f, "%#x", v)
	}
	b := AppendVersionProbe(nil, 0x1a2a3a4a, dcid, scid)
	require.Len(t, b, quic.MinInitialDatagram)
	c, err := quic.Classify(b, 12)
	require.NoError(t, err)
	assert.True(t, c.StartsHandshake())
	h, err := quic.ParseHeader(b, 12)
	require.NoError(t, err)
	assert.Equal(t, quic.UnknownVersion, h.Type)
	assert.Equal(t, dcid, h.DCID)
	assert.Equal(t, scid, h.SCID)

	vn := func(d, s []byte, versions ...uint32) []byte {
		b := []byte{0x80 | 0x2a, 0, 0, 0, 0, byte(len(d))}
		b = append(b, d...)
		b = append(b, byte(len(s)))
		b = append(b, s...)
		for _, v := range versions {
			b = binary.BigEndian.AppendUint32(b, v)
		}
		return b
	}
	assert.NoError(t, CheckQUICAnswer(vn(scid, dcid, 1, 0x6b3343cf), dcid, scid))
	assert.ErrorIs(t, CheckQUICAnswer(vn(dcid, scid, 1), dcid, scid), ErrBadAnswer, "CIDs not swapped")
	assert.ErrorIs(t, CheckQUICAnswer(vn(scid, dcid), dcid, scid), ErrBadAnswer, "no version")
	assert.ErrorIs(t, CheckQUICAnswer(append(vn(scid, dcid, 1), 0), dcid, scid), ErrBadAnswer, "ragged list")
	assert.ErrorIs(t, CheckQUICAnswer(b, dcid, scid), ErrBadAnswer, "the probe echoed")
	assert.ErrorIs(t, CheckQUICAnswer([]byte{0x40, 1, 2}, dcid, scid), ErrBadAnswer, "short header")
}

// responder is a UDP peer on loopback whose answer to each datagram
// answer decides (nil: no answer).
func responder(t *testing.T, answer func(in []byte) []byte) netip.AddrPort {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if out := answer(buf[:n]); out != nil {
				c.WriteToUDPAddrPort(out, from)
			}
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// stripLocal returns the payload after a PPv2 LOCAL header, or nil.
func stripLocal(b []byte) []byte {
	h, n, err := ppv2.Parse(b)
	if err != nil || h.Command != ppv2.Local {
		return nil
	}
	return b[n:]
}

func closedPort(t *testing.T) netip.AddrPort {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	a := c.LocalAddr().(*net.UDPAddr).AddrPort()
	c.Close()
	return a
}

// Probe over real sockets: a DTLS-speaking peer passes; silence is a
// timeout at the deadline; a closed port is refused at once; a plain UDP
// echo, which a port check would pass, is a bad answer.
func TestProbe(t *testing.T) {
	dtlsPeer := responder(t, func(in []byte) []byte {
		if p := stripLocal(in); p != nil && dtls.StartsSession(p, 8) {
			return hvr()
		}
		return nil
	})
	quicPeer := responder(t, func(in []byte) []byte {
		p := stripLocal(in)
		h, err := quic.ParseHeader(p, 0)
		if err != nil || h.Type != quic.UnknownVersion {
			return nil
		}
		b := []byte{0x80, 0, 0, 0, 0, byte(len(h.SCID))}
		b = append(append(b, h.SCID...), byte(len(h.DCID)))
		return binary.BigEndian.AppendUint32(append(b, h.DCID...), 1)
	})
	silent := responder(t, func([]byte) []byte { return nil })
	echo := responder(t, func(in []byte) []byte { return in })
	ctx := func(d time.Duration) context.Context {
		c, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return c
	}

	rtt, err := Probe(ctx(5*time.Second), dtlsPeer, ProbeConfig{Protocol: cidroute.DTLS})
	require.NoError(t, err)
	assert.Positive(t, rtt)
	_, err = Probe(ctx(5*time.Second), quicPeer, ProbeConfig{Protocol: cidroute.QUIC})
	require.NoError(t, err)
	_, err = Probe(ctx(200*time.Millisecond), dtlsPeer, ProbeConfig{Protocol: cidroute.DTLS, Direct: true})
	assert.ErrorIs(t, err, ErrTimeout, "this peer wants the LOCAL header")

	start := time.Now()
	_, err = Probe(ctx(100*time.Millisecond), silent, ProbeConfig{Protocol: cidroute.DTLS})
	assert.ErrorIs(t, err, ErrTimeout)
	assert.Equal(t, Timeout, ResultOf(err))
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)

	_, err = Probe(ctx(5*time.Second), closedPort(t), ProbeConfig{Protocol: cidroute.QUIC})
	assert.ErrorIs(t, err, ErrRefused)
	assert.Equal(t, Refused, ResultOf(err))

	for _, proto := range []cidroute.Protocol{cidroute.DTLS, cidroute.QUIC} {
		_, err = Probe(ctx(5*time.Second), echo, ProbeConfig{Protocol: proto})
		assert.ErrorIs(t, err, ErrBadAnswer, "%v: a plain UDP echo", proto)
		assert.Equal(t, BadAnswer, ResultOf(err))
	}

	_, err = Probe(ctx(time.Second), dtlsPeer, ProbeConfig{})
	assert.ErrorIs(t, err, ErrConfig)
	assert.Equal(t, Error, ResultOf(errors.New("x")))
}
