package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/semver"
	"golang.org/x/tools/go/gcexportdata"
	"golang.org/x/tools/go/packages"
)

// The API baseline: api/version names the release, api/NAME.apidiff holds
// each released module's exported API at that release (apidiff's module
// export data, which `apidiff -m api/NAME.apidiff MODULE` reads too), and
// api/except.txt the incompatible changes made on purpose since, one
// "MODULE: MESSAGE" line each, as apicheck prints them. The baseline is in
// the tree, not taken from tags, so that a checkout without tags (CI's)
// checks the same.
const (
	apiDir      = "api"
	versionFile = "version"
	exceptFile  = "except.txt"
)

const exceptHeader = `# Incompatible API changes since the release in api/version, made on
# purpose: one "MODULE: MESSAGE" line each, copied from apicheck's output.
# The next release must then raise the minor version (v0.x) or the major
# one; the release clears this file.
`

// loadAPI type-checks the module in dir alone (GOWORK=off) and returns its
// importable API: its packages less main and internal ones.
func loadAPI(fset *token.FileSet, dir, modPath string) (*apidiff.Module, error) {
	cfg := &packages.Config{
		Dir:  dir,
		Env:  goEnv(nil),
		Fset: fset,
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedModule,
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	var errs []error
	m := &apidiff.Module{Path: modPath}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, e)
		}
		if p.Module == nil || p.Module.Path != modPath || p.Name == "main" || internalPath(strings.TrimPrefix(p.PkgPath, modPath)) {
			continue
		}
		m.Packages = append(m.Packages, p.Types)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", dir, errors.Join(errs...))
	}
	slices.SortFunc(m.Packages, func(a, b *types.Package) int { return strings.Compare(a.Path(), b.Path()) })
	return m, nil
}

func internalPath(rel string) bool {
	rel = "/" + strings.Trim(rel, "/") + "/"
	return strings.Contains(rel, "/internal/")
}

// writeAPI writes m in the format of `apidiff -m -w`.
func writeAPI(fset *token.FileSet, m *apidiff.Module, name string) error {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	e, err := w.Create("module")
	if err != nil {
		return err
	}
	if _, err := io.WriteString(e, m.Path); err != nil {
		return err
	}
	for _, p := range m.Packages {
		e, err := w.Create(p.Path() + ".x")
		if err != nil {
			return err
		}
		if err := gcexportdata.Write(e, fset, p); err != nil {
			return fmt.Errorf("%s: %v", p.Path(), err)
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(name, buf.Bytes(), 0o644)
}

// readAPI reads a file that writeAPI (or apidiff -m -w) wrote.
func readAPI(fset *token.FileSet, name string) (*apidiff.Module, error) {
	z, err := zip.OpenReader(name)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	m := &apidiff.Module{}
	for _, f := range z.File {
		r, err := f.Open()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return nil, err
		}
		if f.Name == "module" {
			m.Path = string(data)
			continue
		}
		pkgPath, ok := strings.CutSuffix(f.Name, ".x")
		if !ok {
			return nil, fmt.Errorf("%s: unexpected entry %q", name, f.Name)
		}
		p, err := gcexportdata.Read(bytes.NewReader(data), fset, map[string]*types.Package{}, pkgPath)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %v", name, pkgPath, err)
		}
		m.Packages = append(m.Packages, p)
	}
	if m.Path == "" {
		return nil, fmt.Errorf("%s: no module path", name)
	}
	return m, nil
}

// writeBaseline writes api/ for release v and returns the files written
// (relative to repo).
func writeBaseline(repo string, rel []*module, v string) ([]string, error) {
	dir := filepath.Join(repo, apiDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, m := range rel {
		fset := token.NewFileSet()
		api, err := loadAPI(fset, filepath.Join(repo, m.Dir), m.Path)
		if err != nil {
			return nil, err
		}
		name := filepath.Join(apiDir, m.apiName())
		if len(api.Packages) == 0 {
			continue // only commands: nothing to import
		}
		if err := writeAPI(fset, api, filepath.Join(repo, name)); err != nil {
			return nil, err
		}
		files = append(files, name)
	}
	for _, f := range []struct{ name, data string }{
		{versionFile, v + "\n"},
		{exceptFile, exceptHeader},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.data), 0o644); err != nil {
			return nil, err
		}
		files = append(files, filepath.Join(apiDir, f.name))
	}
	return files, nil
}

// apiReport is one module's changes against the baseline.
type apiReport struct {
	mod          *module
	incompatible []string // "MODULE: MESSAGE"
	accepted     []string // the incompatible ones that except.txt lists
	compatible   []string
	noBaseline   bool
}

// checkAPI compares every released module of repo with the baseline.
// It returns the baseline's version ("" when there is none yet).
func checkAPI(repo string, mods []*module) (string, []apiReport, error) {
	vdata, err := os.ReadFile(filepath.Join(repo, apiDir, versionFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, nil
	} else if err != nil {
		return "", nil, err
	}
	base := strings.TrimSpace(string(vdata))
	except, err := readExcept(filepath.Join(repo, apiDir, exceptFile))
	if err != nil {
		return "", nil, err
	}
	var reports []apiReport
	for _, m := range released(mods) {
		r := apiReport{mod: m}
		name := filepath.Join(repo, apiDir, m.apiName())
		fset := token.NewFileSet()
		now, err := loadAPI(fset, filepath.Join(repo, m.Dir), m.Path)
		if err != nil {
			return base, nil, err
		}
		if !fileExists(name) {
			r.noBaseline = len(now.Packages) > 0
			if r.noBaseline {
				reports = append(reports, r)
			}
			continue
		}
		old, err := readAPI(fset, name)
		if err != nil {
			return base, nil, err
		}
		for _, c := range apidiff.ModuleChanges(old, now).Changes {
			line := m.Path + ": " + c.Message
			switch {
			case c.Compatible:
				r.compatible = append(r.compatible, line)
			case except[line]:
				r.accepted = append(r.accepted, line)
			default:
				r.incompatible = append(r.incompatible, line)
			}
		}
		reports = append(reports, r)
	}
	return base, reports, nil
}

func readExcept(name string) (map[string]bool, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	set := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			set[line] = true
		}
	}
	return set, s.Err()
}

// printAPI writes the reports and returns whether any module has an
// incompatible change that except.txt does not list.
func printAPI(w io.Writer, base string, reports []apiReport) (broken bool) {
	if base == "" {
		fmt.Fprintln(w, "apicheck: no api/version yet (no release): nothing to compare")
		return false
	}
	for _, r := range reports {
		switch {
		case r.noBaseline:
			fmt.Fprintf(w, "%s: new since %s (no baseline)\n", r.mod.Path, base)
			continue
		case len(r.incompatible)+len(r.accepted)+len(r.compatible) == 0:
			fmt.Fprintf(w, "%s: same API as %s\n", r.mod.Path, base)
			continue
		}
		fmt.Fprintf(w, "%s: against %s: %d incompatible, %d of them listed in api/%s; %d compatible\n",
			r.mod.Path, base, len(r.incompatible)+len(r.accepted), len(r.accepted), exceptFile, len(r.compatible))
		for _, l := range r.incompatible {
			fmt.Fprintf(w, "  INCOMPATIBLE %s\n", l)
		}
		for _, l := range r.accepted {
			fmt.Fprintf(w, "  incompatible (listed) %s\n", l)
		}
		for _, l := range r.compatible {
			fmt.Fprintf(w, "  compatible %s\n", l)
		}
		broken = broken || len(r.incompatible) > 0
	}
	if broken {
		fmt.Fprintf(w, "apicheck: incompatible changes against %s. Undo them, or, when meant, copy their lines (without INCOMPATIBLE) into api/%s; the next release is then a minor (v0.x) or major version.\n", base, exceptFile)
	}
	return broken
}

// checkAPIForRelease refuses a release over unlisted incompatible changes,
// and a patch release (or a v1+ minor one) over listed ones.
func checkAPIForRelease(repo string, mods []*module, v string, w io.Writer) error {
	base, reports, err := checkAPI(repo, mods)
	if err != nil {
		return err
	}
	if printAPI(w, base, reports) {
		return fmt.Errorf("apicheck failed")
	}
	incompatible := false
	for _, r := range reports {
		incompatible = incompatible || len(r.accepted) > 0
	}
	if !incompatible || base == "" {
		return nil
	}
	bump := semver.MajorMinor(v) != semver.MajorMinor(base)
	if semver.Major(base) != "v0" {
		bump = semver.Major(v) != semver.Major(base)
	}
	if !bump {
		return fmt.Errorf("api/%s lists incompatible changes since %s: %s must raise the minor version (v0) or the major one", exceptFile, base, v)
	}
	return nil
}
