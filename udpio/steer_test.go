package udpio

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
)

// Datagram builders shared with the kernel test.

func dtlsCIDRecord(cid []byte) []byte {
	b := []byte{dtlsCIDType, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 7}
	b = append(b, cid...)
	return append(b, 0, 16, 'e', 'n', 'c', 'r', 'y', 'p', 't', 'e', 'd', '-', 'r', 'e', 'c', 'o', 'r', 'd')
}

func quicShort(cid []byte) []byte {
	return append(append([]byte{0x41}, cid...), bytes.Repeat([]byte{0x5a}, 24)...)
}

func quicLong(dcid []byte) []byte {
	b := []byte{0xc3, 0, 0, 0, 1, byte(len(dcid))}
	b = append(b, dcid...)
	return append(b, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0x40, 0x20)
}

// cidWith returns an n-byte CID with ordinal at off.
func cidWith(n, off int, ordinal byte) []byte {
	c := bytes.Repeat([]byte{0xee}, n)
	c[off] = ordinal
	return c
}

// runProgram runs s's program in x/net/bpf's VM, which, like the kernel,
// returns 0 from a load past the end of the packet.
func runProgram(t testing.TB, s Steering, b []byte) uint32 {
	t.Helper()
	ins, err := s.program()
	require.NoError(t, err)
	vm, err := bpf.NewVM(ins)
	require.NoError(t, err)
	r, err := vm.Run(b)
	require.NoError(t, err)
	return uint32(r)
}

func checkAgainstRef(t testing.TB, s Steering, b []byte) uint32 {
	t.Helper()
	got := runProgram(t, s, b)
	ord, ok := s.steerRef(b)
	want := uint32(retHash)
	if ok {
		want = uint32(ord)
	}
	if got != want {
		t.Fatalf("steering %+v of %x: program %#x, reference %#x", s, b, got, want)
	}
	return got
}

func TestSteeringProgram(t *testing.T) {
	both := Steering{DTLS: true, QUIC: true, CIDLen: 8, OrdinalOffset: 1}
	dtlsOnly := Steering{DTLS: true, CIDLen: 8, OrdinalOffset: 1}
	quicOnly := Steering{QUIC: true, CIDLen: 8, OrdinalOffset: 1}
	cid := cidWith(8, 1, 3)
	const hash = retHash
	for _, tc := range []struct {
		name string
		s    Steering
		b    []byte
		want uint32
	}{
		{"dtls cid", both, dtlsCIDRecord(cid), 3},
		{"quic short", both, quicShort(cid), 3},
		{"quic long server dcid", both, quicLong(cid), 3},
		{"quic long client dcid length", both, quicLong(cidWith(12, 1, 3)), hash},
		{"quic short greased fixed bit", both, append([]byte{0x01}, cid...), hash},
		{"quic short too short", both, quicShort(cid)[:8], hash},
		{"quic short exactly cid", both, quicShort(cid)[:9], 3},
		{"quic long truncated dcid", both, quicLong(cid)[:13], hash},
		{"dtls without length field", both, dtlsCIDRecord(cid)[:11+8+1], hash},
		{"dtls wrong version", both, append([]byte{25, 0x03, 0x03}, dtlsCIDRecord(cid)[3:]...), hash},
		{"dtls handshake record", both, append([]byte{22}, dtlsCIDRecord(cid)[1:]...), hash},
		{"dtls ordinal 200", both, dtlsCIDRecord(cidWith(8, 1, 200)), 200},
		{"empty", both, nil, hash},
		{"one byte", both, []byte{0x41}, hash},
		{"dtls only ignores quic", dtlsOnly, quicShort(cid), hash},
		{"quic only ignores dtls", quicOnly, dtlsCIDRecord(cid), hash},
		{"offset 0", Steering{QUIC: true, CIDLen: 4}, quicShort([]byte{9, 1, 1, 1}), 9},
		{"offset last, dtls 255-byte cid", Steering{DTLS: true, CIDLen: 255, OrdinalOffset: 254}, dtlsCIDRecord(cidWith(255, 254, 2)), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, checkAgainstRef(t, tc.s, tc.b))
		})
	}
}

func TestSteeringProgramRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		s := Steering{DTLS: rng.IntN(2) == 0, QUIC: rng.IntN(2) == 0, CIDLen: 1 + rng.IntN(20)}
		s.OrdinalOffset = rng.IntN(s.CIDLen)
		if !s.DTLS && !s.QUIC {
			s.QUIC = true
		}
		b := make([]byte, rng.IntN(48))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if len(b) > 0 { // bias towards the interesting first bytes
			b[0] = []byte{25, 0x40, 0xc0, b[0]}[rng.IntN(4)]
		}
		if len(b) > 5 && rng.IntN(2) == 0 {
			b[5] = byte(s.CIDLen)
		}
		checkAgainstRef(t, s, b)
	}
}

func TestSteeringValidate(t *testing.T) {
	for _, s := range []Steering{
		{CIDLen: 8},
		{QUIC: true, CIDLen: 0},
		{QUIC: true, CIDLen: 21},
		{DTLS: true, CIDLen: 256},
		{DTLS: true, CIDLen: 8, OrdinalOffset: 8},
		{DTLS: true, CIDLen: 8, OrdinalOffset: -1},
	} {
		_, err := s.program()
		assert.ErrorIs(t, err, ErrConfig, "%+v", s)
	}
	_, err := Steering{DTLS: true, CIDLen: 200}.program()
	assert.NoError(t, err)
	// An encrypted codec's OrdinalOffset (-1) names the reason.
	_, err = Steering{QUIC: true, CIDLen: 12, OrdinalOffset: -1}.program()
	assert.ErrorIs(t, err, ErrNoOrdinalByte)
	assert.ErrorIs(t, err, ErrConfig)
	assert.Contains(t, err.Error(), "encrypted")
	_, err = Steering{QUIC: true, CIDLen: 12, OrdinalOffset: 12}.program()
	assert.NotErrorIs(t, err, ErrNoOrdinalByte)
}

// FuzzSteering checks the assembled classic BPF program against its Go
// reference for arbitrary datagrams and layouts.
func FuzzSteering(f *testing.F) {
	cid := cidWith(8, 1, 3)
	for _, b := range [][]byte{dtlsCIDRecord(cid), quicShort(cid), quicLong(cid), quicLong(cidWith(12, 0, 1)), {}, {0x41}} {
		f.Add(b, uint8(3), uint8(8), uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, proto, cidLen, off uint8) {
		s := Steering{DTLS: proto&1 != 0, QUIC: proto&2 != 0, CIDLen: int(cidLen), OrdinalOffset: int(off)}
		if s.validate() != nil {
			return
		}
		checkAgainstRef(t, s, b)
	})
}
