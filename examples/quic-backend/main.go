// Command quic-backend is a quic-go echo server meant to run behind
// cidproxy: it reads PROXY protocol v2 from trusted proxies and issues
// QUIC-LB connection IDs that carry its ordinal (the Initial SCID and
// every NEW_CONNECTION_ID), so that every proxy replica routes a
// connection's packets to it, including after the client migrates. Every
// stream echoes what it reads.
//
//	quic-backend -ordinal 0 -listen 127.0.0.1:4434 -alpn cidroute-echo
//	quic-backend                       # ordinal from HOSTNAME (qs-2 → 2)
//
// It uses -cert/-key or a self-signed certificate generated at start. It
// logs the claimed client address and the measured proxy address apart,
// once per connection event (started, moved, ended), never per packet.
//
// SIGTERM (or SIGINT) drains it, as a StatefulSet's rolling restart asks:
// new connections are refused at once, open ones are served until they end
// or -drain-timeout (110 s, below the manifests' 120 s grace period)
// passes, and those left are closed with CONNECTION_CLOSE and counted. A
// second signal cuts them at once.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cidroute/cidroute/cidkeys"
	"github.com/cidroute/cidroute/examples/internal/backendcfg"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/shutdown"
)

func main() {
	drain, kill := shutdown.Signals()
	os.Exit(run(drain, kill, os.Args[1:], os.Stderr, nil))
}

// run is main without the process: it serves until drain is done, then
// drains for -drain-timeout or until kill is done. started, when set, is
// called with the running server.
func run(drain, kill context.Context, args []string, stderr io.Writer, started func(*quicecho.Server)) int {
	fs := flag.NewFlagSet("quic-backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common backendcfg.Flags
	common.Register(fs, "0.0.0.0:4433", "qs-2", "Initials")
	cidLen := fs.Int("cid-len", 12, "QUIC-LB connection ID length (6-20); the proxies' cid_len must match")
	var keyFlags backendcfg.CIDKeyFlags
	keyFlags.Register(fs)
	alpn := fs.String("alpn", quicecho.DefaultALPN, "comma-separated ALPN `protocols` offered")
	certFile := fs.String("cert", "", "certificate PEM `file` (default: self-signed at start)")
	keyFile := fs.String("key", "", "private key PEM `file` for -cert")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set, err := common.Parse(fs, stderr)
	log := set.Log
	cfg := quicecho.Config{Listen: set.Listen, Ordinal: set.Ordinal, Codec: quic.LB{Length: *cidLen},
		TrustedProxies: set.TrustedProxies, Direct: set.Direct, Logger: log}
	for p := range strings.SplitSeq(*alpn, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.ALPN = append(cfg.ALPN, p)
		}
	}
	if err == nil && len(cfg.ALPN) == 0 {
		err = fmt.Errorf("-alpn: no protocol")
	}
	var keys *cidkeys.File
	if err == nil {
		keys, err = keyFlags.Open(drain, *cidLen, backendcfg.IsSet(fs, "cid-len"))
	}
	codec := "QUIC-LB plaintext"
	if keys != nil {
		cfg.Codec, codec, *cidLen = keys.Codec(), keys.Codec().String(), keys.Codec().Len()
	}
	cert := "self-signed"
	if err == nil && (*certFile != "" || *keyFile != "") {
		var c tls.Certificate
		c, err = tls.LoadX509KeyPair(*certFile, *keyFile)
		cfg.Certificate, cert = &c, *certFile
	}
	if err != nil {
		fmt.Fprintf(stderr, "quic-backend: %v\n", err)
		return 2
	}
	srv, err := quicecho.Listen(cfg)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	if keys != nil {
		keys.Logger = log
		backendcfg.Watch(kill, keys)
	}
	log.Info("quic-backend started", "ordinal", cfg.Ordinal, "ordinal_from", set.OrdinalFrom, "listen", srv.Addr(),
		"alpn", strings.Join(cfg.ALPN, ","), "certificate", cert, "cid_len", *cidLen, "cid_codec", codec, "trusted_proxies", common.Trusted, "direct", common.Direct, "drain_timeout", set.DrainTimeout)
	if started != nil {
		started(srv)
	}
	shutdown.Drain(drain, kill, srv, set.Shutdown("quic-backend", "connections"))
	st := srv.Stats()
	log.Info("quic-backend stopped", "connections", len(srv.Connections()),
		"proxied", st.AcceptedProxied, "direct", st.AcceptedDirect, "dropped", st.Dropped(), "dropped_untrusted", st.DroppedUntrusted)
	return 0
}
