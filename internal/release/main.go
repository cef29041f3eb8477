// Command release cuts a release of every module of the repository and
// checks its API against the last one. Run it through scripts/release.sh;
// docs/releasing.md is the procedure.
//
//	release [-repo DIR] modules
//	release [-repo DIR] tag -version vX.Y.Z [-dry-run] [-keep] [-modcache DIR]
//	release [-repo DIR] verify -version vX.Y.Z [-go 1.24] [-modules DIR,...]
//	release [-repo DIR] apicheck
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if err := cli(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func cli(args []string, out io.Writer) error {
	top := flag.NewFlagSet("release", flag.ContinueOnError)
	repo := top.String("repo", ".", "the repository's root")
	if err := top.Parse(args); err != nil {
		return err
	}
	if top.NArg() == 0 {
		return fmt.Errorf("want a command: modules, tag, verify or apicheck")
	}
	root, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	cmd, rest := top.Arg(0), top.Args()[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	version := fs.String("version", "", "the release's version, vX.Y.Z")
	modcache := fs.String("modcache", defaultModcache(), "the tool's own module cache")
	switch cmd {
	case "modules":
		if err := fs.Parse(rest); err != nil {
			return err
		}
		mods, err := discover(root)
		if err != nil {
			return err
		}
		for _, m := range mods {
			what := "released"
			if !m.Released {
				what = "not released: " + unreleased[m.Dir]
			}
			fmt.Fprintf(out, "level %d  %-30s go %-7s %s\n", m.Level, m.Dir, m.Go, what)
		}
		return nil

	case "tag":
		dry := fs.Bool("dry-run", false, "release a clone in a temporary directory, verify it, print what it did; the repository is untouched")
		keep := fs.Bool("keep", false, "with -dry-run: keep the clone")
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if !*dry {
			res, err := tagRelease(root, tagOptions{version: *version, modcache: *modcache, out: out})
			if err != nil {
				return err
			}
			printResult(out, root, res, *version, false)
			return nil
		}
		tmp, err := os.MkdirTemp("", "cidroute-release-")
		if err != nil {
			return err
		}
		clone := filepath.Join(tmp, "cidroute")
		if !*keep {
			defer os.RemoveAll(tmp)
		}
		if _, err := run(tmp, os.Environ(), "git", "clone", "-q", root, clone); err != nil {
			return err
		}
		fmt.Fprintf(out, "dry run in %s (a clone of %s)\n", clone, root)
		res, err := tagRelease(clone, tagOptions{version: *version, modcache: *modcache, out: out})
		if err != nil {
			return err
		}
		printResult(out, clone, res, *version, true)
		fmt.Fprintln(out, "\nverifying the clone's tags as a user's go command:")
		if err := verifyRelease(clone, verifyOptions{version: *version, userGo: "1.24", modcache: *modcache, out: out}); err != nil {
			return err
		}
		fmt.Fprintf(out, "\ndry run passed; %s is untouched. Run without -dry-run to do it there.\n", root)
		return nil

	case "verify":
		userGo := fs.String("go", "1.24", "the go line of the user's module")
		only := fs.String("modules", "", "comma-separated module directories (default: every released module)")
		if err := fs.Parse(rest); err != nil {
			return err
		}
		var dirs []string
		if *only != "" {
			dirs = strings.Split(*only, ",")
		}
		return verifyRelease(root, verifyOptions{version: *version, userGo: *userGo, modules: dirs, modcache: *modcache, out: out})

	case "apicheck":
		if err := fs.Parse(rest); err != nil {
			return err
		}
		mods, err := discover(root)
		if err != nil {
			return err
		}
		base, reports, err := checkAPI(root, mods)
		if err != nil {
			return err
		}
		if printAPI(out, base, reports) {
			return fmt.Errorf("apicheck failed")
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func printResult(out io.Writer, repo string, res *result, v string, dry bool) {
	fmt.Fprintf(out, "\nrelease %s from %s:\n", v, res.base[:12])
	log, _ := run(repo, os.Environ(), "git", "log", "--stat", "--format=%h %s", res.base+"..HEAD")
	fmt.Fprint(out, log)
	fmt.Fprintf(out, "tags, in dependency order: %s\n", strings.Join(res.tags, " "))
	if dry {
		return
	}
	branch, _ := run(repo, os.Environ(), "git", "rev-parse", "--abbrev-ref", "HEAD")
	fmt.Fprintf(out, "\nnothing is pushed. To publish, in this order:\n  git push origin %s\n  git push origin %s\n", strings.TrimSpace(branch), strings.Join(res.tags, " "))
}
