package proxyconfig

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
	"github.com/stretchr/testify/require"
)

// svc is a valid service object; tests splice keys into it.
const svc = `"name": "coaps", "protocol": "dtls", "listen": "127.0.0.1:5684", "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}]`

func withServices(services ...string) string {
	return `{"services": [` + strings.Join(services, ",") + `]}`
}

func TestParseConfigGood(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		check func(t *testing.T, c *Config)
	}{
		{"defaults", withServices(`{` + svc + `}`), func(t *testing.T, c *Config) {
			require.Equal(t, slog.LevelInfo, c.LogLevel)
			require.Equal(t, cidroute.WaitThread, c.Wait)
			require.Equal(t, uint64(0), c.Seed)
			require.Empty(t, c.MetricsListen)
			s := c.Services[0]
			require.Equal(t, "coaps", s.Name)
			require.Equal(t, cidroute.DTLS, s.Protocol)
			require.Equal(t, netip.MustParseAddrPort("127.0.0.1:5684"), s.Listen)
			require.Equal(t, 8, s.CIDLen)
			require.Zero(t, s.Workers)
			require.Zero(t, s.MaxAge)
			require.Equal(t, []registry.Backend{{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:6000"), Weight: 1}}, s.Backends)
			require.Equal(t, cidroute.Limits{}, s.Limits)
			require.Equal(t, DefaultRecvBuffer, s.RecvBuffer, "recv_buffer absent")
			require.Zero(t, s.SendBuffer)
		}},
		{"socket buffers", withServices(`{`+svc+`, "recv_buffer": 0, "send_buffer": 65536}`, `{"name": "b", "protocol": "dtls", "listen": "127.0.0.1:2", "backends_file": "f", "recv_buffer": 1048576}`), func(t *testing.T, c *Config) {
			require.Zero(t, c.Services[0].RecvBuffer, "0 is the kernel's default")
			require.Equal(t, 65536, c.Services[0].SendBuffer)
			require.Equal(t, 1<<20, c.Services[1].RecvBuffer)
		}},
		{"quic default cid length", withServices(`{"name": "h3", "protocol": "quic", "listen": "[::]:443", "backends_file": "b.json"}`), func(t *testing.T, c *Config) {
			require.Equal(t, cidroute.QUIC, c.Services[0].Protocol)
			require.Equal(t, 12, c.Services[0].CIDLen)
			require.Equal(t, "b.json", c.Services[0].BackendsFile)
			require.Nil(t, c.Services[0].Backends)
		}},
		{"everything set", `{"hrw_seed": 18446744073709551615, "metrics_listen": ":9184", "log_level": "debug", "services": [{` + svc + `,
			"cid_length": 10, "proxy_protocol": true, "workers": 4, "max_registry_age": "1m30s",
			"limits": {"global_pps": 1, "per_source_pps": 2, "handshake_pps": 3, "zero_rtt_pps": 4}}]}`, func(t *testing.T, c *Config) {
			require.Equal(t, uint64(1<<64-1), c.Seed)
			require.Equal(t, ":9184", c.MetricsListen)
			require.Equal(t, slog.LevelDebug, c.LogLevel)
			s := c.Services[0]
			require.Equal(t, 10, s.CIDLen)
			require.Equal(t, 4, s.Workers)
			require.Equal(t, 90*time.Second, s.MaxAge)
			require.Equal(t, cidroute.Limits{GlobalPPS: 1, PerSourcePPS: 2, HandshakePPS: 3, ZeroRTTPPS: 4}, s.Limits)
		}},
		{"backend fields", withServices(`{"name": "a", "protocol": "dtls", "listen": "10.0.0.1:1", "backends": [
			{"ordinal": 254, "address": "[fd00::1]:2", "weight": 5, "state": "draining"},
			{"ordinal": 3, "address": "10.0.0.2:2", "state": "ready"}]}`), func(t *testing.T, c *Config) {
			require.Equal(t, []registry.Backend{
				{Ordinal: 254, Addr: netip.MustParseAddrPort("[fd00::1]:2"), Weight: 5, State: registry.Draining},
				{Ordinal: 3, Addr: netip.MustParseAddrPort("10.0.0.2:2"), Weight: 1, State: registry.Ready},
			}, c.Services[0].Backends)
		}},
		{"two services", withServices(`{`+svc+`}`, `{"name": "b", "protocol": "quic", "listen": "127.0.0.1:443", "backends_file": "x"}`), func(t *testing.T, c *Config) {
			require.Len(t, c.Services, 2)
		}},
		{"log levels", `{"log_level": "error", "services": [{` + svc + `}]}`, func(t *testing.T, c *Config) {
			require.Equal(t, slog.LevelError, c.LogLevel)
		}},
		{"wait netpoller", `{"wait": "netpoller", "services": [{` + svc + `}]}`, func(t *testing.T, c *Config) {
			require.Equal(t, cidroute.WaitNetpoller, c.Wait)
		}},
		{"kubernetes backends", withServices(`{"name": "k", "protocol": "dtls", "listen": "0.0.0.0:5684",
			"kubernetes": {"namespace": "iot", "service": "ds", "port_name": "dtls"}}`), func(t *testing.T, c *Config) {
			require.Equal(t, &Kubernetes{Namespace: "iot", Service: "ds", PortName: "dtls"}, c.Services[0].Kubernetes)
			require.Contains(t, c.Summary(), "EndpointSlices of iot/ds")
		}},
		{"transparent mode", withServices(`{` + svc + `, "proxy_protocol": false, "max_sessions": 1000, "session_idle": "30s"}`), func(t *testing.T, c *Config) {
			s := c.Services[0]
			require.True(t, s.Transparent)
			require.Equal(t, 1000, s.MaxSessions)
			require.Equal(t, 30*time.Second, s.SessionIdle)
		}},
		{"original source", withServices(`{` + svc + `, "proxy_protocol": false, "original_source": true}`), func(t *testing.T, c *Config) {
			s := c.Services[0]
			require.True(t, s.Transparent)
			require.True(t, s.OriginalSource)
		}},
		{"max age off", withServices(`{` + svc + `, "max_registry_age": "0s"}`), func(t *testing.T, c *Config) {
			require.Zero(t, c.Services[0].MaxAge)
		}},
		{"unroutable", withServices(`{"name": "h3", "protocol": "quic", "listen": "[::]:443", "backends_file": "b.json", "unroutable": "hash"}`,
			`{"name": "h4", "protocol": "quic", "listen": "[::]:444", "backends_file": "b.json", "unroutable": "drop"}`,
			`{"name": "h5", "protocol": "quic", "listen": "[::]:445", "backends_file": "b.json"}`), func(t *testing.T, c *Config) {
			require.Equal(t, cidroute.UnroutableHash, c.Services[0].Unroutable)
			require.Equal(t, cidroute.UnroutableDrop, c.Services[1].Unroutable)
			require.Equal(t, cidroute.UnroutableDrop, c.Services[2].Unroutable, "drop by default")
		}},
		{"slow start", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "slow_start": "2m", "backends": [{"ordinal": 1, "address": "1.1.1.1:1", "ready_since": "2026-01-02T16:04:05+01:00"}]}`), func(t *testing.T, c *Config) {
			require.Equal(t, 2*time.Minute, c.Services[0].SlowStart)
			require.Equal(t, time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC), c.Services[0].Backends[0].ReadySince)
			require.Contains(t, c.Summary(), "slow start 2m0s")
		}},
		{"duration bounds", withServices(`{` + svc + `, "proxy_protocol": false, "session_idle": "1s", "max_registry_age": "3s"}`), func(t *testing.T, c *Config) {
			require.Equal(t, time.Second, c.Services[0].SessionIdle)
			require.Equal(t, 3*time.Second, c.Services[0].MaxAge)
		}},
		{"mapped listen", withServices(`{"name": "m", "protocol": "dtls", "listen": "[::ffff:127.0.0.1]:5684", "backends_file": "f"}`), func(t *testing.T, c *Config) {
			require.Equal(t, netip.MustParseAddrPort("127.0.0.1:5684"), c.Services[0].Listen)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(strings.NewReader(tt.in))
			require.NoError(t, err)
			tt.check(t, c)
			require.NotEmpty(t, c.Summary())
		})
	}
}

func TestParseConfigBad(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty file", ``, `the file is empty; write one JSON object {...} (see docs/configuration.md)`},
		{"not an object", `[]`, `the file is a JSON list, not an object (a backend list belongs in a backends_file); write one JSON object: {"services": [...]}`},
		{"syntax", `{"services": [}`, `'}' where a value is expected; close each [ with ] and each { with }, and write every value: a string, number, true, false, object or list`},
		{"trailing data", withServices(`{`+svc+`}`) + `{}`, `more after the end of the JSON object; remove it: the file is one JSON object`},
		{"unknown top-level key", `{"hrw_sed": 1, "services": [{` + svc + `}]}`, `hrw_sed: unknown key; did you mean "hrw_seed"?`},
		{"unknown service key", withServices(`{` + svc + `, "listn": "x"}`), `services[0].listn: unknown key; did you mean "listen"?`},
		{"unknown limits key", withServices(`{` + svc + `, "limits": {"globl_pps": 1}}`), `services[0].limits.globl_pps: unknown key; did you mean "global_pps"?`},
		{"unknown backend key", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 0, "adress": "1.1.1.1:1"}]}`), `services[0].backends[0].adress: unknown key; did you mean "address"?`},
		{"negative seed", `{"hrw_seed": -1, "services": [{` + svc + `}]}`, `hrw_seed: -1 is negative; write a whole number 0-18446744073709551615, the same on every replica`},
		{"string workers", withServices(`{` + svc + `, "workers": "2"}`), `services[0].workers: "2" is a string; write 2 without quotes`},
		{"negative recv buffer", withServices(`{` + svc + `, "recv_buffer": -1}`), `services[0].recv_buffer: -1 is out of range; write 0 (the kernel's default) to 1073741824 bytes (absent: 4194304)`},
		{"bad log level", `{"log_level": "verbose", "services": [{` + svc + `}]}`, `log_level: "verbose" is not a log level; write "debug", "info", "warn" or "error"`},
		{"bad wait", `{"wait": "spin", "services": [{` + svc + `}]}`, `wait: "spin" is not a wait mode; write "thread" or "netpoller"`},
		{"bad metrics address", `{"metrics_listen": "9184", "services": [{` + svc + `}]}`, "metrics_listen"},
		{"metrics port zero", `{"metrics_listen": "127.0.0.1:0", "services": [{` + svc + `}]}`, "metrics_listen"},
		{"no services", `{"hrw_seed": 1}`, `services: missing; add it: a list of services, such as [{"name": "coaps", "protocol": "dtls", "listen": "0.0.0.0:5684", "backends_file": "backends.json"}]`},
		{"empty services", `{"services": []}`, "at least one service"},
		{"no name", withServices(`{"protocol": "dtls", "listen": "1.2.3.4:5", "backends_file": "f"}`), `services[0].name: missing; add it: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit, such as "coaps"`},
		{"bad name", withServices(`{"name": "a b", "protocol": "dtls", "listen": "1.2.3.4:5", "backends_file": "f"}`), `services[0].name: "a b" is not a service name; write 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit, such as "coaps"`},
		{"duplicate name", withServices(`{`+svc+`}`, `{`+strings.Replace(svc, "5684", "5685", 1)+`}`), `services[1].name: "coaps" is already the name of services[0]; give each service a name of its own`},
		{"duplicate listen", withServices(`{`+svc+`}`, `{`+strings.Replace(svc, `"coaps"`, `"other"`, 1)+`}`), `services[1].listen: 127.0.0.1:5684 is already the listen address of services[0] ("coaps"); give each service an address or port of its own`},
		{"no protocol", withServices(`{"name": "a", "listen": "1.2.3.4:5", "backends_file": "f"}`), `services[0].protocol: missing; add it: "dtls" or "quic"`},
		{"bad protocol", withServices(`{"name": "a", "protocol": "tls", "listen": "1.2.3.4:5", "backends_file": "f"}`), `services[0].protocol: "tls" is not a protocol; write "dtls" or "quic"`},
		{"no listen", withServices(`{"name": "a", "protocol": "dtls", "backends_file": "f"}`), `services[0].listen: missing; add it: ip:port, such as "0.0.0.0:5684" or "[::]:443"`},
		{"host name listen", withServices(`{"name": "a", "protocol": "dtls", "listen": "localhost:5684", "backends_file": "f"}`), `services[0].listen: "localhost:5684" is not ip:port (an IP address, not a host name, and a port); write ip:port, such as "0.0.0.0:5684" or "[::]:443"`},
		{"listen port zero", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:0", "backends_file": "f"}`), `services[0].listen: "1.2.3.4:0" has port 0; write the port the clients send to, 1-65535`},
		{"listen multicast", withServices(`{"name": "a", "protocol": "dtls", "listen": "224.0.0.1:5", "backends_file": "f"}`), `services[0].listen: "224.0.0.1:5" is a multicast or broadcast address; write a unicast address, or "0.0.0.0" or "[::]" for every address, with the port`},
		{"dtls cid too short", withServices(`{` + svc + `, "cid_length": 4}`), `services[0].cid_length: 4 is not a DTLS CID length; write 5-255 (8 is usual), or leave the key out for 8`},
		{"quic cid too long", withServices(`{"name": "a", "protocol": "quic", "listen": "1.2.3.4:5", "cid_length": 21, "backends_file": "f"}`), `services[0].cid_length: 21 is not a QUIC CID length; write 6-20 except 8 (12 is usual), or leave the key out for 12`},
		{"quic cid of a client's length", withServices(`{"name": "a", "protocol": "quic", "listen": "1.2.3.4:5", "cid_length": 8, "backends_file": "f"}`), `services[0].cid_length: 8 is the length most clients give their first, random DCID (new sessions would be routed by its random bytes, not by HRW); write 12 (the default), or 6-7 or 9-20`},
		{"quic encrypted cid of a client's length", withServices(`{"name": "a", "protocol": "quic", "listen": "1.2.3.4:5", "cid_codec": "quic-lb-encrypted", "cid_nonce_length": 6, "cid_keys_file": "k", "backends_file": "f"}`), `services[0].cid_nonce_length: 6 makes 8-octet CIDs, the length most clients give their first, random DCID (new sessions would be routed by its random bytes, not by HRW); write 4-5 or 7-18 (10 is usual)`},
		{"negative cid", withServices(`{` + svc + `, "cid_length": -8}`), `services[0].cid_length: -8 is not a DTLS CID length; write 5-255 (8 is usual), or leave the key out for 8`},
		{"kubernetes and backends", withServices(`{` + svc + `, "kubernetes": {"service": "ds"}}`), "exactly one"},
		{"kubernetes without service", withServices(`{"name": "k", "protocol": "dtls", "listen": "0.0.0.0:1", "kubernetes": {"namespace": "x"}}`), `services[0].kubernetes.service: missing; add it: the name of the Kubernetes Service, such as "dtls-backend"`},
		{"weight annotation without pods", withServices(`{"name": "k", "protocol": "dtls", "listen": "0.0.0.0:1", "kubernetes": {"service": "x", "weight_annotation": "w"}}`), `services[0].kubernetes.weight_annotation: applies only with "watch_pods": true; add "watch_pods": true, or remove it`},
		{"kubernetes typo", withServices(`{"name": "k", "protocol": "dtls", "listen": "0.0.0.0:1", "kubernetes": {"service": "x", "portname": "d"}}`), "portname"},
		{"session settings without transparent mode", withServices(`{` + svc + `, "max_sessions": 10}`), `services[0].max_sessions: applies only in transparent mode; add "proxy_protocol": false, or remove it`},
		{"bad session idle", withServices(`{` + svc + `, "proxy_protocol": false, "session_idle": "soon"}`), "session_idle"},
		{"original source without transparent mode", withServices(`{` + svc + `, "original_source": true}`), `services[0].original_source: applies only in transparent mode; add "proxy_protocol": false, or remove it`},
		{"negative max sessions", withServices(`{` + svc + `, "proxy_protocol": false, "max_sessions": -1}`), "max_sessions"},
		{"negative workers", withServices(`{` + svc + `, "workers": -1}`), `services[0].workers: -1 is out of range; write 0 (one per CPU, the default) to 256`},
		{"too many workers", withServices(`{` + svc + `, "workers": 257}`), `services[0].workers: 257 is out of range; write 0 (one per CPU, the default) to 256`},
		{"bad duration", withServices(`{` + svc + `, "max_registry_age": "30"}`), `services[0].max_registry_age: "30" has no unit; write "30s" (or ms, m, h)`},
		{"negative duration", withServices(`{` + svc + `, "max_registry_age": "-1s"}`), `services[0].max_registry_age: "-1s" is negative; write "0s" (off, the default) or a Go duration of at least "3s", such as "30s"`},
		{"both backend keys", withServices(`{` + svc + `, "backends_file": "f"}`), "give exactly one"},
		{"too many workers in all", withServices(
			`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:1", "workers": 256, "backends_file": "f"}`,
			`{"name": "b", "protocol": "dtls", "listen": "1.2.3.4:2", "workers": 256, "backends_file": "f"}`,
			`{"name": "c", "protocol": "dtls", "listen": "1.2.3.4:3", "workers": 256, "backends_file": "f"}`,
			`{"name": "d", "protocol": "dtls", "listen": "1.2.3.4:4", "workers": 256, "backends_file": "f"}`,
			`{"name": "e", "protocol": "dtls", "listen": "1.2.3.4:5", "workers": 1, "backends_file": "f"}`),
			`services[4].workers: brings the workers of all services to 1025, more than the 1024 a pipeline runs`},
		{"sessions beyond the session memory", withServices(`{` + svc + `, "proxy_protocol": false, "workers": 2, "max_sessions": 20000}`),
			`services[0].max_sessions: 20000 sessions on each of 2 workers, 14336 bytes each, need more than the 256 MiB of session memory; write at most 9362, or 0 to fit it, or raise session_memory`},
		{"sessions beyond a configured session memory", withServices(`{` + svc + `, "proxy_protocol": false, "workers": 1, "max_sessions": 100, "session_memory": 1048576}`),
			`services[0].max_sessions: 100 sessions on each of 1 workers, 14336 bytes each, need more than the 1 MiB of session memory; write at most 73, or 0 to fit it, or raise session_memory`},
		{"max datagram too large", `{"max_datagram": 65480, "services": [{` + svc + `}]}`,
			`max_datagram: 65480 is out of range; write 64-65475 bytes (9216, the default; an IPv4-only proxy may go to 65479)`},
		{"max datagram past an IPv6 service's header room", `{"max_datagram": 65479, "services": [{"name": "a", "protocol": "dtls", "listen": "[::1]:5", "backends_file": "f"}]}`,
			`max_datagram: 65479 and the 52-byte PROXY header of services[0]'s IPv6 clients exceed a UDP datagram; write at most 65475`},
		{"session memory below a session", withServices(`{` + svc + `, "proxy_protocol": false, "session_memory": 1000}`),
			`services[0].session_memory: 1000 bytes is out of range; write a number of bytes of at least 14336 (one session), such as 268435456 (256 MiB, the default)`},
		{"empty backends", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": []}`), `services[0].backends: the list is empty; list the backends (to stop a service, keep them with "state": "gone")`},
		{"negative limit", withServices(`{` + svc + `, "limits": {"handshake_pps": -5}}`), `services[0].limits.handshake_pps: -5 is negative; write 0 (off, the default) or datagrams per second`},
		{"reserved ordinal", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 255, "address": "1.1.1.1:1"}]}`), "255"},
		{"zero weight", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 1, "address": "1.1.1.1:1", "weight": 0}]}`), "weight"},
		{"bad state", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 1, "address": "1.1.1.1:1", "state": "up"}]}`), "state"},
		// One strict decoder for the whole file: keys match exactly, once.
		{"key case", `{"hrw_seed": 1, "HRW_SEED": 2, "services": [{` + svc + `}]}`, `HRW_SEED: unknown key; write "hrw_seed" (keys are lower case)`},
		{"key case alone", `{"Hrw_Seed": 2, "services": [{` + svc + `}]}`, `Hrw_Seed: unknown key; write "hrw_seed" (keys are lower case)`},
		{"services case", `{"Services": [{` + svc + `}]}`, `Services: unknown key; write "services" (keys are lower case)`},
		{"service key case", withServices(`{` + svc + `, "Workers": 2}`), `services[0].Workers: unknown key; write "workers" (keys are lower case)`},
		{"limits key case", withServices(`{` + svc + `, "limits": {"Global_PPS": 1}}`), `services[0].limits.Global_PPS: unknown key; write "global_pps" (keys are lower case)`},
		{"kubernetes key case", withServices(`{"name": "k", "protocol": "dtls", "listen": "0.0.0.0:1", "kubernetes": {"Service": "x"}}`), `services[0].kubernetes.Service: unknown key; write "service" (keys are lower case)`},
		{"duplicate top-level key", `{"hrw_seed": 1, "hrw_seed": 2, "services": [{` + svc + `}]}`, `hrw_seed: given twice in one object; keep one (JSON objects have no repeated keys)`},
		{"duplicate service key", withServices(`{` + svc + `, "listen": "127.0.0.1:5685"}`), `services[0].listen: given twice in one object; keep one (JSON objects have no repeated keys)`},
		{"duplicate limits key", withServices(`{` + svc + `, "limits": {"global_pps": 1, "global_pps": 0}}`), `services[0].limits.global_pps: given twice in one object; keep one (JSON objects have no repeated keys)`},
		{"duplicate services", `{"services": [{` + svc + `}], "services": [{` + svc + `}]}`, `services: given twice in one object; keep one (JSON objects have no repeated keys)`},
		{"broadcast listen", withServices(`{"name": "a", "protocol": "dtls", "listen": "255.255.255.255:5684", "backends_file": "f"}`), "broadcast"},
		{"mapped broadcast listen", withServices(`{"name": "a", "protocol": "dtls", "listen": "[::ffff:255.255.255.255]:5684", "backends_file": "f"}`), "broadcast"},
		{"mapped multicast listen", withServices(`{"name": "a", "protocol": "dtls", "listen": "[::ffff:224.0.0.1]:5684", "backends_file": "f"}`), "broadcast"},
		{"bad unroutable", withServices(`{"name": "a", "protocol": "quic", "listen": "1.2.3.4:5", "backends_file": "f", "unroutable": "route"}`), `services[0].unroutable: "route" is not a policy; write "drop" (the default) or "hash"`},
		{"require_dtls13_cid for quic", withServices(`{"name": "a", "protocol": "quic", "listen": "1.2.3.4:5", "backends_file": "f", "require_dtls13_cid": true}`), `services[0].require_dtls13_cid: applies to DTLS services only; remove it`},
		{"unroutable for dtls", withServices(`{` + svc + `, "unroutable": "drop"}`), `services[0].unroutable: applies to QUIC services only (a DTLS CID has no unroutable marker); remove it`},
		// Durations have lower bounds.
		{"tiny session idle", withServices(`{` + svc + `, "proxy_protocol": false, "session_idle": "3ns"}`), `services[0].session_idle: "3ns" is less than 1s; write a Go duration of at least "1s", such as "2m" (the default)`},
		{"tiny registry age", withServices(`{` + svc + `, "max_registry_age": "4ns"}`), `services[0].max_registry_age: "4ns" is less than 3s; write "0s" (off, the default) or a Go duration of at least "3s", such as "30s"`},
		{"tiny slow start", withServices(`{` + svc + `, "slow_start": "1s"}`), `services[0].slow_start: "1s" is less than 10s; write "0s" (off, the default) or a Go duration from "10s" to "1h", such as "2m"`},
		{"long slow start", withServices(`{` + svc + `, "slow_start": "2h"}`), `services[0].slow_start: "2h" is more than 1h0m0s; write "0s" (off, the default) or a Go duration from "10s" to "1h", such as "2m"`},
		{"bad ready since", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": [{"ordinal": 1, "address": "1.1.1.1:1", "ready_since": "yesterday"}]}`), `services[0].backends[0].ready_since: "yesterday" is not an RFC 3339 time; write when the backend became ready, an RFC 3339 time such as "2026-01-02T15:04:05Z" (for slow_start)`},
		{"zero session idle", withServices(`{` + svc + `, "proxy_protocol": false, "session_idle": "0s"}`), `services[0].session_idle: "0s" is less than 1s; write a Go duration of at least "1s", such as "2m" (the default)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tt.in))
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestParseConfigRegistryErrors(t *testing.T) {
	for _, tt := range []struct {
		backends string
		want     error
	}{
		{`[{"ordinal": 1, "address": "1.1.1.1:1"}, {"ordinal": 1, "address": "1.1.1.2:1"}]`, registry.ErrDuplicateOrdinal},
		{`[{"ordinal": 1, "address": "1.1.1.1:1"}, {"ordinal": 2, "address": "1.1.1.1:1"}]`, registry.ErrDuplicateAddr},
		{`[{"ordinal": 1, "address": "0.0.0.0:1"}]`, registry.ErrUnspecifiedAddr},
		{`[{"ordinal": 1, "address": "1.1.1.1:0"}]`, registry.ErrZeroPort},
	} {
		_, err := Parse(strings.NewReader(withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends": ` + tt.backends + `}`)))
		require.ErrorIs(t, err, tt.want, tt.backends)
		require.Contains(t, err.Error(), `: services[0].backends[`)
	}
}

func TestLoadConfigBackendsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	write := func(name, body string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	write("c.json", withServices(`{"name": "a", "protocol": "dtls", "listen": "1.2.3.4:5", "backends_file": "b.json"}`))
	c, err := Load(context.Background(), path)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "b.json"), c.Services[0].BackendsFile, "relative to the config file")
	require.Error(t, c.CheckFiles(context.Background()), "missing file")

	write("b.json", `[{"ordinal": 1, "address": "1.1.1.1:1"}, {"ordinal": 1, "address": "1.1.1.2:1"}]`)
	err = c.CheckFiles(context.Background())
	require.ErrorIs(t, err, registry.ErrDuplicateOrdinal)
	require.EqualError(t, err, filepath.Join(dir, "b.json")+`:1:54: [1].ordinal: 1 is already the ordinal of [0]; give each backend an ordinal of its own (the one its CIDs carry)`)

	write("b.json", `[]`)
	require.ErrorIs(t, c.CheckFiles(context.Background()), registry.ErrEmptyList)

	write("b.json", `[{"ordinal": 1, "address": "1.1.1.1:1"}]`)
	require.NoError(t, c.CheckFiles(context.Background()))

	_, err = Load(context.Background(), filepath.Join(dir, "missing.json"))
	require.True(t, errors.Is(err, os.ErrNotExist))
}
