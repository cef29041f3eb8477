module github.com/cidroute/cidroute/xdp

go 1.26.0

require (
	github.com/cidroute/cidroute v0.0.0
	github.com/cilium/ebpf v0.22.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/cidroute/cidroute => ../

tool github.com/cilium/ebpf/cmd/bpf2go
