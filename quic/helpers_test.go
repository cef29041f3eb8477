package quic

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

// readHex reads testdata/<name>.hex (see testtool.Hex for the format).
func readHex(t testing.TB, name string) []byte {
	t.Helper()
	return testtool.ReadHex(t, filepath.Join("testdata", name+".hex"))
}

// long builds a v1/v2-style long header packet: first octet, version,
// DCID, SCID, for Initial a token (tokenLen >= 0), then a 2-byte Length
// and pnPayload bytes of 0xaa.
func long(b0 byte, version uint32, dcid, scid []byte, token []byte, withToken bool, pnPayload int) []byte {
	b := []byte{b0, byte(version >> 24), byte(version >> 16), byte(version >> 8), byte(version)}
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	if withToken {
		b = append(b, 0x40|byte(len(token)>>8), byte(len(token)))
		b = append(b, token...)
	}
	if pnPayload >= 0 {
		b = append(b, 0x40|byte(pnPayload>>8), byte(pnPayload))
		b = append(b, bytes.Repeat([]byte{0xaa}, pnPayload)...)
	}
	return b
}

func short(dcid []byte, payload int) []byte {
	b := append([]byte{0x41}, dcid...)
	return append(b, bytes.Repeat([]byte{0xbb}, payload)...)
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func seq(n int, from byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}
