package proxyconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"testing"

	"github.com/cidroute/cidroute/registry"
)

// FuzzParseConfig: the config parser never panics, and what it accepts
// keeps its promises: every key of every object (backend lists included)
// is one of ours exactly (lower case) and unique in its object, listen
// addresses are usable, durations within their bounds, inline lists valid
// and non-empty.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(withServices(`{` + svc + `}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(bytes.NewReader(data))
		if err != nil {
			// Every mistake in the format, positioned unless the file is empty.
			var e *Error
			if !errors.As(err, &e) || e.Problem == "" || (e.Line == 0) != (len(bytes.Trim(data, " \t\r\n")) == 0) {
				t.Fatalf("%q: error %#v", data, err)
			}
			return
		}
		if err := keysExactAndUnique(data); err != nil {
			t.Fatalf("accepted %q: %v", data, err)
		}
		for _, s := range cfg.Services {
			a := s.Listen.Addr()
			if !a.IsValid() || s.Listen.Port() == 0 || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
				t.Fatalf("accepted listen %v", s.Listen)
			}
			if s.SessionIdle != 0 && s.SessionIdle < minSessionIdle || s.MaxAge != 0 && s.MaxAge < minRegistryAge {
				t.Fatalf("accepted durations %v, %v", s.SessionIdle, s.MaxAge)
			}
			if s.Backends != nil {
				if err := registry.Validate(s.Backends); err != nil {
					t.Fatalf("accepted backends %+v: %v", s.Backends, err)
				}
			}
		}
	})
}

var lowerKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// keysExactAndUnique is the reference: it walks the JSON tokens with no
// knowledge of the schema.
func keysExactAndUnique(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if seen[key] || !lowerKey.MatchString(key) {
					return fmt.Errorf("key %q repeated or not lower case", key)
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return walk()
}
