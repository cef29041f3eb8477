package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// transparentWait bounds every wait on an external program: handshakes on
// loopback take milliseconds, -race and a loaded machine included.
const transparentWait = 15 * time.Second

// startTransparent starts n replicas of one DTLS service in transparent
// mode (no PPv2: backends see one upstream socket per client). svc is the
// public address in the HRW key; zero means each replica's own listen
// address, for clients that talk to a replica directly. Counters must
// balance when the test ends.
func startTransparent(t *testing.T, n int, svc netip.AddrPort, bs []registry.Backend) []*replica {
	t.Helper()
	return startServiceReplicas(t, n, bs, cidroute.Service{
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: svc, Transparent: true}})
}

// sessions returns the replica's transparent session count.
func (r *replica) sessions() int {
	n := 0
	for _, s := range r.pipe.Stats() {
		n += s.Sessions
	}
	return n
}

// A transparentProc is an external program (openssl, coap-client) whose
// output the test watches. Stdout and stderr go to one buffer.
type transparentProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   syncBuffer
	done  chan struct{}
}

// startTransparentProc starts path with args. It is killed, at the
// latest, when the test ends.
func startTransparentProc(t *testing.T, name, path string, args ...string) *transparentProc {
	t.Helper()
	p := &transparentProc{name: name, cmd: exec.Command(path, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.WaitDelay = time.Second
	var err error
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start(), "%s", name)
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill ends the program and waits for it.
func (p *transparentProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// exited reports whether the program has ended, without waiting.
func (p *transparentProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// send writes line and a newline to the program's stdin.
func (p *transparentProc) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(t, err, "%s stdin", p.name)
}

// waitFor waits until a line of the program's output contains substr and
// returns that line. It fails the test, showing the output, when the
// program ends first or transparentWait passes.
func (p *transparentProc) waitFor(t *testing.T, substr string) string {
	t.Helper()
	return p.waitForNth(t, substr, 1)
}

// waitForNth is waitFor for the nth line that contains substr.
func (p *transparentProc) waitForNth(t *testing.T, substr string, nth int) string {
	t.Helper()
	deadline := time.Now().Add(transparentWait)
	for {
		seen := 0
		for line := range strings.Lines(p.out.String()) {
			if strings.Contains(line, substr) {
				if seen++; seen == nth {
					return strings.TrimRight(line, "\r\n")
				}
			}
		}
		if p.exited() {
			t.Fatalf("%s ended without printing %q %d times; output:\n%s", p.name, substr, nth, p.out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q %d times within %v; output:\n%s", p.name, substr, nth, transparentWait, p.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExit waits for the program to end by itself.
func (p *transparentProc) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(transparentWait):
		t.Fatalf("%s did not end within %v; output:\n%s", p.name, transparentWait, p.out.String())
	}
}

// transparentFreePort returns a UDP port on addr that was free a moment
// ago, for programs that must be told their port (-bind, -p). Distinct
// loopback addresses per test keep collisions away.
func transparentFreePort(t *testing.T, addr netip.Addr) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// transparentBackends returns ready backends at addrs, ordinals 0, 1, ...
func transparentBackends(addrs ...netip.AddrPort) []registry.Backend {
	bs := make([]registry.Backend, len(addrs))
	for i, a := range addrs {
		bs[i] = registry.Backend{Ordinal: uint8(i), Addr: a, State: registry.Ready}
	}
	return bs
}

// transparentLine is a line that s_server and s_client send as data, never
// as one of their one-letter commands.
func transparentLine(from string, i int) string { return fmt.Sprintf("line %d from %s", i, from) }
