package quic

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

// The client Initial packets of RFC 9001 Appendix A.2 and RFC 9369 Appendix
// A.2 are stored in testdata as the RFCs print them. This test rebuilds
// them from the RFCs' inputs (DCID, unprotected header, CRYPTO frame) with
// the RFCs' key schedule, so the stored bytes are checked against an
// independent derivation, not just copied.

type initialParams struct {
	name    string
	golden  string
	header  string // unprotected, packet number 2 in 4 bytes
	salt    string
	labelPf string // "quic " or "quicv2 "
	version uint32
}

var rfcInitials = []initialParams{
	{"RFC 9001 A.2", "rfc9001_client_initial", "c300000001088394c8f03e5157080000449e00000002",
		"38762cf7f55934b34d179ae6a4c80cadccbb7f0a", "quic ", Version1},
	{"RFC 9369 A.2", "rfc9369_client_initial", "d36b3343cf088394c8f03e5157080000449e00000002",
		"0dede3def700a6db819381be6e269dcbf9bd2ed9", "quicv2 ", Version2},
}

// expandLabel is TLS 1.3 HKDF-Expand-Label with an empty context.
func expandLabel(t *testing.T, secret []byte, label string, n int) []byte {
	t.Helper()
	full := "tls13 " + label
	info := []byte{byte(n >> 8), byte(n), byte(len(full))}
	info = append(info, full...)
	info = append(info, 0)
	out, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func protectClientInitial(t *testing.T, p initialParams) []byte {
	t.Helper()
	dcid := testtool.Hex(t, "8394c8f03e515708")
	initial, err := hkdf.Extract(sha256.New, dcid, testtool.Hex(t, p.salt))
	if err != nil {
		t.Fatal(err)
	}
	client := expandLabel(t, initial, "client in", 32)
	key := expandLabel(t, client, p.labelPf+"key", 16)
	iv := expandLabel(t, client, p.labelPf+"iv", 12)
	hp := expandLabel(t, client, p.labelPf+"hp", 16)

	hdr := testtool.Hex(t, p.header)
	payload := make([]byte, 1162)
	copy(payload, readHex(t, "rfc9001_client_crypto_frame")) // PADDING after it

	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := append([]byte(nil), iv...)
	var pn [8]byte
	binary.BigEndian.PutUint64(pn[:], 2)
	for i := range 8 {
		nonce[4+i] ^= pn[i]
	}
	sealed := gcm.Seal(nil, nonce, payload, hdr)

	// Header protection: the sample starts 4 bytes after the packet number
	// offset, which with a 4-byte packet number is the ciphertext start.
	hpBlock, err := aes.NewCipher(hp)
	if err != nil {
		t.Fatal(err)
	}
	var mask [16]byte
	hpBlock.Encrypt(mask[:], sealed[:16])
	hdr[0] ^= mask[0] & 0x0f
	for i := range 4 {
		hdr[len(hdr)-4+i] ^= mask[1+i]
	}
	return append(hdr, sealed...)
}

func TestRFCClientInitialsReproduced(t *testing.T) {
	for _, p := range rfcInitials {
		t.Run(p.name, func(t *testing.T) {
			want := readHex(t, p.golden)
			if len(want) != 1200 {
				t.Fatalf("golden is %d bytes, want 1200", len(want))
			}
			got := protectClientInitial(t, p)
			if !bytes.Equal(got, want) {
				t.Fatalf("derived packet differs from the RFC's:\n got %x\nwant %x", got[:64], want[:64])
			}
			c, err := Classify(want, 12)
			if err != nil {
				t.Fatal(err)
			}
			if c.Kind != KindNew || c.Type != Initial || c.Version != p.version || !c.Initial || c.ZeroRTT || c.Packets != 1 ||
				!bytes.Equal(c.DCID, testtool.Hex(t, "8394c8f03e515708")) {
				t.Fatalf("Classify = %+v", c)
			}
		})
	}
}
