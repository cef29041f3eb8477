module github.com/cidroute/cidroute/bench

// go 1.25: sync.WaitGroup.Go.
go 1.25

require (
	github.com/cidroute/cidroute v0.0.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.41.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.50.0 // indirect
)

replace github.com/cidroute/cidroute => ..
