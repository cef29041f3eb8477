module github.com/cidroute/cidroute/quic/quicgo

// go 1.25: sync.WaitGroup.Go (quicecho and the tests). quic-go v0.55.0 is
// the oldest release with *quic.Conn and Conn.ConnectionStats, which the
// adapter uses; scripts/minmax.sh tests it and the newest.
go 1.25

require (
	github.com/cidroute/cidroute v0.1.0
	github.com/quic-go/quic-go v0.55.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.41.0 // indirect
	golang.org/x/mod v0.27.0 // indirect
	golang.org/x/net v0.43.0 // indirect
	golang.org/x/sync v0.16.0 // indirect
	golang.org/x/sys v0.35.0 // indirect
	golang.org/x/tools v0.36.0 // indirect
)

replace github.com/cidroute/cidroute => ../..
