package backendcfg

import (
	"errors"
	"testing"
)

func TestFromHostname(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint8
		ok   bool
	}{
		{"ds-2", 2, true},
		{"my-dtls-backend-0", 0, true},
		{"ds-254", 254, true},
		{"ds-17.dtls-backend.cidroute.svc.cluster.local", 17, true},
		{"ds-255", 0, false}, // reserved
		{"ds-", 0, false},
		{"ds", 0, false},
		{"ds-x", 0, false},
		{"ds-+1", 0, false},
		{"ds-01", 0, false}, // registry/kubernetes skips it too
		{"ds-00", 0, false},
	} {
		got, err := FromHostname(tt.in)
		if tt.ok != (err == nil) || got != tt.want {
			t.Errorf("FromHostname(%q) = %d, %v", tt.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrNoOrdinal) {
			t.Errorf("FromHostname(%q): %v is not ErrNoOrdinal", tt.in, err)
		}
	}
}

func TestResolve(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "HOSTNAME" {
				return v
			}
			return ""
		}
	}
	if o, from, err := Resolve(3, env("ds-9")); err != nil || o != 3 || from != "flag" {
		t.Errorf("flag wins: %d %q %v", o, from, err)
	}
	if o, _, err := Resolve(-1, env("ds-9")); err != nil || o != 9 {
		t.Errorf("HOSTNAME: %d %v", o, err)
	}
	if _, _, err := Resolve(255, nil); !errors.Is(err, ErrNoOrdinal) {
		t.Errorf("flag 255: %v", err)
	}
	if _, _, err := Resolve(-1, env("nosuffix")); !errors.Is(err, ErrNoOrdinal) {
		t.Errorf("HOSTNAME without suffix: %v", err)
	}
}
