package proxyapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/proxyconfig"
)

func TestXDPInterfacesKey(t *testing.T) {
	c, err := proxyconfig.Parse(strings.NewReader(`{"xdp_interfaces": ["eth0", "eth1"], "services": [{` + svc + `}]}`))
	require.NoError(t, err)
	require.Equal(t, []string{"eth0", "eth1"}, c.XDPInterfaces)
	for _, bad := range []string{`["eth0", "eth0"]`, `[""]`, `["a-name-much-too-long"]`} {
		_, err := proxyconfig.Parse(strings.NewReader(`{"xdp_interfaces": ` + bad + `, "services": [{` + svc + `}]}`))
		require.ErrorContains(t, err, "xdp_interfaces", bad)
	}
}

// A build without the fast path refuses the key instead of ignoring it,
// and an unknown interface is an error before anything attaches.
func TestXDPNeedsTheBuildAndTheInterface(t *testing.T) {
	listen := fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "udp"))
	cfg, err := proxyconfig.Parse(strings.NewReader(`{"xdp_interfaces": ["lo"], "services": [{"name": "coaps", "protocol": "dtls", "listen": "` + listen + `", "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}]}]}`))
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	_, err = newProxy(context.Background(), cfg, log, Options{})
	require.ErrorIs(t, err, errNoXDP)

	var got []string
	var gotServices []cidroute.Service
	started := errors.New("started")
	opts := Options{XDP: func(pipe *cidroute.Pipeline, services []cidroute.Service, maxDatagram int, interfaces []string, _ *slog.Logger) (Accelerator, error) {
		got, gotServices = interfaces, services
		return nil, started
	}}
	_, err = newProxy(context.Background(), cfg, log, opts)
	require.ErrorIs(t, err, started)
	require.Equal(t, []string{"lo"}, got)
	require.Len(t, gotServices, 1)
	require.Equal(t, "coaps", gotServices[0].Name)

	cfg.XDPInterfaces = []string{"no-such-if0"}
	_, err = newProxy(context.Background(), cfg, log, opts)
	require.ErrorContains(t, err, "no-such-if0")

}
