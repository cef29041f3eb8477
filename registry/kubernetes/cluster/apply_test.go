package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// readManifest decodes every document of the manifest file name (in
// examples/kubernetes) into an unstructured object.
func readManifest(name string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(filepath.Join(manifestsDir, name))
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// applyFile applies the objects of a manifest file the way
// `kubectl apply --server-side -f` does, as the admin, after edit (when
// set) has changed them; edit may return false to leave an object out.
// It returns the objects as applied.
func applyFile(ctx context.Context, cp *controlPlane, name string, edit func(*unstructured.Unstructured) bool) ([]*unstructured.Unstructured, error) {
	objs, err := readManifest(name)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if edit != nil && !edit(o) {
			continue
		}
		if err := apply(ctx, cp, o); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", name, o.GetKind(), o.GetName(), err)
		}
		out = append(out, o)
	}
	return out, nil
}

// deleteFile deletes the objects of a manifest file that keep says to.
func deleteFile(ctx context.Context, cp *controlPlane, name string, keep func(*unstructured.Unstructured) bool) error {
	objs, err := readManifest(name)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if keep != nil && !keep(o) {
			continue
		}
		ri, err := resource(cp, o)
		if err != nil {
			return err
		}
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: deleting %s %s: %w", name, o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

func apply(ctx context.Context, cp *controlPlane, o *unstructured.Unstructured) error {
	ri, err := resource(cp, o)
	if err != nil {
		return err
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "cidroute-test", Force: &force})
	return err
}

// The admin's dynamic client and REST mapper, made once.
var dynamicClient struct {
	sync.Once
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	err    error
}

// resource returns the dynamic client of o's kind (in o's namespace).
func resource(cp *controlPlane, o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	d := &dynamicClient
	d.Do(func() {
		cfg := cp.restConfig(cp.control, adminToken)
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			d.err = err
			return
		}
		d.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
		d.dyn, d.err = dynamic.NewForConfig(cfg)
	})
	if d.err != nil {
		return nil, d.err
	}
	gvk := o.GroupVersionKind()
	m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return d.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return d.dyn.Resource(m.Resource), nil
}

// isKind reports whether o is of kind k named name ("" = any name).
func isKind(o *unstructured.Unstructured, k, name string) bool {
	return o.GetKind() == k && (name == "" || o.GetName() == name)
}

// withoutVerb removes verb from every rule of a Role.
func withoutVerb(o *unstructured.Unstructured, verb string) {
	rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
	for i, r := range rules {
		m := r.(map[string]any)
		var keep []any
		for _, v := range m["verbs"].([]any) {
			if !strings.EqualFold(v.(string), verb) {
				keep = append(keep, v)
			}
		}
		m["verbs"] = keep
		rules[i] = m
	}
	unstructured.SetNestedSlice(o.Object, rules, "rules")
}

// roleVerbs returns the verbs of the manifests' Role.
func roleVerbs() ([]string, error) {
	objs, err := readManifest("rbac.yaml")
	if err != nil {
		return nil, err
	}
	var verbs []string
	for _, o := range objs {
		if !isKind(o, "Role", "") {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			for _, v := range r.(map[string]any)["verbs"].([]any) {
				verbs = append(verbs, v.(string))
			}
		}
	}
	if len(verbs) == 0 {
		return nil, errors.New("rbac.yaml: no Role with verbs")
	}
	return verbs, nil
}
