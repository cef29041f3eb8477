package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestRollingReplacement: real traffic through a rolling replacement.
// The StatefulSet ds of backend.yaml runs dtls-backend processes in pod
// network namespaces; the Kubernetes build of cidproxy, with the
// ConfigMap's config, learns them from the EndpointSlices the real
// controller writes; 12 pion/dtls v3 clients with connection IDs echo a
// record every 200 ms, and a new client handshakes every 250 ms. Then
// the StatefulSet controller replaces every pod (`kubectl rollout restart`
// does the same patch). Each terminating pod drains: its sessions keep
// flowing to it until its drain ends and it closes them; their clients
// handshake again and land on a ready pod. No echo may be lost and no
// new handshake may fail.
func TestRollingReplacement(t *testing.T) {
	cp := needCluster(t)
	n := startBackends(t, cp)
	p := startCidproxy(t, "")
	p.waitState(t, "cidproxy: 3 ready", time.Now(), 30*time.Second, func(s state) bool { return s.ready == 3 && !s.stale })
	before := podUIDs(t, cp)

	tr := runTraffic(t, p, 12, 250*time.Millisecond)
	time.Sleep(time.Second)
	perOrdinal := map[int]int{}
	for ord := range 3 {
		perOrdinal[ord] = len(tr.sessionsOn(time.Now(), ord))
	}
	t.Logf("sessions per ordinal before the rollout: %v", perOrdinal)

	start := time.Now()
	patch := fmt.Appendf(nil, `{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, start.Format(time.RFC3339))
	if _, err := cp.admin.AppsV1().StatefulSets(namespace).Patch(context.Background(), stsName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStatefulSet(t, cp, "rolling replacement of 3 pods", start, 120*time.Second, func(s *appsv1.StatefulSet) bool {
		return s.Status.ObservedGeneration == s.Generation && s.Status.UpdatedReplicas == 3 && s.Status.ReadyReplicas == 3 &&
			s.Status.CurrentRevision == s.Status.UpdateRevision
	})
	p.waitState(t, "cidproxy: the 3 new pods ready", start, 30*time.Second, func(s state) bool {
		return s.ready == 3 && s.draining == 0 && !s.stale
	})
	done := time.Now()
	time.Sleep(2 * time.Second) // traffic on the new pods
	tr.halt()
	t.Logf("traffic: %v", tr)

	after := podUIDs(t, cp)
	for name, uid := range before {
		if after[name] == uid || after[name] == "" {
			errorf(t, "pod %s not replaced (%s → %s)", name, uid, after[name])
		}
	}
	terms := n.terminations()
	if len(terms) != 3 {
		fatalf(t, "node-a stopped %d pods, want 3: %+v", len(terms), terms)
	}
	var order []string
	for _, tm := range terms {
		order = append(order, tm.name)
		// While it drained, its sessions kept reaching it.
		on := tr.sessionsOn(tm.sigterm, tm.ordinal)
		served := tr.echoesIn(tm.sigterm, tm.exited, tm.ordinal)
		t.Logf("%s: SIGTERM at +%v, drained and exited after %v, deleted %v later; %d sessions on it at SIGTERM, %d of them echoed during the drain (%v echoes)",
			tm.name, tm.sigterm.Sub(start).Round(time.Millisecond), tm.exited.Sub(tm.sigterm).Round(time.Millisecond),
			tm.removed.Sub(tm.exited).Round(time.Millisecond), len(on), len(served), sum(served))
		for _, s := range on {
			if served[s] == 0 {
				errorf(t, "session %d was on draining %s and got no echo during its drain", s, tm.name)
			}
		}
	}
	if !slices.Equal(order, []string{"ds-2", "ds-1", "ds-0"}) {
		errorf(t, "replacement order %v, want ds-2, ds-1, ds-0 (a StatefulSet's rolling update goes from the highest ordinal)", order)
	}
	if tr.lost != 0 || tr.broken != 0 {
		errorf(t, "%d echoes lost %v, %d sessions broken; redials: %v", tr.lost, tr.losses, tr.broken, tr.redials)
	}
	// A new handshake may fail only when its cookie round straddled a
	// change of the proxy's backends, and then by its deadline: the
	// backend its second ClientHello reached dropped it as foreign.
	ok, failed := tr.newOutcomes(start, done)
	updates := p.updates()
	changes := 0
	for _, at := range updates {
		if !at.Before(start) && at.Before(done) {
			changes++
		}
	}
	t.Logf("the proxy changed its backends %d times during the rollout", changes)
	if changes < 3 { // a drain and a new pod for each of 3 pods, at least
		errorf(t, "the proxy's log shows %d changes of its backends during the rollout", changes)
	}
	var unexplained []newAt
	for _, f := range failed {
		if f.round.straddles(updates) && errors.Is(f.err, context.DeadlineExceeded) {
			t.Logf("new handshake %v: its cookie round (%v) straddled a change of the backends", f, f.round.verify.Sub(f.round.hello))
			continue
		}
		unexplained = append(unexplained, f)
	}
	if len(unexplained) != 0 || ok == 0 {
		errorf(t, "new handshakes during the rollout: %d ok, %d failed: %v", ok, len(unexplained), unexplained)
	}
	if tr.cuts == 0 {
		errorf(t, "no session was closed by a draining backend: did the pods drain?")
	}
	// Every session works on the new pods.
	last := tr.echoesIn(done, time.Now(), -1)
	if len(last) != 12 {
		errorf(t, "%d of 12 sessions echoed after the rollout: %v", len(last), last)
	}
}

func sum(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestStraddles: the rule that excuses a failed new handshake needs a
// change of the backends inside its cookie round, and a cookie round.
func TestStraddles(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 16, 1, 13, 919_000_000, time.UTC)
	round := cookieRound{hello: t0, verify: t0.Add(2 * time.Millisecond)}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		r       cookieRound
		updates []time.Time
		want    bool
	}{
		{round, []time.Time{ms(1)}, true},
		{round, []time.Time{ms(-1)}, true}, // the log's millisecond
		{round, []time.Time{ms(52)}, true}, // the log line's slack
		{round, []time.Time{ms(-300), ms(53)}, false},
		{round, nil, false},
		{cookieRound{hello: t0}, []time.Time{ms(0)}, false}, // no HelloVerifyRequest
	} {
		if got := tc.r.straddles(tc.updates); got != tc.want {
			t.Errorf("round %v–%v, updates %v: straddles %v, want %v", tc.r.hello.Format("05.000"), tc.r.verify.Format("05.000"), tc.updates, got, tc.want)
		}
	}
}
