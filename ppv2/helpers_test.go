package ppv2_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// Small assertion helpers: testify's assert package needs a module that is
// not in go.sum, and the shared go.mod is not ours to change.

func msgOf(msg []any) string {
	if len(msg) == 0 {
		return ""
	}
	if f, ok := msg[0].(string); ok {
		return ": " + fmt.Sprintf(f, msg[1:]...)
	}
	return ": " + fmt.Sprint(msg...)
}

// equal reports want != got. Byte slices compare by content (nil equals
// empty).
func equal(t testing.TB, want, got any, msg ...any) {
	t.Helper()
	if w, ok := want.([]byte); ok {
		if g, ok := got.([]byte); ok {
			if !bytes.Equal(w, g) {
				t.Errorf("got  % x\nwant % x%s", g, w, msgOf(msg))
			}
			return
		}
	}
	if !reflect.DeepEqual(want, got) {
		t.Errorf("got %v, want %v%s", got, want, msgOf(msg))
	}
}

func isTrue(t testing.TB, ok bool, msg ...any) {
	t.Helper()
	if !ok {
		t.Errorf("expected true%s", msgOf(msg))
	}
}

func noErr(t testing.TB, err error, msg ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error %v%s", err, msgOf(msg))
	}
}

func errIs(t testing.TB, err, target error, msg ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("error %v, want %v%s", err, target, msgOf(msg))
	}
}
