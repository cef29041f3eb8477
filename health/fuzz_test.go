package health

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

// FuzzCheckAnswer feeds arbitrary datagrams, as a backend's host may send
// anything, to both answer checks: they never panic, fail only with
// ErrBadAnswer, and pass only what the protocol's stack would send (checked
// again here with the parsers directly). The seeds are answers of both
// kinds and near misses; the probe's CIDs are fixed.
func FuzzCheckAnswer(f *testing.F) {
	dcid, scid := []byte("0123456789abcdef"), []byte("srcid-01")
	f.Add(hvr())
	sh, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeServerHello, 1, make([]byte, 40))})
	f.Add(sh)
	hello, _ := AppendClientHello(nil, DefaultCipherSuites[:2])
	f.Add(hello)
	f.Add(append([]byte{0x80, 0, 0, 0, 0, 8}, append(append(append([]byte(nil), scid...), 16), append(dcid, 0, 0, 0, 1)...)...))
	f.Add(AppendVersionProbe(nil, 0x1a2a3a4a, dcid, scid))
	f.Add([]byte{})
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := CheckDTLSAnswer(b); err != nil {
			if !errors.Is(err, ErrBadAnswer) {
				t.Fatalf("DTLS: %v", err)
			}
		} else {
			r, _, perr := dtls.ParseRecord(b, dtls.MinCIDLen)
			if perr != nil || r.Type != dtls.Handshake || r.Epoch != 0 ||
				(r.Fragment[0] != byte(dtls.HandshakeHelloVerifyRequest) && r.Fragment[0] != byte(dtls.HandshakeServerHello)) {
				t.Fatalf("DTLS: passed %x", b)
			}
		}
		if m, err := CheckDTLSReply(b, hello); err != nil {
			if !errors.Is(err, ErrBadAnswer) || m != Untied {
				t.Fatalf("DTLS reply: %v %v", m, err)
			}
		} else if CheckDTLSAnswer(b) != nil {
			t.Fatalf("DTLS reply: passed %x, which CheckDTLSAnswer refuses", b)
		}
		if err := CheckQUICAnswer(b, dcid, scid); err != nil {
			if !errors.Is(err, ErrBadAnswer) {
				t.Fatalf("QUIC: %v", err)
			}
		} else {
			h, perr := quic.ParseHeader(b, 0)
			if perr != nil || h.Type != quic.VersionNegotiation || !bytes.Equal(h.DCID, scid) || !bytes.Equal(h.SCID, dcid) {
				t.Fatalf("QUIC: passed %x", b)
			}
		}
	})
}
