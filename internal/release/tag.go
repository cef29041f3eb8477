package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

type tagOptions struct {
	version  string
	modcache string
	out      io.Writer
}

// result is what a release made: the tags in the order they were made
// (every module's after those of the modules it requires) and the
// commits on top of the starting one.
type result struct {
	base    string   // the commit the release started from
	tags    []string // in dependency order
	commits []string
}

// checkVersion refuses what cannot be a release of these modules: not
// canonical semver, a major version that would need a /vN module path, a
// tag already there, a version not above a module's last one, a version
// that CHANGELOG.md does not name.
func checkVersion(repo string, mods []*module, v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH (optionally -prerelease)", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("version %s: major %s needs /%s module paths, which these modules do not have", v, m, m)
	}
	out, err := run(repo, os.Environ(), "git", "tag", "-l")
	if err != nil {
		return err
	}
	tags := strings.Fields(out)
	for _, m := range released(mods) {
		name := m.tagName(v)
		if slices.Contains(tags, name) {
			return fmt.Errorf("tag %s exists", name)
		}
		if last := lastVersion(tags, m); last != "" && semver.Compare(v, last) <= 0 {
			return fmt.Errorf("version %s is not above %s's last release %s", v, m.Path, last)
		}
	}
	log, err := os.ReadFile(filepath.Join(repo, "CHANGELOG.md"))
	if err != nil {
		return err
	}
	heading := regexp.MustCompile(`(?m)^## \[v?` + regexp.QuoteMeta(strings.TrimPrefix(v, "v")) + `\]`)
	if !heading.Match(log) {
		return fmt.Errorf("CHANGELOG.md has no \"## [%s] - DATE\" section: write the release's entry first", strings.TrimPrefix(v, "v"))
	}
	return nil
}

// lastVersion is the highest release tag of m among tags ("" if none).
func lastVersion(tags []string, m *module) string {
	prefix := ""
	if m.Dir != "." {
		prefix = m.Dir + "/"
	}
	last := ""
	for _, t := range tags {
		v, ok := strings.CutPrefix(t, prefix)
		if !ok || !semver.IsValid(v) || strings.Contains(v, "/") {
			continue
		}
		if last == "" || semver.Compare(v, last) > 0 {
			last = v
		}
	}
	return last
}

// tagRelease releases every released module of repo at opts.version:
//
//  1. the modules that require no other module of the repository are
//     tagged at the current commit;
//  2. level by level, the next modules' go.mod files require the
//     version just tagged of every repository module and lose their
//     replace lines for them; go mod tidy fills go.sum from the tags
//     (through fetchEnv, the local clone); one commit per level, whose
//     modules are tagged there;
//  3. a last commit restores the replace lines for development (the
//     requirements stay at the new version), moves the unreleased
//     modules' requirements on the repository to the new version too, and
//     writes the API baseline that apicheck compares against.
//
// Every tagged go.mod is thus what a user's go command reads: versions
// that exist, no replace lines, go.sum complete. The repository must be
// clean; nothing is pushed.
func tagRelease(repo string, opts tagOptions) (*result, error) {
	out := opts.out
	v := opts.version
	if st, err := run(repo, os.Environ(), "git", "status", "--porcelain"); err != nil {
		return nil, err
	} else if st != "" {
		return nil, fmt.Errorf("%s: uncommitted changes:\n%s", repo, st)
	}
	mods, err := discover(repo)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(repo, mods, v); err != nil {
		return nil, err
	}
	if err := checkAPIForRelease(repo, mods, v, out); err != nil {
		return nil, err
	}
	env, err := fetchEnv(repo, opts.modcache)
	if err != nil {
		return nil, err
	}
	base, err := run(repo, os.Environ(), "git", "rev-parse", "HEAD")
	if err != nil {
		return nil, err
	}
	res := &result{base: strings.TrimSpace(base)}
	rel := released(mods)
	// The development go.mod and go.sum, to come back to with only the
	// requirements' versions changed (comments and layout kept).
	orig := map[*module][2][]byte{}
	for _, m := range rel {
		if len(m.Replaces) == 0 {
			continue
		}
		mod, err := os.ReadFile(filepath.Join(repo, m.Dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		sum, err := os.ReadFile(filepath.Join(repo, m.Dir, "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		orig[m] = [2][]byte{mod, sum}
	}
	maxLevel := 0
	for _, m := range rel {
		maxLevel = max(maxLevel, m.Level)
	}
	for level := 0; level <= maxLevel; level++ {
		var here []*module
		for _, m := range rel {
			if m.Level == level {
				here = append(here, m)
			}
		}
		if len(here) == 0 {
			continue
		}
		if level > 0 {
			var files, names []string
			for _, m := range here {
				dir := filepath.Join(repo, m.Dir)
				args := []string{"mod", "edit"}
				for _, p := range sortedKeys(m.Requires) {
					args = append(args, "-require="+p+"@"+v)
				}
				for _, p := range sortedKeys(m.Replaces) {
					args = append(args, "-dropreplace="+p)
				}
				if _, err := run(dir, env, "go", args...); err != nil {
					return res, err
				}
				if _, err := run(dir, env, "go", "mod", "tidy"); err != nil {
					return res, err
				}
				files = append(files, filepath.Join(m.Dir, "go.mod"), filepath.Join(m.Dir, "go.sum"))
				names = append(names, m.Dir)
			}
			msg := fmt.Sprintf("release %s: %s require %s of the repository's modules, without replace lines", v, strings.Join(names, ", "), v)
			c, err := commit(repo, msg, files)
			if err != nil {
				return res, err
			}
			res.commits = append(res.commits, c)
		}
		for _, m := range here {
			name := m.tagName(v)
			if _, err := run(repo, os.Environ(), "git", "tag", "-a", "-m", m.Path+" "+v, name); err != nil {
				return res, err
			}
			res.tags = append(res.tags, name)
			fmt.Fprintf(out, "tagged %s (level %d)\n", name, level)
		}
	}

	// Back to development: the replace lines as they were, the new
	// requirements kept; the API baseline of this release.
	var files []string
	for _, m := range rel {
		saved, ok := orig[m]
		if !ok {
			continue
		}
		dir := filepath.Join(repo, m.Dir)
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), saved[0], 0o644); err != nil {
			return res, err
		}
		if err := os.WriteFile(filepath.Join(dir, "go.sum"), saved[1], 0o644); err != nil {
			return res, err
		}
		args := []string{"mod", "edit"}
		for _, p := range sortedKeys(m.Requires) {
			args = append(args, "-require="+p+"@"+v)
		}
		if _, err := run(dir, env, "go", args...); err != nil {
			return res, err
		}
		if _, err := run(dir, env, "go", "mod", "tidy"); err != nil {
			return res, err
		}
		files = append(files, filepath.Join(m.Dir, "go.mod"), filepath.Join(m.Dir, "go.sum"))
	}
	// The modules that are not released (tests and tools outside the
	// workspace) keep building against the repository through their
	// replace lines; their requirements follow the release, as the
	// released modules' now require v, or their go.mod would no longer
	// be tidy.
	isRel := map[*module]bool{}
	for _, m := range rel {
		isRel[m] = true
	}
	for _, m := range mods {
		if isRel[m] || len(m.Requires) == 0 {
			continue
		}
		args := []string{"mod", "edit"}
		for _, p := range sortedKeys(m.Requires) {
			args = append(args, "-require="+p+"@"+v)
		}
		if _, err := run(filepath.Join(repo, m.Dir), env, "go", args...); err != nil {
			return res, err
		}
		files = append(files, filepath.Join(m.Dir, "go.mod"))
	}
	written, err := writeBaseline(repo, rel, v)
	if err != nil {
		return res, err
	}
	files = append(files, written...)
	c, err := commit(repo, fmt.Sprintf("release %s: replace lines back for development; api/ holds %s's API for apicheck", v, v), files)
	if err != nil {
		return res, err
	}
	res.commits = append(res.commits, c)
	return res, nil
}

func commit(repo, msg string, files []string) (string, error) {
	args := append([]string{"add", "--"}, files...)
	if _, err := run(repo, os.Environ(), "git", args...); err != nil {
		return "", err
	}
	if _, err := run(repo, os.Environ(), "git", "commit", "-q", "-m", msg); err != nil {
		return "", err
	}
	c, err := run(repo, os.Environ(), "git", "rev-parse", "HEAD")
	return strings.TrimSpace(c), err
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
