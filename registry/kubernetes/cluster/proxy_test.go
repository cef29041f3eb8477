package cluster

// The Kubernetes build of cidproxy (examples/kubernetes/cidproxy) as a
// process, with the config of the manifests' ConfigMap, and pion/dtls v3
// clients with connection IDs that talk to it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
)

// cidproxy is one proxy replica.
type cidproxy struct {
	proc    *process
	addr    netip.AddrPort // its service's listen address, where clients send
	metrics string         // host:port of /metrics
	service string         // the service's name in the config
}

// startCidproxy runs the Kubernetes build of cidproxy with the config.json
// of the ConfigMap in cidproxy.yaml, changed only where a pod and this
// machine differ: the listen and metrics addresses (free loopback ports),
// the key file (where keysFile wrote the Secret's), the kubeconfig (the
// cidproxy service account on the proxies' API server: in a pod it is
// the in-cluster config) and max_registry_age, when not "".
func startCidproxy(t *testing.T, maxAge string) *cidproxy {
	t.Helper()
	objs, err := readManifest("cidproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var raw string
	for _, o := range objs {
		if isKind(o, "ConfigMap", "cidproxy") {
			raw, _, _ = unstructured.NestedString(o.Object, "data", "config.json")
		}
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("cidproxy.yaml config.json: %v", err)
	}
	svc := cfg["services"].([]any)[0].(map[string]any)
	p := &cidproxy{
		addr:    netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testtool.FreePort(t, "udp")),
		metrics: fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp")),
		service: svc["name"].(string),
	}
	cfg["metrics_listen"] = p.metrics
	svc["listen"] = p.addr.String()
	if svc["cid_keys_file"] != keysMount {
		t.Fatalf("config.json reads the keys at %v, not at the Secret's mount %s", svc["cid_keys_file"], keysMount)
	}
	svc["cid_keys_file"] = keysFile(t)
	if maxAge != "" {
		svc["max_registry_age"] = maxAge
	}
	svc["kubernetes"].(map[string]any)["kubeconfig"] = proxyKubeconfig
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	data, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p.proc, err = startProcess("cidproxy", filepath.Join(dir, "cidproxy.log"), nil, tools.cidproxy, "-config", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.proc.stop(10 * time.Second); err != nil {
			t.Errorf("cidproxy: %v", err)
		}
		if t.Failed() {
			t.Logf("cidproxy log:\n%s", p.proc.tail(20000))
		}
	})
	return p
}

// scrape returns the proxy's metrics, nil while it does not answer.
func (p *cidproxy) scrape() map[string]float64 {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	m, err := testtool.ParseMetrics(resp.Body)
	if err != nil {
		return nil
	}
	return m
}

// updates returns when the proxy changed its backends, from its log
// (slog's text format, times to the millisecond).
func (p *cidproxy) updates() []time.Time {
	data, _ := os.ReadFile(p.proc.log)
	var ts []time.Time
	for line := range strings.Lines(string(data)) {
		if !strings.Contains(line, `msg="kubernetes: backends updated"`) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
			ts = append(ts, at)
		}
	}
	return ts
}

// straddles reports whether the proxy changed its backends (updates)
// during the cookie round r: between the first ClientHello and the
// ClientHello that answered the HelloVerifyRequest (sent at once; the
// slack allows for the proxy's log line, written after the change, and
// for a loaded machine). Such a round's second ClientHello can go by HRW
// to another backend than its first, and only the first holds the
// cookie: the one way a new handshake may fail while backends change
// (see docs/design.md).
func (r cookieRound) straddles(updates []time.Time) bool {
	if r.verify.IsZero() {
		return false // no HelloVerifyRequest came back
	}
	for _, at := range updates {
		if !at.Before(r.hello.Add(-time.Millisecond)) && !at.After(r.verify.Add(50*time.Millisecond)) {
			return true
		}
	}
	return false
}

// state is the proxy's registry as its metrics show it.
type state struct {
	ready, draining, gone int
	stale                 bool
	refused               int // new sessions dropped as stale_registry
}

func (s state) String() string {
	return fmt.Sprintf("ready=%d draining=%d gone=%d stale=%v refused=%d", s.ready, s.draining, s.gone, s.stale, s.refused)
}

func (p *cidproxy) state() (state, bool) {
	m := p.scrape()
	if m == nil {
		return state{}, false
	}
	g := func(k string) int { return int(m[k]) }
	svc := `service="` + p.service + `"`
	return state{
		ready:    g(`cidroute_registry_backends{` + svc + `,state="ready"}`),
		draining: g(`cidroute_registry_backends{` + svc + `,state="draining"}`),
		gone:     g(`cidroute_registry_backends{` + svc + `,state="gone"}`),
		stale:    g(`cidroute_registry_stale{`+svc+`}`) == 1,
		refused:  g(`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="stale_registry",` + svc + `}`),
	}, true
}

// waitState waits until cond holds for the proxy's state.
func (p *cidproxy) waitState(t *testing.T, step string, start time.Time, bound time.Duration, cond func(state) bool) state {
	t.Helper()
	var last state
	waitFor(t, step, start, bound, func() (bool, string) {
		s, ok := p.state()
		if !ok {
			return false, "no metrics: " + p.proc.tail(2000)
		}
		last = s
		return cond(s), s.String()
	})
	return last
}

// A session is a pion/dtls v3 client with connection IDs, through a proxy.
type session struct {
	conn *pion.Conn
	sock *cidConn
}

// cidConn is the client's socket; it keeps the connection ID of the last
// tls12_cid record the client sent (the CID the backend issued), and the
// times of the handshake's cookie round.
type cidConn struct {
	net.PacketConn
	mu    sync.Mutex
	cid   []byte
	round cookieRound
}

// cookieRound is when the client sent its first datagram (the first
// ClientHello) and when the first HelloVerifyRequest came back: the proxy
// routes the ClientHello that answers it, with the cookie, right after.
type cookieRound struct {
	hello, verify time.Time
}

func (c *cidConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	c.mu.Lock()
	if c.round.hello.IsZero() {
		c.round.hello = time.Now()
	}
	// tls12_cid (25): type, version, epoch, sequence number, then the CID
	// at offset 11, of the configured length (8).
	if len(b) >= 11+8 && b[0] == 25 {
		c.cid = append(c.cid[:0], b[11:19]...)
	}
	c.mu.Unlock()
	return c.PacketConn.WriteTo(b, addr)
}

func (c *cidConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.PacketConn.ReadFrom(b)
	if err == nil && isHelloVerify(b[:n]) {
		c.mu.Lock()
		if c.round.verify.IsZero() {
			c.round.verify = time.Now()
		}
		c.mu.Unlock()
	}
	return n, a, err
}

// isHelloVerify reports whether datagram b starts with a handshake record
// holding a HelloVerifyRequest.
func isHelloVerify(b []byte) bool {
	r, _, err := dtls.ParseRecord(b, 8)
	return err == nil && r.Type == dtls.Handshake && r.Fragment[0] == byte(dtls.HandshakeHelloVerifyRequest)
}

// dial handshakes through the proxy at addr within timeout. The backends
// run in certificate mode with self-signed certificates.
func dial(ctx context.Context, addr netip.AddrPort, timeout time.Duration) (*session, error) {
	s, _, err := dialRound(ctx, addr, timeout)
	return s, err
}

// dialRound is dial that also says when the handshake's cookie round was.
func dialRound(ctx context.Context, addr netip.AddrPort, timeout time.Duration) (*session, cookieRound, error) {
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, cookieRound{}, err
	}
	sock := &cidConn{PacketConn: pc}
	round := func() cookieRound {
		sock.mu.Lock()
		defer sock.mu.Unlock()
		return sock.round
	}
	c, err := pion.Client(sock, net.UDPAddrFromAddrPort(addr), &pion.Config{
		InsecureSkipVerify:    true,
		ConnectionIDGenerator: pion.OnlySendCIDGenerator(),
		ExtendedMasterSecret:  pion.RequireExtendedMasterSecret,
	})
	if err != nil {
		pc.Close()
		return nil, cookieRound{}, err
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.HandshakeContext(hctx); err != nil {
		c.Close()
		pc.Close()
		return nil, round(), fmt.Errorf("handshake via %v: %w", addr, err)
	}
	return &session{conn: c, sock: sock}, round(), nil
}

// ordinal decrypts the backend ordinal from the session's connection ID
// with the example key file; -1 before the client has sent a CID.
func (s *session) ordinal() int {
	s.sock.mu.Lock()
	cid := slices.Clone(s.sock.cid)
	s.sock.mu.Unlock()
	if len(cid) == 0 || keys.codec == nil {
		return -1
	}
	ord, ok := keys.codec.Ordinal(cid)
	if !ok {
		return -1
	}
	return int(ord)
}

var errNoEcho = errors.New("no echo")

// echo sends msg and waits up to wait for it to come back, tries times.
func (s *session) echo(msg string, tries int, wait time.Duration) error {
	buf := make([]byte, 2048)
	for range tries {
		if _, err := s.conn.Write([]byte(msg)); err != nil {
			return err
		}
		s.conn.SetReadDeadline(time.Now().Add(wait))
		n, err := s.conn.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if err != nil {
			return err
		}
		if got := string(buf[:n]); got != msg {
			return fmt.Errorf("echo %q, sent %q", got, msg)
		}
		return nil
	}
	return errNoEcho
}

func (s *session) close() {
	s.conn.Close()
	s.sock.Close()
}

// auditCounts counts the cidproxy identity's EndpointSlice requests in an
// API server's audit log since offset (a byte offset into the log), by
// kind and response code: "list 200"; "watch-list 200", a watch that
// streams the whole state first (sendInitialEvents, a list by another
// name); "watch 200", a watch that resumes from a resource version;
// "watch 403".
func auditCounts(path string, offset int64) (map[string]int, int64) {
	data, _ := os.ReadFile(path)
	if int64(len(data)) < offset {
		offset = 0
	}
	n := map[string]int{}
	for line := range strings.Lines(string(data[offset:])) {
		var ev struct {
			Stage          string `json:"stage"`
			Verb           string `json:"verb"`
			RequestURI     string `json:"requestURI"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		// A watch is logged when it starts (ResponseStarted) and when it
		// ends; a refused one and a list only once (ResponseComplete).
		if ev.Stage == "ResponseStarted" || (ev.Stage == "ResponseComplete" && (ev.Verb != "watch" || ev.ResponseStatus.Code != 200)) {
			kind := ev.Verb
			if u, err := url.Parse(ev.RequestURI); err == nil && kind == "watch" && u.Query().Get("sendInitialEvents") == "true" {
				kind = "watch-list"
			}
			n[fmt.Sprintf("%s %d", kind, ev.ResponseStatus.Code)]++
		}
	}
	return n, int64(len(data))
}
