package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// run runs name with args in dir and returns its standard output; on
// failure the error carries the command and its standard error.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %s %s: %v\n%s", dir, name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// goEnv is the environment with the workspace off (every module is
// handled alone, as a user's go command sees it), the local toolchain and
// the overrides in set (KEY=value).
func goEnv(set []string) []string {
	override := map[string]bool{"GOWORK": true, "GOTOOLCHAIN": true}
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		override[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !override[k] {
			env = append(env, kv)
		}
	}
	env = append(env, "GOWORK=off", "GOTOOLCHAIN=local")
	return append(env, set...)
}

// fetchEnv is the environment in which the go command fetches this
// repository's modules from the local clone at repo, as a user's go
// command fetches them from GitHub once the tags are pushed: by tag, with
// nested modules' path prefixes, through git. Everything else comes from
// the user's module cache first (a file proxy), then from their GOPROXY.
// modcache is a module cache of the tool's own: it is cleared of this
// repository's modules first, so that no earlier run's tag of the same
// name is taken, and the user's own cache never sees a local tag.
func fetchEnv(repo, modcache string) ([]string, error) {
	abs, err := filepath.Abs(repo)
	if err != nil {
		return nil, err
	}
	userCache, err := run(".", goEnv(nil), "go", "env", "GOMODCACHE", "GOPROXY")
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(userCache), "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("go env GOMODCACHE GOPROXY: %q", userCache)
	}
	proxy := lines[1]
	if lines[0] != "" && lines[0] != modcache {
		proxy = "file://" + filepath.ToSlash(filepath.Join(lines[0], "cache", "download")) + "," + proxy
	}
	for _, p := range []string{
		filepath.Join(modcache, "github.com", "cidroute"),
		filepath.Join(modcache, "cache", "download", "github.com", "cidroute"),
		filepath.Join(modcache, "cache", "vcs"),
	} {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	return goEnv([]string{
		"GOMODCACHE=" + modcache,
		"GOFLAGS=-mod=mod -modcacherw",
		// The go command indexes a module cache's packages once per
		// module@version in GOCACHE, trusting them never to change; a
		// tag made again (a rerun, the tests' v0.99.0) would be read
		// through the old index: imports of the earlier tag's files.
		"GODEBUG=goindex=0",
		"GOPROXY=" + proxy,
		"GOPRIVATE=" + rootPath,
		"GONOSUMDB=" + rootPath,
		"GIT_CONFIG_COUNT=1",
		"GIT_CONFIG_KEY_0=url." + abs + ".insteadOf",
		"GIT_CONFIG_VALUE_0=https://" + rootPath,
		"GIT_TERMINAL_PROMPT=0",
	}), nil
}

// defaultModcache is the tool's own module cache (see fetchEnv).
func defaultModcache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "cidroute-release", "gomodcache")
}
