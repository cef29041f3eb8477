package interop

// Differential checks against pion's public recordlayer package. pion splits
// a datagram by lengths only (ContentAwareUnpackDatagram) and checks type
// and version per record (Header.Unmarshal), so where the two disagree the
// reason must be one of our stricter checks.

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/pion/dtls/v3/pkg/protocol"
	"github.com/pion/dtls/v3/pkg/protocol/recordlayer"

	"github.com/cidroute/cidroute/dtls"
)

// pionHeader parses one record header with pion.
func pionHeader(pkt []byte, cidLen int) (recordlayer.Header, error) {
	h := recordlayer.Header{}
	if len(pkt) > 0 && protocol.ContentType(pkt[0]) == protocol.ContentTypeConnectionID {
		h.ConnectionID = make([]byte, cidLen) // pion takes the CID length from here
	}
	err := h.Unmarshal(pkt)
	return h, err
}

// checkAgainstPion compares Classify's verdict (c, err) on b with pion's.
func checkAgainstPion(t testing.TB, b []byte, cidLen int, c dtls.Class, err error) {
	t.Helper()
	if errors.Is(err, dtls.ErrCIDLength) {
		return // nothing to compare: pion takes any length
	}
	if hasDTLS13(b, cidLen) {
		return // pion v3 reads DTLS 1.2 only; dtls's own tests cover DTLS 1.3
	}
	pkts, perr := recordlayer.ContentAwareUnpackDatagram(b, cidLen)
	if err == nil {
		if perr != nil {
			t.Fatalf("we accept, pion rejects (%v): % x", perr, b)
		}
		if len(pkts) != c.Records {
			t.Fatalf("we see %d records, pion %d: % x", c.Records, len(pkts), b)
		}
		for i, pkt := range pkts {
			comparePion(t, pkt, cidLen, i)
		}
		return
	}
	if perr != nil || len(b) == 0 {
		return // both reject (pion returns no records for an empty datagram)
	}
	// pion splits the datagram into whole records; we reject record
	// c.Records. The records before it must match, and the reason must be
	// visible in the failing one.
	if c.Records >= len(pkts) {
		t.Fatalf("we fail at record %d (%v), pion splits into %d: % x", c.Records, err, len(pkts), b)
	}
	for i := range c.Records {
		comparePion(t, pkts[i], cidLen, i)
	}
	pkt := pkts[c.Records]
	hl := dtls.HeaderLen
	if dtls.ContentType(pkt[0]) == dtls.TLS12CID {
		hl += cidLen
	}
	_, herr := pionHeader(pkt, cidLen)
	var ok bool
	switch err {
	case dtls.ErrContentType:
		ok = !validType(pkt[0]) && pkt[0]&0xe0 != 0x20
	case dtls.ErrVersion:
		ok = herr != nil
	case dtls.ErrEmptyRecord:
		ok = len(pkt) == hl // pion allows it except as the last record
	}
	if !ok {
		t.Fatalf("we reject record %d with %v, pion accepts it: % x", c.Records, err, b)
	}
}

// comparePion checks that dtls.ParseRecord and pion read the same header from a
// record pion split off.
func comparePion(t testing.TB, pkt []byte, cidLen, i int) {
	t.Helper()
	r, n, err := dtls.ParseRecord(pkt, cidLen)
	if err != nil || n != len(pkt) {
		t.Fatalf("record %d: n=%d err=%v, pion: %d bytes: % x", i, n, err, len(pkt), pkt)
	}
	h, err := pionHeader(pkt, cidLen)
	if err != nil {
		t.Fatalf("record %d: pion: %v: % x", i, err, pkt)
	}
	if byte(h.ContentType) != byte(r.Type) || uint16(h.Version.Major)<<8|uint16(h.Version.Minor) != r.Version ||
		h.Epoch != r.Epoch || h.SequenceNumber != r.Seq || !bytes.Equal(h.ConnectionID, r.CID) ||
		h.Size()+len(r.Fragment) != len(pkt) {
		t.Fatalf("record %d: we read %+v, pion %+v: % x", i, r, h, pkt)
	}
}

// hasDTLS13 reports whether the record walk of b meets a DTLS 1.3 record
// (a unified header, or a plaintext ACK) before it ends or fails.
func hasDTLS13(b []byte, cidLen int) bool {
	for len(b) > 0 {
		if dtls.IsUnified(b[0]) || dtls.ContentType(b[0]) == dtls.ACK {
			return true
		}
		_, n, err := dtls.ParseRecord(b, cidLen)
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return false
}

// validType reports a DTLS 1.2 content type: change_cipher_spec, alert,
// handshake, application_data (20-23) and tls12_cid (25).
func validType(t byte) bool { return t >= 20 && t <= 23 || t == 25 }

// FuzzClassifyPion holds dtls.Classify to pion on dtls's FuzzClassify
// corpus (the captures and every synthetic case of its table tests), and on
// whatever the fuzzer finds from there.
func FuzzClassifyPion(f *testing.F) {
	for _, v := range corpus(f, filepath.Join(dtlsTestdata, "fuzz", "FuzzClassify")) {
		f.Add(v[0].([]byte), v[1].(byte))
	}
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		c, err := dtls.Classify(b, int(cidLen8))
		checkAgainstPion(t, b, int(cidLen8), c, err)
	})
}

// FuzzParseRecordPion: a record dtls.ParseRecord accepts, pion reads the
// same.
func FuzzParseRecordPion(f *testing.F) {
	for _, v := range corpus(f, filepath.Join(dtlsTestdata, "fuzz", "FuzzParseRecord")) {
		f.Add(v[0].([]byte), v[1].(byte))
	}
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		cidLen := int(cidLen8)
		if _, n, err := dtls.ParseRecord(b, cidLen); err == nil && !hasDTLS13(b[:n], cidLen) {
			comparePion(t, b[:n], cidLen, 0)
		}
	})
}

// TestGoldenPion: every golden capture, and every cut of it, gets the same
// verdict from dtls.Classify and pion.
func TestGoldenPion(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(dtlsTestdata, "*.hex"))
	noErr(t, err)
	isTrue(t, len(files) >= 7, "golden captures in %s", dtlsTestdata)
	for _, f := range files {
		b := readHex(t, filepath.Base(f))
		for cut := 0; cut <= len(b); cut++ {
			c, err := dtls.Classify(b[:cut], liveCIDLen)
			checkAgainstPion(t, b[:cut], liveCIDLen, c, err)
		}
	}
}

// TestGoldenServerHelloCID checks with pion's handshake parser that the
// CID the pion server announced carries its ordinal.
func TestGoldenServerHelloCID(t *testing.T) {
	cid, ok := serverHelloCID(readHex(t, "pion_server_hello.hex"))
	isTrue(t, ok)
	eq(t, liveCIDLen, len(cid))
	eq(t, uint8(liveOrdinal), cid[0])
}
