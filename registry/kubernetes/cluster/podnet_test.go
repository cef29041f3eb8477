package cluster

// The pod network of node-a, for the tests that carry real traffic: a
// bridge at 10.244.0.1/24 in the test binary's own network namespace and,
// per pod, a network namespace with a veth on the bridge and the pod's
// address, as a CNI bridge plugin would make it. 10.244.0.0/16 is the pod
// network the manifests name in the backends' -trusted-proxies: the proxy
// reaches the pods from 10.244.0.1.

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

const bridge = "crbr0"

var podNet struct {
	sync.Mutex
	up   bool
	next int
	live map[string]bool // network namespaces not yet removed
}

// needPodNetwork skips the test (fails it under CIDROUTE_REQUIRE_TOOLS=1)
// unless the binary runs in a network namespace of its own, and makes the
// bridge once.
func needPodNetwork(t *testing.T) {
	t.Helper()
	if !ownNetns {
		why := "pods with real addresses need root, unshare and ip (the test binary moves into a network namespace of its own)"
		if testtool.Required() {
			t.Fatalf("%s, and CIDROUTE_REQUIRE_TOOLS=1", why)
		}
		t.Skip(why + " (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)")
	}
	podNet.Lock()
	defer podNet.Unlock()
	if podNet.up {
		return
	}
	for _, args := range [][]string{
		{"link", "add", bridge, "type", "bridge"},
		{"addr", "add", nodeIP + "/24", "dev", bridge},
		{"link", "set", bridge, "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	podNet.up, podNet.live = true, map[string]bool{}
}

// A sandbox is one pod's network namespace and address.
type sandbox struct {
	netns string
	ip    string
}

// newSandbox makes the next pod's network namespace, at 10.244.0.(10+n).
func newSandbox() (*sandbox, error) {
	podNet.Lock()
	n := podNet.next
	podNet.next++
	podNet.Unlock()
	if n > 240 {
		return nil, fmt.Errorf("pod network: out of addresses")
	}
	s := &sandbox{netns: fmt.Sprintf("cidroute-%d-%d", os.Getpid(), n), ip: fmt.Sprintf("10.244.0.%d", 10+n)}
	veth := fmt.Sprintf("crv%d", n)
	for _, args := range [][]string{
		{"netns", "add", s.netns},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", s.netns},
		{"link", "set", veth, "master", bridge, "up"},
		{"-n", s.netns, "addr", "add", s.ip + "/24", "dev", "eth0"},
		{"-n", s.netns, "link", "set", "eth0", "up"},
		{"-n", s.netns, "link", "set", "lo", "up"},
		{"-n", s.netns, "route", "add", "default", "via", nodeIP},
	} {
		if err := ip(args...); err != nil {
			if args[0] != "netns" {
				ip("netns", "del", s.netns)
			}
			return nil, err
		}
		if args[0] == "netns" {
			podNet.Lock()
			podNet.live[s.netns] = true
			podNet.Unlock()
		}
	}
	return s, nil
}

// command returns a command that runs bin in the sandbox.
func (s *sandbox) command(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", s.netns, bin}, args...)
}

// remove deletes the network namespace (and with it the veth pair).
func (s *sandbox) remove() error {
	podNet.Lock()
	delete(podNet.live, s.netns)
	podNet.Unlock()
	return ip("netns", "del", s.netns)
}

// stopPodNetwork removes the network namespaces left. The bridge goes with
// the test binary's namespace.
func stopPodNetwork() {
	podNet.Lock()
	defer podNet.Unlock()
	for ns := range podNet.live {
		ip("netns", "del", ns)
	}
	podNet.live = nil
}

// ip runs ip(8).
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
