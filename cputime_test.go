package cidroute

import "testing"

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
