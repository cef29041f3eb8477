package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// rootPath is the core module's path; every module of the repository is
// it or below it.
const rootPath = "github.com/cidroute/cidroute"

// unreleased are the modules that are never tagged: harnesses and tools
// that no user imports. Every other go.mod in the tree is released.
var unreleased = map[string]string{
	"bench":                       "benchmark harness",
	"bench/plot":                  "benchmark charts",
	"internal/interop":            "interoperability tests",
	"internal/release":            "this tool",
	"registry/kubernetes/cluster": "tests against a real control plane",
}

// module is one go.mod of the repository.
type module struct {
	Dir      string            // slash-separated, relative to the repository; "." for the core
	Path     string            // module path
	Go       string            // go line
	Requires map[string]string // repository modules it requires: path -> version
	Replaces map[string]string // replace lines for repository modules: path -> target
	Released bool
	Level    int // 0: requires no repository module; else 1 + its deepest dependency's
}

// tagName is the module's tag for version v: nested modules carry their
// directory as a prefix, as the go command expects.
func (m *module) tagName(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// apiName is the file name of the module's API baseline under api/.
func (m *module) apiName() string {
	if m.Dir == "." {
		return "cidroute.apidiff"
	}
	return strings.ReplaceAll(m.Dir, "/", "-") + ".apidiff"
}

func inRepo(p string) bool { return p == rootPath || strings.HasPrefix(p, rootPath+"/") }

type modFile struct {
	Module  struct{ Path string }
	Go      string
	Require []struct{ Path, Version string }
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path, Version string }
	}
}

// parseModFile reads a go.mod's JSON form (go mod edit -json).
func parseModFile(data []byte, dir string) (*module, error) {
	var f modFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s/go.mod: %v", dir, err)
	}
	m := &module{Dir: dir, Path: f.Module.Path, Go: f.Go, Requires: map[string]string{}, Replaces: map[string]string{}}
	for _, r := range f.Require {
		if inRepo(r.Path) {
			m.Requires[r.Path] = r.Version
		}
	}
	for _, r := range f.Replace {
		if inRepo(r.Old.Path) {
			m.Replaces[r.Old.Path] = r.New.Path
		}
	}
	want := rootPath
	if dir != "." {
		want = rootPath + "/" + dir
	}
	if m.Path != want {
		return nil, fmt.Errorf("%s/go.mod: module %s, want %s", dir, m.Path, want)
	}
	return m, nil
}

// discover finds every go.mod under repo (not in testdata, vendor or
// dot-directories), orders the released ones by dependency level and
// checks that no released module requires an unreleased one.
func discover(repo string) ([]*module, error) {
	var dirs []string
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if p != repo && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "go.mod" {
			rel, err := filepath.Rel(repo, filepath.Dir(p))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var mods []*module
	byPath := map[string]*module{}
	for _, dir := range dirs {
		out, err := run(filepath.Join(repo, dir), goEnv(nil), "go", "mod", "edit", "-json")
		if err != nil {
			return nil, err
		}
		m, err := parseModFile([]byte(out), dir)
		if err != nil {
			return nil, err
		}
		_, skip := unreleased[dir]
		m.Released = !skip
		mods = append(mods, m)
		byPath[m.Path] = m
	}
	for d := range unreleased {
		if !slices.Contains(dirs, d) {
			return nil, fmt.Errorf("unreleased module %s: no go.mod there (update the list in modules.go)", d)
		}
	}
	// Levels by depth-first search; a cycle cannot build, but say so.
	state := map[*module]int{} // 1: visiting, 2: done
	var visit func(m *module) error
	visit = func(m *module) error {
		switch state[m] {
		case 1:
			return fmt.Errorf("module %s: requirement cycle", m.Path)
		case 2:
			return nil
		}
		state[m] = 1
		for p := range m.Requires {
			dep, ok := byPath[p]
			if !ok {
				return fmt.Errorf("%s requires %s, which is not in the repository", m.Path, p)
			}
			if m.Released && !dep.Released {
				return fmt.Errorf("%s is released but requires %s, which is not", m.Path, p)
			}
			if err := visit(dep); err != nil {
				return err
			}
			m.Level = max(m.Level, dep.Level+1)
		}
		state[m] = 2
		return nil
	}
	for _, m := range mods {
		if err := visit(m); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(mods, func(a, b *module) int {
		if a.Level != b.Level {
			return a.Level - b.Level
		}
		return strings.Compare(a.Dir, b.Dir)
	})
	return mods, nil
}

func released(mods []*module) []*module {
	var out []*module
	for _, m := range mods {
		if m.Released {
			out = append(out, m)
		}
	}
	return out
}

func findModule(mods []*module, dir string) *module {
	dir = path.Clean(strings.TrimPrefix(dir, "./"))
	for _, m := range mods {
		if m.Dir == dir || m.Path == dir {
			return m
		}
	}
	return nil
}

// fileExists reports whether name exists and is a regular file.
func fileExists(name string) bool {
	fi, err := os.Stat(name)
	return err == nil && fi.Mode().IsRegular()
}
