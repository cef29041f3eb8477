package cidkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/quic"
)

const (
	hex1 = "8f95f09245765f80256934e50c66207f"
	hex2 = "00112233445566778899aabbccddeeff"
)

// secrets are the forms in which a key must never show up in an error or
// a log: its hex digits (in either case), and a part long enough to matter.
func leaks(s string) bool {
	for _, h := range []string{hex1, hex2} {
		for _, form := range []string{h, strings.ToUpper(h), h[:8], h[24:]} {
			if strings.Contains(s, form) {
				return true
			}
		}
	}
	return false
}

func writeKeys(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestParse(t *testing.T) {
	s, err := Parse(strings.NewReader(`{"active": 2, "keys": {"6": "` + hex2 + `", "2": "` + strings.ToUpper(hex1) + `"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Active != 2 || fmt.Sprint(s.ConfigIDs()) != "[2 6]" || fmt.Sprintf("%x", s.Keys[0].Key) != hex1 || fmt.Sprintf("%x", s.Keys[1].Key) != hex2 {
		t.Fatalf("%v active %d", s.ConfigIDs(), s.Active)
	}
	for name, body := range map[string]string{
		"empty":             ``,
		"not JSON":          `{"active": 1, "keys": {"1": ` + hex1 + `}}`,
		"truncated":         `{"active": 1, "keys": {"1": "` + hex1,
		"short key":         `{"active": 1, "keys": {"1": "` + hex1[:30] + `"}}`,
		"long key":          `{"active": 1, "keys": {"1": "` + hex1 + `00"}}`,
		"not hex":           `{"active": 1, "keys": {"1": "` + hex1[:31] + `g"}}`,
		"key not a string":  `{"active": 1, "keys": {"1": 12345}}`,
		"config 7":          `{"active": 7, "keys": {"7": "` + hex1 + `"}}`,
		"config 01":         `{"active": 1, "keys": {"01": "` + hex1 + `"}}`,
		"config -1":         `{"active": 1, "keys": {"-1": "` + hex1 + `"}}`,
		"no keys":           `{"active": 1, "keys": {}}`,
		"no active":         `{"keys": {"1": "` + hex1 + `"}}`,
		"active without":    `{"active": 2, "keys": {"1": "` + hex1 + `"}}`,
		"active negative":   `{"active": -1, "keys": {"1": "` + hex1 + `"}}`,
		"active a string":   `{"active": "` + hex1 + `", "keys": {"1": "` + hex2 + `"}}`,
		"unknown field":     `{"active": 1, "key": "` + hex2 + `", "keys": {"1": "` + hex1 + `"}}`,
		"trailing data":     `{"active": 1, "keys": {"1": "` + hex1 + `"}} "` + hex2 + `"`,
		"keys not a object": `{"active": 1, "keys": ["` + hex1 + `"]}`,
		// Stricter than encoding/json (internal/strictjson): one name per
		// key, exactly as documented, each once.
		"repeated config": `{"active": 1, "keys": {"1": "` + hex1 + `", "1": "` + hex2 + `"}}`,
		"repeated active": `{"active": 1, "active": 2, "keys": {"1": "` + hex1 + `", "2": "` + hex2 + `"}}`,
		"repeated keys":   `{"active": 1, "keys": {"1": "` + hex1 + `"}, "keys": {"1": "` + hex2 + `"}}`,
		"ACTIVE":          `{"ACTIVE": 1, "keys": {"1": "` + hex1 + `"}}`,
		"Keys":            `{"active": 1, "Keys": {"1": "` + hex1 + `"}}`,
		"a key as a name": `{"active": 1, "keys": {"1": "` + hex1 + `"}, "` + hex2 + `": 1}`,
		"a key repeated":  `{"active": 1, "keys": {"1": "` + hex1 + `"}, "` + hex2 + `": 1, "` + hex2 + `": 1}`,
	} {
		_, err := Parse(strings.NewReader(body))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if leaks(err.Error()) {
			t.Errorf("%s: the error shows key material: %v", name, err)
		}
	}
}

// TestParseStrictMessages: the strict decoder's errors name the key when
// it is the file's own, the offset when it could be key material.
func TestParseStrictMessages(t *testing.T) {
	for body, want := range map[string]string{
		`{"active": 1, "keys": {"1": "` + hex1 + `", "1": "` + hex2 + `"}}`: `repeated key "1"`,
		`{"ACTIVE": 1, "keys": {"1": "` + hex1 + `"}}`:                      `unknown key "ACTIVE" (keys are lower case: "active")`,
		`{"active": 1, "keys": {"1": "` + hex1 + `"}, "` + hex2 + `": 1}`:   `unknown key at byte 99 (known keys: "active", "keys")`,
	} {
		_, err := Parse(strings.NewReader(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want %s", err, want)
		}
	}
}

func TestLoadMode(t *testing.T) {
	dir := t.TempDir()
	body := `{"active": 1, "keys": {"1": "` + hex1 + `"}}`
	path := filepath.Join(dir, "keys.json")
	for _, mode := range []os.FileMode{0o600, 0o400} {
		writeKeys(t, path, body, mode)
		if _, err := Load(context.Background(), path); err != nil {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o602, 0o610} {
		writeKeys(t, path, body, mode)
		_, err := Load(context.Background(), path)
		if !errors.Is(err, ErrMode) || !strings.Contains(err.Error(), "chmod 600") || leaks(err.Error()) {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	if _, err := Load(context.Background(), dir); err == nil {
		t.Error("a directory loads")
	}
	if _, err := Load(context.Background(), filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
}

// TestCheckMode: owner-only files pass; group or other access fails,
// except group read of a root-owned file by a non-root process.
func TestCheckMode(t *testing.T) {
	for _, tt := range []struct {
		perm        os.FileMode
		owner, self int
		ok          bool
	}{
		{0o600, 1000, 1000, true},
		{0o400, 0, 0, true},
		{0o400, 0, 65532, true},
		{0o440, 0, 65532, true}, // a Secret volume with fsGroup
		{0o640, 0, 65532, true}, // root-managed, group-readable
		{0o440, 0, 0, false},    // root reading its own file: chmod it
		{0o440, 1000, 1000, false},
		{0o440, 1000, 65532, false},
		{0o460, 0, 65532, false}, // group-writable
		{0o450, 0, 65532, false},
		{0o444, 0, 65532, false}, // world-readable
		{0o404, 1000, 1000, false},
		{0o602, 1000, 1000, false},
		{0o440, 0, -1, false}, // owner unknown
	} {
		err := checkMode(tt.perm, tt.owner, tt.self)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrMode)) {
			t.Errorf("mode %04o, owner %d, process %d: %v", tt.perm, tt.owner, tt.self, err)
		}
	}
}

func TestLoadModeSecretLink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	body := `{"active": 1, "keys": {"1": "` + hex1 + `"}}`
	// A Kubernetes Secret volume: the name is a symbolic link (through
	// ..data) to a file of the volume's defaultMode.
	writeKeys(t, path, body, 0o400)
	link := filepath.Join(dir, "secret-keys.json")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), link); err != nil {
		t.Errorf("symbolic link: %v", err)
	}
}

// TestFileRun: the codec follows the file, polled and on Reload; a file
// it refuses leaves the keys in place and is logged once per change (and
// on every Reload), never with key material.
func TestFileRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	one := `{"active": 1, "keys": {"1": "` + hex1 + `"}}`
	both := `{"active": 2, "keys": {"1": "` + hex1 + `", "2": "` + hex2 + `"}}`
	writeKeys(t, path, one, 0o600)
	f, err := Open(context.Background(), path, quic.LBEncryptedDefaultNonceLen)
	if err != nil || f.Loaded().Active != 1 {
		t.Fatal(err)
	}
	codec := f.Codec()
	var logs testtool.SyncBuffer
	polls := make(chan struct{}, 100)
	f.Interval, f.Logger = time.Hour, slog.New(slog.NewTextHandler(&logs, nil))
	f.polled = func() { polls <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	step := func(body string, mode os.FileMode, reloads int) {
		t.Helper()
		if body != "" {
			writeKeys(t, path, body, mode)
		}
		for range reloads {
			f.Reload()
			select {
			case <-polls:
			case <-time.After(5 * time.Second):
				t.Fatal("no poll after Reload")
			}
		}
	}
	state := func() string { return fmt.Sprint(codec.ConfigIDs(), codec.Active()) }

	step(both, 0o600, 1) // Interval is an hour: only Reload reads the file
	if state() != "[1 2] 2" {
		t.Fatal(state())
	}
	step(one, 0o644, 2) // refused twice, by mode
	if state() != "[1 2] 2" {
		t.Fatal("a world-readable file was applied:", state())
	}
	step(`{"active": 1, "keys": {"1": `+hex2+`}}`, 0o600, 1) // refused, bad JSON
	step("", 0, 0)
	if state() != "[1 2] 2" {
		t.Fatal(state())
	}
	step(`{"active": 2, "keys": {"2": "`+hex2+`"}}`, 0o600, 1)
	if state() != "[2] 2" {
		t.Fatal(state())
	}
	l := logs.String()
	if leaks(l) {
		t.Fatalf("the log shows key material:\n%s", l)
	}
	if n := strings.Count(l, "chmod 600"); n != 2 {
		t.Errorf("mode refusal logged %d times, want 2 (one per Reload):\n%s", n, l)
	}
	if n := strings.Count(l, `msg="CID keys loaded" cid_keys_file=`+path+` configs="[1 2]" active=2`); n != 1 {
		t.Errorf("load not logged:\n%s", l)
	}
	if n := strings.Count(l, `msg="CID keys loaded"`); n != 2 {
		t.Errorf("%d loads logged:\n%s", n, l)
	}
	if !bytes.Contains([]byte(l), []byte("not valid JSON")) {
		t.Errorf("bad JSON not logged:\n%s", l)
	}
}

// TestFilePolls: without Reload, a change is picked up by the poll.
func TestFilePolls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	writeKeys(t, path, `{"active": 1, "keys": {"1": "`+hex1+`"}}`, 0o600)
	f, err := Open(context.Background(), path, 0)
	if err != nil {
		t.Fatal(err)
	}
	codec := f.Codec()
	f.Interval, f.Logger = 10*time.Millisecond, slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	writeKeys(t, path, `{"active": 3, "keys": {"3": "`+hex2+`", "1": "`+hex1+`"}}`, 0o400)
	deadline := time.Now().Add(5 * time.Second)
	for codec.Active() != 3 {
		if time.Now().After(deadline) {
			t.Fatal("change not picked up")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFileIntervalBound: a tiny Interval is raised to MinInterval instead
// of spinning a CPU on reads of the file.
func TestFileIntervalBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	writeKeys(t, path, `{"active": 1, "keys": {"1": "`+hex1+`"}}`, 0o600)
	f, err := Open(context.Background(), path, 0)
	if err != nil {
		t.Fatal(err)
	}
	var polls atomic.Int64
	f.Interval, f.Logger, f.polled = time.Nanosecond, slog.New(slog.DiscardHandler), func() { polls.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	const run = 200 * time.Millisecond
	time.Sleep(run)
	cancel()
	<-done
	if n := polls.Load(); n > int64(run/MinInterval)+10 {
		t.Fatalf("%d polls in %v with Interval 1ns", n, run)
	}
}
