package proxyconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// decodeStrict decodes exactly one JSON value from r into v, the one way
// every object of the configuration file is read. It is stricter than
// encoding/json, which matches keys case-insensitively (so "HRW_SEED"
// would set hrw_seed) and lets a repeated key override the first: here
// every key must be a field's JSON name exactly, appear once per object,
// and nothing may follow the value. A json.RawMessage is left to the
// decoder it is handed to, which names it in its errors: a service's to
// decodeStrict again, a backend list's to registry.DecodeBackends, which
// has the same rules.
func decodeStrict(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	kc := keyChecker{dec: json.NewDecoder(bytes.NewReader(data))}
	if err := kc.value(reflect.TypeOf(v)); err != nil {
		return jsonError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the JSON object")
	}
	return nil
}

// keyChecker walks one JSON value along the Go type it is decoded into.
type keyChecker struct{ dec *json.Decoder }

var rawMessage = reflect.TypeFor[json.RawMessage]()

// value checks the next value; t is nil where any keys are allowed.
func (c keyChecker) value(t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessage { // its own decoder checks it, and names it in errors
		var skip json.RawMessage
		return c.dec.Decode(&skip)
	}
	tok, err := c.dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]bool{}
		for c.dec.More() {
			tok, err := c.dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if seen[key] {
				return fmt.Errorf("repeated key %q", key)
			}
			seen[key] = true
			var ft reflect.Type
			if fields != nil {
				var ok bool
				if ft, ok = fields[key]; !ok {
					return unknownKey(key, fields)
				}
			}
			if err := c.value(ft); err != nil {
				return err
			}
		}
		_, err = c.dec.Token()
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for c.dec.More() {
			if err := c.value(elem); err != nil {
				return err
			}
		}
		_, err = c.dec.Token()
		return err
	}
	return nil // a scalar; encoding/json checks its type
}

// jsonFields maps the JSON names of t's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f.Type
	}
	return m
}

var errUnknownKey = errors.New("unknown key")

func unknownKey(key string, fields map[string]reflect.Type) error {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Errorf("%w %q (keys are lower case: %q)", errUnknownKey, key, name)
		}
	}
	return fmt.Errorf("%w %q", errUnknownKey, key)
}
