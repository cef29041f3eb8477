// Package testtool lets tests that need an external program (openssl, qemu,
// nginx, coap-client) skip on a machine without it, unless the environment
// says the tools are required (CI sets CIDROUTE_REQUIRE_TOOLS=1).
package testtool

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Required reports whether missing tools must fail tests instead of skipping
// them.
func Required() bool { return os.Getenv("CIDROUTE_REQUIRE_TOOLS") == "1" }

// Look returns the path of the first of names found on PATH. When none is
// found, the test is skipped with a message naming what to install, or
// failed when tools are required.
func Look(t testing.TB, pkg string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if Required() {
		t.Fatalf("%v not found on PATH and CIDROUTE_REQUIRE_TOOLS=1 (install Debian package %s)", names, pkg)
	}
	t.Skipf("%v not found on PATH: install Debian package %s (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)", names, pkg)
	return ""
}

// FreePort returns a loopback port that was free a moment ago on network
// "udp" or "tcp", for configs that must name a port before the program that
// binds it starts.
func FreePort(t testing.TB, network string) uint16 {
	t.Helper()
	var a net.Addr
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a = c.LocalAddr()
		c.Close()
	} else {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a = l.Addr()
		l.Close()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return ap.Port()
}

// SyncBuffer is a bytes.Buffer that writer goroutines (a logger, a child
// process) and the test may use at the same time.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Hex decodes hex digits written with any white space, skipping lines that
// start with '#' (the golden datagrams' format). Bad hex fails the test.
func Hex(t testing.TB, s string) []byte {
	t.Helper()
	var sb strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			sb.WriteString(strings.Join(strings.Fields(line), ""))
		}
	}
	b, err := hex.DecodeString(sb.String())
	if err != nil {
		t.Fatalf("hex: %v", err)
	}
	return b
}

// ReadHex reads a golden datagram file (see Hex).
func ReadHex(t testing.TB, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return Hex(t, string(raw))
}

// ParseMetrics reads the Prometheus text format into "name{labels}" →
// value, labels as the exposition writes them (sorted by name), for tests
// that scrape a running binary.
func ParseMetrics(r io.Reader) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}
