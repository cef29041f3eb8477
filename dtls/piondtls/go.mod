module github.com/cidroute/cidroute/dtls/piondtls

// go 1.24: the core module's. pion/dtls v3.1.0 is the oldest release with
// the options API (ServerWithOptions, WithConnectionIDGenerator) the adapter
// uses; scripts/minmax.sh tests it and the newest.
go 1.24.0

require (
	github.com/cidroute/cidroute v0.1.0
	github.com/pion/dtls/v3 v3.1.0
	github.com/pion/logging v0.2.4
	github.com/pion/transport/v5 v5.0.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/pion/transport/v4 v4.0.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.40.0 // indirect
	golang.org/x/net v0.42.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
)

replace github.com/cidroute/cidroute => ../..
