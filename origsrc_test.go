package cidroute

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/registry"
)

// TestOriginalSourceNeedsTransparent: original source is a kind of
// transparent mode; with a PPv2 header it means nothing, and New says so.
func TestOriginalSourceNeedsTransparent(t *testing.T) {
	reg := newRegistry(t, 1, backend(0, "192.0.2.10:5684", registry.Ready))
	_, err := New(Config{Services: []Service{{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}, OriginalSource: true}}})
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "original source needs transparent mode")
}
