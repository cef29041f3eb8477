package udpio

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
)

// runFilter runs f's program in x/net/bpf's VM, which, like the kernel,
// ends a program with 0 at a load past the end of the packet, on payload
// b behind a UDP header, as the kernel runs it: true when it keeps the
// datagram.
func runFilter(t testing.TB, f *Filter, b []byte) bool {
	t.Helper()
	ins, err := f.program()
	require.NoError(t, err)
	vm, err := bpf.NewVM(ins)
	require.NoError(t, err)
	return vmKeeps(t, vm, b)
}

func vmKeeps(t testing.TB, vm *bpf.VM, b []byte) bool {
	t.Helper()
	r, err := vm.Run(append(make([]byte, udpHeaderLen), b...))
	require.NoError(t, err)
	return uint32(r) != filterDrop
}

func testFilter(routable ...uint8) *Filter {
	f := &Filter{CIDLen: 8}
	for _, o := range routable {
		f.Routable[o] = true
	}
	return f
}

func record(typ byte, version uint16, body int) []byte {
	b := []byte{typ, byte(version >> 8), byte(version), 0, 0, 0, 0, 0, 0, 0, 1, 0, byte(body)}
	return append(b, make([]byte, body)...)
}

func TestFilterCases(t *testing.T) {
	f := testFilter(0, 2, 31, 32, 200, 254)
	cid := func(ord byte) []byte { return dtlsCIDRecord(cidWith(8, 0, ord)) }
	for _, tc := range []struct {
		name string
		b    []byte
		keep bool
	}{
		{"routable ordinal 0", cid(0), true},
		{"routable ordinal 2", cid(2), true},
		{"bitmap word edges: 31", cid(31), true},
		{"32", cid(32), true},
		{"33", cid(33), false},
		{"200", cid(200), true},
		{"254", cid(254), true},
		{"unknown ordinal 1", cid(1), false},
		{"reserved 255", cid(255), false},
		{"CID record of DTLS 1.0", append([]byte{25, 0xfe, 0xff}, cid(0)[3:]...), true},
		{"CID record of another version", append([]byte{25, 0x03, 0x03}, cid(0)[3:]...), false},
		{"CID record cut inside its CID", cid(0)[:15], false},
		{"ClientHello, record version 1.0", record(22, 0xfeff, 40), true},
		{"handshake 1.2", record(22, 0xfefd, 40), true},
		{"ChangeCipherSpec", record(20, 0xfefd, 1), true},
		{"alert", record(21, 0xfefd, 2), true},
		{"application data", record(23, 0xfefd, 30), true},
		{"handshake of TLS 1.2", record(22, 0x0303, 40), false},
		{"heartbeat (24)", record(24, 0xfefd, 4), false},
		{"DTLS 1.3 ACK in plaintext (26)", record(26, 0xfefd, 18), true},
		{"type 26 of TLS", record(26, 0x0303, 18), false},
		{"type 27", record(27, 0xfefd, 4), false},
		{"DTLS 1.3 unified header with CID", append([]byte{0x3f}, make([]byte, 30)...), true},
		{"DTLS 1.3 unified header, no CID", append([]byte{0x2c}, make([]byte, 30)...), true},
		{"first byte 0", make([]byte, 40), false},
		{"first byte 0x40 (a QUIC short header)", append([]byte{0x41}, make([]byte, 40)...), false},
		{"first byte 0xc0 (a QUIC long header)", append([]byte{0xc0}, make([]byte, 40)...), false},
		{"12 bytes", record(22, 0xfefd, 0)[:12], false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.keep, f.accepts(tc.b), "reference")
			assert.Equal(t, tc.keep, runFilter(t, f, tc.b), "program")
		})
	}
}

// TestFilterOffsetsAndSets: random routable sets, CID lengths and ordinal
// offsets, and random datagrams around the interesting shapes: the
// program agrees with its reference.
func TestFilterOffsetsAndSets(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		f := &Filter{CIDLen: 1 + rnd.IntN(20)}
		f.OrdinalOffset = rnd.IntN(f.CIDLen)
		for o := range 256 {
			f.Routable[o] = rnd.IntN(3) == 0
		}
		ins, err := f.program()
		require.NoError(t, err)
		vm, err := bpf.NewVM(ins)
		require.NoError(t, err)
		for range 50 {
			b := make([]byte, rnd.IntN(48))
			for i := range b {
				b[i] = byte(rnd.Uint32())
			}
			if len(b) > 3 && rnd.IntN(2) == 0 {
				b[0], b[1], b[2] = []byte{20, 21, 22, 23, 25, 25, 25, 26, 0x2a}[rnd.IntN(9)], 0xfe, []byte{0xfd, 0xff, 0x00}[rnd.IntN(3)]
			}
			require.Equal(t, f.accepts(b), vmKeeps(t, vm, b), "%+v: %x", f, b)
		}
	}
}

func TestFilterValidate(t *testing.T) {
	for _, f := range []Filter{{CIDLen: 0}, {CIDLen: 256}, {CIDLen: 8, OrdinalOffset: 8}, {CIDLen: 8, OrdinalOffset: -1}} {
		_, err := f.program()
		assert.ErrorIs(t, err, ErrConfig, "%+v", f)
	}
	_, err := (&Filter{CIDLen: 8, OrdinalOffset: -1}).program()
	assert.ErrorIs(t, err, ErrNoOrdinalByte)
}

// FuzzFilter: the program and its reference agree on every datagram.
func FuzzFilter(f *testing.F) {
	f.Add(dtlsCIDRecord(cidWith(8, 0, 3)), uint8(8), uint8(0))
	f.Add(dtlsCIDRecord(cidWith(8, 0, 255)), uint8(8), uint8(0))
	f.Add(record(22, 0xfeff, 40), uint8(8), uint8(0))
	f.Add([]byte{0x3f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint8(3))
	f.Add([]byte{}, uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, cidLen, off uint8) {
		flt := &Filter{CIDLen: max(1, int(cidLen)%21), OrdinalOffset: int(off)}
		flt.OrdinalOffset %= flt.CIDLen
		for o := 0; o < 255; o += 3 {
			flt.Routable[o] = true
		}
		if got, want := runFilter(t, flt, b), flt.accepts(b); got != want {
			t.Fatalf("%+v: %x: program %v, reference %v", flt, b, got, want)
		}
	})
}
