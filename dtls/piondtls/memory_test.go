package piondtls

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/require"
)

// idleClientsEnv makes the test binary the client side of
// TestIdleSessionMemory: "ADDR N" opens N sessions to ADDR, asks one echo
// each, prints "ready" and holds them until its stdin closes.
const idleClientsEnv = "PIONDTLS_IDLE_CLIENTS"

// TestIdleSessionMemory measures what an idle DTLS session costs the
// server: a pion.Conn over the adapter's session, its demultiplexer
// entries and return route, and the goroutine blocked in its Read (heap
// and stacks, after a GC). The clients run in a child process so that
// their memory is not counted. The bound only catches a leak or a buffer
// per session grown by mistake; the figure is for docs/backends.md.
func TestIdleSessionMemory(t *testing.T) {
	if v := os.Getenv(idleClientsEnv); v != "" {
		holdIdleClients(t, v)
		return
	}
	if testing.Short() {
		t.Skip("opens 400 sessions")
	}
	const n = 400
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	ln, err := ListenConfig(bc, Config{Backlog: n}, cfg)
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)

	before := inUse()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleSessionMemory$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%v %d", idleClientsEnv, bc.LocalAddr(), n))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the clients: %q", line)
	require.Equal(t, "ready\n", line)
	require.Equal(t, n, e.ln.Stats().Sessions)
	per := (inUse() - before) / n
	t.Logf("an idle session costs the server %d bytes (heap and stack, %d sessions)", per, n)
	require.Less(t, per, int64(64<<10))
}

// inUse returns the heap and stack memory in use after a full GC.
func inUse() int64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

func holdIdleClients(t *testing.T, v string) {
	var addr string
	var n int
	if _, err := fmt.Sscanf(v, "%s %d", &addr, &n); err != nil {
		t.Fatal(err)
	}
	to, err := net.ResolveUDPAddr("udp", addr)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var conns []*pion.Conn
	for i := range n {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		ccfg := pskConfig()
		ccfg.PSKIdentityHint = []byte("client")
		ccfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
		c, err := pion.Client(u, to, ccfg)
		require.NoError(t, err)
		require.NoError(t, c.HandshakeContext(ctx), "session %d", i)
		msg := strconv.Itoa(i)
		_, err = c.Write([]byte(msg))
		require.NoError(t, err)
		buf := make([]byte, 64)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = c.Read(buf)
		require.NoError(t, err, "echo %d", i)
		conns = append(conns, c)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}
