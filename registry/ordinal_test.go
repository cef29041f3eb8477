package registry

import (
	"errors"
	"testing"
)

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

func TestOwnOrdinal(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "HOSTNAME" {
				return v
			}
			return ""
		}
	}
	host := func(h string, err error) func() (string, error) { return func() (string, error) { return h, err } }
	for _, tc := range []struct {
		name     string
		flag     int
		env      string
		host     string
		hostErr  error
		want     uint8
		from     string
		noResult bool
	}{
		{name: "flag wins", flag: 3, env: "ds-9", want: 3, from: "flag"},
		{name: "flag 0", flag: 0, env: "ds-9", want: 0, from: "flag"},
		{name: "HOSTNAME", flag: -1, env: "ds-9", host: "node-4", want: 9, from: "HOSTNAME ds-9"},
		{name: "os.Hostname", flag: -1, host: "ds-4.svc", want: 4, from: "hostname ds-4.svc"},
		{name: "flag 255", flag: 255, noResult: true},
		{name: "HOSTNAME without suffix", flag: -1, env: "nosuffix", host: "ds-1", noResult: true},
		{name: "HOSTNAME ds-255", flag: -1, env: "ds-255", noResult: true},
		{name: "hostname fails", flag: -1, hostErr: errors.New("no uts"), noResult: true},
	} {
		o, from, err := ownOrdinal(tc.flag, env(tc.env), host(tc.host, tc.hostErr))
		if tc.noResult {
			isErr(t, err, ErrNoOrdinal, tc.name)
			continue
		}
		noErr(t, err, tc.name)
		equal(t, o, tc.want, tc.name)
		equal(t, from, tc.from, tc.name)
	}
}
