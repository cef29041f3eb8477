package proxyconfig

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pprof_listen: Go's profiler on a listener of its own, off when absent;
// never metrics_listen's; a change needs new sockets, so a reload
// refuses it by name.
func TestPprofListen(t *testing.T) {
	parse := func(top string) (*Config, error) {
		return Parse(strings.NewReader(`{` + top + `"services": [{` + svc + `}]}`))
	}
	c, err := parse(``)
	require.NoError(t, err)
	assert.Empty(t, c.PprofListen, "off by default")
	c, err = parse(`"metrics_listen": "127.0.0.1:9184", "pprof_listen": "127.0.0.1:9185", `)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9185", c.PprofListen)
	assert.Contains(t, c.Summary(), "; pprof on 127.0.0.1:9185")
	_, err = parse(`"metrics_listen": "127.0.0.1:9184", "pprof_listen": "127.0.0.1:9184", `)
	assert.ErrorContains(t, err, "pprof_listen")
	_, err = parse(`"pprof_listen": "nope", `)
	assert.ErrorContains(t, err, "pprof_listen")

	next, err := parse(`"metrics_listen": "127.0.0.1:9184", "pprof_listen": "127.0.0.1:9186", `)
	require.NoError(t, err)
	d := c.Diff(next)
	require.Equal(t, []Refusal{{Key: "pprof_listen"}}, d.Refused)
	assert.Equal(t, "127.0.0.1:9185", d.Effective.PprofListen, "keeps the running one")
}
