package proxyconfig

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

func mustParse(t *testing.T, js string) *Config {
	t.Helper()
	c, err := Parse(strings.NewReader(js))
	require.NoError(t, err)
	return c
}

// TestBuildStatic: a static list is in the registry when Build returns,
// and the service definition carries every key of the file and the flags.
func TestBuildStatic(t *testing.T) {
	c := mustParse(t, `{"hrw_seed": 7, "services": [{`+svc+`, "require_dtls13_cid": true, "workers": 3, "max_registry_age": "30s", "limits": {"handshake_pps": 5}},
		{"name": "h3", "protocol": "quic", "listen": "[::1]:443", "proxy_protocol": false, "max_sessions": 9, "session_idle": "5s", "unroutable": "hash",
		 "backends": [{"ordinal": 3, "address": "[::1]:7000"}]}]}`)
	regs, err := c.Build(Options{Logger: slog.New(slog.DiscardHandler), Join: true})
	require.NoError(t, err)
	defer regs.Close()

	defs := regs.Services()
	require.Len(t, defs, 2)
	reg, ok := regs.Registry("coaps")
	require.True(t, ok)
	require.Equal(t, 1, reg.Snapshot().Len(), "published before Build returns")
	require.Equal(t, reg.MaxAge(), 30*time.Second)
	d := defs[0]
	require.Equal(t, "coaps", d.Name)
	require.Equal(t, netip.MustParseAddrPort("127.0.0.1:5684"), d.Listen)
	require.Equal(t, cidroute.DTLS, d.Protocol)
	require.Equal(t, 8, d.CIDLen)
	require.Same(t, reg, d.Backends)
	require.Nil(t, d.Codec)
	require.Equal(t, 3, d.Workers)
	require.Equal(t, 5, d.Limits.HandshakePPS)
	require.True(t, d.JoinExisting)
	require.True(t, d.RequireDTLS13CID)

	d = defs[1]
	require.True(t, d.Transparent)
	require.Equal(t, 9, d.MaxSessions)
	require.Equal(t, 5*time.Second, d.SessionIdle)
	require.Equal(t, cidroute.UnroutableHash, d.Unroutable)
	require.Equal(t, 12, d.CIDLen)
	_, ok = regs.Registry("nope")
	require.False(t, ok)

	// The definitions are what cidroute.New takes.
	defs[0].Listen, defs[1].Listen = netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("[::1]:0")
	defs[1].MaxSessions = 1
	p, err := cidroute.New(cidroute.Config{Services: defs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil && strings.Contains(err.Error(), "address") { // no IPv6 loopback here
		t.Skip(err)
	}
	require.NoError(t, err)
	require.NoError(t, p.Close())
}

// TestBuildSources: a service without backends key gets its source from
// Options.Source, and is refused without one; "kubernetes" needs its hook;
// Source is asked first for every service.
func TestBuildSources(t *testing.T) {
	c := mustParse(t, withServices(`{"name": "own", "protocol": "dtls", "listen": "127.0.0.1:5684"}`,
		`{"name": "k", "protocol": "dtls", "listen": "127.0.0.1:5685", "kubernetes": {"service": "ds", "port_name": "coaps"}}`))
	require.Contains(t, c.Summary(), "backends from the program")

	_, err := c.Build(Options{})
	require.ErrorIs(t, err, ErrNoSource)
	require.EqualError(t, err, `1:15: services[0]: no backends; add "backends", "backends_file" or "kubernetes"`)
	require.ErrorIs(t, c.Validate(Options{}), ErrNoSource)

	var gotK Kubernetes
	kube := func(k Kubernetes, _ *slog.Logger) (registry.Source, error) {
		gotK = k
		return registry.Static{{Ordinal: 5, Addr: netip.MustParseAddrPort("127.0.0.1:9005")}}, nil
	}
	var asked []string
	own := func(s Service, _ *slog.Logger) (registry.Source, error) {
		asked = append(asked, s.Name)
		if s.Name != "own" {
			return nil, nil // the file's source
		}
		return registry.Static{{Ordinal: 1, Addr: netip.MustParseAddrPort("127.0.0.1:9001")}}, nil
	}
	_, err = c.Build(Options{Source: own})
	require.ErrorIs(t, err, ErrNoKubernetes)
	require.EqualError(t, err, `1:155: services[1].kubernetes: this program has no Kubernetes source; list the backends with "backends" or "backends_file"`)
	require.ErrorIs(t, c.Validate(Options{Source: own}), ErrNoKubernetes)

	asked = nil
	o := Options{Logger: slog.New(slog.DiscardHandler), Kubernetes: kube, Source: own}
	require.NoError(t, c.Validate(o))
	regs, err := c.Build(o)
	require.NoError(t, err)
	defer regs.Close()
	require.Equal(t, []string{"own", "k"}, asked)
	require.Equal(t, Kubernetes{Service: "ds", PortName: "coaps"}, gotK)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { regs.Run(ctx); close(done) }()
	for _, want := range []struct {
		name string
		ord  uint8
	}{{"own", 1}, {"k", 5}} {
		reg, _ := regs.Registry(want.name)
		require.Eventually(t, func() bool { _, ok := reg.Snapshot().Serving(want.ord); return ok }, 5*time.Second, time.Millisecond, want.name)
	}
	cancel()
	<-done
}

// TestBuildEncrypted: an encrypted service's codec holds the key file's
// keys; a missing file fails Build.
func TestBuildEncrypted(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.json")
	conf := filepath.Join(dir, "c.json")
	require.NoError(t, os.WriteFile(conf, []byte(withServices(`{`+svc+`, "cid_codec": "quic-lb-encrypted", "cid_keys_file": "keys.json"}`)), 0o600))
	c, err := Load(context.Background(), conf)
	require.NoError(t, err)
	_, err = c.Build(Options{Logger: slog.New(slog.DiscardHandler)})
	require.ErrorContains(t, err, "cid_keys_file")
	require.ErrorIs(t, err, os.ErrNotExist)

	require.NoError(t, os.WriteFile(keys, []byte(`{"active": 2, "keys": {"2": "00112233445566778899aabbccddeeff"}}`), 0o600))
	regs, err := c.Build(Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer regs.Close()
	codec, ok := regs.Services()[0].Codec.(*quic.LBEncrypted)
	require.True(t, ok)
	require.Equal(t, []uint8{2}, codec.ConfigIDs())
	require.Equal(t, 8, codec.Len())
}

// TestRunStopsWithStuckSource: Run returns within StopWait of its context
// even when a source ignores it, and says so.
func TestRunStopsWithStuckSource(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	stuck := func(Service, *slog.Logger) (registry.Source, error) {
		return registry.SourceFunc(func(context.Context, registry.Updater) error { <-release; return nil }), nil
	}
	var logs syncBuffer
	c := mustParse(t, withServices(`{"name": "s", "protocol": "dtls", "listen": "127.0.0.1:1"}`))
	regs, err := c.Build(Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Source: stuck})
	require.NoError(t, err)
	defer regs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	regs.Run(ctx)
	require.Less(t, time.Since(start), StopWait+time.Second)
	require.Contains(t, logs.String(), "did not stop")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestValidateOwnBackends: a backend at a service's listen or public
// address, or a wildcard listen's port on a host address, is refused
// before any socket is open (-check), with the check the Pipeline makes.
func TestValidateOwnBackends(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		services []string
		file     string // the backends_file of service "f"
		public   string // set on services[0]
		want     string
	}{
		"its own listen": {services: []string{`{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "127.0.0.1:5684"}]}`},
			want: `1:116: services[0].backends[0].address: 127.0.0.1:5684 is an address of this proxy`},
		"a sibling's listen": {services: []string{
			`{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}]}`,
			`{"name": "b", "protocol": "dtls", "listen": "127.0.0.1:5685", "backends": [{"ordinal": 0, "address": "[::ffff:127.0.0.1]:5684"}]}`},
			want: `services[1].backends[0].address: [::ffff:127.0.0.1]:5684 is an address of this proxy`},
		"a wildcard listen": {services: []string{`{"name": "a", "protocol": "dtls", "listen": "0.0.0.0:5684", "backends": [{"ordinal": 1, "address": "127.0.0.3:5684"}]}`},
			want: "services[0].backends[0].address: 127.0.0.3:5684 is an address of this proxy"},
		"its public address": {services: []string{`{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "192.0.2.1:5684"}]}`},
			public: "192.0.2.1:5684", want: "services[0].backends[0].address: 192.0.2.1:5684 is an address of this proxy"},
		"in backends_file": {services: []string{`{"name": "f", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends_file": "` + filepath.Join(dir, "f.json") + `"}`},
			file: `[{"ordinal": 0, "address": "127.0.0.1:5684"}]`, want: filepath.Join(dir, "f.json") + ":1:28: [0].address: 127.0.0.1:5684 is an address of this proxy"},
	} {
		c := mustParse(t, withServices(tc.services...))
		if tc.public != "" {
			c.Services[0].Public = netip.MustParseAddrPort(tc.public)
		}
		err := c.Validate(Options{})
		if tc.file != "" {
			require.NoError(t, err, name) // the file is read by CheckFiles
			require.NoError(t, os.WriteFile(filepath.Join(dir, "f.json"), []byte(tc.file), 0o600))
			err = c.CheckFiles(context.Background())
		}
		require.ErrorIs(t, err, cidroute.ErrConfig, name)
		require.ErrorContains(t, err, tc.want, name)
	}
	// Elsewhere on the port, or another port: fine.
	c := mustParse(t, withServices(`{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "127.0.0.2:5684"}, {"ordinal": 1, "address": "127.0.0.1:5685"}]}`))
	require.NoError(t, c.Validate(Options{}))
}

// TestBuildOriginalSource: "original_source" reaches the service
// definition cidroute.New takes.
func TestBuildOriginalSource(t *testing.T) {
	c := mustParse(t, `{"services": [{`+svc+`, "proxy_protocol": false, "original_source": true}]}`)
	regs, err := c.Build(Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer regs.Close()
	d := regs.Services()[0]
	require.True(t, d.Transparent)
	require.True(t, d.OriginalSource)
}
