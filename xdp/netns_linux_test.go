package xdp

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
	"golang.org/x/sys/unix"
)

// needRoot skips a test that loads BPF programs or makes namespaces unless
// it runs as root, or fails it when tools are required (CI runs as root).
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		testtool.Look(t, "iproute2", "ip")
		return
	}
	if testtool.Required() {
		t.Fatal("the XDP tests need root (BPF_PROG_TEST_RUN, network namespaces) and CIDROUTE_REQUIRE_TOOLS=1")
	}
	t.Skip("the XDP tests need root: BPF_PROG_TEST_RUN and network namespaces (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)")
}

var nsSeq atomic.Int64

// netns is a named network namespace (ip netns), removed at cleanup.
type netns struct {
	name string
	fd   int
}

func newNetns(t testing.TB, tag string) *netns {
	t.Helper()
	name := fmt.Sprintf("cx%s%d-%d", tag, os.Getpid(), nsSeq.Add(1))
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	n := &netns{name: name, fd: fd}
	n.ip(t, "link set lo up")
	return n
}

// ip runs an ip(8) command in the namespace.
func (n *netns) ip(t testing.TB, args string) {
	t.Helper()
	run(t, "ip", append([]string{"-n", n.name}, strings.Fields(args)...)...)
}

// do runs f on a thread that is in the namespace, then puts the thread
// back: BPF_PROG_TEST_RUN, the FIB and the interface list go by the
// calling thread's namespace.
func (n *netns) do(t testing.TB, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			panic(err) // a thread left in the namespace must not be reused
		}
	}()
	f()
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
