module github.com/cidroute/cidroute/xdp

// go 1.26: the quicgo module its wire tests use declares it
// (github.com/cilium/ebpf v0.22.0 alone needs 1.25).
go 1.26.0

require (
	github.com/cidroute/cidroute v0.1.0
	github.com/cidroute/cidroute/dtls/piondtls v0.1.0
	github.com/cidroute/cidroute/quic/quicgo v0.1.0
	github.com/cilium/ebpf v0.22.0
	github.com/pion/dtls/v3 v3.1.15
	github.com/quic-go/quic-go v0.65.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/pion/logging v0.2.4 // indirect
	github.com/pion/transport/v5 v5.0.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/net v0.62.0 // indirect
)

replace (
	github.com/cidroute/cidroute => ..
	github.com/cidroute/cidroute/dtls/piondtls => ../dtls/piondtls
	github.com/cidroute/cidroute/quic/quicgo => ../quic/quicgo
)

tool github.com/cilium/ebpf/cmd/bpf2go
