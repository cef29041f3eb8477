package quic

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

// TestCPUTimePerOp logs the CPU time (not wall time) one Classify, and one
// decode of each CID codec, takes, by
// getrusage(RUSAGE_THREAD) around a loop on a locked thread. On a shared,
// loaded machine wall-clock benchmarks mostly measure waiting for a core;
// this does not. It asserts nothing. Run with:
//
//	CIDROUTE_CPUTIME=1 go test -run TestCPUTimePerOp -v ./quic
func TestCPUTimePerOp(t *testing.T) {
	if os.Getenv("CIDROUTE_CPUTIME") != "1" {
		t.Skip("set CIDROUTE_CPUTIME=1 to measure")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() int64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
			t.Fatal(err)
		}
		return ru.Utime.Nano() + ru.Stime.Nano()
	}
	perOp := func(f func()) float64 {
		const n = 10_000_000
		best := int64(1 << 62)
		for range 3 {
			start := cpu()
			for range n {
				f()
			}
			best = min(best, cpu()-start)
		}
		return float64(best) / n
	}
	for _, name := range []string{"quicgo_short", "quicgo_initial_0rtt", "quicgo_initial_coalesced", "rfc9001_client_initial"} {
		d := readHex(t, name)
		t.Logf("Classify %-26s %6.1f ns CPU/op", name, perOp(func() { sinkClass, _ = Classify(d, 12) }))
	}
	plain, _ := LB{}.AppendCID(nil, 7)
	t.Logf("LB.Ordinal %-24s %6.1f ns CPU/op", "plaintext", perOp(func() { sinkOrd, _ = LB{}.Ordinal(plain) }))
	for _, nl := range []int{LBSinglePassNonceLen, LBEncryptedDefaultNonceLen} {
		c := mustLBEnc(t, LBEncryptedConfig{NonceLen: nl, Keys: []LBKey{{1, draftKey}}, Active: 1})
		cid, _ := c.AppendCID(nil, 7)
		t.Logf("LBEncrypted.Ordinal %-15s %6.1f ns CPU/op", c.String()[19:], perOp(func() { sinkOrd, _ = c.Ordinal(cid) }))
	}
}
