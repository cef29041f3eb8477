// Package docs holds the test that keeps the Go snippets of the READMEs
// and of docs/ compiling.
package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A snippet is one ```go block of a README or of a page of docs/: a Go
// file without its package clause (imports, then declarations), so that
// what a reader copies is what compiles.
type snippet struct {
	file string // README path, relative to the repository
	line int    // line of the opening fence
	src  string
}

// TestREADMESnippets compiles every ```go block of every README*.md of
// the repository and of every page under docs/, all as files of one
// package (one build: a cold cache compiles each dependency once), in a
// scratch module that a workspace of all the repository's modules lets
// import any of them. Snippets therefore declare distinct names.
func TestREADMESnippets(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the adapters and their dependencies")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	snips := readmeSnippets(t, root)
	if len(snips) < 6 {
		t.Fatalf("found only %d snippets: the walk is broken", len(snips))
	}
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module snippets\n\ngo 1.26.0\n")
	work := "go 1.26.0\n\nuse (\n\t.\n"
	for _, m := range workspaceModules(t, root) {
		work += "\t" + m + "\n"
	}
	write("go.work", work+")\n")
	if sum, err := os.ReadFile(filepath.Join(root, "go.work.sum")); err == nil {
		write("go.work.sum", string(sum))
	}
	var compiled int
	where := map[string]snippet{}
	for i, s := range snips {
		name := fmt.Sprintf("s%02d.go", i)
		write(name, "package s\n\n"+s.src)
		where[name] = s
		compiled++
	}
	cmd := exec.Command("go", "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("README snippets do not compile:\n%s", mapPositions(string(out), where))
	}
	t.Logf("%d snippets compiled", compiled)
}

// readmeSnippets returns the ```go blocks of every README*.md under root
// and of every page under root/docs.
func readmeSnippets(t *testing.T, root string) []snippet {
	var out []snippet
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		inDocs := strings.HasPrefix(filepath.ToSlash(rel), "docs/")
		if !strings.HasSuffix(d.Name(), ".md") || !inDocs && !strings.HasPrefix(d.Name(), "README") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var cur *snippet
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case cur == nil && strings.TrimSpace(line) == "```go":
				cur = &snippet{file: filepath.ToSlash(rel), line: n}
			case cur != nil && strings.TrimSpace(line) == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.src += line + "\n"
			}
		}
		if cur != nil {
			t.Errorf("%s:%d: unterminated ```go block", rel, cur.line)
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// workspaceModules returns the absolute directories of the modules the
// repository's go.work uses.
func workspaceModules(t *testing.T, root string) []string {
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "use (":
			in = true
		case in && line == ")":
			in = false
		case in && line != "":
			mods = append(mods, filepath.Join(root, line))
		}
	}
	if len(mods) == 0 {
		t.Fatal("go.work lists no modules")
	}
	return mods
}

var position = regexp.MustCompile(`(?m)(?:\./)?(s\d\d\.go):(\d+)(:\d+)?`)

// mapPositions rewrites positions in the scratch files as README lines.
func mapPositions(out string, where map[string]snippet) string {
	return position.ReplaceAllStringFunc(out, func(m string) string {
		g := position.FindStringSubmatch(m)
		s, ok := where[g[1]]
		n, _ := strconv.Atoi(g[2])
		if !ok {
			return m
		}
		return fmt.Sprintf("%s:%d%s", s.file, s.line+n-2, g[3]) // "package s" and a blank line precede the block
	})
}
