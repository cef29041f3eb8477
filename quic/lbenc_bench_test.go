package quic

import "testing"

// Decoding an encrypted CID is the per-datagram cost a proxy adds: one AES
// decryption (single pass) or three AES encryptions (four pass). Targets
// (issue 23): ≤ 60 ns and ≤ 150 ns, 0 allocs.
func benchLBEncOrdinal(b *testing.B, nonceLen int) {
	c := mustLBEnc(b, LBEncryptedConfig{NonceLen: nonceLen, Keys: []LBKey{{1, draftKey}}, Active: 1})
	cid, _ := c.AppendCID(nil, 7)
	b.ReportAllocs()
	for b.Loop() {
		sinkOrd, _ = c.Ordinal(cid)
	}
}

func BenchmarkLBEncryptedOrdinalSinglePass(b *testing.B) {
	benchLBEncOrdinal(b, LBSinglePassNonceLen)
}

func BenchmarkLBEncryptedOrdinalFourPass(b *testing.B) {
	benchLBEncOrdinal(b, LBEncryptedDefaultNonceLen)
}

// An unknown config ID: the rejection costs no AES.
func BenchmarkLBEncryptedOrdinalUnroutable(b *testing.B) {
	c := mustLBEnc(b, LBEncryptedConfig{Keys: []LBKey{{1, draftKey}}, Active: 1})
	cid, _ := c.AppendCID(nil, 7)
	cid[0] |= 0xe0
	b.ReportAllocs()
	for b.Loop() {
		sinkOrd, _ = c.Ordinal(cid)
	}
}

func benchLBEncAppend(b *testing.B, nonceLen int) {
	c := mustLBEnc(b, LBEncryptedConfig{NonceLen: nonceLen, Keys: []LBKey{{1, draftKey}}, Active: 1})
	buf := make([]byte, 0, MaxCIDLen)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = c.AppendCID(buf[:0], 7)
	}
}

func BenchmarkLBEncryptedAppendCIDSinglePass(b *testing.B) {
	benchLBEncAppend(b, LBSinglePassNonceLen)
}

func BenchmarkLBEncryptedAppendCIDFourPass(b *testing.B) {
	benchLBEncAppend(b, LBEncryptedDefaultNonceLen)
}
