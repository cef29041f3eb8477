package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/internal/testtool"
)

// inNetns runs f on a thread in the namespace at path, then puts it back.
func inNetns(t *testing.T, path string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(orig)
	ns, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ns)
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			panic(err)
		}
	}()
	f()
}

// TestXDPInterfaces runs the cidproxy program with "xdp_interfaces" in a
// namespace with a veth pair: the program attaches (natively on veth),
// exports cidroute_datagrams_total with path="xdp" beside
// path="socket", and detaches when the program stops.
func TestXDPInterfaces(t *testing.T) {
	if os.Geteuid() != 0 {
		if testtool.Required() {
			t.Fatal("needs root (XDP, network namespaces) and CIDROUTE_REQUIRE_TOOLS=1")
		}
		t.Skip("needs root: XDP and network namespaces (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)")
	}
	ip := testtool.Look(t, "iproute2", "ip")
	name := fmt.Sprintf("cxcp%d", os.Getpid())
	sh := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(ip, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	sh("netns", "add", name)
	t.Cleanup(func() { exec.Command(ip, "netns", "del", name).Run() })
	sh("-n", name, "link", "set", "lo", "up")
	sh("-n", name, "link", "add", "xv0", "type", "veth", "peer", "name", "xv1")
	sh("-n", name, "addr", "add", "192.0.2.1/24", "dev", "xv0")
	sh("-n", name, "link", "set", "xv0", "up")
	sh("-n", name, "link", "set", "xv1", "up")

	dir := t.TempDir()
	cfg := filepath.Join(dir, "cidproxy.json")
	if err := os.WriteFile(cfg, []byte(`{
		"metrics_listen": "127.0.0.1:9184",
		"xdp_interfaces": ["xv0"],
		"services": [{"name": "coaps", "protocol": "dtls", "listen": "192.0.2.1:5684",
			"backends": [{"ordinal": 0, "address": "192.0.2.10:6000"}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &testtool.SyncBuffer{}
	done := make(chan int, 1)
	// The program's sockets and the attach happen in the namespace: Run
	// starts there, on a thread that stays.
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(ns, unix.CLONE_NEWNET)
			unix.Close(ns)
		}
		if err != nil {
			t.Error(err)
			done <- -1
			return
		}
		done <- proxyapp.Run(ctx, []string{"-config", cfg}, io.Discard, logs, proxyapp.Options{XDP: startXDP})
	}()
	// Scrape from inside the namespace.
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		inNetns(t, "/run/netns/"+name, func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) })
		return c, err
	}}}
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := client.Get("http://127.0.0.1:9184/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if strings.Contains(body, `path="xdp"`) {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no xdp series: %v\n%s\nlogs:\n%s", err, body, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{
		`cidroute_datagrams_received_total{direction="forward",path="xdp",service="coaps"} 0`,
		`cidroute_datagrams_received_total{direction="forward",path="socket",service="coaps"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(logs.String(), `msg="xdp attached" interface=xv0 mode=native`) {
		t.Errorf("no native attach logged:\n%s", logs.String())
	}
	if out := sh("-n", name, "link", "show", "xv0"); !strings.Contains(out, "xdp") {
		t.Errorf("no program on xv0 while running:\n%s", out)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, logs.String())
	}
	if out := sh("-n", name, "link", "show", "xv0"); strings.Contains(out, "xdp") {
		t.Errorf("the program stayed attached after exit:\n%s", out)
	}
	if !strings.Contains(logs.String(), `msg="xdp detached" interface=xv0`) {
		t.Errorf("no detach logged:\n%s", logs.String())
	}
}
