package dtls

import (
	"bytes"
	"testing"
)

func TestOrdinalFirst(t *testing.T) {
	c := OrdinalFirst{}
	eq(t, 8, c.Len())
	eq(t, 0, c.OrdinalOffset())
	noErr(t, c.Validate())

	prefix := []byte("xy")
	out, err := c.AppendCID(prefix, 254)
	noErr(t, err)
	eq(t, 2+8, len(out))
	eq(t, "xy", string(out[:2]))
	ord, ok := c.Ordinal(out[2:])
	isTrue(t, ok)
	eq(t, uint8(254), ord)

	out, err = c.AppendCID(prefix, ReservedOrdinal)
	errIs(t, err, ErrReservedOrdinal)
	eq(t, prefix, out)

	for _, n := range []int{5, 20, 255} {
		cid, err := OrdinalFirst{Length: n}.AppendCID(nil, 3)
		noErr(t, err)
		eq(t, n, len(cid))
	}
	for _, n := range []int{-1, 1, 4, 256} {
		_, err := OrdinalFirst{Length: n}.AppendCID(nil, 3)
		errIs(t, err, ErrCIDLength, "length %d", n)
		_, err = OrdinalFirst{Length: n}.Generator(3)
		errIs(t, err, ErrCIDLength, "length %d", n)
	}
}

func TestOrdinalFirstWrongLength(t *testing.T) {
	c := OrdinalFirst{}
	for _, cid := range [][]byte{nil, {}, {3}, make([]byte, 9)} {
		ord, ok := c.Ordinal(cid)
		isTrue(t, ok)
		eq(t, uint8(ReservedOrdinal), ord, "a CID of %d bytes is dropped, not guessed", len(cid))
	}
}

func TestOrdinalFirstRandom(t *testing.T) {
	gen, err := OrdinalFirst{}.Generator(9)
	noErr(t, err)
	seen := map[string]bool{}
	for range 1000 {
		cid := gen()
		eq(t, 8, len(cid))
		eq(t, uint8(9), cid[0])
		isTrue(t, !seen[string(cid)], "duplicate CID")
		seen[string(cid)] = true
	}
	a, b := gen(), gen()
	a[1] ^= 0xff
	isTrue(t, !bytes.Equal(a, b), "each call returns its own slice")

	_, err = OrdinalFirst{}.Generator(ReservedOrdinal)
	errIs(t, err, ErrReservedOrdinal)
}

// cidCodec mirrors cidroute.CIDCodec (codec.go at the repository root),
// which this package must not import.
type cidCodec interface {
	Len() int
	AppendCID(dst []byte, ordinal uint8) ([]byte, error)
	Ordinal(cid []byte) (ordinal uint8, ok bool)
	OrdinalOffset() int
}

var _ cidCodec = OrdinalFirst{}
