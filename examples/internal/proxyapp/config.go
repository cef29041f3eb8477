package proxyapp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// The JSON file, as written. Keys are matched exactly and unknown keys are
// errors, so a typo is reported instead of silently taking a default.
type fileConfig struct {
	HRWSeed       uint64            `json:"hrw_seed"`
	MetricsListen string            `json:"metrics_listen"`
	LogLevel      string            `json:"log_level"`
	XDPInterfaces []string          `json:"xdp_interfaces"` // xdp.go
	Services      []json.RawMessage `json:"services"`       // decoded one by one, to name the service in errors
}

type fileService struct {
	Name           string          `json:"name"`
	Protocol       string          `json:"protocol"`
	Listen         string          `json:"listen"`
	CIDLength      int             `json:"cid_length"`
	ProxyProtocol  *bool           `json:"proxy_protocol"`
	MaxSessions    int             `json:"max_sessions"` // transparent mode only
	SessionIdle    string          `json:"session_idle"` // transparent mode only
	Workers        int             `json:"workers"`
	MaxRegistryAge string          `json:"max_registry_age"`
	Backends       json.RawMessage `json:"backends"` // registry.DecodeBackends format
	BackendsFile   string          `json:"backends_file"`
	Kubernetes     *Kubernetes     `json:"kubernetes"`
	Limits         fileLimits      `json:"limits"`
}

type fileLimits struct {
	GlobalPPS    int `json:"global_pps"`
	PerSourcePPS int `json:"per_source_pps"`
	HandshakePPS int `json:"handshake_pps"`
	ZeroRTTPPS   int `json:"zero_rtt_pps"`
}

// config is a validated configuration with every default filled in.
type config struct {
	Seed          uint64
	MetricsListen string // "" = no metrics endpoint
	LogLevel      slog.Level
	XDPInterfaces []string // the XDP fast path's interfaces (xdp.go)
	Services      []serviceConfig
}

type serviceConfig struct {
	Name     string
	Protocol cidroute.Protocol
	Listen   netip.AddrPort
	// Public is the public address (the VIP) when it differs from Listen;
	// zero means Listen. Not in the JSON yet; the demo sets it.
	Public netip.AddrPort
	CIDLen int
	// Transparent (proxy_protocol false): no PPv2 header, one upstream
	// socket per client address, at most MaxSessions per worker, each
	// expiring after SessionIdle (0 = the library defaults).
	Transparent bool
	MaxSessions int
	SessionIdle time.Duration
	Workers     int // 0 = one per CPU (GOMAXPROCS)
	MaxAge      time.Duration
	// Exactly one of Backends (a static list, validated) and BackendsFile
	// (an absolute path, or relative to the working directory).
	Backends     []registry.Backend
	BackendsFile string
	// Kubernetes, when set instead, names the Service whose EndpointSlices
	// are the backends (builds with Options.Kubernetes only).
	Kubernetes *Kubernetes
	Limits     cidroute.Limits
}

const maxWorkers = 256 // cidroute.Pipeline's limit

var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// loadConfig reads and validates the file at path. A relative
// backends_file is taken relative to the config file's directory.
func loadConfig(path string) (*config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := parseConfig(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, s := range cfg.Services {
		if s.BackendsFile != "" && !filepath.IsAbs(s.BackendsFile) {
			cfg.Services[i].BackendsFile = filepath.Join(filepath.Dir(path), s.BackendsFile)
		}
	}
	return cfg, nil
}

// parseConfig decodes and validates a JSON configuration.
func parseConfig(r io.Reader) (*config, error) {
	var fc fileConfig
	if err := decodeStrict(r, &fc); err != nil {
		return nil, err
	}
	cfg := &config{Seed: fc.HRWSeed, MetricsListen: fc.MetricsListen, XDPInterfaces: fc.XDPInterfaces}
	if err := checkXDP(fc.XDPInterfaces); err != nil {
		return nil, err
	}
	if fc.MetricsListen != "" {
		if err := checkHostPort(fc.MetricsListen); err != nil {
			return nil, fmt.Errorf("metrics_listen: %w", err)
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
func parseService(raw json.RawMessage) (serviceConfig, error) {
	var fs fileService
	if err := decodeStrict(bytes.NewReader(raw), &fs); err != nil {
		var named struct{ Name string }
		json.Unmarshal(raw, &named) // only to name the service in the error
		return serviceConfig{Name: named.Name}, err
	}
	s := serviceConfig{Name: fs.Name, BackendsFile: fs.BackendsFile, Kubernetes: fs.Kubernetes}
	fail := func(format string, args ...any) (serviceConfig, error) {
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
	if s.Listen.Port() == 0 || s.Listen.Addr().IsMulticast() {
		return fail("listen %v: want a unicast or wildcard address and a non-zero port", s.Listen)
	}
	s.Listen = netip.AddrPortFrom(s.Listen.Addr().Unmap(), s.Listen.Port())
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
	s.Transparent = fs.ProxyProtocol != nil && !*fs.ProxyProtocol
	if !s.Transparent && (fs.MaxSessions != 0 || fs.SessionIdle != "") {
		return fail("max_sessions and session_idle apply only with proxy_protocol false")
	}
	if fs.MaxSessions < 0 {
		return fail("max_sessions %d: want 0 (default %d) or more", fs.MaxSessions, cidroute.DefaultMaxSessions)
	}
	s.MaxSessions = fs.MaxSessions
	if fs.SessionIdle != "" {
		if s.SessionIdle, err = time.ParseDuration(fs.SessionIdle); err != nil || s.SessionIdle <= 0 {
			return fail("session_idle %q: want a positive Go duration such as \"2m\"", fs.SessionIdle)
		}
	}
	if fs.Workers < 0 || fs.Workers > maxWorkers {
		return fail("workers %d: want 0 (one per CPU) to %d", fs.Workers, maxWorkers)
	}
	s.Workers = fs.Workers
	if fs.MaxRegistryAge != "" {
		if s.MaxAge, err = time.ParseDuration(fs.MaxRegistryAge); err != nil || s.MaxAge < 0 {
			return fail("max_registry_age %q: want a Go duration such as \"30s\" (\"0s\" = off)", fs.MaxRegistryAge)
		}
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
	case sources == 0:
		return fail("no backends: give backends, backends_file or kubernetes")
	case fs.Kubernetes != nil:
		if err := fs.Kubernetes.validate(); err != nil {
			return fail("kubernetes: %v", err)
		}
	case hasList:
		if s.Backends, err = registry.DecodeBackends(bytes.NewReader(fs.Backends)); err != nil {
			return s, fmt.Errorf("backends: %w", err)
		}
		if len(s.Backends) == 0 {
			return fail("backends: empty list")
		}
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

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// keys (in nested objects too) and trailing data.
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the JSON object")
	}
	return nil
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

// summary is the one-line description -check prints and the start-up log
// repeats.
func (c *config) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d service(s):", len(c.Services))
	for i, s := range c.Services {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %s %s on %v (cid %d", s.Name, s.Protocol, s.Listen, s.CIDLen)
		if s.Kubernetes != nil {
			fmt.Fprintf(&b, ", backends from EndpointSlices of %s/%s", s.Kubernetes.namespace(), s.Kubernetes.Service)
		} else if s.BackendsFile != "" {
			fmt.Fprintf(&b, ", backends from %s", s.BackendsFile)
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
		b.WriteByte(')')
	}
	if c.MetricsListen != "" {
		fmt.Fprintf(&b, "; metrics on %s", c.MetricsListen)
	}
	fmt.Fprintf(&b, "; hrw_seed %d", c.Seed)
	return b.String()
}

// checkBackendFiles reads every backends_file once, for -check: at run time
// a bad file is logged and retried, but a check should say so.
func (c *config) checkBackendFiles() error {
	for _, s := range c.Services {
		if s.BackendsFile == "" {
			continue
		}
		f, err := os.Open(s.BackendsFile)
		if err != nil {
			return fmt.Errorf("service %q: backends_file: %w", s.Name, err)
		}
		bs, err := registry.DecodeBackends(io.LimitReader(f, 1<<20))
		f.Close()
		if err != nil {
			return fmt.Errorf("service %q: backends_file %s: %w", s.Name, s.BackendsFile, err)
		}
		if len(bs) == 0 {
			return fmt.Errorf("service %q: backends_file %s: empty list", s.Name, s.BackendsFile)
		}
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
