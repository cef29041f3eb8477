package backend

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
)

// TestDirectNoHandshakeMixed: a direct datagram that carries a session
// start behind established content (a ClientHello after a tls12_cid
// record; a QUIC Initial or 0-RTT packet after a Handshake packet) starts
// a session too: the proxy limits it as one (Protocol.StartsSession), and
// DirectNoHandshake drops it.
func TestDirectNoHandshakeMixed(t *testing.T) {
	app := testtool.ReadHex(t, dtlsAppData)
	hello, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte("hi"))})
	require.NoError(t, err)
	mixed := append(append([]byte(nil), app...), hello...)
	require.True(t, DTLS.StartsSession(mixed, DTLS.DefaultCIDLen()))

	c := newConn(t, Config{Direct: DirectNoHandshake, Protocol: DTLS, TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	px.send(c, nil, mixed)
	px.send(c, nil, app)
	b, a := read(t, c)
	assert.Equal(t, app, b, "the CID record alone passes; the mixed datagram does not")
	assert.False(t, a.Proxied())
	s := c.Stats()
	assert.Equal(t, uint64(1), s.DroppedDirectHandshake)
	balanced(t, s, 2)
}

func TestDirectPolicyText(t *testing.T) {
	for _, d := range []DirectPolicy{DirectAccept, DirectNoHandshake, DirectDrop} {
		b, err := d.MarshalText()
		require.NoError(t, err)
		var got DirectPolicy
		require.NoError(t, got.UnmarshalText(b))
		assert.Equal(t, d, got)
		assert.Equal(t, string(b), d.String())
	}
	var d DirectPolicy
	require.ErrorIs(t, d.UnmarshalText([]byte("nohandshake")), ErrConfig)
	_, err := DirectPolicy(7).MarshalText()
	require.ErrorIs(t, err, ErrConfig)
	var cfg struct{ Direct DirectPolicy }
	require.NoError(t, json.Unmarshal([]byte(`{"Direct": "no-handshake"}`), &cfg))
	assert.Equal(t, DirectNoHandshake, cfg.Direct)
	out, err := json.Marshal(cfg)
	require.NoError(t, err)
	assert.JSONEq(t, `{"Direct": "no-handshake"}`, string(out))
}
