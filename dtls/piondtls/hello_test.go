package piondtls

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
)

func TestServerHelloCID(t *testing.T) {
	// Captured from pion v3.1.15 with an ordinal-first generator, CID
	// length 8, ordinal 7.
	cid, ok := serverHelloCID(testtool.ReadHex(t, "../testdata/pion_server_hello.hex"))
	require.True(t, ok)
	assert.Len(t, cid, 8)
	assert.Equal(t, byte(7), cid[0])

	for _, name := range []string{"pion_clienthello_1.hex", "pion_flight5.hex", "pion_appdata.hex"} {
		_, ok := serverHelloCID(testtool.ReadHex(t, "../testdata/"+name))
		assert.False(t, ok, name)
	}
	// Every truncation of the ServerHello fails cleanly.
	sh := testtool.ReadHex(t, "../testdata/pion_server_hello.hex")
	for i := range sh {
		serverHelloCID(sh[:i])
	}
}

func FuzzServerHelloCID(f *testing.F) {
	for _, name := range []string{"pion_server_hello.hex", "pion_clienthello_1.hex", "pion_flight5.hex"} {
		f.Add(testtool.ReadHex(f, "../testdata/"+name))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cid, ok := serverHelloCID(b)
		if !ok {
			return
		}
		if len(cid) == 0 || len(cid) > 255 {
			t.Fatalf("CID of %d bytes", len(cid))
		}
		// The CID is a view into b.
		if !strings.Contains(string(b), string(cid)) {
			t.Fatal("CID not from the datagram")
		}
	})
}

func TestSealed(t *testing.T) {
	for file, want := range map[string]bool{
		"pion_server_hello.hex":  false, // epoch 0 only
		"pion_clienthello_1.hex": false,
		"pion_flight5.hex":       true, // ChangeCipherSpec, then Finished in epoch 1
		"pion_appdata.hex":       true,
		"pion_close_notify.hex":  true,
	} {
		assert.Equal(t, want, sealed(testtool.ReadHex(t, "../testdata/"+file)), file)
	}
	assert.False(t, sealed(nil))
	assert.False(t, sealed([]byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200, 1}), "truncated")
}
