// Package cidkeys reads the QUIC-LB key file of encrypted connection IDs
// (quic.LBEncrypted), the "cid_keys_file" of cidproxy's configuration, and
// keeps a codec's keys in step with it: the proxy's codec and a backend's
// CID generator read the same file.
//
// The file is JSON: the configurations by config ID (0–6), each an AES-128
// key as 32 hex digits, and the active one, which backends encrypt new
// CIDs with (proxies decode every listed configuration):
//
//	{"active": 1, "keys": {"1": "00112233445566778899aabbccddeeff"}}
//
// A key file must be readable by its owner only (mode 0600 or 0400): a
// file others may access is refused, and so is one its group may access,
// with one exception, the rule PostgreSQL applies to its key files: a
// file owned by root may be group-readable (0640, 0440) when the process
// is not root. That is what a Kubernetes Secret volume gives a non-root
// pod with an fsGroup (root-owned, the pod's group, 0440). Key material
// never appears in an error, a log line or a String method.
package cidkeys

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cidroute/cidroute/internal/boundedread"
	"github.com/cidroute/cidroute/internal/strictjson"
	"github.com/cidroute/cidroute/quic"
)

// maxFileSize bounds a key file: seven keys take a few hundred bytes.
const maxFileSize = 64 << 10

// ErrMode is wrapped by Load for a key file that group or others may
// access (see the package documentation).
var ErrMode = errors.New("cidkeys: key file is accessible by group or others (chmod 600)")

// checkMode applies the package's mode rule to a file of mode perm owned
// by uid owner, read by a process of uid self (-1: unknown).
func checkMode(perm fs.FileMode, owner, self int) error {
	switch {
	case perm&0o077 == 0:
		return nil
	case perm&0o037 == 0 && owner == 0 && self > 0:
		return nil // root-owned, group-readable: a Secret volume with fsGroup
	}
	return fmt.Errorf("mode %04o: %w", perm, ErrMode)
}

// A Set is the content of a key file.
type Set struct {
	Keys   []quic.LBKey // by increasing config ID
	Active uint8        // the config ID new CIDs are encoded with
}

// ConfigIDs returns the config IDs of s.
func (s Set) ConfigIDs() []uint8 {
	ids := make([]uint8, len(s.Keys))
	for i, k := range s.Keys {
		ids[i] = k.ConfigID
	}
	return ids
}

// Load reads the key file at path: it must be a regular file (symbolic
// links are followed, as Kubernetes Secret volumes need) of mode 0600 or
// 0400 (see the package documentation for root-owned files). The read is
// bounded (internal/boundedread): a FIFO or a device is refused without
// waiting for a writer, and a read that takes longer than ReadTimeout or
// outlives ctx is abandoned.
func Load(ctx context.Context, path string) (Set, error) {
	var g boundedread.Guard
	data, err := read(ctx, &g, path)
	if err != nil {
		return Set{}, err
	}
	return Parse(bytes.NewReader(data))
}

// MinInterval is the shortest polling period File.Run uses.
const MinInterval = time.Millisecond

// ReadTimeout bounds one read of a key file, which takes microseconds
// unless its file system hangs.
const ReadTimeout = 5 * time.Second

func read(ctx context.Context, g *boundedread.Guard, path string) ([]byte, error) {
	data, err := g.Do(ctx, ReadTimeout, func() ([]byte, error) {
		return boundedread.RegularFunc(path, maxFileSize, func(st fs.FileInfo) error {
			if err := checkMode(st.Mode().Perm(), fileOwner(st), os.Getuid()); err != nil {
				return fmt.Errorf("%s has %w", path, err)
			}
			return nil
		})
	})
	if errors.Is(err, boundedread.ErrTimeout) || errors.Is(err, boundedread.ErrBlocked) {
		err = fmt.Errorf("%s: %w", path, err) // the others name it
	}
	return data, err
}

// Parse decodes a key file's content strictly, as the proxy's
// configuration is read (internal/strictjson): the keys are "active" and
// "keys" exactly, and no key, config IDs included, appears twice (with
// encoding/json a repeated config ID would silently replace the first
// key). Its errors name config IDs and JSON offsets, never file content.
func Parse(r io.Reader) (Set, error) {
	var f struct {
		Active *int                       `json:"active"`
		Keys   map[string]json.RawMessage `json:"keys"`
	}
	if err := strictjson.Decode(r, &f); err != nil {
		return Set{}, jsonError(err)
	}
	if len(f.Keys) == 0 {
		return Set{}, errors.New(`cidkeys: "keys" is missing or empty`)
	}
	var s Set
	for id, raw := range f.Keys {
		n, err := strconv.ParseUint(id, 10, 8)
		if err != nil || n >= quic.LBUnroutable || strconv.FormatUint(n, 10) != id {
			return Set{}, fmt.Errorf("cidkeys: config ID %q: want 0 to 6", id)
		}
		var hexKey string
		if json.Unmarshal(raw, &hexKey) != nil || len(hexKey) != 32 {
			return Set{}, fmt.Errorf("cidkeys: config ID %d: the key must be a string of 32 hex digits", n)
		}
		k := quic.LBKey{ConfigID: uint8(n)}
		if _, err := hex.Decode(k.Key[:], []byte(hexKey)); err != nil {
			return Set{}, fmt.Errorf("cidkeys: config ID %d: the key must be a string of 32 hex digits", n)
		}
		s.Keys = append(s.Keys, k)
	}
	slices.SortFunc(s.Keys, func(a, b quic.LBKey) int { return int(a.ConfigID) - int(b.ConfigID) })
	if f.Active == nil {
		return Set{}, errors.New(`cidkeys: "active" is missing: the config ID backends encrypt new CIDs with`)
	}
	if *f.Active < 0 || *f.Active >= quic.LBUnroutable || !slices.Contains(s.ConfigIDs(), uint8(*f.Active)) {
		return Set{}, fmt.Errorf("cidkeys: active config ID %d has no key", *f.Active)
	}
	s.Active = uint8(*f.Active)
	return s, nil
}

// jsonError rewords encoding/json's errors without quoting the input: a
// syntax error message can show a character of a key, and a JSON name can
// be key material pasted in the wrong place. Only names that are the
// file's own (a field in another case, a config ID) are shown.
func jsonError(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var ke *strictjson.KeyError
	switch {
	case errors.As(err, &ke):
		what := "unknown"
		if errors.Is(ke.Err, strictjson.ErrRepeatedKey) {
			what = "repeated"
		}
		switch {
		case ke.Field != "":
			return fmt.Errorf("cidkeys: unknown key %q (keys are lower case: %q)", ke.Key, ke.Field)
		case ke.Key == "active" || ke.Key == "keys" || (len(ke.Key) == 1 && ke.Key[0] >= '0' && ke.Key[0] <= '9'):
			return fmt.Errorf("cidkeys: %s key %q", what, ke.Key)
		}
		return fmt.Errorf("cidkeys: %s key at byte %d (known keys: \"active\", \"keys\")", what, ke.Offset)
	case errors.Is(err, strictjson.ErrTrailingData):
		return errors.New("cidkeys: data after the JSON object")
	case errors.As(err, &se):
		return fmt.Errorf("cidkeys: not valid JSON (at byte %d)", se.Offset)
	case errors.As(err, &te):
		return fmt.Errorf("cidkeys: %q has the wrong JSON type", te.Field)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("cidkeys: empty or truncated file")
	}
	return errors.New("cidkeys: not a key file (known keys: \"active\", \"keys\")")
}

// File is a key file and the encrypted codec that holds its keys: Run
// re-reads the file every Interval and on Reload, and applies it when its
// content changed. A file that cannot be read, is refused (mode) or does
// not parse leaves the keys in place and is logged once per change (and
// again on Reload). Replace the file atomically (write, then rename), as a
// Kubernetes Secret volume does.
type File struct {
	Path     string        // the key file, read on every check
	Interval time.Duration // 0 means 1s, at least MinInterval; set before Run
	Logger   *slog.Logger  // nil means slog.Default(); set before Run

	codec *quic.LBEncrypted
	set   Set

	// The hash of the content last applied or refused (a hash, so that no
	// copy of the keys is kept), whether it was applied, and the error
	// last logged: Run's state.
	last    [sha256.Size]byte
	lastOK  bool
	lastErr string

	guard  boundedread.Guard // Run's reads: a stuck one blocks the next
	once   sync.Once
	reload chan struct{}
	polled func() // tests: called after every poll
}

// Open reads the key file at path, as Load does, and returns it with a new
// encrypted codec of nonceLen-octet nonces holding its keys.
func Open(ctx context.Context, path string, nonceLen int) (*File, error) {
	var g boundedread.Guard
	data, err := read(ctx, &g, path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	c, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{NonceLen: nonceLen, Keys: s.Keys, Active: s.Active})
	if err != nil {
		return nil, err
	}
	return &File{Path: path, codec: c, set: s, last: sha256.Sum256(data), lastOK: true}, nil
}

// Codec returns the codec whose keys the File keeps.
func (f *File) Codec() *quic.LBEncrypted { return f.codec }

// Loaded returns the key set Open read (config IDs and active, for logs).
func (f *File) Loaded() Set { return f.set }

func (f *File) init() { f.once.Do(func() { f.reload = make(chan struct{}, 1) }) }

// Reload asks a running (or the next) Run to read the file now, and to log
// a failure again. It does not wait. Wire it to SIGHUP.
func (f *File) Reload() {
	f.init()
	select {
	case f.reload <- struct{}{}:
	default:
	}
}

// Run polls until ctx is done. A File runs at most once at a time.
func (f *File) Run(ctx context.Context) {
	f.init()
	interval := f.Interval
	if interval <= 0 {
		interval = time.Second
	}
	interval = max(interval, MinInterval) // a tiny period would spin
	log := f.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("cid_keys_file", f.Path)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.poll(ctx, false, log)
		case <-f.reload:
			f.poll(ctx, true, log)
		}
		if f.polled != nil {
			f.polled()
		}
	}
}

func (f *File) poll(ctx context.Context, forced bool, log *slog.Logger) {
	data, err := read(ctx, &f.guard, f.Path)
	if ctx.Err() != nil {
		return // stopping: an abandoned read is no failure of the file
	}
	if err == nil {
		sum := sha256.Sum256(data)
		if sum == f.last && !forced {
			if f.lastOK {
				f.lastErr = "" // readable again, and still applied
			}
			return
		}
		var s Set
		if s, err = Parse(bytes.NewReader(data)); err == nil {
			if err = f.codec.SetKeys(s.Keys, s.Active); err == nil {
				f.last, f.lastOK, f.lastErr = sum, true, ""
				log.Info("CID keys loaded", "configs", fmt.Sprint(s.ConfigIDs()), "active", s.Active)
				return
			}
		}
		f.last, f.lastOK = sum, false // not parsed again until it changes
	}
	if msg := err.Error(); forced || msg != f.lastErr {
		f.lastErr = msg
		log.Error("cannot use the CID key file; keeping the previous keys", "err", err,
			"configs", fmt.Sprint(f.codec.ConfigIDs()), "active", f.codec.Active())
	}
}
