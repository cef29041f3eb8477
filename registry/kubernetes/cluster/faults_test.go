package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// maxAge is the proxies' max_registry_age in the fault tests: the
// manifests' 30 s would outlast the 30 s outage; 10 s shows the registry
// stale for most of it.
const (
	maxAge       = 10 * time.Second
	maxAgeConfig = "10s"
)

// staleBound is how long after the watch is lost the registry may take to
// turn stale: max_registry_age after the last confirmation, which came at
// most a confirmation period (max_registry_age/4) before the loss, plus
// the transition bound.
const staleBound = maxAge + transitionBound

// recoveryBound allows for client-go's reflector backoff: after an outage
// it retries every [30 s, 60 s) at worst.
const recoveryBound = 75 * time.Second

// checkStale asserts what a stale registry must do: established sessions
// go on, new handshakes are refused.
func checkStale(t *testing.T, p *cidproxy, tr *traffic, from time.Time, dur time.Duration) {
	t.Helper()
	refused0, _ := p.state()
	time.Sleep(dur)
	to := time.Now()
	echoed := tr.echoesIn(from, to, -1)
	ok, failed := tr.newOutcomes(from, to)
	s, _ := p.state()
	t.Logf("while stale for %v: %d sessions echoed %d times; new handshakes %d ok, %d refused; stale_registry drops %d",
		dur, len(echoed), sum(echoed), ok, len(failed), s.refused-refused0.refused)
	if len(echoed) != 6 {
		errorf(t, "%d of 6 established sessions echoed while the registry was stale", len(echoed))
	}
	if ok != 0 || len(failed) == 0 {
		errorf(t, "new handshakes while stale: %d ok, %d refused; want all refused", ok, len(failed))
	}
	if s.refused <= refused0.refused {
		errorf(t, "no datagram dropped as stale_registry while stale")
	}
}

// TestAPIServerOutage stops the API server the proxy watches for 30 s
// while the StatefulSet is scaled 3 → 4 through the other one. The
// registry turns stale within max_registry_age, new handshakes are
// refused, established sessions keep flowing; when the server returns,
// the proxy sees the fourth pod, turns fresh, and new handshakes work
// again. The audit log shows what the proxy asked for after the return.
func TestAPIServerOutage(t *testing.T) {
	cp := needCluster(t)
	startBackends(t, cp)
	p := startCidproxy(t, maxAgeConfig)
	p.waitState(t, "cidproxy: 3 ready", time.Now(), 30*time.Second, func(s state) bool { return s.ready == 3 && !s.stale })
	tr := runTraffic(t, p, 6, 500*time.Millisecond)
	_, offset := auditCounts(cp.proxy.auditLog(), 0)

	cp.proxy.ensureUp(t, cp.caPEM)
	if err := cp.proxy.stop(); err != nil {
		t.Fatalf("kube-apiserver proxy: %v", err)
	}
	down := time.Now()
	scale(t, cp, 4)
	waitStatefulSet(t, cp, "outage: ds-3 ready (through the other API server)", down, 30*time.Second, func(s *appsv1.StatefulSet) bool {
		return s.Status.ReadyReplicas == 4
	})
	p.waitState(t, "outage: stale", down, staleBound, func(s state) bool { return s.stale })
	staleFrom := time.Now()
	if s, _ := p.state(); s.ready != 3 {
		errorf(t, "stale proxy has %d ready backends, want the 3 it knew", s.ready)
	}
	checkStale(t, p, tr, staleFrom, time.Until(down.Add(30*time.Second))-time.Second)

	time.Sleep(time.Until(down.Add(30 * time.Second)))
	up := time.Now()
	if err := cp.proxy.start(cp.caPEM); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver proxy back after %v, ready %v after its start", up.Sub(down).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	p.waitState(t, "outage over: fresh, 4 ready", up, recoveryBound, func(s state) bool { return !s.stale && s.ready == 4 })
	recovered := time.Now()
	time.Sleep(3 * time.Second)
	if ok, failed := tr.newOutcomes(recovered, time.Now()); len(failed) != 0 || ok == 0 {
		errorf(t, "new handshakes after the recovery: %d ok, %d failed: %v", ok, len(failed), failed)
	}
	tr.halt()
	t.Logf("traffic: %v", tr)
	if tr.lost != 0 || tr.broken != 0 {
		errorf(t, "established sessions lost %d echoes %v (%d broken)", tr.lost, tr.losses, tr.broken)
	}
	counts, _ := auditCounts(cp.proxy.auditLog(), offset)
	t.Logf("the proxy's EndpointSlice requests to the returned API server: %v", counts)
	checkNoStorm(t, counts)
}

// checkNoStorm fails when the proxy fetched the whole state (a list, or a
// watch-list that streams it) more than twice after the API server came
// back. Refused requests (403) are not counted: an API server that has
// just started listening refuses everyone until its RBAC informers have
// synced, and the proxy, which talks to that one server and not through
// the kubernetes Service (which lists only ready ones), may ask in that
// window; they cost the server nothing to answer.
func checkNoStorm(t *testing.T, counts map[string]int) {
	t.Helper()
	relists := counts["list 200"] + counts["watch-list 200"]
	if relists > 2 {
		errorf(t, "the proxy fetched the whole state %d times after the return: %v", relists, counts)
	}
	if n := counts["list 403"] + counts["watch-list 403"] + counts["watch 403"]; n > 0 {
		t.Logf("%d requests refused while the restarted API server's RBAC cache was empty", n)
	}
}

// TestCompactedHistory stops the proxies' API server, scales the
// StatefulSet 3 → 2 through the other one, compacts etcd past everything
// the proxy has seen and starts the server again: the proxy's watch
// cannot resume from its resource version (410 Gone), it must list
// again, and it must end with ds-2 gone.
func TestCompactedHistory(t *testing.T) {
	cp := needCluster(t)
	startBackends(t, cp)
	p := startCidproxy(t, maxAgeConfig)
	p.waitState(t, "cidproxy: 3 ready", time.Now(), 30*time.Second, func(s state) bool { return s.ready == 3 && !s.stale })
	tr := runTraffic(t, p, 6, 0)
	_, offset := auditCounts(cp.proxy.auditLog(), 0)

	cp.proxy.ensureUp(t, cp.caPEM)
	if err := cp.proxy.stop(); err != nil {
		t.Fatalf("kube-apiserver proxy: %v", err)
	}
	down := time.Now()
	scale(t, cp, 2)
	waitStatefulSet(t, cp, "compaction: scaled to 2 (through the other API server)", down, 30*time.Second, func(s *appsv1.StatefulSet) bool {
		return s.Status.Replicas == 2 && s.Status.ReadyReplicas == 2
	})
	rev, err := cp.compact(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd compacted at revision %d", rev)
	up := time.Now()
	if err := cp.proxy.start(cp.caPEM); err != nil {
		t.Fatal(err)
	}
	p.waitState(t, "compacted restart: 2 ready, fresh", up, recoveryBound, func(s state) bool {
		return s.ready == 2 && s.draining == 0 && !s.stale
	})
	time.Sleep(time.Second)
	tr.halt()
	t.Logf("traffic: %v", tr)
	counts, _ := auditCounts(cp.proxy.auditLog(), offset)
	t.Logf("the proxy's EndpointSlice requests to the restarted API server: %v", counts)
	checkNoStorm(t, counts)
	if tr.broken != 0 {
		errorf(t, "%d sessions broken", tr.broken)
	}
}

// TestRBACRevoked deletes the manifests' RoleBinding while the proxy
// watches. An established watch is authorized once, when it starts, so
// the proxy goes on until its watch has to be opened again (here: its API
// server restarts); then the server refuses, the proxy logs the refusal
// once, turns stale and refuses new handshakes while established sessions
// go on. Applying rbac.yaml again restores it.
func TestRBACRevoked(t *testing.T) {
	cp := needCluster(t)
	ctx := context.Background()
	startBackends(t, cp)
	p := startCidproxy(t, maxAgeConfig)
	p.waitState(t, "cidproxy: 3 ready", time.Now(), 30*time.Second, func(s state) bool { return s.ready == 3 && !s.stale })
	tr := runTraffic(t, p, 6, 500*time.Millisecond)

	binding := func(o *unstructured.Unstructured) bool { return isKind(o, "RoleBinding", "") }
	revoked := time.Now()
	if err := deleteFile(ctx, cp, "rbac.yaml", binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := applyFile(ctx, cp, "rbac.yaml", nil); err != nil {
			t.Error(err)
		}
	})
	waitAllowed(t, "watch", false)
	// The open watch lives on.
	time.Sleep(maxAge + 2*time.Second)
	if s, _ := p.state(); s.stale {
		fatalf(t, "stale %v after the RoleBinding went, while its watch was open", time.Since(revoked))
	}
	t.Logf("%v after the revocation the proxy is still fresh: its watch was authorized when it opened", time.Since(revoked).Round(time.Second))

	// The watch has to be opened again: the server refuses.
	restart := time.Now()
	cp.proxy.ensureUp(t, cp.caPEM)
	if err := cp.proxy.stop(); err != nil {
		t.Fatalf("kube-apiserver proxy: %v", err)
	}
	if err := cp.proxy.start(cp.caPEM); err != nil {
		t.Fatal(err)
	}
	p.waitState(t, "RBAC revoked: stale after the watch reopened", restart, staleBound+5*time.Second, func(s state) bool { return s.stale })
	log := p.proc.tail(1 << 20)
	refusal := firstLine(log, "forbidden")
	if refusal == "" {
		fatalf(t, "no refusal in the proxy's log:\n%s", log)
	}
	t.Logf("the proxy says: %s", refusal)
	if n := strings.Count(log, "forbidden"); n > 1 {
		errorf(t, "the refusal is logged %d times, want once", n)
	}
	checkStale(t, p, tr, time.Now(), 3*time.Second)

	restored := time.Now()
	if _, err := applyFile(ctx, cp, "rbac.yaml", nil); err != nil {
		t.Fatal(err)
	}
	p.waitState(t, "RBAC restored: fresh", restored, recoveryBound, func(s state) bool { return !s.stale && s.ready == 3 })
	recovered := time.Now()
	time.Sleep(2 * time.Second)
	if ok, failed := tr.newOutcomes(recovered, time.Now()); len(failed) != 0 || ok == 0 {
		errorf(t, "new handshakes after the recovery: %d ok, %d failed: %v", ok, len(failed), failed)
	}
	tr.halt()
	t.Logf("traffic: %v", tr)
	if tr.lost != 0 || tr.broken != 0 {
		errorf(t, "established sessions lost %d echoes %v (%d broken)", tr.lost, tr.losses, tr.broken)
	}
}
