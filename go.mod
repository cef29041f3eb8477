module github.com/cidroute/cidroute

// go 1.24: the oldest release the core and its tests need (testing.B.Loop);
// the dependencies below are the newest versions that still declare go 1.24,
// so a user's own go line is never raised by requiring this module.
go 1.24

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.42.0
	golang.org/x/sys v0.35.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
