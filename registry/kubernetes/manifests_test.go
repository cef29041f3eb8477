package kubernetes

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// manifestsDir holds the example deployment, in the main module's tree.
const manifestsDir = "../../examples/kubernetes"

// loadManifests decodes every YAML document of every *.yaml file in dir into
// typed objects. Unknown fields are errors (a misspelt field would
// otherwise be dropped silently by kubectl's client-side decoding too).
func loadManifests(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			if len(bytes.TrimSpace(doc)) == 0 || isOnlyComments(doc) {
				continue
			}
			obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			require.NoError(t, err, "%s document %d", f, i)
			strict, err := scheme.Scheme.New(*gvk)
			require.NoError(t, err)
			require.NoError(t, yaml.UnmarshalStrict(doc, strict), "%s document %d (%s)", f, i, gvk.Kind)
			objs = append(objs, obj)
		}
	}
	return objs
}

func isOnlyComments(doc []byte) bool {
	for line := range strings.Lines(string(doc)) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// ofType returns the objects of type T in objs.
func ofType[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// single returns the one object of type T in objs.
func single[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	s := ofType[T](objs)
	require.Len(t, s, 1, "%T", *new(T))
	return s[0]
}

// proxyConfig mirrors the cidproxy config keys (examples/cidproxy), with
// the "kubernetes" service source; unknown keys fail the decode as they
// fail cidproxy.
type proxyConfig struct {
	HRWSeed       uint64 `json:"hrw_seed"`
	MetricsListen string `json:"metrics_listen"`
	LogLevel      string `json:"log_level"`
	Services      []struct {
		Name           string          `json:"name"`
		Protocol       string          `json:"protocol"`
		Listen         string          `json:"listen"`
		CIDLength      int             `json:"cid_length"`
		CIDCodec       string          `json:"cid_codec"`
		CIDNonceLength int             `json:"cid_nonce_length"`
		CIDKeysFile    string          `json:"cid_keys_file"`
		ProxyProtocol  *bool           `json:"proxy_protocol"`
		OriginalSource bool            `json:"original_source"`
		SessionIdle    string          `json:"session_idle"`
		Workers        int             `json:"workers"`
		MaxRegistryAge string          `json:"max_registry_age"`
		Backends       json.RawMessage `json:"backends"`
		BackendsFile   string          `json:"backends_file"`
		Limits         json.RawMessage `json:"limits"`
		Kubernetes     *struct {
			Namespace  string `json:"namespace"`
			Service    string `json:"service"`
			PortName   string `json:"port_name"`
			Kubeconfig string `json:"kubeconfig"`
		} `json:"kubernetes"`
	} `json:"services"`
}

func TestManifests(t *testing.T) {
	if _, err := os.Stat(manifestsDir); err != nil {
		// Only a copy of this module outside the repository lacks them.
		if _, err := os.Stat("../../go.mod"); err == nil {
			t.Fatalf("examples/kubernetes missing: %v", err)
		}
		t.Skip("not in the cidroute repository")
	}
	objs := loadManifests(t, manifestsDir)

	for _, o := range objs {
		switch o.(type) {
		case *corev1.Namespace, *corev1.Service, *appsv1.StatefulSet, *appsv1.Deployment,
			*corev1.ConfigMap, *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding, *corev1.Secret,
			*networkingv1.NetworkPolicy:
		default:
			t.Fatalf("unexpected kind %T (no cluster-wide RBAC or anything else)", o)
		}
	}
	ns := single[*corev1.Namespace](t, objs).Name
	sts := single[*appsv1.StatefulSet](t, objs)
	dep := single[*appsv1.Deployment](t, objs)
	cm := single[*corev1.ConfigMap](t, objs)
	sa := single[*corev1.ServiceAccount](t, objs)
	role := single[*rbacv1.Role](t, objs)
	rb := single[*rbacv1.RoleBinding](t, objs)
	services := ofType[*corev1.Service](objs)
	require.Len(t, services, 2)
	for _, o := range objs {
		if _, ok := o.(*corev1.Namespace); ok {
			continue
		}
		m := o.(interface{ GetNamespace() string })
		require.Equal(t, ns, m.GetNamespace(), "%T in the example namespace", o)
	}

	// Backends: a StatefulSet behind a headless Service with a UDP port.
	var headless, lb *corev1.Service
	for _, s := range services {
		switch {
		case s.Spec.ClusterIP == corev1.ClusterIPNone:
			headless = s
		case s.Spec.Type == corev1.ServiceTypeLoadBalancer:
			lb = s
		}
	}
	require.NotNil(t, headless, "a headless Service")
	require.NotNil(t, lb, "a LoadBalancer Service")
	require.Equal(t, headless.Name, sts.Spec.ServiceName, "the StatefulSet's serviceName is the headless Service, so endpoints carry the pod hostname")
	require.NotNil(t, sts.Spec.Replicas)
	require.Positive(t, *sts.Spec.Replicas)
	require.LessOrEqual(t, *sts.Spec.Replicas, int32(255), "ordinals 0-254")
	podLabels := labels.Set(sts.Spec.Template.Labels)
	require.True(t, labels.SelectorFromSet(headless.Spec.Selector).Matches(podLabels), "headless Service selects the backend pods")
	require.Equal(t, sts.Spec.Selector.MatchLabels, sts.Spec.Template.Labels)
	require.Len(t, headless.Spec.Ports, 1)
	backendPort := headless.Spec.Ports[0]
	require.Equal(t, corev1.ProtocolUDP, backendPort.Protocol)
	require.NotEmpty(t, backendPort.Name)
	backend := sts.Spec.Template.Spec.Containers[0]
	require.True(t, slices.ContainsFunc(backend.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == backendPort.TargetPort.StrVal && p.Protocol == corev1.ProtocolUDP
	}), "the backend container exposes the Service's target port over UDP")
	require.True(t, slices.ContainsFunc(backend.Env, func(e corev1.EnvVar) bool {
		return e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
			(e.ValueFrom.FieldRef.FieldPath == "metadata.name" ||
				e.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']")
	}), "the backend learns its ordinal from the pod")

	// RBAC: list and watch on endpointslices, nothing more (the informer
	// never gets one; registry/kubernetes/cluster shows each verb needed).
	require.Len(t, role.Rules, 1)
	rule := role.Rules[0]
	require.Equal(t, []string{"discovery.k8s.io"}, rule.APIGroups)
	require.Equal(t, []string{"endpointslices"}, rule.Resources)
	require.ElementsMatch(t, []string{"list", "watch"}, rule.Verbs)
	require.Empty(t, rule.ResourceNames)
	require.Empty(t, rule.NonResourceURLs)
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}, rb.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: ns}}, rb.Subjects)

	// The proxy Deployment: 2+ replicas under that account, with the config.
	require.NotNil(t, dep.Spec.Replicas)
	require.GreaterOrEqual(t, *dep.Spec.Replicas, int32(2))
	require.Equal(t, sa.Name, dep.Spec.Template.Spec.ServiceAccountName)
	require.Equal(t, dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
	var mountPath string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
				if m.Name == v.Name {
					mountPath = m.MountPath
				}
			}
		}
	}
	require.NotEmpty(t, mountPath, "the ConfigMap is mounted")
	proxy := dep.Spec.Template.Spec.Containers[0]
	require.Contains(t, proxy.Args, mountPath+"/config.json")

	// The proxy config: valid JSON naming the headless Service and its port.
	raw, ok := cm.Data["config.json"]
	require.True(t, ok)
	var cfg proxyConfig
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&cfg))
	require.NotZero(t, cfg.HRWSeed, "replicas must share an explicit seed")
	require.Len(t, cfg.Services, 1)
	svc := cfg.Services[0]
	require.NotNil(t, svc.Kubernetes)
	require.Nil(t, svc.Backends, "kubernetes replaces backends")
	require.Empty(t, svc.BackendsFile)
	require.Equal(t, ns, svc.Kubernetes.Namespace)
	require.Equal(t, headless.Name, svc.Kubernetes.Service)
	require.Equal(t, backendPort.Name, svc.Kubernetes.PortName)
	require.Empty(t, svc.Kubernetes.Kubeconfig, "in-cluster config")
	age, err := time.ParseDuration(svc.MaxRegistryAge)
	require.NoError(t, err)
	require.Positive(t, age, "freshness on: an unreachable API server stops new handshakes")
	_, err = New(Config{Client: newCluster(t).cs, Namespace: svc.Kubernetes.Namespace, Service: svc.Kubernetes.Service, PortName: svc.Kubernetes.PortName})
	require.NoError(t, err, "the source accepts the config")
	listenPort, err := strconv.Atoi(svc.Listen[strings.LastIndexByte(svc.Listen, ':')+1:])
	require.NoError(t, err, svc.Listen)

	// The load balancer: UDP to the proxies, keeping client addresses.
	require.Equal(t, corev1.ServiceExternalTrafficPolicyLocal, lb.Spec.ExternalTrafficPolicy)
	require.True(t, labels.SelectorFromSet(lb.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)))
	require.False(t, labels.SelectorFromSet(lb.Spec.Selector).Matches(podLabels), "the load balancer does not reach the backends")
	require.Len(t, lb.Spec.Ports, 1)
	lbPort := lb.Spec.Ports[0]
	require.Equal(t, corev1.ProtocolUDP, lbPort.Protocol)
	require.True(t, slices.ContainsFunc(proxy.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == lbPort.TargetPort.StrVal && p.Protocol == corev1.ProtocolUDP && p.ContainerPort == int32(listenPort)
	}), "the load balancer targets the port cidproxy listens on")

	checkCIDKeys(t, objs, svc.CIDCodec, svc.CIDKeysFile, dep, sts)

	// Health: ready and live on the metrics port, where /readyz and /livez
	// are served.
	metricsPort := proxy.Ports[slices.IndexFunc(proxy.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })]
	require.Equal(t, cfg.MetricsListen, fmt.Sprintf(":%d", metricsPort.ContainerPort), "the metrics port is metrics_listen's")
	for _, pr := range []struct {
		probe *corev1.Probe
		path  string
	}{{proxy.ReadinessProbe, "/readyz"}, {proxy.LivenessProbe, "/livez"}} {
		require.NotNil(t, pr.probe, pr.path)
		require.NotNil(t, pr.probe.HTTPGet, pr.path)
		require.Equal(t, pr.path, pr.probe.HTTPGet.Path)
		require.Equal(t, intstr.FromString("metrics"), pr.probe.HTTPGet.Port)
	}

	checkNetworkPolicies(t, ofType[*networkingv1.NetworkPolicy](objs), dep, sts, backend, proxy, lbPort.TargetPort.StrVal)
}

// checkNetworkPolicies: the backends take datagrams on their port from the
// cidproxy pods only; the proxies take the service port from anyone, UDP
// from the backends, and the metrics port from the monitoring namespace
// only. Every rule is checked for what it admits, not only for being there.
func checkNetworkPolicies(t *testing.T, pols []*networkingv1.NetworkPolicy, dep *appsv1.Deployment, sts *appsv1.StatefulSet,
	backend, proxy corev1.Container, servicePort string) {
	t.Helper()
	proxyPods, backendPods := labels.Set(dep.Spec.Template.Labels), labels.Set(sts.Spec.Template.Labels)
	selects := func(sel *metav1.LabelSelector, pod labels.Set) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		require.NoError(t, err)
		return s.Matches(pod)
	}
	var forBackends, forProxies *networkingv1.NetworkPolicy
	for _, p := range pols {
		b, pr := selects(&p.Spec.PodSelector, backendPods), selects(&p.Spec.PodSelector, proxyPods)
		require.False(t, b && pr, "%s selects both tiers", p.Name)
		require.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, p.Spec.PolicyTypes,
			"%s: ingress only (an egress rule would have to let the proxies' probes and API watch out)", p.Name)
		switch {
		case b:
			require.Nil(t, forBackends, "one policy for the backends")
			forBackends = p
		case pr:
			require.Nil(t, forProxies, "one policy for the proxies")
			forProxies = p
		}
	}
	require.NotNil(t, forBackends, "a NetworkPolicy selects the backend pods")
	require.NotNil(t, forProxies, "a NetworkPolicy selects the cidproxy pods")

	// Backends: one rule, from the proxy pods (in this namespace: a peer
	// without namespaceSelector), to the backend's UDP port.
	require.Len(t, forBackends.Spec.Ingress, 1)
	rule := forBackends.Spec.Ingress[0]
	require.Len(t, rule.From, 1)
	peer := rule.From[0]
	require.Nil(t, peer.NamespaceSelector, "same namespace only")
	require.Nil(t, peer.IPBlock)
	require.NotNil(t, peer.PodSelector)
	require.True(t, selects(peer.PodSelector, proxyPods), "the backends admit the cidproxy pods")
	require.False(t, selects(peer.PodSelector, backendPods), "and not each other")
	require.False(t, selects(peer.PodSelector, labels.Set{}), "and not any pod")
	require.Len(t, rule.Ports, 1)
	require.NotNil(t, rule.Ports[0].Protocol)
	require.Equal(t, corev1.ProtocolUDP, *rule.Ports[0].Protocol)
	require.Equal(t, backend.Ports[0].Name, rule.Ports[0].Port.StrVal, "the backend's PPv2 port")

	// Proxies: whatever admits the metrics port admits the monitoring
	// namespace only; the service port is open; the backends reach UDP.
	var metricsPort, udpPort int32
	for _, p := range proxy.Ports {
		switch {
		case p.Name == "metrics":
			metricsPort = p.ContainerPort
		case p.Name == servicePort:
			udpPort = p.ContainerPort
		}
	}
	covers := func(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, name string, num int32) bool {
		if len(ports) == 0 {
			return true // all ports
		}
		for _, p := range ports {
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if pp == proto && (p.Port == nil || p.Port.StrVal == name || (p.Port.Type == intstr.Int && p.Port.IntVal == num)) {
				return true
			}
		}
		return false
	}
	monitoring := labels.Set{"kubernetes.io/metadata.name": "monitoring"}
	var metricsRules, serviceOpen, backendsIn int
	for _, r := range forProxies.Spec.Ingress {
		if covers(r.Ports, corev1.ProtocolTCP, "metrics", metricsPort) {
			metricsRules++
			require.NotEmpty(t, r.From, "the metrics port is not open to all")
			for _, p := range r.From {
				require.Nil(t, p.IPBlock, "no address block reaches the metrics port")
				require.Nil(t, p.PodSelector, "no pod selector (this namespace's pods) reaches the metrics port")
				require.NotNil(t, p.NamespaceSelector)
				require.True(t, selects(p.NamespaceSelector, monitoring), "the monitoring namespace")
				require.False(t, selects(p.NamespaceSelector, labels.Set{"kubernetes.io/metadata.name": "cidroute"}), "not the tier's own")
				require.False(t, selects(p.NamespaceSelector, labels.Set{}), "not every namespace")
			}
		}
		if covers(r.Ports, corev1.ProtocolUDP, servicePort, udpPort) && len(r.From) == 0 {
			serviceOpen++
		}
		if len(r.From) > 0 && r.From[0].PodSelector != nil && selects(r.From[0].PodSelector, backendPods) {
			require.True(t, covers(r.Ports, corev1.ProtocolUDP, "", 40000), "backends reach the proxies' ephemeral upstream ports")
			backendsIn++
		}
	}
	require.Equal(t, 1, metricsRules, "one rule admits the metrics port")
	require.Equal(t, 1, serviceOpen, "clients from anywhere reach the service port")
	require.Equal(t, 1, backendsIn, "the backends' replies reach the proxies")
}

// checkCIDKeys: with encrypted CIDs, the one Secret holds a valid key file
// and is mounted, read-only and without world access, where the proxies'
// cid_keys_file and the backends' -cid-keys point, in pods whose fsGroup
// lets their non-root user read it.
func checkCIDKeys(t *testing.T, objs []runtime.Object, codec, file string, dep *appsv1.Deployment, sts *appsv1.StatefulSet) {
	t.Helper()
	secrets := ofType[*corev1.Secret](objs)
	if codec == "" {
		require.Empty(t, secrets, "a Secret without encrypted CIDs")
		return
	}
	require.Equal(t, "quic-lb-encrypted", codec)
	require.Len(t, secrets, 1)
	secret := secrets[0]
	dir, name := filepath.Dir(file), filepath.Base(file)
	require.True(t, filepath.IsAbs(file), file)
	content, ok := secret.StringData[name]
	if !ok {
		content = string(secret.Data[name])
	}
	var keys struct {
		Active *int              `json:"active"`
		Keys   map[string]string `json:"keys"`
	}
	dec := json.NewDecoder(strings.NewReader(content))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&keys), "the Secret's %s", name)
	require.NotNil(t, keys.Active)
	require.Contains(t, keys.Keys, strconv.Itoa(*keys.Active), "the active config ID has a key")
	for id, k := range keys.Keys {
		n, err := strconv.Atoi(id)
		require.NoError(t, err)
		require.True(t, n >= 0 && n <= 6, "config ID %s", id)
		_, err = hex.DecodeString(k)
		require.NoError(t, err, "config %s", id)
		require.Len(t, k, 32, "config %s: AES-128", id)
	}
	for _, pod := range []struct {
		what string
		spec corev1.PodSpec
	}{{"cidproxy", dep.Spec.Template.Spec}, {"backend", sts.Spec.Template.Spec}} {
		var vol *corev1.Volume
		for i, v := range pod.spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == secret.Name {
				vol = &pod.spec.Volumes[i]
			}
		}
		require.NotNil(t, vol, "%s mounts the Secret", pod.what)
		require.NotNil(t, vol.Secret.DefaultMode, pod.what)
		// The kubelet ORs 0440 into it for the fsGroup: still no group
		// write and no world access, as cidkeys requires.
		mode := *vol.Secret.DefaultMode | 0o440
		require.Zero(t, mode&0o037, "%s: defaultMode %04o", pod.what, *vol.Secret.DefaultMode)
		require.NotNil(t, pod.spec.SecurityContext, pod.what)
		require.NotNil(t, pod.spec.SecurityContext.FSGroup, "%s: fsGroup lets the non-root user read the root-owned key file", pod.what)
		c := pod.spec.Containers[0]
		require.True(t, slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == vol.Name && m.MountPath == dir && m.ReadOnly
		}), "%s mounts the Secret read-only at %s", pod.what, dir)
	}
	args := sts.Spec.Template.Spec.Containers[0].Args
	i := slices.Index(args, "-cid-keys")
	require.True(t, i >= 0 && i+1 < len(args) && args[i+1] == file, "the backends read the proxies' key file: %q", args)
}

// TestOriginalSourceManifest: the original-source deployment
// (examples/kubernetes/original-source, docs/original-source.md) decodes
// strictly; its proxy runs on the node's network with CAP_NET_ADMIN, after
// an init container that installs the return route for the backends' pod
// network and port; its config is original-source mode on the backends'
// headless Service; and the backends run on the proxy's nodes, whose
// routing brings their replies back. registry/kubernetes/cluster's
// TestOriginalSourceManifestDryRun has the API server accept it.
func TestOriginalSourceManifest(t *testing.T) {
	dir := filepath.Join(manifestsDir, "original-source")
	if _, err := os.Stat(dir); err != nil {
		if _, err := os.Stat("../../go.mod"); err == nil {
			t.Fatalf("examples/kubernetes/original-source missing: %v", err)
		}
		t.Skip("not in the cidroute repository")
	}
	objs := loadManifests(t, dir)
	ds := single[*appsv1.DaemonSet](t, objs)
	sts := single[*appsv1.StatefulSet](t, objs)
	svc := single[*corev1.Service](t, objs)
	var cfgMap, routes *corev1.ConfigMap
	for _, cm := range ofType[*corev1.ConfigMap](objs) {
		if _, ok := cm.Data["config.json"]; ok {
			cfgMap = cm
		} else {
			routes = cm
		}
	}
	require.NotNil(t, cfgMap, "the proxy config")
	require.NotNil(t, routes, "the return route's settings")

	pod := ds.Spec.Template.Spec
	require.True(t, pod.HostNetwork, "the proxy on the node's network, where replies come back")
	require.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	require.NotEmpty(t, pod.NodeSelector)
	require.Equal(t, pod.NodeSelector, sts.Spec.Template.Spec.NodeSelector, "the backends on the proxy's nodes")
	hasNetAdmin := func(c corev1.Container) bool {
		sc := c.SecurityContext
		return sc != nil && sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "NET_ADMIN") &&
			slices.Contains(sc.Capabilities.Drop, "ALL") && sc.RunAsUser != nil && *sc.RunAsUser == 0
	}
	require.Len(t, pod.InitContainers, 1)
	init := pod.InitContainers[0]
	require.True(t, hasNetAdmin(init), "the init container may change the node's routing, nothing more")
	script := strings.Join(init.Args, " ")
	require.Contains(t, script, `ip rule add priority 100 from "$BACKEND_CIDR" ipproto udp sport "$BACKEND_PORT" lookup "$ROUTE_TABLE"`)
	require.Contains(t, script, `ip route replace local 0.0.0.0/0 dev lo table "$ROUTE_TABLE"`)
	require.Len(t, init.EnvFrom, 1)
	require.Equal(t, routes.Name, init.EnvFrom[0].ConfigMapRef.Name)
	for _, k := range []string{"BACKEND_CIDR", "BACKEND_PORT", "ROUTE_TABLE"} {
		require.NotEmpty(t, routes.Data[k], k)
	}
	proxy := pod.Containers[0]
	require.True(t, hasNetAdmin(proxy), "IP_TRANSPARENT needs CAP_NET_ADMIN in the effective set: root with that one")
	require.Equal(t, "cidproxy", pod.ServiceAccountName, "rbac.yaml's account: list and watch on EndpointSlices")

	raw := cfgMap.Data["config.json"]
	var cfg proxyConfig
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&cfg))
	require.Len(t, cfg.Services, 1)
	s := cfg.Services[0]
	require.NotNil(t, s.ProxyProtocol)
	require.False(t, *s.ProxyProtocol, "transparent mode")
	require.True(t, s.OriginalSource)
	require.NotNil(t, s.Kubernetes)
	require.Equal(t, svc.Name, s.Kubernetes.Service)
	require.Equal(t, svc.Namespace, s.Kubernetes.Namespace)
	require.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	require.Len(t, svc.Spec.Ports, 1)
	require.Equal(t, svc.Spec.Ports[0].Name, s.Kubernetes.PortName)
	require.Equal(t, routes.Data["BACKEND_PORT"], strconv.Itoa(int(svc.Spec.Ports[0].Port)), "the rule names the backends' port")
	require.Equal(t, svc.Name, sts.Spec.ServiceName)
	require.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)))
	listenPort := s.Listen[strings.LastIndexByte(s.Listen, ':')+1:]
	require.Equal(t, listenPort, strconv.Itoa(int(proxy.Ports[0].HostPort)), "devices reach the listen port on the node")
}
