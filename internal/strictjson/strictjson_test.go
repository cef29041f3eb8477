package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type doc struct {
		A   int              `json:"a"`
		In  *inner           `json:"in"`
		L   []inner          `json:"l"`
		M   map[string]inner `json:"m"`
		Raw json.RawMessage  `json:"raw"`
	}
	var d doc
	if err := Decode(strings.NewReader(`{"a": 1, "in": {"n": 2}, "l": [{"n": 3}], "m": {"x": {"n": 4}}, "raw": {"z": 1, "z": 2}}`), &d); err != nil {
		t.Fatal(err) // a RawMessage is its own decoder's business
	}
	if d.A != 1 || d.In.N != 2 || d.L[0].N != 3 || d.M["x"].N != 4 {
		t.Fatalf("%+v", d)
	}
	for body, want := range map[string]error{
		`{"a": 1, "a": 2}`:                      ErrRepeatedKey,
		`{"A": 1}`:                              ErrUnknownKey,
		`{"b": 1}`:                              ErrUnknownKey,
		`{"in": {"n": 1, "n": 2}}`:              ErrRepeatedKey,
		`{"in": {"N": 1}}`:                      ErrUnknownKey,
		`{"l": [{"n": 1}, {"n": 1, "n": 1}]}`:   ErrRepeatedKey,
		`{"m": {"x": {"n": 1}, "x": {"n": 2}}}`: ErrRepeatedKey,
		`{"m": {"x": {"N": 1}}}`:                ErrUnknownKey,
		`{"a": 1} {}`:                           ErrTrailingData,
	} {
		err := Decode(strings.NewReader(body), &doc{})
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", body, err, want)
		}
	}
	var ke *KeyError
	if err := Decode(strings.NewReader(`{"A": 1}`), &doc{}); !errors.As(err, &ke) || ke.Field != "a" || err.Error() != `unknown key "A" (keys are lower case: "a")` {
		t.Errorf("%v", err)
	}
	var se *json.SyntaxError
	if err := Decode(strings.NewReader(`{"a": }`), &doc{}); !errors.As(err, &se) {
		t.Errorf("syntax: %v", err)
	}
}
