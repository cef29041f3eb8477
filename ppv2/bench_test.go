package ppv2_test

import (
	"testing"

	"github.com/cidroute/cidroute/ppv2"
)

var benchHeaders = []struct {
	name string
	h    ppv2.Header
	crc  bool
}{
	{"IPv4", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, false},
	{"IPv6", ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6}, false},
	{"IPv4-CRC", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, true},
	{"IPv6-CRC", ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6}, true},
}

func BenchmarkAppendHeader(b *testing.B) {
	for _, bc := range benchHeaders {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 64)
			buf, _ = ppv2.AppendHeaderCRC(buf, bc.h)
			if !bc.crc {
				buf, _ = ppv2.AppendHeader(buf[:0], bc.h)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			if bc.crc {
				for b.Loop() {
					buf, _ = ppv2.AppendHeaderCRC(buf[:0], bc.h)
				}
				return
			}
			for b.Loop() {
				buf, _ = ppv2.AppendHeader(buf[:0], bc.h)
			}
		})
	}
}

func BenchmarkAppendProxy(b *testing.B) {
	for _, bc := range benchHeaders[:2] {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = ppv2.AppendProxy(buf[:0], bc.h.Src, bc.h.Dst)
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range benchHeaders {
		b.Run(bc.name, func(b *testing.B) {
			enc := ppv2.AppendHeader
			if bc.crc {
				enc = ppv2.AppendHeaderCRC
			}
			dgram, err := enc(nil, bc.h)
			if err != nil {
				b.Fatal(err)
			}
			dgram = append(dgram, make([]byte, 1200)...) // a full-size QUIC/DTLS payload follows
			b.SetBytes(int64(len(dgram) - 1200))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := ppv2.Parse(dgram); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSniff(b *testing.B) {
	dgram, _ := ppv2.AppendHeader(nil, benchHeaders[0].h)
	b.ReportAllocs()
	for b.Loop() {
		ppv2.Sniff(dgram)
	}
}
