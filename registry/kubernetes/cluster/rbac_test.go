package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cidroute/cidroute/registry/kubernetes"
)

// waitAllowed waits until the proxies' API server answers the cidproxy
// service account's access review for verb on endpointslices with allowed
// (RBAC changes reach each API server through its own watch).
func waitAllowed(t *testing.T, verb string, allowed bool) {
	t.Helper()
	c, err := kubernetes.NewClient(proxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("RBAC: %s allowed=%v on the proxies' API server", verb, allowed), time.Now(), transitionBound, func() (bool, string) {
		r, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Namespace: namespace, Verb: verb, Group: "discovery.k8s.io", Resource: "endpointslices",
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err.Error()
		}
		return r.Status.Allowed == allowed, fmt.Sprintf("allowed=%v", r.Status.Allowed)
	})
}

// TestRoleVerbs runs the source as the manifests' service account with
// the manifests' Role (rbac.yaml), then with each of its verbs removed in
// turn, against the proxies' API server as it is (streaming lists, the
// WatchList feature, on by default since Kubernetes 1.34) and with
// WatchList off (as up to 1.33, or where a cluster turns it off). With
// the whole Role the registry is fresh and stays so. Without a verb the
// source needs, the registry must not stay fresh, and the log must say the
// API server refused. A verb the source needs with neither kind of server
// fails the test: the Role would grant more than the proxy needs.
func TestRoleVerbs(t *testing.T) {
	cp := needCluster(t)
	ctx := context.Background()
	k := kubelet{cp.admin}
	app := uniqueName("verbs")
	if _, err := cp.admin.CoreV1().Services(namespace).Create(ctx, headlessService(app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for ord := range 2 {
		startPod(t, ctx, k, statefulPod(app, app, ord), fmt.Sprintf("192.0.2.%d", 30+ord), true)
	}
	want := "0:ready@192.0.2.30:5684 1:ready@192.0.2.31:5684"
	const maxAge = 2 * time.Second
	verbs, err := roleVerbs()
	if err != nil {
		t.Fatal(err)
	}
	needed := map[string][]string{} // verb → the servers with which the source needed it

	for _, server := range []struct {
		name  string
		flags []string
	}{
		{"streaming lists", nil},
		{"no streaming lists", []string{"--feature-gates=WatchList=false"}},
	} {
		t.Run(server.name, func(t *testing.T) {
			if server.flags != nil {
				cp.proxy.ensureUp(t, cp.caPEM)
				if err := cp.proxy.restart(cp.caPEM, server.flags...); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := cp.proxy.restart(cp.caPEM); err != nil {
						t.Fatal(err)
					}
				})
			}
			t.Run("manifests' Role", func(t *testing.T) {
				w := watchSource(t, app, maxAge)
				w.waitBackends(t, "source started → backends", time.Now(), want)
				for end := time.Now().Add(3 * maxAge); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
					if w.reg.Stale() {
						t.Fatalf("registry stale with the manifests' Role (verbs %v)", verbs)
					}
				}
			})
			for _, verb := range verbs {
				t.Run("without "+verb, func(t *testing.T) {
					if _, err := applyFile(ctx, cp, "rbac.yaml", func(o *unstructured.Unstructured) bool {
						if isKind(o, "Role", "") {
							withoutVerb(o, verb)
						}
						return true
					}); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						if _, err := applyFile(ctx, cp, "rbac.yaml", nil); err != nil {
							t.Fatal(err)
						}
						waitAllowed(t, verb, true)
					})
					waitAllowed(t, verb, false)
					w := watchSource(t, app, maxAge)
					time.Sleep(3 * maxAge)
					if !w.reg.Stale() {
						t.Logf("without %q: fresh after 3×max age (backends %q): the source did not use it", verb, describe(w.reg.Snapshot()))
						return
					}
					refusal := firstLine(w.log.String(), "forbidden")
					if refusal == "" {
						t.Fatalf("without %q: stale, but no refusal logged:\n%s", verb, w.log.String())
					}
					needed[verb] = append(needed[verb], server.name)
					t.Logf("without %q: stale, backends %q; logged: %s", verb, describe(w.reg.Snapshot()), refusal)
				})
			}
		})
	}
	for _, verb := range verbs {
		if len(needed[verb]) == 0 {
			t.Errorf("the manifests' Role grants %q, which the source needs with neither kind of API server", verb)
		} else {
			t.Logf("%q is needed with: %v", verb, needed[verb])
		}
	}
}

// firstLine returns the first line of s that contains sub.
func firstLine(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
