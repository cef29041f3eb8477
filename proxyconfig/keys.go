package proxyconfig

import (
	"fmt"
	"strings"
)

// wants says, for every key of the file (normalized: services[].name),
// what a valid value is: the "what to write" of its errors when the value
// has the wrong type, is null or is empty. docs/configuration.md gives the
// same ranges; TestEveryKeyDocumented checks that every key is in both.
var wants = map[string]string{
	"hrw_seed":       "a whole number 0-18446744073709551615, the same on every replica",
	"metrics_listen": `host:port, such as "127.0.0.1:9184" (":9184": every address)`,
	"pprof_listen":   `host:port on loopback, such as "127.0.0.1:6060"`,
	"log_level":      `"debug", "info", "warn" or "error"`,
	"wait":           `"thread" or "netpoller"`,
	"max_datagram":   "64-65475 bytes (9216, the default; an IPv4-only proxy may go to 65479)",
	"xdp_interfaces": `a list of interface names, such as ["eth0"]`,
	"services":       `a list of services, such as [{"name": "coaps", "protocol": "dtls", "listen": "0.0.0.0:5684", "backends_file": "backends.json"}]`,

	"services[]":                    `a service object, such as {"name": "coaps", "protocol": "dtls", "listen": "0.0.0.0:5684", "backends_file": "backends.json"}`,
	"services[].name":               `1-64 letters, digits, '_', '.' or '-', starting with a letter or digit, such as "coaps"`,
	"services[].protocol":           `"dtls" or "quic"`,
	"services[].listen":             `ip:port, such as "0.0.0.0:5684" or "[::]:443"`,
	"services[].cid_length":         "5-255 for DTLS (default 8), 6-20 except 8 for QUIC (default 12)",
	"services[].cid_codec":          `"quic-lb-encrypted", or leave the key out for the protocol's plaintext codec`,
	"services[].cid_nonce_length":   "4-18 (the CID is 2 + nonce octets)",
	"services[].cid_keys_file":      `the path of the CID key file, such as "cid-keys.json"`,
	"services[].proxy_protocol":     "true (a PROXY v2 header on each datagram, the default) or false (transparent mode)",
	"services[].original_source":    "true (the client's own address as the source of what the backends receive; needs \"proxy_protocol\": false, CAP_NET_ADMIN and routing, see docs/original-source.md) or false (the default)",
	"services[].max_sessions":       "0 (fit to RLIMIT_NOFILE, the default) or a number of sessions per worker",
	"services[].session_memory":     "a number of bytes of at least 14336 (one session), such as 268435456 (256 MiB, the default)",
	"services[].slow_start":         `"0s" (off, the default) or a Go duration from "10s" to "1h", such as "2m"`,
	"services[].session_idle":       `a Go duration of at least "1s", such as "2m" (the default)`,
	"services[].workers":            "0 (one per CPU, the default) to 256",
	"services[].recv_buffer":        "0 (the kernel's default) to 1073741824 bytes (absent: 4194304)",
	"services[].send_buffer":        "0 (the kernel's default, also when absent) to 1073741824 bytes",
	"services[].early_drop":         "true or false (the default)",
	"services[].max_registry_age":   `"0s" (off, the default) or a Go duration of at least "3s", such as "30s"`,
	"services[].backends":           `a list of backends, such as [{"ordinal": 0, "address": "10.0.0.10:5684"}]`,
	"services[].backends_file":      `the path of a JSON backend list, such as "backends.json"`,
	"services[].kubernetes":         `an object such as {"service": "dtls-backend"}`,
	"services[].limits":             `an object such as {"handshake_pps": 2000}`,
	"services[].unroutable":         `"drop" (the default) or "hash"`,
	"services[].require_dtls13_cid": "true (DTLS 1.3 records without a CID are dropped as dtls13_no_cid) or false (the default: routed by HRW like a new session)",
	"services[].health_check":       `an object such as {"interval": "2s"}, or {} for the defaults`,

	"services[].kubernetes.namespace":         `a namespace, such as "default" (the default)`,
	"services[].kubernetes.service":           `the name of the Kubernetes Service, such as "dtls-backend"`,
	"services[].kubernetes.port_name":         "the name of one of the Service's ports",
	"services[].kubernetes.kubeconfig":        "the path of a kubeconfig file, or leave the key out in a cluster",
	"services[].kubernetes.watch_pods":        "true or false (the default)",
	"services[].kubernetes.weight_annotation": `a Pod annotation key, such as "cidroute.io/weight" (the default)`,
	"services[].kubernetes.pod_selector":      `a label selector of the backends' Pods, such as "app=dtls-backend"`,

	"services[].limits.global_pps":     "0 (off, the default) or datagrams per second",
	"services[].limits.per_source_pps": "0 (off, the default) or datagrams per second",
	"services[].limits.handshake_pps":  "0 (off, the default) or datagrams per second",
	"services[].limits.zero_rtt_pps":   "0 (off, the default) or datagrams per second",

	"services[].health_check.interval": `a Go duration of at least "100ms", such as "2s" (the default)`,
	"services[].health_check.timeout":  `a Go duration of at least "10ms" and at most the interval, such as "1s" (the default)`,
	"services[].health_check.jitter":   `"0s" (none) or a Go duration of at least "1ms" and less than the interval (default: the interval / 5)`,
	"services[].health_check.fall":     "1-100 (default 3)",
	"services[].health_check.rise":     "1-100 (default 2)",

	"services[].backends[]":             `a backend object, such as {"ordinal": 0, "address": "10.0.0.10:5684"}`,
	"services[].backends[].ordinal":     "0-254",
	"services[].backends[].address":     `the backend's ip:port, such as "10.0.0.10:5684"`,
	"services[].backends[].weight":      "1 or more (default 1)",
	"services[].backends[].state":       `"ready" (the default), "draining" or "gone"`,
	"services[].backends[].ready_since": `when the backend became ready, an RFC 3339 time such as "2026-01-02T15:04:05Z" (for slow_start)`,
}

// want is what to write at path (a path in the file or in a backend list
// file, whose entries are those of "backends").
func want(path string) string {
	n := normalize(path)
	if strings.HasPrefix(n, "[]") {
		n = "services[].backends" + n
	}
	if w, ok := wants[n]; ok {
		return w
	}
	return "a valid value (see docs/configuration.md)"
}

// checkNullsAndEmpty refuses, anywhere in the file, a null (encoding/json
// would leave the default in place: "cid_length": null ran as 8) and an
// empty string (which every key would read as absent).
func (s *source) checkNullsAndEmpty() error {
	var first string
	firstOff := -1
	for path, n := range s.nodes {
		v := s.data[n.val:n.end]
		if (string(v) == "null" || string(v) == `""`) && (firstOff < 0 || n.val < firstOff) {
			first, firstOff = path, n.val
		}
	}
	if firstOff < 0 {
		return nil
	}
	what := "null"
	if s.raw(first) == `""` {
		what = "an empty string"
	}
	return s.err(first, fmt.Sprintf("%s is not a value", what), "write "+want(first)+", or leave the key out")
}
