package main

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	cidquic "github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
)

// dcidConn records the DCID of the client's short-header packets: the
// server's CID.
type dcidConn struct {
	net.PacketConn
	n    int
	mu   sync.Mutex
	last []byte
}

func (c *dcidConn) WriteTo(b []byte, a net.Addr) (int, error) {
	if len(b) > c.n && b[0]&0xc0 == 0x40 {
		c.mu.Lock()
		c.last = append(c.last[:0], b[1:1+c.n]...)
		c.mu.Unlock()
	}
	return c.PacketConn.WriteTo(b, a)
}

func (c *dcidConn) dcid() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.last...)
}

func writeKeys(t *testing.T, path, body string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path+".tmp", []byte(body), 0o600))
	require.NoError(t, os.Rename(path+".tmp", path))
}

// TestEncryptedCIDKeys: with -cid-keys the backend issues encrypted
// QUIC-LB CIDs that decode, with the file's key, to its ordinal, and a
// new active configuration is used once the file changes (SIGHUP here; the
// 1 s poll would pick it up too).
func TestEncryptedCIDKeys(t *testing.T) {
	const k1, k2 = "8f95f09245765f80256934e50c66207f", "00112233445566778899aabbccddeeff"
	keys := filepath.Join(t.TempDir(), "cid-keys.json")
	writeKeys(t, keys, `{"active": 1, "keys": {"1": "`+k1+`"}}`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, code, logs := start(t, ctx, "-ordinal", "5", "-listen", "127.0.0.1:0", "-cid-keys", keys, "-cid-nonce-len", "15")
	// decoder is what a proxy with both keys holds.
	var key1, key2 [16]byte
	hex.Decode(key1[:], []byte(k1))
	hex.Decode(key2[:], []byte(k2))
	decoder, err := cidquic.NewLBEncrypted(cidquic.LBEncryptedConfig{NonceLen: 15,
		Keys: []cidquic.LBKey{{ConfigID: 1, Key: key1}, {ConfigID: 2, Key: key2}}, Active: 1})
	require.NoError(t, err)

	serverCID := func() []byte {
		t.Helper()
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		rec := &dcidConn{PacketConn: udp, n: 17}
		tr := &quic.Transport{Conn: rec}
		defer tr.Close()
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		defer dcancel()
		conn, err := tr.Dial(dctx, net.UDPAddrFromAddrPort(srv.Addr()),
			&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
		require.NoError(t, err)
		defer conn.CloseWithError(0, "")
		s, err := conn.OpenStreamSync(dctx)
		require.NoError(t, err)
		_, err = s.Write([]byte("x"))
		require.NoError(t, err)
		_, err = s.Read(make([]byte, 1))
		require.NoError(t, err)
		// The first 1-RTT data may ride in a datagram behind a Handshake
		// packet; the ACK of the reply goes in a short header of its own.
		require.Eventually(t, func() bool { return len(rec.dcid()) == 17 }, 5*time.Second, 5*time.Millisecond,
			"no short-header packet from the client")
		cid := rec.dcid()
		ord, ok := decoder.Ordinal(cid)
		require.True(t, ok, "%x", cid)
		require.Equal(t, uint8(5), ord)
		return cid
	}
	require.Equal(t, byte(1), serverCID()[0]>>5)

	writeKeys(t, keys, `{"active": 2, "keys": {"1": "`+k1+`", "2": "`+k2+`"}}`)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `configs="[1 2]" active=2`) {
		require.True(t, time.Now().Before(deadline), "keys not reloaded: %s", logs)
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, byte(2), serverCID()[0]>>5)
	cancel()
	require.Equal(t, 0, <-code)
	require.Contains(t, logs.String(), "QUIC-LB encrypted, 17 octets (single-pass)")
	require.NotContains(t, logs.String(), k1[:8])
	require.NotContains(t, logs.String(), k2[:8])
}
