// Command cidproxy is the reference cidroute proxy: a stateless, CID-aware
// UDP proxy for DTLS 1.2 (RFC 9146) and QUIC services, configured by a JSON
// file. See docs/configuration.md (cidproxy -h names it) for the file.
//
//	cidproxy -config cidproxy.json          run
//	cidproxy -check -config cidproxy.json   validate the file and exit
//	cidproxy -handover PATH -config cidproxy.json
//	                                        run; the next process started so takes over without loss
//	cidproxy -join -config cidproxy.json    run, sharing the sockets of a running instance
//	cidproxy -demo                          a self-contained demo on loopback
//
// SIGINT and SIGTERM stop it; SIGHUP reloads the configuration. This
// build has no Kubernetes code; examples/kubernetes/cidproxy is the same
// program with the EndpointSlice source.
package main

import "github.com/cidroute/cidroute/examples/internal/proxyapp"

func main() { proxyapp.Main(proxyapp.Options{XDP: startXDP}) }
