package cidroute

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
)

const bufferChildEnv = "CIDROUTE_BUFFER_TEST_CHILD"

// TestBufferCapWarned: a process without CAP_NET_ADMIN (here: root of a
// user namespace of its own) asks for buffers above net.core.rmem_max
// and wmem_max; the kernel caps them silently, and the Pipeline says so,
// once per service and kind of socket, with both sizes.
func TestBufferCapWarned(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("buffer sizes are probed on Linux")
	}
	if os.Getenv(bufferChildEnv) == "" {
		// Under an emulator (qemu-user) the test binary is not one the
		// host can exec, in a namespace or not.
		if err := exec.Command(os.Args[0], "-test.run=^$").Run(); errors.Is(err, syscall.ENOEXEC) {
			t.Skipf("the test binary does not run natively here: %v", err)
		}
		unshare := testtool.Look(t, "util-linux", "unshare")
		cmd := exec.Command(unshare, "--user", "--map-root-user", os.Args[0], "-test.run=^TestBufferCapWarned$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), bufferChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if !bytes.Contains(out, []byte("=== RUN")) {
			if testtool.Required() {
				t.Fatalf("cannot create a user namespace (%v): %s", err, out)
			}
			t.Skipf("cannot create a user namespace (%v): %s", err, out)
		}
		t.Logf("without CAP_NET_ADMIN:\n%s", out)
		require.NoError(t, err)
		return
	}
	max := func(name string) int {
		b, err := os.ReadFile("/proc/sys/net/core/" + name)
		require.NoError(t, err)
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return n
	}
	asked := min(2*max("rmem_max")+4096, 1<<30)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	reg := newRegistry(t, 1)
	mk := func(recv, send int) *Pipeline {
		p, err := New(Config{Logger: log, Services: []Service{{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 2,
			RecvBuffer: recv, SendBuffer: send, RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		return p
	}
	mk(asked, 0)
	out := logs.String()
	t.Log(out)
	assert.Equal(t, 2, strings.Count(out, "socket buffer smaller than configured"), "one line each for the service and the upstream sockets")
	assert.Contains(t, out, "net.core.rmem_max")
	assert.Contains(t, out, "asked="+strconv.Itoa(asked))
	assert.NotContains(t, out, "buffer=send")

	logs.Reset()
	mk(4096, 4096) // within the limits: nothing to say
	assert.NotContains(t, logs.String(), "socket buffer smaller")
}
