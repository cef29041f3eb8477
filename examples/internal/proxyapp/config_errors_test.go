package proxyapp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goodConfig is a valid configuration, one key a line, that the mistakes
// below edit.
const goodConfig = `{
  "hrw_seed": 7,
  "services": [
    {
      "name": "coaps",
      "protocol": "dtls",
      "listen": "127.0.0.1:5684",
      "cid_length": 8,
      "backends": [
        {"ordinal": 0, "address": "127.0.0.1:6000"}
      ]
    }
  ]
}
`

// configMistakes are the mistakes a user is most likely to make, each with
// the exact message cidproxy prints for it (dir/ stands for the test's
// directory). Each is an edit of goodConfig (from → to) or a whole file.
var configMistakes = []struct {
	name     string
	from, to string // an edit of goodConfig; from "" : to is the whole file
	keys     os.FileMode
	want     string
}{
	{"YAML instead of JSON", "", "hrw_seed: 7\nservices:\n  - name: coaps\n    protocol: dtls\n", 0,
		`cidproxy.json:1:1: this looks like YAML; cidproxy reads JSON; write the same keys as one JSON object: {"services": [{"name": "coaps", ...}]}`},
	{"trailing comma", `"cid_length": 8,
      "backends": [
        {"ordinal": 0, "address": "127.0.0.1:6000"}
      ]`, `"cid_length": 8,
      "backends": [
        {"ordinal": 0, "address": "127.0.0.1:6000"},
      ]`, 0,
		`cidproxy.json:10:52: a comma before ']'; remove it: JSON allows no trailing comma`},
	{"a comment", `"cid_length": 8,`, `"cid_length": 8, // the default`, 0,
		`cidproxy.json:8:24: a comment; remove it: JSON has no comments`},
	{"a missing comma", `"protocol": "dtls",`, `"protocol": "dtls"`, 0,
		`cidproxy.json:7:7: '"' where a comma or the end of the object is expected; add the missing comma before it`},
	{"single quotes", `"name": "coaps"`, `'name': 'coaps'`, 0,
		`cidproxy.json:5:7: a single quote; write strings and keys in double quotes: "coaps"`},
	{"a misspelt key", `"cid_length"`, `"cid_lenght"`, 0,
		`cidproxy.json:8:7: services[0].cid_lenght: unknown key; did you mean "cid_length"?`},
	{"a key in capitals", `"hrw_seed"`, `"HRW_SEED"`, 0,
		`cidproxy.json:2:3: HRW_SEED: unknown key; write "hrw_seed" (keys are lower case)`},
	{"cid_length 0 for DTLS", `"cid_length": 8`, `"cid_length": 0`, 0,
		`cidproxy.json:8:21: services[0].cid_length: 0 is not a DTLS CID length; write 5-255 (8 is usual), or leave the key out for 8`},
	{"a QUIC CID of a client's length", `"protocol": "dtls"`, `"protocol": "quic"`, 0,
		`cidproxy.json:8:21: services[0].cid_length: 8 is the length most clients give their first, random DCID (new sessions would be routed by its random bytes, not by HRW); write 12 (the default), or 6-7 or 9-20`},
	{"a protocol in capitals", `"dtls"`, `"DTLS"`, 0,
		`cidproxy.json:6:19: services[0].protocol: "DTLS" is not a protocol; write "dtls" or "quic"`},
	{"a host name to listen on", `"127.0.0.1:5684"`, `"localhost:5684"`, 0,
		`cidproxy.json:7:17: services[0].listen: "localhost:5684" is not ip:port (an IP address, not a host name, and a port); write ip:port, such as "0.0.0.0:5684" or "[::]:443"`},
	{"a number in quotes", `"cid_length": 8`, `"cid_length": "8"`, 0,
		`cidproxy.json:8:21: services[0].cid_length: "8" is a string; write 8 without quotes`},
	{"a boolean in quotes", `"cid_length": 8,`, `"cid_length": 8, "proxy_protocol": "false",`, 0,
		`cidproxy.json:8:42: services[0].proxy_protocol: "false" is a string; write false without quotes`},
	{"a duration without unit", `"cid_length": 8,`, `"cid_length": 8, "max_registry_age": 30,`, 0,
		`cidproxy.json:8:44: services[0].max_registry_age: 30 is a number; write "0s" (off, the default) or a Go duration of at least "3s", such as "30s"`},
	{"a slow start in seconds", `"cid_length": 8,`, `"cid_length": 8, "slow_start": "5s",`, 0,
		`cidproxy.json:8:38: services[0].slow_start: "5s" is less than 10s; write "0s" (off, the default) or a Go duration from "10s" to "1h", such as "2m"`},
	{"a ready_since without a zone", `"address": "127.0.0.1:6000"`, `"address": "127.0.0.1:6000", "ready_since": "2026-01-02 15:04:05"`, 0,
		`cidproxy.json:10:68: services[0].backends[0].ready_since: "2026-01-02 15:04:05" is not an RFC 3339 time; write when the backend became ready, an RFC 3339 time such as "2026-01-02T15:04:05Z" (for slow_start)`},
	{"a duration string without unit", `"cid_length": 8,`, `"cid_length": 8, "max_registry_age": "30",`, 0,
		`cidproxy.json:8:44: services[0].max_registry_age: "30" has no unit; write "30s" (or ms, m, h)`},
	{"null for a default", `"cid_length": 8`, `"cid_length": null`, 0,
		`cidproxy.json:8:21: services[0].cid_length: null is not a value; write 5-255 for DTLS (default 8), 6-20 except 8 for QUIC (default 12), or leave the key out`},
	{"no backends", `,
      "backends": [
        {"ordinal": 0, "address": "127.0.0.1:6000"}
      ]`, ``, 0,
		`cidproxy.json:4:5: services[0]: no backends; add "backends", "backends_file" or "kubernetes"`},
	{"both backends and a backends_file", `"cid_length": 8,`, `"cid_length": 8, "backends_file": "backends.json",`, 0,
		`cidproxy.json:9:7: services[0].backends: "backends_file" is given too; give exactly one of "backends", "backends_file" and "kubernetes"`},
	{"ordinal 255", `"ordinal": 0`, `"ordinal": 255`, 0,
		`cidproxy.json:10:21: services[0].backends[0].ordinal: 255 is reserved (CIDs that name no backend); write 0-254`},
	{"weight 0 to drain", `"address": "127.0.0.1:6000"}`, `"address": "127.0.0.1:6000", "weight": 0}`, 0,
		`cidproxy.json:10:63: services[0].backends[0].weight: 0 is not a weight; write 1 or more, or leave the key out for 1; for no new sessions write "state": "draining"`},
	{"a backend at the proxy's own address", `"127.0.0.1:6000"`, `"127.0.0.1:5684"`, 0,
		`cidproxy.json:10:35: services[0].backends[0].address: 127.0.0.1:5684 is an address of this proxy (a service's listen or public address, or a host address at a wildcard listen's port): datagrams sent there would loop; write the backend's own address`},
	{"session settings without transparent mode", `"cid_length": 8,`, `"cid_length": 8, "max_sessions": 1000,`, 0,
		`cidproxy.json:8:24: services[0].max_sessions: applies only in transparent mode; add "proxy_protocol": false, or remove it`},
	{"original source without transparent mode", `"cid_length": 8,`, `"cid_length": 8, "original_source": true,`, 0,
		`cidproxy.json:8:24: services[0].original_source: applies only in transparent mode; add "proxy_protocol": false, or remove it`},
	{"two services of one name", `    }
  ]`, `    },
    {"name": "coaps", "protocol": "quic", "listen": "127.0.0.1:443", "backends_file": "b.json"}
  ]`, 0,
		`cidproxy.json:13:14: services[1].name: "coaps" is already the name of services[0]; give each service a name of its own`},
	{"a CID key file others can read", `"cid_length": 8,`, `"cid_length": 8, "cid_codec": "quic-lb-encrypted", "cid_keys_file": "keys.json",`, 0o644,
		`cidproxy.json:8:75: services[0].cid_keys_file: dir/keys.json is readable or writable by group or others (mode 0644); chmod 600 dir/keys.json`},
	{"a kubernetes service in the plain build", `"backends": [
        {"ordinal": 0, "address": "127.0.0.1:6000"}
      ]`, `"kubernetes": {"service": "dtls-backend"}`, 0,
		`cidproxy.json:9:21: services[0].kubernetes: this build of cidproxy has no Kubernetes source; run the Kubernetes build (examples/kubernetes/cidproxy), or list the backends with "backends" or "backends_file"`},
}

// TestConfigMistakes: each likely mistake is refused with its exact
// message, at -check and at a start alike (the start's last line of
// output is the same message: nothing else may say it differently).
func TestConfigMistakes(t *testing.T) {
	for _, tt := range configMistakes {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			body := tt.to
			if tt.from != "" || tt.to == "" {
				require.Contains(t, goodConfig, tt.from)
				body = strings.Replace(goodConfig, tt.from, tt.to, 1)
			}
			path := filepath.Join(dir, "cidproxy.json")
			require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
			if tt.keys != 0 {
				writeKeyFile(t, filepath.Join(dir, "keys.json"), 1, map[int]string{1: testKey1}, tt.keys)
			}
			want := strings.ReplaceAll(tt.want, "dir/", dir+"/")
			want = strings.ReplaceAll(want, "cidproxy.json:", path+":")

			code, out, errOut := runArgs(t, "-check", "-config", path)
			require.Equal(t, 1, code, out)
			require.Equal(t, want+"\n", errOut, "-check")

			code, _, errOut = runArgs(t, "-config", path)
			require.Equal(t, 1, code)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			require.Equal(t, want, lines[len(lines)-1], "a start:\n%s", errOut)
		})
	}
}

// TestConfigReadErrors: a configuration path that is not a readable
// regular file is named with what it is (a directory: its mode in octal).
func TestConfigReadErrors(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "conf.d")
	require.NoError(t, os.Mkdir(sub, 0o755))
	require.NoError(t, os.Chmod(sub, 0o755)) // whatever the umask
	for _, check := range []bool{true, false} {
		args := []string{"-config", sub}
		if check {
			args = append([]string{"-check"}, args...)
		}
		code, _, errOut := runArgs(t, args...)
		require.Equal(t, 1, code)
		require.Equal(t, sub+": the file is a directory (mode 0755), not a regular file; give the path of the JSON configuration file\n", errOut)
	}
}

// TestUsageNamesReference: -h points to the configuration reference.
func TestUsageNamesReference(t *testing.T) {
	code, _, errOut := runArgs(t, "-h")
	require.Equal(t, 2, code) // flag.ErrHelp
	require.Contains(t, errOut, "docs/configuration.md")
	require.Contains(t, errOut, "-check")
}

// TestReferenceShowsTheMessages: docs/configuration.md shows each
// mistake's message as TestConfigMistakes finds it.
func TestReferenceShowsTheMessages(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/configuration.md")
	require.NoError(t, err)
	for _, tt := range configMistakes {
		want := strings.ReplaceAll(tt.want, "dir/", "/etc/cidproxy/")
		require.Contains(t, string(doc), "| `"+want+"` |", tt.name)
	}
}
