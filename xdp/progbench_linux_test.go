package xdp

import (
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkProgram runs the program on one frame per case through
// BPF_PROG_TEST_RUN and reports its own run time per frame
// (kernel.bpf_stats_enabled), without the syscall around it. "cold" runs
// it once a syscall, with the syscall's cache misses; "warm" 64 times in
// a row in live-frame mode (each run on a fresh copy of the frame, sent
// on for real), as a busy NAPI poll runs it.
func BenchmarkProgram(b *testing.B) {
	e := newDiffEnv(b)
	d, q := e.services[0], e.services[1]
	client := ap("203.0.113.5:40000")
	for _, c := range []struct {
		name string
		s    *diffService
		p    []byte
	}{
		{"dtls-cid", d, dtlsCIDRecord(8, 1, 64)},
		{"dtls-hello", d, dtlsRecord(22, 0xfefd, 0, append([]byte{1}, make([]byte, 100)...))},
		{"quic-short", q, quicShort(lbCID(12, 0, 1, false), 100)},
		{"quic-initial", q, padTo(quicLong(1, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1100), 1200)},
	} {
		frame := udpFrame(peerMAC, proxyMAC, client, c.s.Listen, c.p, frameOpts{ttl: 9})
		for _, warm := range []bool{false, true} {
			name := "cold/" + c.name
			if warm {
				name = "warm/" + c.name
			}
			b.Run(name, func(b *testing.B) {
				st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				fwd0 := e.forwarded(b, c.s)
				p0, _ := e.prog.objs.Cidroute.Stats()
				out := make([]byte, 2048)
				runs := uint64(0)
				e.ns.do(b, func() {
					for range b.N {
						opts := &ebpf.RunOptions{Data: frame, DataOut: out,
							Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: e.ifindex}}
						if warm {
							opts = &ebpf.RunOptions{Data: frame, Repeat: 64, BatchSize: 64, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
								Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: e.ifindex}}
						}
						ret, err := e.prog.objs.Cidroute.Run(opts)
						if err != nil || (!warm && ret != xdpTX) {
							b.Fatalf("verdict %d, %v", ret, err)
						}
						runs += uint64(max(opts.Repeat, 1))
					}
				})
				p1, _ := e.prog.objs.Cidroute.Stats()
				if fwd := e.forwarded(b, c.s) - fwd0; fwd < runs {
					b.Fatalf("forwarded %d of %d", fwd, runs)
				}
				b.ReportMetric(float64((p1.Runtime-p0.Runtime).Nanoseconds())/float64(max(p1.RunCount-p0.RunCount, 1)), "prog-ns/frame")
			})
		}
	}
}

// forwarded is the program's forwarded counter of s.
func (e *diffEnv) forwarded(t testing.TB, s *diffService) uint64 {
	st, err := e.prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st[s.id].Forward.Forwarded
}
