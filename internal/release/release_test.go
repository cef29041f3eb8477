package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const repoRoot = "../.."

// TestModules: the repository's modules, levelled so that every module
// comes after those it requires, the adapters released, the harnesses not.
func TestModules(t *testing.T) {
	mods, err := discover(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	level := map[string]int{}
	for _, m := range mods {
		level[m.Path] = m.Level
	}
	for _, m := range mods {
		for p := range m.Requires {
			if level[p] >= m.Level {
				t.Errorf("%s (level %d) requires %s (level %d)", m.Dir, m.Level, p, level[p])
			}
		}
	}
	for dir, want := range map[string]bool{".": true, "dtls/piondtls": true, "quic/quicgo": true, "xdp": true, "examples": true, "bench": false, "internal/interop": false} {
		m := findModule(mods, dir)
		if m == nil || m.Released != want {
			t.Errorf("%s: released %v, want %v", dir, m != nil && m.Released, want)
		}
	}
	if m := findModule(mods, "dtls/piondtls"); m.tagName("v0.1.0") != "dtls/piondtls/v0.1.0" {
		t.Errorf("tag name %s", m.tagName("v0.1.0"))
	}
}

// TestReleaseEndToEnd releases a copy of the working tree, then checks
// the tags as a user's go command sees them and the API check against
// the baseline the release wrote.
func TestReleaseEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("releases every module of a copy of the repository (minutes)")
	}
	const v = "v0.99.0"
	repo := filepath.Join(t.TempDir(), "cidroute")
	copyTree(t, repoRoot, repo)
	// The copy starts without a release (whatever api/ the tree has) and
	// with a function whose signature the test changes afterwards.
	if err := os.RemoveAll(filepath.Join(repo, apiDir)); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(repo, "zz_release_probe.go"), "package cidroute\n\n// ReleaseProbe is the release tool test's.\nfunc ReleaseProbe(a int) int { return a }\n")
	changelog, err := os.ReadFile(filepath.Join(repo, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(repo, "CHANGELOG.md"), string(changelog)+"\n## [0.99.0] - test\n")
	for _, kv := range []string{"GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=test@example.com", "GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=test@example.com"} {
		k, val, _ := strings.Cut(kv, "=")
		t.Setenv(k, val)
	}
	git(t, repo, "init", "-q")
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "base")

	mods, err := discover(repo)
	if err != nil {
		t.Fatal(err)
	}
	baseMod := map[string]string{}
	baseSum := map[string]string{}
	for _, m := range released(mods) {
		baseMod[m.Dir] = readFile(t, filepath.Join(repo, m.Dir, "go.mod"))
		baseSum[m.Dir] = readFile(t, filepath.Join(repo, m.Dir, "go.sum"))
	}

	modcache := filepath.Join(filepath.Dir(defaultModcache()), "gomodcache-test")
	var out bytes.Buffer
	res, err := tagRelease(repo, tagOptions{version: v, modcache: modcache, out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}

	// Every released module tagged once, after the modules it requires,
	// at a commit where its go.mod requires this version of them and has
	// no replace line for them.
	var wantTags []string
	for _, m := range released(mods) {
		wantTags = append(wantTags, m.tagName(v))
	}
	if !slices.Equal(res.tags, wantTags) {
		t.Fatalf("tags %v, want %v", res.tags, wantTags)
	}
	for _, m := range released(mods) {
		tag := m.tagName(v)
		gomod := git(t, repo, "show", tag+":"+inDir(m.Dir, "go.mod"))
		if strings.Contains(gomod, "replace "+rootPath) || strings.Contains(gomod, "\t"+rootPath+" =>") {
			t.Errorf("%s: go.mod keeps a replace line:\n%s", tag, gomod)
		}
		for p := range m.Requires {
			if !strings.Contains(gomod, p+" "+v) {
				t.Errorf("%s: go.mod does not require %s %s", tag, p, v)
			}
			dep := findModule(mods, p)
			if err := exec.Command("git", "-C", repo, "merge-base", "--is-ancestor", dep.tagName(v), tag).Run(); err != nil {
				t.Errorf("%s's commit does not follow %s's", tag, dep.tagName(v))
			}
		}
	}
	// Development goes on with the go.mod and go.sum it had, the
	// requirements at the new version.
	for _, m := range released(mods) {
		want := baseMod[m.Dir]
		for p, was := range m.Requires {
			want = strings.ReplaceAll(want, p+" "+was, p+" "+v)
		}
		if got := readFile(t, filepath.Join(repo, m.Dir, "go.mod")); got != want {
			t.Errorf("%s/go.mod after the release:\n%s\nwant:\n%s", m.Dir, got, want)
		}
		if got := readFile(t, filepath.Join(repo, m.Dir, "go.sum")); got != baseSum[m.Dir] {
			t.Errorf("%s/go.sum changed by the release", m.Dir)
		}
	}
	if st := git(t, repo, "status", "--porcelain"); st != "" {
		t.Errorf("the release left changes:\n%s", st)
	}
	// The unreleased modules (the Kubernetes cluster tests) require the
	// new version too, so that their go.mod stays tidy.
	for _, m := range mods {
		if m.Dir != "registry/kubernetes/cluster" {
			continue
		}
		gomod := readFile(t, filepath.Join(repo, m.Dir, "go.mod"))
		for p := range m.Requires {
			if !strings.Contains(gomod, p+" "+v) {
				t.Errorf("%s/go.mod does not require %s %s after the release", m.Dir, p, v)
			}
		}
	}

	// A user's module at go 1.24 gets one nested module with go get
	// alone; its go line rises only to the module's own.
	out.Reset()
	err = verifyRelease(repo, verifyOptions{version: v, userGo: "1.24", modules: []string{"dtls/piondtls", "quic/quicgo"}, modcache: modcache, out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"go get " + rootPath + "/dtls/piondtls@" + v + ": builds " + rootPath + "/dtls/piondtls; user's go 1.24 -> 1.24.0",
		"github.com/pion/dtls/v3 v3.1.0",
		"go get " + rootPath + "/quic/quicgo@" + v + ": builds " + rootPath + "/quic/quicgo; user's go 1.24 -> 1.25",
		"github.com/quic-go/quic-go v0.55.0",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verify output lacks %q", want)
		}
	}

	// The API check: clean right after the release, failed by an
	// incompatible change, passed once api/except.txt lists it, and a
	// patch release refused over it.
	if base, reports, err := checkAPI(repo, mods); err != nil || base != v {
		t.Fatalf("checkAPI: %v, baseline %q", err, base)
	} else if printAPI(&out, base, reports) {
		t.Fatalf("apicheck fails right after the release:\n%s", out.String())
	}
	writeFile(t, filepath.Join(repo, "zz_release_probe.go"), "package cidroute\n\n// ReleaseProbe is the release tool test's.\nfunc ReleaseProbe(a, b int) int { return a + b }\n\n// ReleaseAdded is new.\nfunc ReleaseAdded() {}\n")
	_, reports, err := checkAPI(repo, mods)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if !printAPI(&out, v, reports) {
		t.Fatalf("apicheck passed a changed signature:\n%s", out.String())
	}
	t.Log(out.String())
	var broken []string
	for _, r := range reports {
		broken = append(broken, r.incompatible...)
		if r.mod.Dir == "." && len(r.compatible) != 1 {
			t.Errorf("compatible changes %v, want ReleaseAdded's", r.compatible)
		}
	}
	if len(broken) != 1 || !strings.Contains(broken[0], "ReleaseProbe") {
		t.Fatalf("incompatible changes %v, want ReleaseProbe's", broken)
	}
	writeFile(t, filepath.Join(repo, apiDir, exceptFile), exceptHeader+broken[0]+"\n")
	_, reports, err = checkAPI(repo, mods)
	if err != nil {
		t.Fatal(err)
	}
	if printAPI(&out, v, reports) {
		t.Fatalf("apicheck failed on a change api/except.txt lists:\n%s", out.String())
	}
	if err := checkAPIForRelease(repo, mods, "v0.99.1", &out); err == nil {
		t.Error("a patch release over an incompatible change was accepted")
	}
	if err := checkAPIForRelease(repo, mods, "v0.100.0", &out); err != nil {
		t.Errorf("a minor release over a listed incompatible change: %v", err)
	}
	if err := checkVersion(repo, mods, v); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("releasing %s twice: %v", v, err)
	}
	if err := checkVersion(repo, mods, "v0.98.0"); err == nil {
		t.Error("a version below the last release was accepted")
	}
}

func inDir(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// copyTree copies the files git tracks or would track (not ignored).
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	list, err := exec.Command("git", "-C", from, "ls-files", "-co", "--exclude-standard", "-z").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src := filepath.Join(from, name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(to, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := run(dir, os.Environ(), "git", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
