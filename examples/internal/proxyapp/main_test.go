package proxyapp

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestCheckGood(t *testing.T) {
	code, out, errOut := runArgs(t, "-check", "-config", "../../cidproxy/example.json")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	require.True(t, strings.HasPrefix(out, "../../cidproxy/example.json: ok: 2 service(s): coaps dtls"), out)
	require.Equal(t, 1, strings.Count(out, "\n"), "one line")
}

func TestCheckBad(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ name, body, want string }{
		{"typo", `{"services": [{"name": "a", "protocl": "dtls"}]}`, `:1:29: services[0].protocl: unknown key; did you mean "protocol"?`},
		{"duplicate ordinal", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 1, "address": "1.1.1.1:1"}, {"ordinal": 1, "address": "1.1.1.2:1"}]}`), "duplicate ordinal"},
		{"missing backends file", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends_file": "nope.json"}`), `:1:89: services[0].backends_file: ` + filepath.Join(dir, "nope.json") + ` does not exist; create it, or correct the path`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name+".json")
			require.NoError(t, os.WriteFile(path, []byte(tt.body), 0o644))
			code, out, errOut := runArgs(t, "-check", "-config", path)
			require.Equal(t, 1, code)
			require.Empty(t, out)
			require.Contains(t, errOut, tt.want)
			require.True(t, strings.HasPrefix(errOut, path+":"), errOut)
		})
	}
	code, _, errOut := runArgs(t, "-check", "-config", filepath.Join(dir, "absent.json"))
	require.Equal(t, 1, code)
	require.Equal(t, filepath.Join(dir, "absent.json")+": the file does not exist; give the path of the JSON configuration file\n", errOut)
}

func TestUsage(t *testing.T) {
	code, _, errOut := runArgs(t)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "-config FILE is required")
	code, _, _ = runArgs(t, "-bogus")
	require.Equal(t, 2, code)
	code, _, errOut = runArgs(t, "-config", "../../cidproxy/example.json", "extra")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "unexpected arguments")
}

func TestLogRateLimit(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(&buf, slog.LevelInfo, time.Hour)
	a, b := log.With("service", "a"), log.With("service", "b")
	for range 5 {
		a.Error("cannot read", "err", "x")
		b.Error("cannot read", "err", "x") // another service: its own key
	}
	require.Equal(t, 2, strings.Count(buf.String(), "\n"), buf.String())
	flushLogs(log) // at exit: the held-back lines with their counts
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4, buf.String())
	for i, svc := range []string{"service=a", "service=b"} {
		require.Contains(t, strings.Join(lines[2:], "\n"), svc)
		require.Contains(t, lines[2+i], "suppressed=3")
	}
	flushLogs(log)
	require.Len(t, strings.Split(strings.TrimSpace(buf.String()), "\n"), 4, "nothing left to flush")
}

// TestKubernetesNeedsItsBuild: the plain build refuses a "kubernetes"
// service with a message naming the build that has it; a build with the
// hook starts that service's source through it.
func TestKubernetesNeedsItsBuild(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k.json")
	port := freePort(t, "udp")
	require.NoError(t, os.WriteFile(path, []byte(`{"services": [{"name": "k", "protocol": "dtls", "listen": "127.0.0.1:`+strconv.Itoa(int(port))+`",
		"kubernetes": {"service": "ds", "port_name": "dtls"}}]}`), 0o600))
	code, _, errOut := runArgs(t, "-check", "-config", path)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "examples/kubernetes/cidproxy")

	var got proxyconfig.Kubernetes
	var out, e bytes.Buffer
	one := registry.Static{{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")}}
	code = Run(context.Background(), []string{"-check", "-config", path}, &out, &e, Options{
		Kubernetes: func(k proxyconfig.Kubernetes, _ *slog.Logger) (registry.Source, error) { got = k; return one, nil },
	})
	require.Equal(t, 0, code, e.String())
	ctx, cancel := context.WithCancel(context.Background())
	code = Run(ctx, []string{"-config", path}, &out, &e, Options{
		Kubernetes: func(k proxyconfig.Kubernetes, _ *slog.Logger) (registry.Source, error) {
			got = k
			cancel() // serve starts the source, then stops at once
			return one, nil
		},
	})
	require.Equal(t, 0, code, e.String())
	require.Equal(t, proxyconfig.Kubernetes{Service: "ds", PortName: "dtls"}, got)
}

// svc is a valid service object; tests splice keys into it.
const svc = `"name": "coaps", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}]`

func withServices(services ...string) string {
	return `{"services": [` + strings.Join(services, ",") + `]}`
}
