module github.com/cidroute/cidroute/examples

// go 1.26: quic-go v0.65.0 and client_golang v1.25.0 declare it.
go 1.26.0

require (
	github.com/cidroute/cidroute v0.1.0
	github.com/cidroute/cidroute/dtls/piondtls v0.1.0
	github.com/cidroute/cidroute/promcollector v0.1.0
	github.com/cidroute/cidroute/quic/quicgo v0.1.0
	github.com/cidroute/cidroute/xdp v0.1.0
	github.com/pion/dtls/v2 v2.2.12
	github.com/pion/dtls/v3 v3.1.15
	github.com/pion/transport/v5 v5.1.4
	github.com/plgd-dev/go-coap/v3 v3.8.1
	github.com/prometheus/client_golang v1.25.0
	github.com/quic-go/quic-go v0.65.0
	github.com/stretchr/testify v1.12.1
	go.yaml.in/yaml/v3 v3.0.5
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/dsnet/golib/memfile v1.0.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pion/logging v0.2.4 // indirect
	github.com/pion/transport/v2 v2.2.4 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/exp v0.0.0-20261014143641-f0251eb4aa3e // indirect
	golang.org/x/sync v0.24.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/cidroute/cidroute => ..
	github.com/cidroute/cidroute/dtls/piondtls => ../dtls/piondtls
	github.com/cidroute/cidroute/promcollector => ../promcollector
	github.com/cidroute/cidroute/quic/quicgo => ../quic/quicgo
	github.com/cidroute/cidroute/xdp => ../xdp
)
