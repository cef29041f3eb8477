package proxyconfig

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// keyRow is a table row of the reference whose first cell is one key.
var keyRow = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|")

// TestEveryKeyDocumented: every key the decoder accepts has a row in the
// configuration reference and a "what to write" for its errors, and the
// reference documents no key the decoder refuses.
func TestEveryKeyDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	known := map[string]bool{}
	for parent, typ := range fileTypes {
		if parent == "[]" { // a backends_file: the keys of services[].backends[]
			continue
		}
		for _, name := range knownKeys(join(parent, "x")) {
			key := join(parent, name)
			known[name] = true
			require.Contains(t, wants, key, "wants lacks %s", key)
			require.Contains(t, string(doc), "| `"+name+"` |", "docs/configuration.md has no row for %s", key)
		}
		require.Equal(t, reflect.Struct, typ.Kind())
	}
	for _, m := range keyRow.FindAllStringSubmatch(string(doc), -1) {
		require.True(t, known[m[1]], "docs/configuration.md documents %q, which the decoder does not know", m[1])
	}
}

// TestReferenceExamples: the configurations the reference and cidproxy's
// README show are valid.
func TestReferenceExamples(t *testing.T) {
	n := 0
	for _, path := range []string{"../docs/configuration.md", "../examples/cidproxy/README.md"} {
		doc, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range jsonBlock.FindAllStringSubmatch(string(doc), -1) {
			if !strings.Contains(m[1], `"services"`) {
				continue // the key file's
			}
			_, err := Parse(strings.NewReader(m[1]))
			require.NoError(t, err, "%s:\n%s", path, m[1])
			n++
		}
	}
	require.Equal(t, 2, n)
}

var jsonBlock = regexp.MustCompile("(?s)```json\n(.*?)```")
