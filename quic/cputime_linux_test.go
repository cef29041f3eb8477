package quic

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

// TestCPUTimePerOp logs the CPU time (not wall time) one Classify takes, by
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
	for _, name := range []string{"quicgo_short", "quicgo_initial_0rtt", "quicgo_initial_coalesced", "rfc9001_client_initial"} {
		d := readHex(t, name)
		const n = 10_000_000
		best := int64(1 << 62)
		for range 3 {
			start := cpu()
			for range n {
				sinkClass, _ = Classify(d, 12)
			}
			best = min(best, cpu()-start)
		}
		t.Logf("Classify %-26s %6.1f ns CPU/op", name, float64(best)/n)
	}
}
