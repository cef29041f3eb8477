module github.com/cidroute/cidroute/internal/interop

// go 1.25: github.com/pires/go-proxyproto v0.15.0 declares it.
go 1.25.0

require (
	github.com/cidroute/cidroute v0.0.0
	github.com/pion/dtls/v3 v3.1.15
	github.com/pires/go-proxyproto v0.15.0
)

require (
	github.com/pion/logging v0.2.4 // indirect
	github.com/pion/transport/v5 v5.0.0 // indirect
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
)

replace github.com/cidroute/cidroute => ../..
