package proxyapp

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/quic"
)

const (
	testKey1 = "8f95f09245765f80256934e50c66207f"
	testKey2 = "00112233445566778899aabbccddeeff"
)

// keyLeak reports whether s shows key material.
func keyLeak(s string) bool {
	for _, k := range []string{testKey1, testKey2} {
		if strings.Contains(strings.ToLower(s), k[:8]) || strings.Contains(strings.ToLower(s), k[24:]) {
			return true
		}
	}
	return false
}

func writeKeyFile(t *testing.T, path string, active int, keys map[int]string, mode os.FileMode) {
	t.Helper()
	var parts []string
	for id, k := range keys {
		parts = append(parts, fmt.Sprintf("%q: %q", fmt.Sprint(id), k))
	}
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(fmt.Sprintf(`{"active": %d, "keys": {%s}}`, active, strings.Join(parts, ", "))), mode))
	require.NoError(t, os.Chmod(tmp, mode))
	require.NoError(t, os.Rename(tmp, path))
}

// TestCheckCIDKeys: -check reads the key file (relative to the config
// file), refuses one that group or others can read, and prints no key.
func TestCheckCIDKeys(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "cidproxy.json")
	require.NoError(t, os.WriteFile(conf, []byte(withServices(`{`+svc+`, "cid_codec": "quic-lb-encrypted", "cid_keys_file": "keys/cid.json"}`)), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "keys"), 0o700))
	keys := filepath.Join(dir, "keys", "cid.json")

	writeKeyFile(t, keys, 1, map[int]string{1: testKey1, 2: testKey2}, 0o600)
	code, out, errOut := runArgs(t, "-check", "-config", conf)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "(cid 8, quic-lb-encrypted with 6-octet nonces, keys from "+keys)
	require.False(t, keyLeak(out+errOut))

	for _, bad := range []struct {
		mode os.FileMode
		body string
		want string
	}{
		{0o644, "", "is readable or writable by group or others (mode 0644); chmod 600 " + keys},
		{0o640, "", "chmod 600"},
		{0o600, `{"active": 1, "keys": {"1": "` + testKey1[:30] + `"}}`, "32 hex digits"},
		{0o600, `{"active": 1, "keys": {"1": ` + testKey1 + `}}`, "not valid JSON"},
	} {
		if bad.body == "" {
			writeKeyFile(t, keys, 1, map[int]string{1: testKey1}, bad.mode)
		} else {
			require.NoError(t, os.Remove(keys))
			require.NoError(t, os.WriteFile(keys, []byte(bad.body), bad.mode))
		}
		code, out, errOut := runArgs(t, "-check", "-config", conf)
		require.Equal(t, 1, code, out)
		require.Contains(t, errOut, conf+":")
		require.Contains(t, errOut, `: services[0].cid_keys_file: `)
		require.Contains(t, errOut, bad.want)
		require.False(t, keyLeak(errOut), errOut)
	}
	require.NoError(t, os.Remove(keys))
	code, _, errOut = runArgs(t, "-check", "-config", conf)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, keys+" does not exist; create it, or correct the path")
}

// TestServeEncryptedCIDs runs the proxy with an encrypted QUIC service:
// datagrams whose CID was encrypted with the file's key reach the backend
// it names; a rotated key file is applied on SIGHUP (the poll is turned
// off, so the signal alone reloads it); neither the logs nor /metrics
// show a key.
func TestServeEncryptedCIDs(t *testing.T) {
	defer func(d time.Duration) { cidKeysPoll = d }(cidKeysPoll)
	cidKeysPoll = time.Hour
	dir := t.TempDir()
	keys := filepath.Join(dir, "cid-keys.json")
	writeKeyFile(t, keys, 1, map[int]string{1: testKey1}, 0o600)

	var backends [2]*net.UDPConn
	var list []string
	for i := range backends {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer c.Close()
		backends[i] = c
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": %q}`, i, c.LocalAddr()))
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp"))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"metrics_listen": %q, "services": [
		{"name": "q", "protocol": "quic", "listen": %q, "workers": 1, "cid_codec": "quic-lb-encrypted",
		 "cid_keys_file": %q, "backends": [%s]}]}`, metrics, listen, keys, strings.Join(list, ", "))))
	require.NoError(t, err)

	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, slog.LevelInfo, errWindow), Options{}) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	}()

	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer client.Close()
	to, err := net.ResolveUDPAddr("udp4", listen)
	require.NoError(t, err)
	// send writes a QUIC short header whose CID the server side would
	// issue with key for ordinal, and returns what backend ordinal got.
	send := func(key string, config uint8, ordinal int) {
		t.Helper()
		var k [16]byte
		_, err := hex.Decode(k[:], []byte(key))
		require.NoError(t, err)
		codec, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{Keys: []quic.LBKey{{ConfigID: config, Key: k}}, Active: config})
		require.NoError(t, err)
		cid, err := codec.AppendCID(nil, uint8(ordinal))
		require.NoError(t, err)
		pkt := append(append([]byte{0x41}, cid...), bytes.Repeat([]byte{0xab}, 40)...)
		got := make([]byte, 2048)
		require.NoError(t, backends[ordinal].SetReadDeadline(time.Now().Add(5*time.Second)))
		for try := 0; ; try++ { // the proxy may not be listening yet
			_, err = client.WriteToUDP(pkt, to)
			require.NoError(t, err)
			backends[ordinal].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := backends[ordinal].ReadFromUDP(got)
			if err == nil {
				require.True(t, bytes.HasSuffix(got[:n], pkt), "backend %d got the datagram after a PPv2 header", ordinal)
				return
			}
			require.Less(t, try, 25, "backend %d received nothing for config %d", ordinal, config)
		}
	}
	send(testKey1, 1, 1)
	send(testKey1, 1, 0)

	// Rotate to config 2 only, and reload by SIGHUP (serve is running and
	// has its handler installed: it forwarded the datagrams above).
	writeKeyFile(t, keys, 2, map[int]string{2: testKey2}, 0o600)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	waitFor(t, 5*time.Second, "keys reloaded", func() bool {
		return strings.Contains(logs.String(), `msg="CID keys loaded" service=q cid_keys_file=`+keys+` configs=[2] active=2`)
	})
	send(testKey2, 2, 0)
	send(testKey2, 2, 1)

	// A world-readable file is refused on the next reload; the keys stay.
	writeKeyFile(t, keys, 1, map[int]string{1: testKey1}, 0o644)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	waitFor(t, 5*time.Second, "refusal logged", func() bool { return strings.Contains(logs.String(), "chmod 600") })
	send(testKey2, 2, 1)

	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "cidroute_datagrams_total")
	require.False(t, keyLeak(string(body)), "/metrics shows a key")
	l := logs.String()
	require.False(t, keyLeak(l), "the log shows a key:\n%s", l)
	require.Contains(t, l, "SIGHUP: re-reading backend and CID key files")
	require.Contains(t, l, "QUIC-LB encrypted, 12 octets (four-pass), configs [1], active 1")
}
