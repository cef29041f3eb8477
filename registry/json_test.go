package registry

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestDecodeBackends(t *testing.T) {
	in := `[
	  {"ordinal": 0, "address": "10.0.0.10:5684", "weight": 2, "state": "ready"},
	  {"ordinal": 1, "address": "[fd00::11]:5684"},
	  {"state": "draining", "address": "[fe80::1%eth0]:443", "ordinal": 254},
	  {"ordinal": 3, "address": "[::ffff:10.0.0.13]:5684", "state": "gone", "weight": 4294967295}
	]`
	bs, err := DecodeBackends(strings.NewReader(in))
	noErr(t, err)
	want := []Backend{
		{Ordinal: 0, Addr: ap("10.0.0.10:5684"), Weight: 2, State: Ready},
		{Ordinal: 1, Addr: ap("[fd00::11]:5684"), Weight: 1, State: Ready},
		{Ordinal: 254, Addr: ap("[fe80::1%eth0]:443"), Weight: 1, State: Draining},
		{Ordinal: 3, Addr: ap("[::ffff:10.0.0.13]:5684"), Weight: 1<<32 - 1, State: Gone},
	}
	equal(t, bs, want)

	// Round trip through MarshalJSON (normalized: the 4in6 address unmaps).
	out, err := json.Marshal(bs)
	noErr(t, err)
	again, err := DecodeBackends(strings.NewReader(string(out)))
	noErr(t, err)
	want[3].Addr = ap("10.0.0.13:5684")
	equal(t, again, want)
	equal(t, string(out[:62]), `[{"ordinal":0,"address":"10.0.0.10:5684","weight":2,"state":"ready"}`[:62])
}

func TestDecodeBackendsErrors(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error
	}{
		{``, ErrDecode},
		{`null`, ErrDecode},
		{`{}`, ErrDecode},
		{`[`, ErrDecode},
		{`[] []`, ErrDecode},
		{`[]x`, ErrDecode},
		{`[null]`, ErrDecode},
		{`[1]`, ErrDecode},
		{`[{"address": "10.0.0.1:1"}]`, ErrDecode},
		{`[{"ordinal": 1}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "port": 1}]`, ErrDecode},
		{`[{"Ordinal": 1, "address": "10.0.0.1:1"}]`, ErrDecode},
		{`[{"ordinal": 1, "ordinal": 2, "address": "10.0.0.1:1"}]`, ErrDecode},
		{`[{"ordinal": "1", "address": "10.0.0.1:1"}]`, ErrDecode},
		{`[{"ordinal": [1], "address": "10.0.0.1:1"}]`, ErrDecode},
		{`[{"ordinal": 1, "address": 1}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "weight": "2"}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "weight": 4294967296}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "weight": -1}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "weight": 1.5}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "state": 0}]`, ErrDecode},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "weight": 0}]`, ErrZeroWeight},
		{`[{"ordinal": 255, "address": "10.0.0.1:1"}]`, ErrReservedOrdinal},
		{`[{"ordinal": 256, "address": "10.0.0.1:1"}]`, ErrInvalidOrdinal},
		{`[{"ordinal": -1, "address": "10.0.0.1:1"}]`, ErrInvalidOrdinal},
		{`[{"ordinal": 1.0, "address": "10.0.0.1:1"}]`, ErrInvalidOrdinal},
		{`[{"ordinal": 1e0, "address": "10.0.0.1:1"}]`, ErrInvalidOrdinal},
		{`[{"ordinal": 1, "address": "10.0.0.1"}]`, ErrInvalidAddr},
		{`[{"ordinal": 1, "address": "host:1"}]`, ErrInvalidAddr},
		{`[{"ordinal": 1, "address": "10.0.0.1:65536"}]`, ErrInvalidAddr},
		{`[{"ordinal": 1, "address": "10.0.0.1:0"}]`, ErrZeroPort},
		{`[{"ordinal": 1, "address": "0.0.0.0:1"}]`, ErrUnspecifiedAddr},
		{`[{"ordinal": 1, "address": "[ff02::1]:1"}]`, ErrInvalidAddr},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "state": "Ready"}]`, ErrInvalidState},
		{`[{"ordinal": 1, "address": "10.0.0.1:1", "state": "terminating"}]`, ErrInvalidState},
		{`[{"ordinal": 1, "address": "10.0.0.1:1"}, {"ordinal": 1, "address": "10.0.0.2:1"}]`, ErrDuplicateOrdinal},
		{`[{"ordinal": 1, "address": "10.0.0.1:1"}, {"ordinal": 2, "address": "[::ffff:10.0.0.1]:1"}]`, ErrDuplicateAddr},
	} {
		_, err := DecodeBackends(strings.NewReader(c.in))
		isErr(t, err, c.want, c.in)
		truth(t, wrapsSentinel(err), "%s: %v wraps no sentinel", c.in, err)
	}
}

func TestState(t *testing.T) {
	for _, st := range []State{Ready, Draining, Gone} {
		got, err := ParseState(st.String())
		noErr(t, err)
		equal(t, got, st)
		b, err := st.MarshalText()
		noErr(t, err)
		var back State
		noErr(t, back.UnmarshalText(b))
		equal(t, back, st)
	}
	equal(t, State(7).String(), "State(7)")
	_, err := State(7).MarshalText()
	isErr(t, err, ErrInvalidState)
	_, err = ParseState("")
	isErr(t, err, ErrInvalidState)
	var s State
	isErr(t, s.UnmarshalText([]byte("up")), ErrInvalidState)
	truth(t, Ready.Serving() && Draining.Serving() && !Gone.Serving())
	_, err = json.Marshal(Backend{Ordinal: 1, Addr: ap("10.0.0.1:1"), State: 5})
	truth(t, err != nil)
}

var sentinels = []error{
	ErrReservedOrdinal, ErrInvalidOrdinal, ErrDuplicateOrdinal, ErrDuplicateAddr,
	ErrInvalidAddr, ErrUnspecifiedAddr, ErrZeroPort, ErrZeroWeight, ErrInvalidState, ErrDecode, ErrEmptyList,
}

func wrapsSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// FuzzDecodeBackends: never panics, errors wrap a sentinel, an accepted list
// is valid, survives a Marshal round trip, and publishes.
func FuzzDecodeBackends(f *testing.F) {
	f.Add([]byte(`[{"ordinal":0,"address":"127.0.0.1:5684","weight":1,"state":"ready"}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := DecodeBackends(strings.NewReader(string(data)))
		if err != nil {
			if !wrapsSentinel(err) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		noErr(t, Validate(bs))
		out, err := json.Marshal(bs)
		noErr(t, err)
		again, err := DecodeBackends(strings.NewReader(string(out)))
		noErr(t, err, "re-decoding %s", out)
		for i := range bs {
			equal(t, again[i], bs[i].normalize(), "round trip")
		}
		r, _ := newTestRegistry(t, 0)
		noErr(t, r.Update(bs))
		if err := checkInvariants(r.Snapshot(), bs); err != nil {
			t.Fatal(err)
		}
	})
}
