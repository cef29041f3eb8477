package cidroute

import (
	"testing"

	"golang.org/x/sys/unix"
)

// processCPU returns the process's CPU time in nanoseconds. On a shared,
// loaded machine wall-clock ns/op measures the neighbours; CPU time per op
// measures the code.
func processCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// reportCPU runs f under b.Loop and reports CPU nanoseconds per op beside
// the wall-clock figure.
func reportCPU(b *testing.B, f func()) {
	b.Helper()
	start := processCPU()
	n := 0
	for b.Loop() {
		f()
		n++
	}
	if n > 0 {
		b.ReportMetric(float64(processCPU()-start)/float64(n), "cpu-ns/op")
	}
}
