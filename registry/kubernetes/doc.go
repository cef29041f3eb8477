// Package kubernetes is a registry.Source that discovers a service's
// backends from Kubernetes EndpointSlices: the pods of a StatefulSet behind
// a headless Service, each writing its StatefulSet ordinal into the
// connection IDs it issues.
//
// Every proxy replica runs its own [Source] against the same Service, sees
// the same EndpointSlices, builds the same backend list (sorted, merged
// deterministically) and so, with the same HRW seed, picks the same backend
// for every new session. The replicas share no state with each other.
//
// The package is a module of its own
// (github.com/cidroute/cidroute/registry/kubernetes) so that client-go
// stays out of the core: a program that does not import this package
// neither downloads nor compiles any Kubernetes code.
//
// The Source needs list and watch on endpointslices
// (discovery.k8s.io) in the Service's namespace, and on pods with
// Config.WatchPods (weights and slow start), nothing else; it never gets
// one by name. With an API server that offers streaming lists
// (WatchList, on by default since Kubernetes 1.34) it only watches.
package kubernetes
