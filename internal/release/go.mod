module github.com/cidroute/cidroute/internal/release

// Built with GOWORK=off, never part of go.work: golang.org/x/exp and
// x/tools (apidiff, go/packages) would join every other module's build
// list in the workspace. go 1.26: golang.org/x/exp declares it.
go 1.26.0

require (
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
	golang.org/x/mod v0.42.0
	golang.org/x/tools v0.52.1-0.20261106145633-d407941a339a
)

require golang.org/x/sync v0.24.0 // indirect
