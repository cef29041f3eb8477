package main

import (
	"context"
	"strings"
	"testing"
)

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		rc   int
		want string
	}{
		{[]string{"-connect", "nowhere"}, 2, "-connect"},
		{[]string{"-rss-pids", "x"}, 2, "-rss-pids"},
		{[]string{"-devices", "5", "-disrupt", "sideways"}, 1, `unknown disruption "sideways"`},
		{[]string{"-devices", "5", "-update-fraction", "1.5"}, 1, "update fraction"},
		{[]string{"-devices", "5", "-connect", "127.0.0.1:9", "-disrupt", "proxy-kill"}, 1, "disruptions need"},
	} {
		var out, errw strings.Builder
		if rc := run(context.Background(), c.args, &out, &errw); rc != c.rc || !strings.Contains(errw.String(), c.want) {
			t.Errorf("%q: status %d, stderr %q; want %d and %q", c.args, rc, errw.String(), c.rc, c.want)
		}
	}
}
