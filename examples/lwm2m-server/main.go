// Command lwm2m-server is the fleet simulator's LwM2M-shaped registration
// server (package examples/internal/lwm2m) as a process of its own, to
// run behind cidproxy: CoAP over DTLS 1.2 with ordinal-first connection
// IDs, PSK, PROXY protocol v2 from trusted proxies. Its counters are
// served as JSON on -http (GET /stats).
//
//	lwm2m-server -ordinal 0 -listen 127.0.0.1:5700 -psk 6369647230757465 -http 127.0.0.1:9700
//
// SIGTERM drains it (new sessions refused, the open ones closed with
// close_notify after -drain-timeout, so that devices handshake again at
// once elsewhere); a second signal cuts them.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cidroute/cidroute/examples/internal/backendcfg"
	"github.com/cidroute/cidroute/examples/internal/lwm2m"
	"github.com/cidroute/cidroute/shutdown"
)

func main() {
	drain, kill := shutdown.Signals()
	os.Exit(run(drain, kill, os.Args[1:], os.Stderr, nil))
}

// run is main without the process; started, when set, gets the server.
func run(drain, kill context.Context, args []string, stderr io.Writer, started func(*lwm2m.Server, net.Addr)) int {
	fs := flag.NewFlagSet("lwm2m-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common backendcfg.Flags
	common.Register(fs, "0.0.0.0:5684", "lwm2m-2", "ClientHellos")
	cidLen := fs.Int("cid-len", 8, "connection ID length; the proxies' cid_length must match")
	psk := fs.String("psk", "", "pre-shared key in `hex`, for every identity (required)")
	httpAddr := fs.String("http", "", "`address` serving the counters as JSON at /stats (empty: none)")
	routeIdle := fs.Duration("route-idle", 0, "PPv2 route lifetime without traffic (0: the adapter's default, 5m); a queue-mode device's first record on waking makes a new one")
	ack := fs.Duration("ack-timeout", 2*time.Second, "CoAP ACK_TIMEOUT of the server's requests (observe)")
	retx := fs.Int("max-retransmit", 4, "CoAP MAX_RETRANSMIT")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set, err := common.Parse(fs, stderr)
	var key []byte
	if err == nil {
		key, err = hex.DecodeString(*psk)
		if err == nil && len(key) == 0 {
			err = errors.New("-psk: required")
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "lwm2m-server: %v\n", err)
		return 2
	}
	srv, err := lwm2m.Listen(lwm2m.ServerConfig{Listen: set.Listen, Ordinal: set.Ordinal, CIDLen: *cidLen, PSK: key,
		TrustedProxies: set.TrustedProxies, Direct: set.Direct, RouteIdle: *routeIdle, ACKTimeout: *ack, MaxRetransmit: *retx, Logger: set.Log})
	if err != nil {
		set.Log.Error("cannot start", "err", err)
		return 1
	}
	var httpLn net.Listener
	if *httpAddr != "" {
		httpLn, err = net.Listen("tcp", *httpAddr)
		if err != nil {
			srv.Close()
			set.Log.Error("cannot listen for HTTP", "err", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("GET /stats", srv)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(httpLn)
		defer hs.Close()
	}
	set.Log.Info("lwm2m-server started", "ordinal", set.Ordinal, "listen", srv.Addr(), "http", *httpAddr, "cid_len", *cidLen)
	if started != nil {
		var a net.Addr
		if httpLn != nil {
			a = httpLn.Addr()
		}
		started(srv, a)
	}
	shutdown.Drain(drain, kill, srv, set.Shutdown("lwm2m-server", "sessions"))
	st := srv.Stats()
	set.Log.Info("lwm2m-server stopped", "registrations", st.Registrations, "updates", st.Updates, "notifications", st.Notifications, "cut", st.Cut)
	return 0
}
