package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cidroute/cidroute/examples/internal/lwm2m"
)

// TestStatsEndpoint starts the command, reads its counters as JSON, and
// drains it.
func TestStatsEndpoint(t *testing.T) {
	drain, stop := context.WithCancel(context.Background())
	defer stop()
	got := make(chan net.Addr, 1)
	done := make(chan int, 1)
	var errw strings.Builder
	go func() {
		done <- run(drain, context.Background(), []string{"-ordinal", "3", "-listen", "127.0.0.1:0", "-psk", "00ff",
			"-http", "127.0.0.1:0", "-drain-timeout", "1s", "-log-level", "error"}, &errw,
			func(_ *lwm2m.Server, a net.Addr) { got <- a })
	}()
	var addr net.Addr
	select {
	case addr = <-got:
	case rc := <-done:
		t.Fatalf("exited with %d: %s", rc, errw.String())
	case <-time.After(20 * time.Second):
		t.Fatal("did not start")
	}
	resp, err := http.Get("http://" + addr.String() + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st lwm2m.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Ordinal != 3 {
		t.Fatalf("stats %+v, %v: want ordinal 3", st, err)
	}
	stop()
	if rc := <-done; rc != 0 {
		t.Fatalf("status %d after a drain: %s", rc, errw.String())
	}
}

func TestNoPSK(t *testing.T) {
	var errw strings.Builder
	if rc := run(context.Background(), context.Background(), []string{"-ordinal", "0"}, &errw, nil); rc != 2 || !strings.Contains(errw.String(), "-psk") {
		t.Fatalf("status %d, %q: want 2 and a -psk error", rc, errw.String())
	}
}
