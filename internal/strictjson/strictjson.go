// Package strictjson decodes the JSON files an operator writes (the proxy
// configuration, the CID key file) more strictly than encoding/json, which
// matches keys case-insensitively (so "HRW_SEED" would set hrw_seed, and
// "ACTIVE" the active key) and lets a repeated key override the first:
// here every key must be a field's JSON name exactly, no object (a map's
// included) may repeat a key, and nothing may follow the value.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Errors, wrapped by a *KeyError or with context.
var (
	ErrUnknownKey   = errors.New("unknown key")
	ErrRepeatedKey  = errors.New("repeated key")
	ErrTrailingData = errors.New("data after the JSON object")
)

// A KeyError names the key that is unknown or repeated. Offset is where
// the key ends in the input; Field, for an unknown key that differs from a
// field's name only in case, is that name. Error quotes the key: callers
// whose files hold secrets print Offset instead.
type KeyError struct {
	Err    error // ErrUnknownKey or ErrRepeatedKey
	Key    string
	Field  string
	Offset int64
}

func (e *KeyError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%v %q (keys are lower case: %q)", e.Err, e.Key, e.Field)
	}
	return fmt.Sprintf("%v %q", e.Err, e.Key)
}

func (e *KeyError) Unwrap() error { return e.Err }

// Decode decodes exactly one JSON value from r into v. Errors of the JSON
// itself are encoding/json's (*json.SyntaxError, *json.UnmarshalTypeError,
// io.EOF ...), for the caller to word in its file's terms. A
// json.RawMessage is left to the decoder it is handed to, which names it
// in its errors.
func Decode(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	kc := keyChecker{dec: json.NewDecoder(bytes.NewReader(data))}
	if err := kc.value(reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return ErrTrailingData
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
	if t == rawMessage { // its own decoder checks it
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
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = jsonFields(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		seen := map[string]bool{}
		for c.dec.More() {
			tok, err := c.dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if seen[key] {
				return &KeyError{Err: ErrRepeatedKey, Key: key, Offset: c.dec.InputOffset()}
			}
			seen[key] = true
			ft := elem
			if fields != nil {
				var ok bool
				if ft, ok = fields[key]; !ok {
					return unknownKey(key, fields, c.dec.InputOffset())
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

func unknownKey(key string, fields map[string]reflect.Type, off int64) error {
	e := &KeyError{Err: ErrUnknownKey, Key: key, Offset: off}
	for name := range fields {
		if strings.EqualFold(name, key) {
			e.Field = name
		}
	}
	return e
}
