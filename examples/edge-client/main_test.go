package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// The program against a pion backend behind two cidroute edges on
// loopback: the edge it uses is stopped mid-run, the session goes on
// through the other, and the backend sees one session.
func TestEdgeClientSurvivesItsEdge(t *testing.T) {
	psk := []byte("secret")
	srv, err := dtlsecho.Listen(dtlsecho.Config{PSK: psk, Prefix: "0|", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Direct: backend.DirectNoHandshake})
	require.NoError(t, err)
	defer srv.Close()
	bs := []registry.Backend{{Ordinal: 0, Addr: srv.Addr()}}
	var pipes []*cidroute.Pipeline
	var edges []string
	for range 2 {
		px := cidroutetest.Start(t, 1, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}}, bs...)
		p, a := px.Pipeline, px.Addr
		pipes = append(pipes, p)
		edges = append(edges, a.String())
	}

	var stdout, stderr testtool.SyncBuffer
	state := t.TempDir() + "/edges.json"
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"-edges", strings.Join(edges, ","), "-psk", hex.EncodeToString(psk),
			"-every", "20ms", "-count", "60", "-wait", "500ms", "-silence", "200ms", "-state", state}, &stdout, &stderr)
	}()
	via := regexp.MustCompile(`hello 10: "0\|hello 10" via (\S+)`)
	var used string
	require.Eventually(t, func() bool {
		m := via.FindStringSubmatch(stdout.String())
		if m != nil {
			used = m[1]
		}
		return m != nil
	}, 20*time.Second, 10*time.Millisecond, "stdout: %s\nstderr: %s", &stdout, &stderr)
	for i, e := range edges {
		if e == used {
			require.NoError(t, pipes[i].Close())
		}
	}
	select {
	case code := <-done:
		assert.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("edge-client did not finish")
	}
	out, logs := stdout.String(), stderr.String()
	t.Log(logs)
	assert.Contains(t, logs, `msg="edge switch" from=`+used)
	assert.Contains(t, logs, "reason=unreachable")
	assert.Contains(t, out, `hello 60: "0|hello 60" via `)
	assert.NotContains(t, out, "hello 60: \"0|hello 60\" via "+used)
	_, dm := srv.Stats()
	assert.Equal(t, uint64(3), dm.NewSessions, "two probes and the session: no handshake for the switch")
	assert.FileExists(t, state)

	// Bad flags.
	for _, args := range [][]string{{}, {"-psk", "zz", "-edges", edges[0]}, {"-psk", "00", "-name", "x:1", "-edges", edges[0]}} {
		assert.Equal(t, 2, run(context.Background(), args, &stdout, &stderr), fmt.Sprint(args))
	}
}
