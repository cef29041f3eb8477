package piondtls_test

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/health"
)

// Issue 35: the adapter's answer to a health probe is tied to the probe:
// pion's HelloVerifyRequest leaves with the probe's record sequence
// number (RFC 6347 §4.2.2), which a forger that cannot see the probe
// cannot echo. A direct ClientHello (no PROXY header) is a client's
// session, answered by pion as it is: untied.
func TestProbeAnswerTied(t *testing.T) {
	be, err := dtlsecho.Listen(dtlsecho.Config{PSK: []byte("k"), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer be.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		_, m, err := health.ProbeAnswer(ctx, be.Addr(), health.ProbeConfig{Protocol: cidroute.DTLS})
		require.NoError(t, err)
		require.Equal(t, health.Tied, m)
	}
	_, m, err := health.ProbeAnswer(ctx, be.Addr(), health.ProbeConfig{Protocol: cidroute.DTLS, Direct: true})
	require.NoError(t, err)
	require.Equal(t, health.Untied, m)
}
