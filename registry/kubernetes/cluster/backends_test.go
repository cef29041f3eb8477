package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// The backends of backend.yaml.
const (
	stsName     = "ds"
	backendApp  = "dtls-backend"
	backendPods = "app.kubernetes.io/name=" + backendApp
)

// drainTimeout replaces the backends' 110 s -drain-timeout (and a grace
// period of 15 s the manifests' 120 s) so that a rolling replacement of
// three pods takes seconds, not minutes; the order of events is the same.
const drainTimeout = "4s"

// preStopSeconds replaces the manifests' preStop sleep of 5 s: the proxies
// see a terminating pod well within 1 s here (0.06 s measured).
const preStopSeconds = 1

// startBackends applies backend.yaml (the headless Service and the
// StatefulSet ds, 3 replicas) with the shorter drain, runs node-a for its
// pods and waits until the StatefulSet controller reports them all ready.
// When the test ends the StatefulSet and its pods are deleted.
func startBackends(t *testing.T, cp *controlPlane) *node {
	t.Helper()
	ctx := context.Background()
	n := startNode(t, cp, backendPods)
	if _, err := applyFile(ctx, cp, "backend.yaml", func(o *unstructured.Unstructured) bool {
		if isKind(o, "StatefulSet", stsName) {
			unstructured.SetNestedField(o.Object, int64(15), "spec", "template", "spec", "terminationGracePeriodSeconds")
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			c := cs[0].(map[string]any)
			c["args"] = append(c["args"].([]any), "-drain-timeout", drainTimeout)
			unstructured.SetNestedField(c, int64(preStopSeconds), "lifecycle", "preStop", "sleep", "seconds")
			unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteBackends(t, cp) })
	waitStatefulSet(t, cp, "StatefulSet ds: 3 pods ready", time.Now(), 60*time.Second, func(s *appsv1.StatefulSet) bool {
		return s.Status.ReadyReplicas == 3 && s.Status.AvailableReplicas == 3
	})
	return n
}

// deleteBackends deletes the StatefulSet and then its pods at once (no
// garbage collector runs to do it), and waits until they are gone.
func deleteBackends(t *testing.T, cp *controlPlane) {
	ctx := context.Background()
	// Background propagation (the default) deletes it at once; Orphan
	// would wait for the garbage collector's finalizer, which does not run.
	if err := cp.admin.AppsV1().StatefulSets(namespace).Delete(ctx, stsName, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the StatefulSet: %v", err)
	}
	k := kubelet{cp.admin}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		l, err := cp.admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: backendPods})
		if err != nil {
			t.Errorf("listing pods: %v", err)
			return
		}
		if len(l.Items) == 0 {
			return
		}
		for _, p := range l.Items {
			k.forceDelete(ctx, namespace, p.Name, p.UID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("backend pods still there after 30s")
}

// waitStatefulSet waits until cond holds for the StatefulSet ds.
func waitStatefulSet(t *testing.T, cp *controlPlane, step string, start time.Time, bound time.Duration, cond func(*appsv1.StatefulSet) bool) {
	t.Helper()
	waitFor(t, step, start, bound, func() (bool, string) {
		s, err := cp.admin.AppsV1().StatefulSets(namespace).Get(context.Background(), stsName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cond(s), fmt.Sprintf("replicas %d ready %d updated %d revision %s→%s",
			s.Status.Replicas, s.Status.ReadyReplicas, s.Status.UpdatedReplicas, s.Status.CurrentRevision, s.Status.UpdateRevision)
	})
}

// scale sets the StatefulSet's replicas.
func scale(t *testing.T, cp *controlPlane, replicas int) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	if _, err := cp.admin.AppsV1().StatefulSets(namespace).Patch(context.Background(), stsName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podUIDs returns the backend pods' UIDs by name.
func podUIDs(t *testing.T, cp *controlPlane) map[string]types.UID {
	t.Helper()
	l, err := cp.admin.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: backendPods})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]types.UID{}
	for _, p := range l.Items {
		m[p.Name] = p.UID
	}
	return m
}
