package quic

import "testing"

var sinkClass Class

func benchClassify(b *testing.B, name string, cidLen int) {
	d := readHex(b, name)
	if _, err := Classify(d, cidLen); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		sinkClass, _ = Classify(d, cidLen)
	}
}

// A quic-go 1-RTT packet (12-byte server CID).
func BenchmarkClassifyShort(b *testing.B) { benchClassify(b, "quicgo_short", 12) }

// A quic-go resumed session's Initial coalesced with 0-RTT.
func BenchmarkClassifyInitial0RTT(b *testing.B) { benchClassify(b, "quicgo_initial_0rtt", 12) }

// quic-go's Initial + Handshake + 1-RTT datagram.
func BenchmarkClassifyInitialCoalesced3(b *testing.B) {
	benchClassify(b, "quicgo_initial_coalesced", 12)
}

// RFC 9001's 1200-byte client Initial.
func BenchmarkClassifyInitial(b *testing.B) { benchClassify(b, "rfc9001_client_initial", 12) }

// A Retry from a client: the drop path.
func BenchmarkClassifyRetryError(b *testing.B) {
	d := readHex(b, "rfc9001_retry")
	b.ReportAllocs()
	for b.Loop() {
		sinkClass, _ = Classify(d, 12)
	}
}

var sinkOrd uint8

func BenchmarkLBOrdinal(b *testing.B) {
	cid, _ := LB{}.AppendCID(nil, 7)
	b.ReportAllocs()
	for b.Loop() {
		sinkOrd, _ = LB{}.Ordinal(cid)
	}
}

func BenchmarkLBAppendCID(b *testing.B) {
	buf := make([]byte, 0, MaxCIDLen)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = LB{}.AppendCID(buf[:0], 7)
	}
}
