package registry

import "testing"

func TestOrdinalFromHostname(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int // -1: no ordinal
	}{
		{"ds-0", 0}, {"ds-2", 2}, {"my-dtls-backend-17", 17}, {"ds-254", 254},
		{"ds-17.dtls-backend.cidroute.svc.cluster.local", 17},
		{"ds-255", -1}, {"ds-999", -1}, {"ds-1000", -1}, {"ds-02", -1}, {"ds-00", -1}, {"ds-01", -1},
		{"ds-", -1}, {"ds", -1}, {"", -1}, {"ds-2a", -1}, {"ds-a2", -1}, {"ds--1", 1}, {"ds-x", -1},
		{"ds-+1", -1}, {"ds- 1", -1}, {"-7", 7}, {"ds-١", -1}, {"ds-2.", 2}, {".ds-2", -1},
	} {
		got, ok := OrdinalFromHostname(tc.in)
		if tc.want < 0 {
			if ok {
				t.Errorf("%q gave %d", tc.in, got)
			}
			continue
		}
		if !ok || got != uint8(tc.want) {
			t.Errorf("%q = %d, %v; want %d", tc.in, got, ok, tc.want)
		}
	}
}
