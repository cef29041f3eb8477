package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// origSrcManifest is the original-source deployment (docs/original-source.md).
const origSrcManifest = "original-source/original-source.yaml"

// TestOriginalSourceManifestDryRun: the API server accepts every object
// of the original-source deployment as `kubectl apply --server-side
// --dry-run=server` sends it: validation, defaulting and admission (the
// DaemonSet's hostNetwork, capabilities and init container included), in
// the namespace and with the service account that namespace.yaml and
// rbac.yaml define. Nothing is stored. A field the server does not know
// fails too: the patch asks for strict field validation.
func TestOriginalSourceManifestDryRun(t *testing.T) {
	cp := needCluster(t)
	objs, err := readManifest(origSrcManifest)
	if err != nil {
		fatalf(t, "%v", err)
	}
	kinds := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range objs {
		if err := dryRunApply(ctx, cp, o); err != nil {
			errorf(t, "%s %s: %v", o.GetKind(), o.GetName(), err)
			continue
		}
		kinds[o.GetKind()]++
		ri, err := resource(cp, o)
		if err != nil {
			fatalf(t, "%v", err)
		}
		if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); err == nil {
			errorf(t, "%s %s was stored by a dry run", o.GetKind(), o.GetName())
		}
	}
	t.Logf("accepted by the API server (dry run): %v", kinds)
	for _, k := range []string{"ConfigMap", "DaemonSet", "Service", "StatefulSet"} {
		if kinds[k] == 0 {
			errorf(t, "no %s accepted", k)
		}
	}

	// The check can fail: a misspelt field is refused.
	bad := objs[0].DeepCopy()
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			bad = o.DeepCopy()
		}
	}
	unstructured.SetNestedField(bad.Object, true, "spec", "template", "spec", "hostNetwrok")
	if err := dryRunApply(ctx, cp, bad); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		errorf(t, "a DaemonSet with a misspelt field: %v, want an error naming it", err)
	}
}

// dryRunApply is apply with dryRun=All and strict field validation.
func dryRunApply(ctx context.Context, cp *controlPlane, o *unstructured.Unstructured) error {
	ri, err := resource(cp, o)
	if err != nil {
		return err
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
		FieldManager: "cidroute-test", Force: &force, DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
	return err
}
