package proxyconfig

import (
	"regexp"
	"testing"
)

// The hand-written scanners replace three regular expressions; these are
// the expressions they replace, checked against them on tricky inputs.
var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	yamlRE  = regexp.MustCompile(`(?m)^[ \t\r\f]*(---[ \t\r\f]*$|- |[A-Za-z_][A-Za-z0-9_-]*[ \t]*:([ \t\r\n\f\v]|$))`)
	indexRE = regexp.MustCompile(`\[[0-9]+\]`)
)

var scanInputs = []string{
	"", "a", "-a", "_a", "0", "a.b-c_d", "dtls", "Ä", "a b", "a/b", "a:",
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	"{\"seed\": 1}", "seed: 1", "  seed:\n", "seed:", "seed:x", "- a", "-a", "---", "--- \n", "---x",
	"{\n  \"a\": 1\n}\nkey: v", "\"a\": 1", "1a: b", "_x-y : z", "x-:\t", "a\n\tb:\n", "a\r\nb:\r\n",
	"services[2].limits", "services[].limits", "a[x]", "a[12", "a[1][2]", "[3]", "a[]b[07].c", "]",
}

func TestScannersMatchTheirExpressions(t *testing.T) {
	for _, in := range scanInputs {
		if got, want := validName(in), nameRE.MatchString(in); got != want {
			t.Errorf("validName(%q) = %v, the expression says %v", in, got, want)
		}
		if got, want := looksLikeYAML([]byte(in)), yamlRE.MatchString(in); got != want {
			t.Errorf("looksLikeYAML(%q) = %v, the expression says %v", in, got, want)
		}
		if got, want := normalize(in), indexRE.ReplaceAllString(in, "[]"); got != want {
			t.Errorf("normalize(%q) = %q, the expression says %q", in, got, want)
		}
	}
}
