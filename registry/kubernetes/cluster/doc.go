// Package cluster tests the EndpointSlice source (registry/kubernetes) and
// the Kubernetes build of cidproxy (examples/kubernetes/cidproxy) against a
// real control plane: etcd, kube-apiserver and kube-controller-manager of
// k8s.io/kubernetes v1.37.2, built from source by the tests' TestMain into
// one binary (cmd/kubecp) and started as processes on free loopback ports.
// Besides cmd/kubecp it holds only tests; it is a module of its own so that
// no other module of the repository compiles Kubernetes server code.
//
//	cd registry/kubernetes/cluster && GOWORK=off go test -v .
//
// GOWORK=off matters: the module is not part of go.work, because a
// workspace ignores the replace lines that pin Kubernetes' staging modules
// (see go.mod) and would merge k8s.io/kubernetes's requirements into every
// other module's build list.
//
// The first run compiles Kubernetes (1,750 CPU-seconds with the tests,
// about 15 minutes of an idle 2-core machine; 3.5 GB of memory while
// linking); the binaries go to $CIDROUTE_CLUSTER_CACHE (else the user
// cache directory), and later runs only check them (6–12 s).
// When the build fails (no network for the modules, no go) the tests skip,
// unless CIDROUTE_REQUIRE_TOOLS=1 makes that a failure.
//
// What runs:
//
//   - etcd (go.etcd.io/etcd/server v3.7.0 embedded, the version
//     Kubernetes requires) and two kube-apiservers on it, as in an HA
//     control plane: "proxy" serves the identity under test, "control" the
//     controller manager and the test itself, so that a test can take the
//     proxies' API server away while the cluster goes on. RBAC is on;
//     static tokens for the admin and the controller manager; the proxies
//     use a bound token of the service account examples/kubernetes defines,
//     with the Role and RoleBinding of rbac.yaml applied from the file.
//   - kube-controller-manager with the EndpointSlice controller (at most
//     3 endpoints per slice, so that a few pods split), the service account
//     controller and the StatefulSet controller (no garbage collector: the
//     tests delete what they made).
//   - the test as node-a's scheduler and kubelet: pods are bound to node-a
//     and their status is written as a kubelet writes it. In the traffic
//     tests each pod gets a network namespace with an address on a bridge,
//     its container runs as a dtls-backend process there with the args of
//     backend.yaml, and a graceful delete is SIGTERM, the drain, the exit
//     and the delete with grace period 0.
//
// As root, with unshare and ip, the test binary first moves into a network
// namespace of its own, so nothing it starts touches the machine's ports or
// routes; without them the control-plane tests run on the machine's
// loopback and the traffic tests skip (fail under CIDROUTE_REQUIRE_TOOLS=1).
//
// Tests: TestTransitions (each EndpointSlice transition, measured),
// TestRoleVerbs (every verb of the manifests' Role is needed),
// TestRollingReplacement (pion/dtls v3 clients through a StatefulSet
// rollout), TestAPIServerOutage, TestCompactedHistory and TestRBACRevoked
// (the faults). go test -v prints the measured transitions at the end.
package cluster
