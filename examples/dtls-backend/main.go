// Command dtls-backend is a pion/dtls v3 echo server meant to run behind
// cidproxy: it reads PROXY protocol v2 from trusted proxies, issues
// ordinal-first connection IDs (RFC 9146) so that every proxy replica
// routes a session's records to it, and answers through the proxy that
// delivered each record. It echoes every application record back.
//
//	dtls-backend -ordinal 0 -listen 127.0.0.1:5685 -psk 6369647230757465
//	dtls-backend                       # ordinal from HOSTNAME (ds-2 → 2), certificate mode
//
// Without -psk it runs in certificate mode, with -cert/-key or with a
// self-signed certificate generated at start. It logs the claimed client
// address and the measured proxy address apart, once per session event
// (started, moved, ended), never per datagram.
//
// SIGTERM (or SIGINT) drains it, as a StatefulSet's rolling restart asks:
// new sessions are refused at once, open ones are served until they end or
// -drain-timeout (110 s, below the manifests' 120 s grace period) passes,
// and those left are closed with close_notify and counted. A second signal
// cuts them at once.
package main

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cidroute/cidroute/cidkeys"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/examples/internal/backendcfg"
	"github.com/cidroute/cidroute/shutdown"
)

func main() {
	drain, kill := shutdown.Signals()
	os.Exit(run(drain, kill, os.Args[1:], os.Stderr, nil))
}

// run is main without the process: it serves until drain is done, then
// drains for -drain-timeout or until kill is done. started, when set, is
// called with the running server.
func run(drain, kill context.Context, args []string, stderr io.Writer, started func(*dtlsecho.Server)) int {
	fs := flag.NewFlagSet("dtls-backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common backendcfg.Flags
	common.Register(fs, "0.0.0.0:5684", "ds-2", "ClientHellos")
	cidLen := fs.Int("cid-len", 8, "connection ID length; the proxies' cid_len must match")
	var keyFlags backendcfg.CIDKeyFlags
	keyFlags.Register(fs)
	psk := fs.String("psk", "", "pre-shared key in `hex`: PSK mode (TLS_PSK_WITH_AES_128_CCM_8, _GCM_SHA256); empty: certificate mode")
	hint := fs.String("psk-identity-hint", "cidroute", "PSK identity hint sent to clients")
	certFile := fs.String("cert", "", "certificate PEM `file` (certificate mode; default: self-signed at start)")
	keyFile := fs.String("key", "", "private key PEM `file` for -cert")
	prefix := fs.String("prefix", "", "`text` prepended to every echo")
	idle := fs.Duration("idle-timeout", 5*time.Minute, "end a session that received nothing for this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set, err := common.Parse(fs, stderr)
	log := set.Log
	cfg := dtlsecho.Config{Listen: set.Listen, Ordinal: set.Ordinal, CIDLen: *cidLen, PSKIdentityHint: *hint,
		TrustedProxies: set.TrustedProxies, Direct: set.Direct, Prefix: *prefix, IdleTimeout: *idle, Logger: log}
	var keys *cidkeys.File
	if err == nil {
		keys, err = keyFlags.Open(drain, *cidLen, backendcfg.IsSet(fs, "cid-len"))
	}
	codec := "ordinal-first"
	if keys != nil {
		cfg.Codec, cfg.CIDLen, codec = keys.Codec(), keys.Codec().Len(), keys.Codec().String()
	}
	if err == nil && *idle <= 0 {
		err = fmt.Errorf("-idle-timeout %v: must be positive", *idle)
	}
	if err == nil && *psk != "" {
		cfg.PSK, err = hex.DecodeString(*psk)
		if err == nil && len(cfg.PSK) == 0 {
			err = fmt.Errorf("-psk: empty key")
		}
	}
	mode := "psk"
	if err == nil && *psk == "" {
		mode = "certificate (self-signed)"
		if *certFile != "" || *keyFile != "" {
			var c tls.Certificate
			c, err = tls.LoadX509KeyPair(*certFile, *keyFile)
			cfg.Certificate = &c
			mode = "certificate " + *certFile
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "dtls-backend: %v\n", err)
		return 2
	}
	srv, err := dtlsecho.Listen(cfg)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	if keys != nil {
		keys.Logger = log
		backendcfg.Watch(kill, keys)
	}
	log.Info("dtls-backend started", "ordinal", cfg.Ordinal, "ordinal_from", set.OrdinalFrom, "listen", srv.Addr(),
		"mode", mode, "cid_len", cfg.CIDLen, "cid_codec", codec, "trusted_proxies", common.Trusted, "direct", common.Direct, "drain_timeout", set.DrainTimeout)
	if started != nil {
		started(srv)
	}
	shutdown.Drain(drain, kill, srv, set.Shutdown("dtls-backend", "sessions"))
	st, dm := srv.Stats()
	log.Info("dtls-backend stopped", "sessions", dm.NewSessions,
		"proxied", st.AcceptedProxied, "direct", st.AcceptedDirect, "dropped", st.Dropped(),
		"dropped_untrusted", st.DroppedUntrusted, "dropped_no_session", dm.DroppedNoSession,
		"dropped_foreign_hello", dm.DroppedForeignHello)
	return 0
}
