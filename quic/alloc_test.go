package quic

import "testing"

func TestNoAllocs(t *testing.T) {
	datagrams := make([][]byte, 0, len(goldenFiles))
	for _, n := range goldenFiles {
		datagrams = append(datagrams, readHex(t, n))
	}
	truncated := datagrams[0][:500]
	cid, err := LB{}.AppendCID(nil, 9)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, MaxCIDLen)
	for name, f := range map[string]func(){
		"ParseHeader": func() {
			for _, d := range datagrams {
				_, _ = ParseHeader(d, 12)
			}
		},
		"Classify (ok and error)": func() {
			for _, d := range datagrams {
				_, _ = Classify(d, 12)
			}
			_, _ = Classify(truncated, 12)
			_, _ = Classify(nil, 12)
		},
		"StartsSession": func() {
			for _, d := range datagrams {
				_ = StartsSession(d, 12)
			}
			_ = StartsSession(truncated, 12)
		},
		"LB.Ordinal":   func() { _, _ = LB{}.Ordinal(cid); _, _ = LB{ConfigID: 9}.Ordinal(cid) },
		"LB.AppendCID": func() { buf, _ = LB{}.AppendCID(buf[:0], 9) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
}
