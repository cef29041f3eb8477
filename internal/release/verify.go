package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// verifyOptions: a user's module at go line userGo gets each module at
// version from the tags of repo, as it would from GitHub.
type verifyOptions struct {
	version  string
	userGo   string
	modules  []string // directories; empty: every released module
	modcache string
	out      io.Writer
}

// keyDeps are the third-party modules whose selected version verify
// reports: what the user's go.mod is raised to.
var keyDeps = []string{
	"github.com/pion/dtls/v3", "github.com/quic-go/quic-go",
	"github.com/prometheus/client_golang", "k8s.io/client-go", "github.com/cilium/ebpf",
}

// verifyRelease, for each module: a scratch module outside the repository
// that says `go userGo` runs `go get MODULE@version` (no replace line,
// no workspace), imports one of its packages and builds; its go line must
// end as the higher of userGo and the module's own. A module of commands
// only is installed instead (`go install PKG@version`, which refuses a
// go.mod with replace lines).
func verifyRelease(repo string, opts verifyOptions) error {
	out := opts.out
	mods, err := discover(repo)
	if err != nil {
		return err
	}
	env, err := fetchEnv(repo, opts.modcache)
	if err != nil {
		return err
	}
	var todo []*module
	if len(opts.modules) == 0 {
		todo = released(mods)
	}
	for _, d := range opts.modules {
		m := findModule(mods, d)
		if m == nil || !m.Released {
			return fmt.Errorf("%s: not a released module", d)
		}
		todo = append(todo, m)
	}
	failed := 0
	for _, m := range todo {
		if err := verifyOne(repo, env, m, opts); err != nil {
			fmt.Fprintf(out, "FAIL %s@%s: %v\n", m.Path, opts.version, err)
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("verify: %d of %d modules failed", failed, len(todo))
	}
	return nil
}

// Builds are -trimpath: the tool's own module cache puts the sources at
// other paths than the user's, and only trimmed builds share the build
// cache across runs.
func verifyOne(repo string, env []string, m *module, opts verifyOptions) error {
	tag := m.tagName(opts.version)
	modData, err := run(repo, os.Environ(), "git", "show", tag+":"+filepath.ToSlash(filepath.Join(m.Dir, "go.mod")))
	if err != nil {
		return err
	}
	if strings.Contains(modData, "\nreplace") {
		return fmt.Errorf("%s's go.mod has replace lines", tag)
	}
	// The current tree's packages stand for the tag's: a release changes
	// only go.mod and go.sum.
	pkgs, err := run(filepath.Join(repo, m.Dir), goEnv(nil), "go", "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	if err != nil {
		return err
	}
	var lib string
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(pkgs), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if internalPath(strings.TrimPrefix(path, m.Path)) {
			continue
		}
		if name == "main" {
			cmds = append(cmds, path)
		} else if lib == "" || path == m.Path {
			lib = path
		}
	}
	modGo := goLine(modData)
	want := opts.userGo
	if semver.Compare("v"+modGo, "v"+want) > 0 {
		want = modGo
	}
	dir, err := os.MkdirTemp("", "cidroute-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A commands-only module (or one whose commands are its point) is
	// installed: that is what its users run.
	if len(cmds) > 0 && (lib == "" || strings.HasPrefix(m.Dir, "examples")) {
		bin := filepath.Join(dir, "bin")
		installEnv := append(append([]string{}, env...), "GOBIN="+bin, "GOFLAGS=-modcacherw")
		pkg := cmds[0]
		for _, c := range cmds {
			if strings.HasSuffix(c, "/cidproxy") {
				pkg = c
			}
		}
		if _, err := run(dir, installEnv, "go", "install", "-trimpath", pkg+"@"+opts.version); err != nil {
			return err
		}
		fmt.Fprintf(opts.out, "ok   go install %s@%s (module go %s)\n", pkg, opts.version, modGo)
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/user\n\ngo "+opts.userGo+"\n"), 0o644); err != nil {
		return err
	}
	src := fmt.Sprintf("package main\n\nimport _ %q\n\nfunc main() {}\n", lib)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return err
	}
	if _, err := run(dir, env, "go", "get", m.Path+"@"+opts.version); err != nil {
		return err
	}
	if _, err := run(dir, env, "go", "mod", "tidy"); err != nil {
		return err
	}
	if _, err := run(dir, env, "go", "build", "-trimpath", "-o", os.DevNull, "."); err != nil {
		return err
	}
	userMod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if strings.Contains(string(userMod), "\nreplace") {
		return fmt.Errorf("the user's go.mod has replace lines:\n%s", userMod)
	}
	got := goLine(string(userMod))
	if semver.Compare("v"+got, "v"+want) != 0 {
		return fmt.Errorf("the user's go line went %s -> %s; want %s (the module says %s)", opts.userGo, got, want, modGo)
	}
	// The versions built, not the whole module graph's.
	built, err := run(dir, env, "go", "list", "-deps", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{end}}", ".")
	if err != nil {
		return err
	}
	var deps []string
	for _, line := range strings.Split(built, "\n") {
		p, _, _ := strings.Cut(line, " ")
		if slices.Contains(keyDeps, p) && !slices.Contains(deps, line) {
			deps = append(deps, line)
		}
	}
	fmt.Fprintf(opts.out, "ok   go get %s@%s: builds %s; user's go %s -> %s (module go %s)", m.Path, opts.version, lib, opts.userGo, got, modGo)
	if len(deps) > 0 {
		fmt.Fprintf(opts.out, "; selects %s", strings.Join(deps, ", "))
	}
	fmt.Fprintln(opts.out)
	return nil
}

// goLine is a go.mod's go version ("" if none).
func goLine(gomod string) string {
	for _, line := range strings.Split(gomod, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
