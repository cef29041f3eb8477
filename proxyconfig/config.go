package proxyconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/internal/boundedread"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// The JSON file, as written. Every object is read by decodeStrict: keys
// match exactly and once, unknown keys are errors, so a typo is reported
// instead of silently taking a default.
type fileConfig struct {
	HRWSeed       uint64            `json:"hrw_seed"`
	MetricsListen string            `json:"metrics_listen"`
	PprofListen   string            `json:"pprof_listen"`
	LogLevel      string            `json:"log_level"`
	Wait          string            `json:"wait"`
	XDPInterfaces []string          `json:"xdp_interfaces"` // xdp.go
	Services      []json.RawMessage `json:"services"`       // decoded one by one, to name the service in errors
}

type fileService struct {
	Name           string           `json:"name"`
	Protocol       string           `json:"protocol"`
	Listen         string           `json:"listen"`
	CIDLength      int              `json:"cid_length"`
	CIDCodec       string           `json:"cid_codec"`        // cidkeys.go
	CIDNonceLength int              `json:"cid_nonce_length"` // cidkeys.go
	CIDKeysFile    string           `json:"cid_keys_file"`    // cidkeys.go
	ProxyProtocol  *bool            `json:"proxy_protocol"`
	MaxSessions    int              `json:"max_sessions"` // transparent mode only
	SessionIdle    string           `json:"session_idle"` // transparent mode only
	Workers        int              `json:"workers"`
	RecvBuffer     *int             `json:"recv_buffer"` // absent: DefaultRecvBuffer
	SendBuffer     int              `json:"send_buffer"`
	EarlyDrop      bool             `json:"early_drop"`
	MaxRegistryAge string           `json:"max_registry_age"`
	Backends       json.RawMessage  `json:"backends"` // registry.DecodeBackends format
	BackendsFile   string           `json:"backends_file"`
	Kubernetes     *Kubernetes      `json:"kubernetes"`
	Limits         fileLimits       `json:"limits"`
	Unroutable     string           `json:"unroutable"`   // QUIC only: "drop" (default) or "hash"
	HealthCheck    *fileHealthCheck `json:"health_check"` // health.go
}

type fileLimits struct {
	GlobalPPS    int `json:"global_pps"`
	PerSourcePPS int `json:"per_source_pps"`
	HandshakePPS int `json:"handshake_pps"`
	ZeroRTTPPS   int `json:"zero_rtt_pps"`
}

// Config is a validated configuration with every default filled in.
type Config struct {
	Seed          uint64     // hrw_seed
	MetricsListen string     // metrics_listen; "" = no metrics endpoint
	PprofListen   string     // pprof_listen: Go's profiler, on a listener of its own; "" = none
	LogLevel      slog.Level // log_level
	// Wait ("wait") is how the pipeline's workers wait for datagrams:
	// "thread" (the default here: each worker holds a thread that waits
	// in epoll_wait for both of its sockets, the cheapest wake-up)
	// or "netpoller".
	Wait cidroute.WaitMode
	// XDPInterfaces (xdp_interfaces) are the interfaces of the XDP fast
	// path: distinct names, not checked against the host. Attaching is the
	// program's (module cidroute/xdp, xdp.Accelerate).
	XDPInterfaces []string
	Services      []Service
}

// Service is one entry of "services". The zero values of Workers,
// MaxSessions, SessionIdle and MaxAge mean the library's defaults.
type Service struct {
	Name     string
	Protocol cidroute.Protocol
	Listen   netip.AddrPort
	// Public is the public address (the VIP) when it differs from Listen;
	// zero means Listen. Not in the JSON yet; a program may set it.
	Public netip.AddrPort
	CIDLen int
	// CIDEncryption, when set, makes the CIDs encrypted QUIC-LB ones
	// (cidkeys.go).
	CIDEncryption *CIDEncryption
	// Transparent (proxy_protocol false): no PPv2 header, one upstream
	// socket per client address, at most MaxSessions per worker, each
	// expiring after SessionIdle (0 = the library defaults).
	Transparent bool
	MaxSessions int
	SessionIdle time.Duration
	Workers     int // 0 = one per CPU (GOMAXPROCS as the process started)
	// RecvBuffer and SendBuffer (recv_buffer, send_buffer) are the
	// service sockets' SO_RCVBUF and SO_SNDBUF in bytes; 0 keeps the
	// kernel's default. An absent recv_buffer is DefaultRecvBuffer.
	RecvBuffer, SendBuffer int
	// EarlyDrop (early_drop): cidroute.Service.EarlyDrop, DTLS with the
	// ordinal-first codec only.
	EarlyDrop bool
	MaxAge    time.Duration // max_registry_age; 0 = never stale
	// At most one of Backends (a static list, validated), BackendsFile
	// (an absolute path, or relative to the working directory) and
	// Kubernetes (the Service whose EndpointSlices are the backends,
	// sourced by Options.Kubernetes). With none of them the program
	// supplies the backends (Options.Source).
	Backends     []registry.Backend
	BackendsFile string
	Kubernetes   *Kubernetes
	Limits       cidroute.Limits
	// Unroutable ("unroutable", QUIC only): what becomes of short-header
	// and Handshake packets whose CID names no server.
	Unroutable cidroute.UnroutablePolicy
	// Health ("health_check"), when set, is the configuration of the
	// service's health checker, defaults applied (health.go).
	Health *health.Config
}

const maxWorkers = 256 // cidroute.Pipeline's limit

// DefaultRecvBuffer is recv_buffer when the key is absent: 4 MiB. The
// kernel's default (about 208 KiB) holds about 2 ms of datagrams at 100k/s,
// so a scheduling stall drops them: on ../shared/bench at 100k/s the
// default lost 0.78–1.88 % and 4 MiB none, at the same CPU per datagram,
// and an independent QUIC client's 16 MB downloads lost 59–289 datagrams
// per run at the default and none at 4 MiB. The size is a limit, not an
// allocation: the memory is used only while datagrams wait. Without
// CAP_NET_ADMIN the kernel caps it at net.core.rmem_max, which the
// Pipeline logs.
const DefaultRecvBuffer = 4 << 20

// maxSocketBuffer bounds recv_buffer and send_buffer (1 GiB): the kernel
// caps what it grants anyway, this catches a unit mistaken for another.
const maxSocketBuffer = 1 << 30

// Lower bounds of the duration keys, checked by -check as by a start.
const (
	// The library's bound (see cidroute.MinSessionIdle), checked here
	// too so that -check, which opens no socket, says so.
	minSessionIdle = cidroute.MinSessionIdle
	// The file source confirms once per 1 s poll; a limit of fewer than
	// three polls turns a healthy registry stale at the first slow one and
	// makes it flap (4ns spun a CPU and logged 33,000 lines in 4 s).
	minRegistryAge = 3 * time.Second
)

// Bounds of the files the program reads: both are a few kilobytes in
// practice; a FIFO or a hung mount must not block start-up or -check.
const (
	maxConfigSize = 1 << 20
	readTimeout   = 5 * time.Second
)

var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Load reads and validates the file at path (at most 1 MiB, a regular
// file, read within 5 s). A relative backends_file or cid_keys_file is
// taken relative to the config file's directory.
func Load(ctx context.Context, path string) (*Config, error) {
	data, err := boundedread.Read(ctx, path, maxConfigSize, readTimeout)
	if err != nil {
		return nil, err
	}
	cfg, err := Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, s := range cfg.Services {
		if s.BackendsFile != "" && !filepath.IsAbs(s.BackendsFile) {
			cfg.Services[i].BackendsFile = filepath.Join(filepath.Dir(path), s.BackendsFile)
		}
		s.CIDEncryption.resolve(filepath.Dir(path))
	}
	return cfg, nil
}

// Parse decodes and validates a JSON configuration. Relative file names
// stay as written (relative to the working directory).
func Parse(r io.Reader) (*Config, error) {
	var fc fileConfig
	if err := decodeStrict(r, &fc); err != nil {
		return nil, err
	}
	cfg := &Config{Seed: fc.HRWSeed, MetricsListen: fc.MetricsListen, PprofListen: fc.PprofListen, XDPInterfaces: fc.XDPInterfaces}
	if err := checkXDP(fc.XDPInterfaces); err != nil {
		return nil, err
	}
	if fc.MetricsListen != "" {
		if err := checkHostPort(fc.MetricsListen); err != nil {
			return nil, fmt.Errorf("metrics_listen: %w", err)
		}
	}
	if fc.PprofListen != "" {
		if err := checkHostPort(fc.PprofListen); err != nil {
			return nil, fmt.Errorf("pprof_listen: %w", err)
		}
		if fc.PprofListen == fc.MetricsListen {
			return nil, fmt.Errorf("pprof_listen %q: the profiler has a listener of its own, not metrics_listen's", fc.PprofListen)
		}
	}
	switch fc.LogLevel {
	case "", "info":
		cfg.LogLevel = slog.LevelInfo
	case "debug":
		cfg.LogLevel = slog.LevelDebug
	case "warn":
		cfg.LogLevel = slog.LevelWarn
	case "error":
		cfg.LogLevel = slog.LevelError
	default:
		return nil, fmt.Errorf("log_level %q: want debug, info, warn or error", fc.LogLevel)
	}
	cfg.Wait = cidroute.WaitThread
	if fc.Wait != "" {
		if err := cfg.Wait.UnmarshalText([]byte(fc.Wait)); err != nil {
			return nil, fmt.Errorf("wait: %w", err)
		}
	}
	if len(fc.Services) == 0 {
		return nil, fmt.Errorf("services: at least one service is needed")
	}
	names := map[string]int{}
	listens := map[netip.AddrPort]string{}
	for i, raw := range fc.Services {
		s, err := parseService(raw)
		if err != nil {
			if s.Name != "" {
				return nil, fmt.Errorf("services[%d] (%q): %w", i, s.Name, err)
			}
			return nil, fmt.Errorf("services[%d]: %w", i, err)
		}
		if j, dup := names[s.Name]; dup {
			return nil, fmt.Errorf("services[%d]: name %q already used by services[%d]", i, s.Name, j)
		}
		names[s.Name] = i
		if other, dup := listens[s.Listen]; dup {
			return nil, fmt.Errorf("services[%d] (%q): listen %v already used by %q", i, s.Name, s.Listen, other)
		}
		listens[s.Listen] = s.Name
		cfg.Services = append(cfg.Services, s)
	}
	return cfg, nil
}

// parseService decodes one service. The returned value carries the name
// (when one was read) even on error, for the caller's message.
func parseService(raw json.RawMessage) (Service, error) {
	var fs fileService
	if err := decodeStrict(bytes.NewReader(raw), &fs); err != nil {
		var named struct{ Name string }
		json.Unmarshal(raw, &named) // only to name the service in the error
		return Service{Name: named.Name}, err
	}
	s := Service{Name: fs.Name, BackendsFile: fs.BackendsFile, Kubernetes: fs.Kubernetes}
	fail := func(format string, args ...any) (Service, error) {
		return s, fmt.Errorf(format, args...)
	}
	if !serviceName.MatchString(fs.Name) {
		return fail("name %q: want 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit", fs.Name)
	}
	var err error
	if s.Protocol, err = cidroute.ParseProtocol(fs.Protocol); err != nil {
		return fail("protocol %q: want \"dtls\" or \"quic\"", fs.Protocol)
	}
	if s.Listen, err = netip.ParseAddrPort(fs.Listen); err != nil {
		return fail("listen %q: want ip:port (IPv6 in brackets)", fs.Listen)
	}
	// Unmapped before it is checked: [::ffff:255.255.255.255] is the
	// broadcast address too.
	s.Listen = netip.AddrPortFrom(s.Listen.Addr().Unmap(), s.Listen.Port())
	if s.Listen.Port() == 0 || s.Listen.Addr().IsMulticast() || s.Listen.Addr() == broadcast {
		return fail("listen %v: want a unicast or wildcard address (not multicast or broadcast) and a non-zero port", fs.Listen)
	}
	s.CIDLen = fs.CIDLength
	switch s.Protocol {
	case cidroute.DTLS:
		if s.CIDLen == 0 {
			s.CIDLen = cidroute.DefaultDTLSCIDLen
		}
		err = dtls.OrdinalFirst{Length: s.CIDLen}.Validate()
	case cidroute.QUIC:
		if s.CIDLen == 0 {
			s.CIDLen = cidroute.DefaultQUICCIDLen
		}
		err = quic.LB{Length: s.CIDLen}.Validate()
	}
	if err != nil || fs.CIDLength < 0 {
		return fail("cid_length %d: %v", fs.CIDLength, err)
	}
	if err := parseCIDCodec(&fs, &s); err != nil {
		return fail("%v", err)
	}
	if s.Protocol == cidroute.QUIC {
		if err := quic.CheckServerCIDLen(s.CIDLen); err != nil {
			return fail("cid_length: %v", err)
		}
	}
	s.Transparent = fs.ProxyProtocol != nil && !*fs.ProxyProtocol
	if !s.Transparent && (fs.MaxSessions != 0 || fs.SessionIdle != "") {
		return fail("max_sessions and session_idle apply only with proxy_protocol false")
	}
	if fs.MaxSessions < 0 {
		return fail("max_sessions %d: want 0 (default %d) or more", fs.MaxSessions, cidroute.DefaultMaxSessions)
	}
	s.MaxSessions = fs.MaxSessions
	if s.SessionIdle, err = parseDuration("session_idle", fs.SessionIdle, minSessionIdle, false); err != nil {
		return s, err
	}
	if fs.Workers < 0 || fs.Workers > maxWorkers {
		return fail("workers %d: want 0 (one per CPU) to %d", fs.Workers, maxWorkers)
	}
	s.Workers = fs.Workers
	recv := DefaultRecvBuffer
	if fs.RecvBuffer != nil {
		recv = *fs.RecvBuffer
	}
	if recv < 0 || fs.SendBuffer < 0 || recv > maxSocketBuffer || fs.SendBuffer > maxSocketBuffer {
		return fail("recv_buffer %d, send_buffer %d: want 0 (the kernel's default) to %d bytes", recv, fs.SendBuffer, maxSocketBuffer)
	}
	s.RecvBuffer, s.SendBuffer = recv, fs.SendBuffer
	if fs.EarlyDrop && (s.Protocol != cidroute.DTLS || s.CIDEncryption != nil) {
		return fail("early_drop: DTLS services with the ordinal-first codec only (the socket filter reads the ordinal in the clear)")
	}
	s.EarlyDrop = fs.EarlyDrop
	if s.MaxAge, err = parseDuration("max_registry_age", fs.MaxRegistryAge, minRegistryAge, true); err != nil {
		return s, err
	}
	hasList := len(fs.Backends) > 0 && string(fs.Backends) != "null"
	sources := 0
	for _, given := range []bool{hasList, fs.BackendsFile != "", fs.Kubernetes != nil} {
		if given {
			sources++
		}
	}
	switch {
	case sources > 1:
		return fail("backends, backends_file and kubernetes: give exactly one")
	case fs.Kubernetes != nil:
		if err := fs.Kubernetes.validate(); err != nil {
			return fail("kubernetes: %v", err)
		}
	case hasList:
		// The registry's own validation, as for every other source.
		if s.Backends, err = registry.DecodeBackends(bytes.NewReader(fs.Backends)); err != nil {
			return s, fmt.Errorf("backends: %w", err)
		}
	}
	switch fs.Unroutable {
	case "", "drop":
	case "hash":
		s.Unroutable = cidroute.UnroutableHash
	default:
		return fail("unroutable %q: want \"drop\" or \"hash\"", fs.Unroutable)
	}
	if fs.Unroutable != "" && s.Protocol != cidroute.QUIC {
		return fail("unroutable applies to quic services only (a DTLS CID has no unroutable marker)")
	}
	if err := parseHealthCheck(fs.HealthCheck, &s); err != nil {
		return s, err
	}
	l := fs.Limits
	for _, v := range []struct {
		key string
		n   int
	}{{"global_pps", l.GlobalPPS}, {"per_source_pps", l.PerSourcePPS}, {"handshake_pps", l.HandshakePPS}, {"zero_rtt_pps", l.ZeroRTTPPS}} {
		if v.n < 0 {
			return fail("limits.%s %d: want 0 (off) or a positive rate", v.key, v.n)
		}
	}
	s.Limits = cidroute.Limits{GlobalPPS: l.GlobalPPS, PerSourcePPS: l.PerSourcePPS, HandshakePPS: l.HandshakePPS, ZeroRTTPPS: l.ZeroRTTPPS}
	return s, nil
}

// jsonError rewords encoding/json's errors to name the key in the file's
// terms.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "value"
		}
		return fmt.Errorf("%s: JSON %s where %s is expected", field, te.Value, kindName(te.Type.Kind().String()))
	case errors.As(err, &se):
		return fmt.Errorf("JSON syntax error at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("empty file")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("unknown key %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return fmt.Errorf("%w", err)
}

func kindName(k string) string {
	switch {
	case strings.HasPrefix(k, "uint"):
		return "a non-negative integer"
	case strings.HasPrefix(k, "int"):
		return "an integer"
	case k == "slice":
		return "a list"
	case k == "struct":
		return "an object"
	case k == "ptr":
		return "a boolean"
	}
	return "a " + k
}

var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// parseDuration reads a duration key: absent means 0 (the default); else a
// Go duration of at least min, or "0s" where zeroOff says 0 turns the
// feature off.
func parseDuration(key, s string, min time.Duration, zeroOff bool) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil || d < 0:
		return 0, fmt.Errorf("%s %q: want a Go duration such as \"30s\"", key, s)
	case d == 0 && zeroOff:
		return 0, nil
	case d < min && zeroOff:
		return 0, fmt.Errorf("%s %q: want \"0s\" (off) or at least %v", key, s, min)
	case d < min:
		return 0, fmt.Errorf("%s %q: want at least %v", key, s, min)
	}
	return d, nil
}

// checkHostPort accepts host:port with a numeric port, host possibly
// empty (all addresses) or a name.
func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port %q: want 1-65535", s, port)
	}
	return nil
}

// Summary is a one-line description of c, the one cidproxy -check prints
// and its start-up log repeats. It shows no key material.
func (c *Config) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d service(s):", len(c.Services))
	for i, s := range c.Services {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %s %s on %v (cid %d%s", s.Name, s.Protocol, s.Listen, s.CIDLen, s.CIDEncryption.summary())
		if s.Kubernetes != nil {
			fmt.Fprintf(&b, ", backends from EndpointSlices of %s/%s", s.Kubernetes.namespace(), s.Kubernetes.Service)
		} else if s.BackendsFile != "" {
			fmt.Fprintf(&b, ", backends from %s", s.BackendsFile)
		} else if s.Backends == nil {
			b.WriteString(", backends from the program")
		} else {
			fmt.Fprintf(&b, ", %d backends", len(s.Backends))
		}
		if s.Workers > 0 {
			fmt.Fprintf(&b, ", %d workers", s.Workers)
		}
		if s.MaxAge > 0 {
			fmt.Fprintf(&b, ", max age %v", s.MaxAge)
		}
		if s.Limits != (cidroute.Limits{}) {
			b.WriteString(", limits on")
		}
		if s.Unroutable == cidroute.UnroutableHash {
			b.WriteString(", unroutable CIDs hashed")
		}
		b.WriteString(healthSummary(s.Health))
		b.WriteByte(')')
	}
	if c.MetricsListen != "" {
		fmt.Fprintf(&b, "; metrics on %s", c.MetricsListen)
	}
	if c.PprofListen != "" {
		fmt.Fprintf(&b, "; pprof on %s", c.PprofListen)
	}
	fmt.Fprintf(&b, "; hrw_seed %d", c.Seed)
	return b.String()
}

// CheckFiles reads every backends_file and cid_keys_file once, for
// cidproxy -check: at run time a bad file is logged and retried, but a
// check should say so. The read is bounded as the file source's is, and
// the list validated by the same decoder and refused at an own address
// as Validate refuses an inline one.
func (c *Config) CheckFiles(ctx context.Context) error {
	lists := make([][]registry.Backend, len(c.Services))
	for i, s := range c.Services {
		if s.BackendsFile == "" {
			continue
		}
		data, err := boundedread.Read(ctx, s.BackendsFile, maxConfigSize, readTimeout)
		if err != nil {
			return fmt.Errorf("service %q: backends_file: %w", s.Name, err)
		}
		if lists[i], err = registry.DecodeBackends(bytes.NewReader(data)); err != nil {
			return fmt.Errorf("service %q: backends_file %s: %w", s.Name, s.BackendsFile, err)
		}
	}
	if err := c.checkOwnBackends(func(i int) []registry.Backend { return lists[i] }); err != nil {
		return fmt.Errorf("backends_file: %w", err)
	}
	return c.checkCIDKeyFiles(ctx)
}

// checkXDP validates the "xdp_interfaces" key: names of interfaces,
// each once. Whether they exist is checked when the program attaches.
func checkXDP(names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || len(n) >= 16 || seen[n] { // IFNAMSIZ
			return fmt.Errorf("xdp_interfaces: %q: want distinct interface names", n)
		}
		seen[n] = true
	}
	return nil
}

// Kubernetes is a service's "kubernetes" key: the backends are the
// endpoints of a Service, read from its EndpointSlices.
type Kubernetes struct {
	Namespace  string `json:"namespace"`  // "" = "default"
	Service    string `json:"service"`    // required
	PortName   string `json:"port_name"`  // "" when the Service has one port
	Kubeconfig string `json:"kubeconfig"` // "" = in-cluster configuration
}

func (k *Kubernetes) validate() error {
	if k.Service == "" {
		return fmt.Errorf("service is required")
	}
	return nil
}

func (k *Kubernetes) namespace() string {
	if k.Namespace == "" {
		return "default"
	}
	return k.Namespace
}
