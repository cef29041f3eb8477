package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// A Store keeps a Ranking across restarts. Load returns nil and no error
// when nothing is stored. A Chooser calls it from one goroutine at a time.
type Store interface {
	Load() (*Ranking, error) // the stored ranking, or nil
	Save(*Ranking) error     // replaces the stored ranking
}

// ErrCorrupt is wrapped by a FileStore's Load when the file does not hold
// a ranking.
var ErrCorrupt = errors.New("edge: stored ranking is corrupt")

// FileStore keeps the ranking in a JSON file at path, written to a
// temporary file beside it and renamed, so a crash leaves the old or the
// new ranking, never half of one.
func FileStore(path string) Store { return fileStore(path) }

type fileStore string

type fileState struct {
	Version int `json:"version"`
	*Ranking
}

const fileVersion = 1

func (f fileStore) Load() (*Ranking, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := fileState{Ranking: &Ranking{}}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", string(f), ErrCorrupt, err)
	}
	r := st.Ranking
	if st.Version != fileVersion || !r.valid(setOf(r.Set)) || len(setOf(r.Set)) != len(r.Set) {
		return nil, fmt.Errorf("%s: %w: version %d, %d addresses, %d entries", string(f), ErrCorrupt, st.Version, len(r.Set), len(r.Entries))
	}
	return r, nil
}

func (f fileStore) Save(r *Ranking) error {
	b, err := json.MarshalIndent(fileState{Version: fileVersion, Ranking: r}, "", "  ")
	if err != nil {
		return err
	}
	dir, name := filepath.Split(string(f))
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), string(f))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
