module github.com/cidroute/cidroute/registry/kubernetes

go 1.26.0

require github.com/cidroute/cidroute v0.0.0

require (
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	k8s.io/api v0.37.2 // indirect
	k8s.io/apimachinery v0.37.2 // indirect
	k8s.io/client-go v0.37.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace github.com/cidroute/cidroute => ../..
