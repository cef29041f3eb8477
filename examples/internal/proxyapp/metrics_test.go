package proxyapp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
)

// Issue 35: the metrics listener holds at most its cap of connections,
// and closes a keep-alive connection left idle, so that idle clients
// cannot take the descriptors the probes and sessions need (600 of them
// made the health probes fail with "too many open files"). Before the
// fix every connection was served and none was ever closed. The
// profiler is not on it: only on pprof_listen's listener, when set.
func TestMetricsListenerBounded(t *testing.T) {
	defer func(d time.Duration) { adminIdleTimeout = d }(adminIdleTimeout)
	adminIdleTimeout = 500 * time.Millisecond
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"metrics_listen": %q, "pprof_listen": %q, "services": [
		{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1,
		 "backends": [{"ordinal": 0, "address": "127.0.0.1:9"}]}]}`, metrics, pprofAddr, freePort(t, "udp"))))
	require.NoError(t, err)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, slog.LevelInfo, errWindow), Options{}) }()
	defer func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	}()
	waitFor(t, 5*time.Second, "serving", func() bool { c, _ := getBody(t, "http://"+metrics+"/livez"); return c == 200 })

	// Every connection sends one request and keeps the connection open.
	max := metricsMaxConns()
	n := max + 20
	var answered atomic.Int64
	closed := make(chan time.Time, n)
	var wg sync.WaitGroup
	for range n {
		c, err := net.Dial("tcp", metrics)
		require.NoError(t, err)
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			fmt.Fprintf(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			r := bufio.NewReader(c)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return
			}
			resp.Body.Close()
			answered.Add(1)
			if _, err := r.ReadByte(); errors.Is(err, io.EOF) { // the server closes it
				closed <- time.Now()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // below the idle timeout
	assert.LessOrEqual(t, answered.Load(), int64(max), "at most the cap served at once (cap %d)", max)
	t0 := time.Now()
	wg.Wait()
	assert.Equal(t, int64(n), answered.Load(), "the rest served as idle ones close")
	require.Len(t, closed, n, "every idle keep-alive connection closed by the server")
	first := <-closed
	assert.Less(t, first.Sub(t0), 5*time.Second)

	code, _ := getBody(t, "http://"+metrics+"/debug/pprof/")
	assert.Equal(t, http.StatusNotFound, code, "no profiler on the metrics listener")
	code, body := getBody(t, "http://"+pprofAddr+"/debug/pprof/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "goroutine")
	code, _ = getBody(t, "http://"+pprofAddr+"/metrics")
	assert.Equal(t, http.StatusNotFound, code, "and nothing else on the profiler's")
}

// The cap fits the descriptors the pipeline leaves to the rest of the
// process (the fd budget: transparent session tables are sized to leave
// cidroute.ReservedFDs), a quarter of them at most.
func TestMetricsMaxConnsFitsTheReserve(t *testing.T) {
	max := metricsMaxConns()
	assert.GreaterOrEqual(t, max, 4)
	assert.LessOrEqual(t, max, 64)
	if n, ok := reservedFDs(); ok {
		assert.LessOrEqual(t, max+pprofMaxConns+2, n/2, "the admin listeners' connections and listeners, reserve %d", n)
	}
}

func reservedFDs() (int, bool) { return cidroute.ReservedFDs() }

// In a restart handover the predecessor keeps pprof_listen's port until
// it exits (the profiler's listener is not handed over): the successor
// waits for it instead of failing; a first start with the port busy
// fails.
func TestPprofWaitsForItsPort(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := busy.Addr().String()
	log := slog.New(slog.DiscardHandler)
	_, err = startPprof(addr, false, log)
	require.Error(t, err, "no handover: a busy port fails the start")
	m, err := startPprof(addr, true, log)
	require.NoError(t, err)
	defer m.stop()
	busy.Close() // the predecessor exits
	waitFor(t, 5*time.Second, "the profiler on the freed port", func() bool {
		code, _ := getBody(t, "http://"+addr+"/debug/pprof/cmdline")
		return code == 200
	})
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	m2, err := startPprof(held.Addr().String(), true, log)
	require.NoError(t, err)
	stopped := make(chan struct{})
	go func() { m2.stop(); close(stopped) }()
	select {
	case <-stopped: // stop ends the wait
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not end the wait for the port")
	}
}
