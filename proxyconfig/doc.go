// Package proxyconfig reads the JSON configuration of cidproxy and turns
// it into the library's service definitions, so that a program can embed
// the whole proxy — with its own backend sources, metrics and logs — from
// the same file the reference binary reads.
//
//	cfg, err := proxyconfig.Load(ctx, "cidproxy.json")
//	regs, err := cfg.Build(proxyconfig.Options{Source: mySource})
//	pipe, err := cidroute.New(cidroute.Config{Services: regs.Services()})
//	go regs.Run(ctx)
//	err = pipe.Run(ctx)
//
// (errors elided; see the package example.)
//
// # The file
//
// One JSON object; every object in it is read by one strict decoder: a key
// must be spelled exactly (lower case), may appear once per object, and an
// unknown key anywhere is an error, so a typo is reported instead of
// silently becoming a default.
//
//	{
//	  "hrw_seed": 7205759403792793,       // the same on every replica
//	  "metrics_listen": "127.0.0.1:9184", // for the program; absent = none
//	  "pprof_listen": "127.0.0.1:9185",   // Go's profiler, for the program; absent = none
//	  "log_level": "info",                // debug, info, warn, error
//	  "wait": "thread",                   // or "netpoller" (cidroute.WaitMode)
//	  "xdp_interfaces": ["eth0"],         // for the program (module cidroute/xdp)
//	  "services": [{
//	    "name": "coaps", "protocol": "dtls", "listen": "0.0.0.0:5684",
//	    "cid_length": 8,                  // DTLS default 8, QUIC 12
//	    "cid_codec": "quic-lb-encrypted", "cid_nonce_length": 6, "cid_keys_file": "keys.json",
//	    "proxy_protocol": false,          // transparent mode; absent or true: PROXY v2 headers
//	    "original_source": true,          // transparent mode only: backends see the client's address
//	    "max_sessions": 0, "session_idle": "2m", // transparent mode only
//	    "workers": 2, "max_registry_age": "30s",
//	    "recv_buffer": 4194304, "send_buffer": 0, // bytes; 0 = the kernel's default; recv_buffer absent = 4 MiB
//	    "early_drop": false,              // DTLS: a socket filter drops what can never route
//	    "backends": [{"ordinal": 0, "address": "10.0.0.10:5684"}],
//	    "unroutable": "drop",             // QUIC only: drop or hash
//	    "limits": {"global_pps": 0, "per_source_pps": 200, "handshake_pps": 2000, "zero_rtt_pps": 0},
//	    "health_check": {"interval": "2s", "timeout": "1s", "fall": 3, "rise": 2} // absent = no probes
//	  }]
//	}
//
// (comments are not JSON.) A service's backends come from exactly one of
// "backends" (the list format of registry.DecodeBackends), "backends_file"
// (the same list in a file, polled: registry.File) and "kubernetes" (the
// EndpointSlices of a Service, through Options.Kubernetes), or, with none
// of them, from the program (Options.Source). With "health_check",
// Registries.Run also runs a health.Checker per service, which marks
// backends down in the service's registry (Registries.Checker gives its
// Stats). The meaning and bounds of every key are in
// docs/configuration.md; Parse enforces them.
//
// # Errors
//
// Every mistake in the file is an *Error, formatted as
//
//	cidproxy.json:8:21: services[0].cid_length: 0 is not a DTLS CID length; write 5-255 (8 is usual), or leave the key out for 8
//
// FILE:LINE:COLUMN, the key's JSON path, what is wrong and what to write.
// Load, Parse, Validate, CheckFiles and Build (a cid_keys_file) return
// them; a syntax error, YAML, a null or an empty string are mistakes too.
//
// # Reloads
//
// A running program re-reads its file and compares it with what runs:
// Config.Diff says which services' backends (lists or sources), limits
// and health checks changed, which services are new, and which keys need
// new sockets or routing rules (Refused, named as the file names them; a
// service with one keeps its whole configuration). Registries.Apply
// replaces the changed sources and checkers on the same registries,
// Registries.AddService builds a new service for
// cidroute.Pipeline.AddService, and Pipeline.SetLimits takes the limits;
// Delta.Effective is the configuration that then runs.
package proxyconfig
