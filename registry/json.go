package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"
)

// ParseReadySince parses a backend's "ready_since": an RFC 3339 time
// with its offset, such as "2026-01-02T15:04:05Z".
func ParseReadySince(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: ready_since %q is not an RFC 3339 time such as \"2026-01-02T15:04:05Z\"", ErrDecode, s)
	}
	return t.UTC(), nil
}

// MarshalJSON writes b in the list element form (see "JSON format" in the
// package documentation), with its effective weight.
func (b Backend) MarshalJSON() ([]byte, error) {
	b = b.normalize()
	st, err := b.State.MarshalText()
	if err != nil {
		return nil, err
	}
	addr, err := b.Addr.MarshalText()
	if err != nil {
		return nil, err
	}
	out := []byte(`{"ordinal":`)
	out = strconv.AppendUint(out, uint64(b.Ordinal), 10)
	out = append(out, `,"address":`...)
	out = strconv.AppendQuote(out, string(addr))
	out = append(out, `,"weight":`...)
	out = strconv.AppendUint(out, uint64(b.Weight), 10)
	out = append(out, `,"state":"`...)
	out = append(out, st...)
	out = append(out, '"')
	if !b.ReadySince.IsZero() {
		out = append(out, `,"ready_since":"`...)
		out = b.ReadySince.AppendFormat(out, time.RFC3339Nano)
		out = append(out, '"')
	}
	return append(out, '}'), nil
}

// UnmarshalJSON reads one list element strictly (see "JSON format" in the
// package documentation). It
// checks each field on its own; relations between backends (duplicates) are
// [Validate]'s job.
func (b *Backend) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDecode, err)
	}
	if t != json.Delim('{') {
		return fmt.Errorf("%w: backend is not an object", ErrDecode)
	}
	const (
		haveOrdinal = 1 << iota
		haveAddress
		haveWeight
		haveState
		haveReadySince
	)
	var (
		seen int
		out  = Backend{Weight: 1}
	)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrDecode, err)
		}
		key, _ := t.(string)
		if t, err = dec.Token(); err != nil {
			return fmt.Errorf("%w: %w", ErrDecode, err)
		}
		var bit int
		switch key {
		case "ordinal":
			bit = haveOrdinal
			n, ok := t.(json.Number)
			if !ok {
				return fmt.Errorf("%w: ordinal is not a number", ErrDecode)
			}
			v, err := strconv.ParseUint(string(n), 10, 8)
			switch {
			case err != nil:
				return fmt.Errorf("%w: %s", ErrInvalidOrdinal, n)
			case v > MaxOrdinal:
				return ErrReservedOrdinal
			}
			out.Ordinal = uint8(v)
		case "address":
			bit = haveAddress
			s, ok := t.(string)
			if !ok {
				return fmt.Errorf("%w: address is not a string", ErrDecode)
			}
			ap, err := netip.ParseAddrPort(s)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidAddr, err)
			}
			out.Addr = ap
		case "weight":
			bit = haveWeight
			n, ok := t.(json.Number)
			if !ok {
				return fmt.Errorf("%w: weight is not a number", ErrDecode)
			}
			v, err := strconv.ParseUint(string(n), 10, 32)
			if err != nil {
				return fmt.Errorf("%w: weight %s is not an integer 1-%d", ErrDecode, n, uint32(1<<32-1))
			}
			if v == 0 {
				return fmt.Errorf("%w (leave \"weight\" out for the default, 1; \"state\": \"draining\" stops new sessions)", ErrZeroWeight)
			}
			out.Weight = uint32(v)
		case "state":
			bit = haveState
			s, ok := t.(string)
			if !ok {
				return fmt.Errorf("%w: state is not a string", ErrDecode)
			}
			if out.State, err = ParseState(s); err != nil {
				return err
			}
		case "ready_since":
			bit = haveReadySince
			s, ok := t.(string)
			if !ok {
				return fmt.Errorf("%w: ready_since is not a string", ErrDecode)
			}
			if out.ReadySince, err = ParseReadySince(s); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: unknown key %q", ErrDecode, key)
		}
		if seen&bit != 0 {
			return fmt.Errorf("%w: repeated key %q", ErrDecode, key)
		}
		seen |= bit
	}
	switch {
	case seen&haveOrdinal == 0:
		return fmt.Errorf("%w: missing \"ordinal\"", ErrDecode)
	case seen&haveAddress == 0:
		return fmt.Errorf("%w: missing \"address\"", ErrDecode)
	}
	*b = out
	return nil
}

// DecodeBackends reads a JSON backend list (see "JSON format" in the
// package documentation) from r and
// validates it like [Validate]. Nothing may follow the list. The error wraps
// [ErrDecode] for malformed JSON and the specific sentinel otherwise.
func DecodeBackends(r io.Reader) ([]Backend, error) {
	bs, err := decodeList(r)
	if err != nil {
		return nil, err
	}
	if err := Validate(bs); err != nil {
		return nil, err
	}
	return bs, nil
}

// decodeList is DecodeBackends without Validate.
func decodeList(r io.Reader) ([]Backend, error) {
	dec := json.NewDecoder(r)
	var raw *[]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: null instead of a list", ErrDecode)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the list", ErrDecode)
	}
	bs := make([]Backend, len(*raw))
	for i, m := range *raw {
		if err := bs[i].UnmarshalJSON(m); err != nil {
			return nil, fmt.Errorf("backends[%d]: %w", i, err)
		}
	}
	return bs, nil
}
