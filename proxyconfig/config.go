package proxyconfig

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
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

// The JSON file, as written. Every object is read by source.decode: keys
// match exactly and once, unknown keys are errors, so a typo is reported
// instead of silently taking a default.
type fileConfig struct {
	HRWSeed       uint64            `json:"hrw_seed"`
	MetricsListen string            `json:"metrics_listen"`
	PprofListen   string            `json:"pprof_listen"`
	LogLevel      string            `json:"log_level"`
	Wait          string            `json:"wait"`
	MaxDatagram   int               `json:"max_datagram"`
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
	OriginalSource bool             `json:"original_source"` // transparent mode only
	MaxSessions    int              `json:"max_sessions"`    // transparent mode only
	SessionIdle    string           `json:"session_idle"`    // transparent mode only
	SessionMemory  int64            `json:"session_memory"`  // transparent mode only
	Workers        int              `json:"workers"`
	RecvBuffer     *int             `json:"recv_buffer"` // absent: DefaultRecvBuffer
	SendBuffer     int              `json:"send_buffer"`
	EarlyDrop      bool             `json:"early_drop"`
	MaxRegistryAge string           `json:"max_registry_age"`
	SlowStart      string           `json:"slow_start"`
	Backends       json.RawMessage  `json:"backends"` // registry.DecodeBackends format
	BackendsFile   string           `json:"backends_file"`
	Kubernetes     *Kubernetes      `json:"kubernetes"`
	Limits         fileLimits       `json:"limits"`
	Unroutable     string           `json:"unroutable"`         // QUIC only: "drop" (default) or "hash"
	RequireCID13   bool             `json:"require_dtls13_cid"` // DTLS only
	HealthCheck    *fileHealthCheck `json:"health_check"`       // health.go
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
	// MaxDatagram ("max_datagram") is the largest datagram relayed in
	// either direction, the PPv2 header not counted
	// (cidroute.Config.MaxDatagram; 0 = cidroute.DefaultMaxDatagram).
	MaxDatagram int
	// XDPInterfaces (xdp_interfaces) are the interfaces of the XDP fast
	// path: distinct names, not checked against the host. Attaching is the
	// program's (module cidroute/xdp, xdp.Accelerate).
	XDPInterfaces []string
	// Services ("services") are the services in the file's order, at
	// least one, with distinct names and listen addresses.
	Services []Service

	src *source // the file it was read from, to position later errors; nil when built in Go
}

// Service is one entry of "services". The zero values of Workers,
// MaxSessions, SessionIdle and MaxAge mean the library's defaults.
type Service struct {
	// Name ("name") labels the service in metrics and logs; unique.
	Name string
	// Protocol ("protocol"): cidroute.DTLS or cidroute.QUIC.
	Protocol cidroute.Protocol
	// Listen ("listen") is the address the service's sockets bind,
	// unmapped: a unicast or wildcard address and a non-zero port.
	Listen netip.AddrPort
	// Public is the public address (the VIP) when it differs from Listen;
	// zero means Listen. Not in the JSON yet; a program may set it.
	Public netip.AddrPort
	// CIDLen ("cid_length") is the length of the backends' CIDs, the
	// protocol's default (8 for DTLS, 12 for QUIC) when the key is absent;
	// with CIDEncryption, 2 + its NonceLen.
	CIDLen int
	// CIDEncryption, when set, makes the CIDs encrypted QUIC-LB ones
	// (cidkeys.go).
	CIDEncryption *CIDEncryption
	// Transparent (proxy_protocol false): no PPv2 header, one upstream
	// socket per client address, at most MaxSessions per worker, each
	// expiring after SessionIdle (0 = the library defaults).
	Transparent bool
	// OriginalSource ("original_source"), in transparent mode: each
	// session's socket sends with the client's own address as its source
	// (cidroute.Service.OriginalSource).
	OriginalSource bool
	// MaxSessions ("max_sessions"): the transparent sessions per worker;
	// 0 fits them to RLIMIT_NOFILE (cidroute.Service.MaxSessions).
	MaxSessions int
	// SessionIdle ("session_idle"): a transparent session without traffic
	// expires after it; 0 is cidroute.DefaultSessionIdle.
	SessionIdle time.Duration
	// SessionMemory ("session_memory"): bytes the service's transparent
	// sessions may hold, all workers together; 0 is
	// cidroute.DefaultSessionMemory.
	SessionMemory int64
	Workers       int // 0 = one per CPU (GOMAXPROCS as the process started)
	// RecvBuffer and SendBuffer (recv_buffer, send_buffer) are the
	// service sockets' SO_RCVBUF and SO_SNDBUF in bytes; 0 keeps the
	// kernel's default. An absent recv_buffer is DefaultRecvBuffer.
	RecvBuffer, SendBuffer int
	// EarlyDrop (early_drop): cidroute.Service.EarlyDrop, DTLS with the
	// ordinal-first codec only.
	EarlyDrop bool
	MaxAge    time.Duration // max_registry_age; 0 = never stale
	// SlowStart ("slow_start"): registry.Config.SlowStart, the ramp of a
	// newly ready backend's share of new sessions; 0 = off.
	SlowStart time.Duration
	// At most one of Backends (a static list, validated), BackendsFile
	// (an absolute path, or relative to the working directory) and
	// Kubernetes (the Service whose EndpointSlices are the backends,
	// sourced by Options.Kubernetes). With none of them the program
	// supplies the backends (Options.Source).
	Backends []registry.Backend
	// BackendsFile ("backends_file"): see Backends.
	BackendsFile string
	// Kubernetes ("kubernetes"): see Backends.
	Kubernetes *Kubernetes
	// Limits ("limits") are the service's rate limits; zero is off.
	Limits cidroute.Limits
	// Unroutable ("unroutable", QUIC only): what becomes of short-header
	// and Handshake packets whose CID names no server.
	Unroutable cidroute.UnroutablePolicy
	// RequireDTLS13CID ("require_dtls13_cid", DTLS only): a DTLS 1.3
	// record without a CID, outside a ClientHello's datagram, is dropped
	// as dtls13_no_cid instead of routed by HRW
	// (cidroute.RouterConfig.RequireDTLS13CID).
	RequireDTLS13CID bool
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

// validName reports whether s is a service name: 1 to 64 of A-Z a-z 0-9
// _ . -, starting with a letter or digit. (No regexp: the demo compiles
// proxyconfig, and regexp is a tenth of its cold build.)
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// Load reads and validates the file at path (at most 1 MiB, a regular
// file, read within 5 s). A relative backends_file or cid_keys_file is
// taken relative to the config file's directory. Every mistake in the
// file is an *Error naming path, the line and column, and the key.
func Load(ctx context.Context, path string) (*Config, error) {
	data, err := boundedread.Read(ctx, path, maxConfigSize, readTimeout)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		problem, _ := readError(path, err)
		return nil, &Error{File: path, Problem: "the file " + problem, Fix: "give the path of the JSON configuration file", Err: err}
	}
	cfg, err := parse(path, data)
	if err != nil {
		return nil, err
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
// stay as written (relative to the working directory). Every mistake is
// an *Error with its line, column and key, without a file name.
func Parse(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return parse("", data)
}

func parse(file string, data []byte) (*Config, error) {
	src, err := readSource(file, data, '{')
	if err != nil {
		return nil, err
	}
	if err := src.checkNullsAndEmpty(); err != nil {
		return nil, err
	}
	var fc fileConfig
	if err := src.decode("", &fc); err != nil {
		return nil, err
	}
	cfg := &Config{Seed: fc.HRWSeed, MetricsListen: fc.MetricsListen, PprofListen: fc.PprofListen, XDPInterfaces: fc.XDPInterfaces, src: src}
	if err := checkXDP(src, fc.XDPInterfaces); err != nil {
		return nil, err
	}
	if fc.MetricsListen != "" {
		if problem := checkHostPort(fc.MetricsListen); problem != "" {
			return nil, src.err("metrics_listen", problem, "write "+want("metrics_listen"))
		}
	}
	if fc.PprofListen != "" {
		if problem := checkHostPort(fc.PprofListen); problem != "" {
			return nil, src.err("pprof_listen", problem, "write "+want("pprof_listen"))
		}
		if fc.PprofListen == fc.MetricsListen {
			return nil, src.err("pprof_listen", "is metrics_listen's address", "give the profiler a listener of its own, such as \"127.0.0.1:6060\"")
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
		return nil, src.err("log_level", fmt.Sprintf("%q is not a log level", fc.LogLevel), "write "+want("log_level"))
	}
	cfg.Wait = cidroute.WaitThread
	if fc.Wait != "" {
		if err := cfg.Wait.UnmarshalText([]byte(fc.Wait)); err != nil {
			return nil, src.err("wait", fmt.Sprintf("%q is not a wait mode", fc.Wait), "write "+want("wait"))
		}
	}
	if src.has("max_datagram") && (fc.MaxDatagram < 64 || fc.MaxDatagram > cidroute.MaxDatagram4) {
		return nil, src.err("max_datagram", fmt.Sprintf("%d is out of range", fc.MaxDatagram), "write "+want("max_datagram"))
	}
	cfg.MaxDatagram = fc.MaxDatagram
	switch {
	case !src.has("services"):
		return nil, src.err("services", "missing", "add it: "+want("services"))
	case len(fc.Services) == 0:
		return nil, src.err("services", "the list is empty", "list at least one service: "+want("services[]"))
	}
	names := map[string]int{}
	listens := map[netip.AddrPort]int{}
	for i := range fc.Services {
		path := fmt.Sprintf("services[%d]", i)
		s, err := parseService(src, path, cfg.MaxDatagram)
		if err != nil {
			return nil, err
		}
		if limit := cidroute.MaxDatagramFor(s.Listen, s.Transparent); cfg.MaxDatagram > limit {
			return nil, src.err("max_datagram", fmt.Sprintf("%d and the 52-byte PROXY header of %s's IPv6 clients exceed a UDP datagram", cfg.MaxDatagram, path),
				fmt.Sprintf("write at most %d", limit))
		}
		if j, dup := names[s.Name]; dup {
			return nil, src.err(path+".name", fmt.Sprintf("%q is already the name of services[%d]", s.Name, j), "give each service a name of its own")
		}
		names[s.Name] = i
		if j, dup := listens[s.Listen]; dup {
			return nil, src.err(path+".listen", fmt.Sprintf("%v is already the listen address of services[%d] (%q)", s.Listen, j, cfg.Services[j].Name),
				"give each service an address or port of its own")
		}
		listens[s.Listen] = i
		src.services[s.Name] = path
		cfg.Services = append(cfg.Services, s)
	}
	// cidroute.New caps the workers of all services together.
	workers := 0
	for i, s := range cfg.Services {
		n := s.Workers
		if n == 0 {
			n = cidroute.DefaultWorkers()
		}
		if workers += n; workers > cidroute.DefaultMaxWorkers {
			return nil, src.err(fmt.Sprintf("services[%d].workers", i),
				fmt.Sprintf("brings the workers of all services to %d, more than the %d a pipeline runs (0: one per CPU, %d here)", workers, cidroute.DefaultMaxWorkers, cidroute.DefaultWorkers()),
				"give the services fewer workers")
		}
	}
	return cfg, nil
}

// parseService decodes and validates the service at path.
func parseService(src *source, path string, maxDatagram int) (Service, error) {
	var fs fileService
	if err := src.decode(path, &fs); err != nil {
		return Service{}, err
	}
	s := Service{Name: fs.Name, BackendsFile: fs.BackendsFile, Kubernetes: fs.Kubernetes}
	at := func(key string) string { return path + "." + key }
	fail := func(key, problem, fix string) (Service, error) {
		return s, src.err(at(key), problem, fix)
	}
	missing := func(key string) (Service, error) {
		return fail(key, "missing", "add it: "+want(at(key)))
	}
	switch {
	case !src.has(at("name")):
		return missing("name")
	case !validName(fs.Name):
		return fail("name", fmt.Sprintf("%q is not a service name", fs.Name), "write "+want(at("name")))
	case !src.has(at("protocol")):
		return missing("protocol")
	}
	var err error
	if s.Protocol, err = cidroute.ParseProtocol(fs.Protocol); err != nil {
		return fail("protocol", fmt.Sprintf("%q is not a protocol", fs.Protocol), "write "+want(at("protocol")))
	}
	if !src.has(at("listen")) {
		return missing("listen")
	}
	if s.Listen, err = netip.ParseAddrPort(fs.Listen); err != nil {
		return fail("listen", fmt.Sprintf("%q is not ip:port (an IP address, not a host name, and a port)", fs.Listen), "write "+want(at("listen")))
	}
	// Unmapped before it is checked: [::ffff:255.255.255.255] is the
	// broadcast address too.
	s.Listen = netip.AddrPortFrom(s.Listen.Addr().Unmap(), s.Listen.Port())
	switch {
	case s.Listen.Port() == 0:
		return fail("listen", fmt.Sprintf("%q has port 0", fs.Listen), "write the port the clients send to, 1-65535")
	case s.Listen.Addr().IsMulticast() || s.Listen.Addr() == broadcast:
		return fail("listen", fmt.Sprintf("%q is a multicast or broadcast address", fs.Listen),
			`write a unicast address, or "0.0.0.0" or "[::]" for every address, with the port`)
	}
	s.CIDLen = fs.CIDLength
	hasLen := src.has(at("cid_length"))
	switch s.Protocol {
	case cidroute.DTLS:
		if !hasLen {
			s.CIDLen = cidroute.DefaultDTLSCIDLen
		} else if s.CIDLen <= 0 || (dtls.OrdinalFirst{Length: s.CIDLen}).Validate() != nil { // Length 0 would mean the default
			return fail("cid_length", fmt.Sprintf("%d is not a DTLS CID length", fs.CIDLength), "write 5-255 (8 is usual), or leave the key out for 8")
		}
	case cidroute.QUIC:
		if !hasLen {
			s.CIDLen = cidroute.DefaultQUICCIDLen
		} else if s.CIDLen <= 0 || (quic.LB{Length: s.CIDLen}).Validate() != nil {
			return fail("cid_length", fmt.Sprintf("%d is not a QUIC CID length", fs.CIDLength), "write 6-20 except 8 (12 is usual), or leave the key out for 12")
		}
	}
	if err := parseCIDCodec(src, path, &fs, &s); err != nil {
		return s, err
	}
	if s.Protocol == cidroute.QUIC && quic.CheckServerCIDLen(s.CIDLen) != nil {
		if s.CIDEncryption != nil && !hasLen {
			return fail("cid_nonce_length", fmt.Sprintf("%d makes %d-octet CIDs, the length most clients give their first, random DCID (new sessions would be routed by its random bytes, not by HRW)", s.CIDEncryption.NonceLen, s.CIDLen),
				"write 4-5 or 7-18 (10 is usual)")
		}
		return fail("cid_length", fmt.Sprintf("%d is the length most clients give their first, random DCID (new sessions would be routed by its random bytes, not by HRW)", s.CIDLen),
			"write 12 (the default), or 6-7 or 9-20")
	}
	s.Transparent = fs.ProxyProtocol != nil && !*fs.ProxyProtocol
	s.OriginalSource = fs.OriginalSource
	for _, key := range []string{"original_source", "max_sessions", "session_idle", "session_memory"} {
		if !s.Transparent && src.has(at(key)) {
			return s, src.keyErr(at(key), "applies only in transparent mode", `add "proxy_protocol": false, or remove it`)
		}
	}
	if fs.MaxSessions < 0 {
		return fail("max_sessions", fmt.Sprintf("%d is negative", fs.MaxSessions), "write "+want(at("max_sessions")))
	}
	s.MaxSessions = fs.MaxSessions
	if src.has(at("session_memory")) && (fs.SessionMemory < int64(cidroute.SessionBytes(0)) || fs.SessionMemory > 1<<40) {
		return fail("session_memory", fmt.Sprintf("%d bytes is out of range", fs.SessionMemory), "write "+want(at("session_memory")))
	}
	s.SessionMemory = fs.SessionMemory
	if s.SessionIdle, err = parseDuration(src, at("session_idle"), fs.SessionIdle, minSessionIdle, false); err != nil {
		return s, err
	}
	if fs.Workers < 0 || fs.Workers > maxWorkers {
		return fail("workers", fmt.Sprintf("%d is out of range", fs.Workers), "write "+want(at("workers")))
	}
	s.Workers = fs.Workers
	if s.MaxSessions > 0 { // the Pipeline's memory bound, as cidroute.New applies it
		workers := cmp.Or(s.Workers, cidroute.DefaultWorkers())
		per := cidroute.SessionBytes(maxDatagram)
		mem := cmp.Or(s.SessionMemory, cidroute.DefaultSessionMemory)
		if fit := cidroute.SessionsFit(mem, workers, maxDatagram); s.MaxSessions > fit {
			return fail("max_sessions", fmt.Sprintf("%d sessions on each of %d workers, %d bytes each, need more than the %d MiB of session memory",
				s.MaxSessions, workers, per, mem>>20), fmt.Sprintf("write at most %d, or 0 to fit it, or raise session_memory", fit))
		}
	}
	recv := DefaultRecvBuffer
	if fs.RecvBuffer != nil {
		recv = *fs.RecvBuffer
	}
	for _, b := range []struct {
		key string
		n   int
	}{{"recv_buffer", recv}, {"send_buffer", fs.SendBuffer}} {
		if b.n < 0 || b.n > maxSocketBuffer {
			return fail(b.key, fmt.Sprintf("%d is out of range", b.n), "write "+want(at(b.key)))
		}
	}
	s.RecvBuffer, s.SendBuffer = recv, fs.SendBuffer
	if fs.EarlyDrop && (s.Protocol != cidroute.DTLS || s.CIDEncryption != nil) {
		return fail("early_drop", "true needs a DTLS service with the plaintext codec (the socket filter reads the ordinal in the clear)", "remove it")
	}
	s.EarlyDrop = fs.EarlyDrop
	if s.MaxAge, err = parseDuration(src, at("max_registry_age"), fs.MaxRegistryAge, minRegistryAge, true); err != nil {
		return s, err
	}
	if s.SlowStart, err = parseDuration(src, at("slow_start"), fs.SlowStart, registry.MinSlowStart, true); err != nil {
		return s, err
	}
	if s.SlowStart > registry.MaxSlowStart {
		return fail("slow_start", fmt.Sprintf("%q is more than %v", fs.SlowStart, registry.MaxSlowStart), "write "+want(at("slow_start")))
	}
	var given []string // in the file's order
	for _, key := range []string{"backends", "backends_file", "kubernetes"} {
		if src.has(at(key)) {
			given = append(given, key)
		}
	}
	slices.SortFunc(given, func(a, b string) int { return src.nodes[at(a)].val - src.nodes[at(b)].val })
	if len(given) > 1 {
		return s, src.keyErr(at(given[1]), fmt.Sprintf("%q is given too", given[0]), `give exactly one of "backends", "backends_file" and "kubernetes"`)
	}
	switch {
	case fs.Kubernetes != nil:
		if fs.Kubernetes.Service == "" {
			return fail("kubernetes.service", "missing", "add it: "+want(at("kubernetes.service")))
		}
		for _, key := range []string{"weight_annotation", "pod_selector"} {
			if !fs.Kubernetes.WatchPods && src.has(at("kubernetes."+key)) {
				return s, src.keyErr(at("kubernetes."+key), "applies only with \"watch_pods\": true", `add "watch_pods": true, or remove it`)
			}
		}
	case src.has(at("backends")):
		if s.Backends, err = parseBackends(src, at("backends")); err != nil {
			return s, err
		}
	}
	switch fs.Unroutable {
	case "", "drop":
	case "hash":
		s.Unroutable = cidroute.UnroutableHash
	default:
		return fail("unroutable", fmt.Sprintf("%q is not a policy", fs.Unroutable), "write "+want(at("unroutable")))
	}
	if fs.Unroutable != "" && s.Protocol != cidroute.QUIC {
		return s, src.keyErr(at("unroutable"), "applies to QUIC services only (a DTLS CID has no unroutable marker)", "remove it")
	}
	if fs.RequireCID13 && s.Protocol != cidroute.DTLS {
		return s, src.keyErr(at("require_dtls13_cid"), "applies to DTLS services only", "remove it")
	}
	s.RequireDTLS13CID = fs.RequireCID13
	if err := parseHealthCheck(src, at("health_check"), fs.HealthCheck, &s); err != nil {
		return s, err
	}
	l := fs.Limits
	for _, v := range []struct {
		key string
		n   int
	}{{"global_pps", l.GlobalPPS}, {"per_source_pps", l.PerSourcePPS}, {"handshake_pps", l.HandshakePPS}, {"zero_rtt_pps", l.ZeroRTTPPS}} {
		if v.n < 0 {
			return fail("limits."+v.key, fmt.Sprintf("%d is negative", v.n), "write "+want(at("limits."+v.key)))
		}
	}
	s.Limits = cidroute.Limits{GlobalPPS: l.GlobalPPS, PerSourcePPS: l.PerSourcePPS, HandshakePPS: l.HandshakePPS, ZeroRTTPPS: l.ZeroRTTPPS}
	return s, nil
}

var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// parseDuration reads the duration key at path: absent means 0 (the
// default); else a Go duration of at least min, or "0s" where zeroOff
// says 0 turns the feature off.
func parseDuration(src *source, path, s string, min time.Duration, zeroOff bool) (time.Duration, error) {
	if !src.has(path) {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		if n, nerr := strconv.ParseFloat(s, 64); nerr == nil && n > 0 {
			return 0, src.err(path, fmt.Sprintf("%q has no unit", s), fmt.Sprintf("write %q (or ms, m, h)", s+"s"))
		}
		return 0, src.err(path, fmt.Sprintf("%q is not a Go duration", s), "write "+want(path))
	case d < 0:
		return 0, src.err(path, fmt.Sprintf("%q is negative", s), "write "+want(path))
	case d == 0 && zeroOff:
		return 0, nil
	case d < min:
		return 0, src.err(path, fmt.Sprintf("%q is less than %v", s, min), "write "+want(path))
	}
	return d, nil
}

// checkHostPort accepts host:port with a numeric port, host possibly
// empty (all addresses) or a name; else it says what is wrong.
func checkHostPort(s string) string {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Sprintf("%q is not host:port", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Sprintf("%q has port %q", s, port)
	}
	return ""
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
		if s.SlowStart > 0 {
			fmt.Fprintf(&b, ", slow start %v", s.SlowStart)
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
// cidproxy -check: at run time a bad backends_file is logged and retried,
// but a check should say so. The read is bounded as the file source's
// is, the list validated by the same rules as an inline one (its errors
// are positioned in the backends_file: "b.json:3:17: [0].ordinal: ..."),
// and refused at an own address as Validate refuses an inline one.
func (c *Config) CheckFiles(ctx context.Context) error {
	lists := make([][]registry.Backend, len(c.Services))
	srcs := make([]*source, len(c.Services))
	for i, s := range c.Services {
		if s.BackendsFile == "" {
			continue
		}
		data, err := boundedread.Read(ctx, s.BackendsFile, maxConfigSize, readTimeout)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return err
			}
			problem, fix := readError(s.BackendsFile, err)
			return c.serviceErr(s, "backends_file", s.BackendsFile+" "+problem, fix, err)
		}
		src, err := readSource(s.BackendsFile, data, '[')
		if err != nil {
			return err
		}
		if err := src.checkNullsAndEmpty(); err != nil {
			return err
		}
		if lists[i], err = parseBackends(src, ""); err != nil {
			return err
		}
		srcs[i] = src
	}
	err := c.checkOwnBackends(func(i int) []registry.Backend { return lists[i] },
		func(i, k int) *Error { return srcs[i].err(fmt.Sprintf("[%d].address", k), "", "") })
	if err != nil {
		return err
	}
	return c.checkCIDKeyFiles(ctx)
}

// checkXDP validates the "xdp_interfaces" key: names of interfaces,
// each once. Whether they exist is checked when the program attaches.
func checkXDP(src *source, names []string) error {
	seen := map[string]int{}
	for i, n := range names {
		path := fmt.Sprintf("xdp_interfaces[%d]", i)
		if j, dup := seen[n]; dup {
			return src.err(path, fmt.Sprintf("%q is already xdp_interfaces[%d]", n, j), "list each interface once")
		}
		if len(n) >= 16 { // IFNAMSIZ
			return src.err(path, fmt.Sprintf("%q is longer than 15 bytes", n), "write an interface name (ip link lists them)")
		}
		seen[n] = i
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
	// WatchPods ("watch_pods") reads each endpoint's Pod for its weight
	// (WeightAnnotation) and its Ready time (for slow_start).
	WatchPods bool `json:"watch_pods"`
	// WeightAnnotation ("weight_annotation", with WatchPods) is the Pod
	// annotation holding the weight; "" = cidroute.io/weight.
	WeightAnnotation string `json:"weight_annotation"`
	// PodSelector ("pod_selector", with WatchPods) is a label selector
	// narrowing the Pod watch; "" = every Pod of the namespace.
	PodSelector string `json:"pod_selector"`
}

func (k *Kubernetes) namespace() string {
	if k.Namespace == "" {
		return "default"
	}
	return k.Namespace
}
