package piondtls

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
)

// Issue 35: a backend that answers the hello probe but drops its
// sessions' data passes the protocol probe and fails the data probe (a
// full handshake through the PROXY path, then one echo), which takes it
// down; a backend that echoes passes both.
func TestDataProbe(t *testing.T) {
	key := []byte("probe key")
	suites := []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8}
	server := func() *pion.Config {
		gen, err := Generator(0, 0)
		require.NoError(t, err)
		return &pion.Config{PSK: func([]byte) ([]byte, error) { return key, nil }, PSKIdentityHint: []byte("prober"),
			CipherSuites: suites, ConnectionIDGenerator: gen}
	}
	// echo answers "0|" and the datagram; mute accepts sessions and
	// drops their data.
	bcEcho := newBackendConn(t, nil)
	lnEcho, err := Listen(bcEcho, server())
	require.NoError(t, err)
	serveEcho(t, lnEcho, bcEcho)
	bcMute := newBackendConn(t, nil)
	lnMute, err := Listen(bcMute, server())
	require.NoError(t, err)
	go func() {
		for {
			c, err := lnMute.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 2048)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { lnMute.Close(); bcMute.Close() })
	echo := bcEcho.LocalAddr().(*net.UDPAddr).AddrPort()
	mute := bcMute.LocalAddr().(*net.UDPAddr).AddrPort()

	probe, err := DataProbe(DataProbeConfig{Client: &pion.Config{PSK: func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte("prober"), CipherSuites: suites}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, m, err := probe(ctx, echo)
	require.NoError(t, err)
	assert.Equal(t, health.Tied, m)
	_, _, err = health.ProbeAnswer(ctx, mute, health.ProbeConfig{Protocol: cidroute.DTLS})
	require.NoError(t, err, "the mute backend answers the hello probe")
	short, cancelShort := context.WithTimeout(context.Background(), time.Second)
	defer cancelShort()
	_, _, err = probe(short, mute)
	require.ErrorIs(t, err, health.ErrTimeout, "but not the data probe")
	_, err = DataProbe(DataProbeConfig{})
	require.ErrorIs(t, err, health.ErrConfig)

	// A checker with the data probe takes the mute backend down.
	reg, err := registry.NewStatic(registry.Config{Service: "d"}, []registry.Backend{{Ordinal: 0, Addr: echo}, {Ordinal: 1, Addr: mute}})
	require.NoError(t, err)
	defer reg.Close()
	c, err := health.New(reg, health.Config{ProbeConfig: health.ProbeConfig{Protocol: cidroute.DTLS}, Probe: probe,
		Interval: 1500 * time.Millisecond, Timeout: time.Second, Fall: 1, Rise: 1, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(rctx) }()
	defer func() { stop(); <-done }()
	require.Eventually(t, func() bool { return reg.Snapshot().Down(1) }, 10*time.Second, 10*time.Millisecond)
	assert.False(t, reg.Snapshot().Down(0), "the echoing backend stays up")
}
