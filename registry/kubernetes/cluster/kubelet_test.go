package cluster

// The test plays the scheduler and the kubelet of node-a: it binds pods to
// the node and writes their status as a kubelet does (phase, pod IP,
// conditions, container statuses), and at a graceful delete it does what a
// kubelet does when the container has exited: a terminal status, then the
// delete with grace period 0.

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// nodeIP is node-a's address: the pod bridge's, in the traffic tests.
const nodeIP = "10.244.0.1"

// kubelet writes pods as node-a's kubelet would, as the admin on the
// control API server.
type kubelet struct{ c k8s.Interface }

// bind schedules the pod onto node-a, as the scheduler would. Only a bound
// pod's graceful delete waits for its kubelet.
func (k kubelet) bind(ctx context.Context, p *corev1.Pod) error {
	return k.c.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}, metav1.CreateOptions{})
}

// status changes a pod's status with f and writes it, retrying on
// conflicts.
func (k kubelet) status(ctx context.Context, ns, name string, f func(*corev1.Pod)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := k.c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(p)
		_, err = k.c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// running is the status of a pod whose containers run at ip, ready or
// not (the readiness probe's verdict).
func running(ip string, ready bool) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.HostIP, p.Status.HostIPs = nodeIP, []corev1.HostIP{{IP: nodeIP}}
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		setConditions(p, map[corev1.PodConditionType]bool{
			corev1.PodScheduled: true, corev1.PodReadyToStartContainers: true, corev1.PodInitialized: true,
			corev1.ContainersReady: ready, corev1.PodReady: ready,
		})
		started := true
		var cs []corev1.ContainerStatus
		for i, c := range p.Spec.Containers {
			startedAt := now
			if i < len(p.Status.ContainerStatuses) && p.Status.ContainerStatuses[i].State.Running != nil {
				startedAt = p.Status.ContainerStatuses[i].State.Running.StartedAt
			}
			cs = append(cs, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: "docker.io/" + c.Image,
				ContainerID: "containerd://" + string(p.UID) + "-" + c.Name,
				Ready:       ready, Started: &started,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}},
			})
		}
		p.Status.ContainerStatuses = cs
	}
}

// ready changes only the Ready and ContainersReady conditions (and the
// containers' ready flags): a readiness probe's verdict.
func ready(r bool) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		setConditions(p, map[corev1.PodConditionType]bool{corev1.ContainersReady: r, corev1.PodReady: r})
		for i := range p.Status.ContainerStatuses {
			p.Status.ContainerStatuses[i].Ready = r
		}
	}
}

// exited is the status after the containers have exited with code 0: not
// ready, terminal phase (a deleted pod's kubelet reports Succeeded).
func exited(p *corev1.Pod) {
	now := metav1.Now()
	setConditions(p, map[corev1.PodConditionType]bool{corev1.ContainersReady: false, corev1.PodReady: false})
	p.Status.Phase = corev1.PodSucceeded
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		var startedAt metav1.Time
		if cs.State.Running != nil {
			startedAt = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, new(bool)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: startedAt, FinishedAt: now, ContainerID: cs.ContainerID,
		}}
	}
}

func setConditions(p *corev1.Pod, want map[corev1.PodConditionType]bool) {
	now := metav1.Now()
	for typ, v := range want {
		st := corev1.ConditionFalse
		if v {
			st = corev1.ConditionTrue
		}
		found := false
		for i := range p.Status.Conditions {
			c := &p.Status.Conditions[i]
			if c.Type != typ {
				continue
			}
			found = true
			if c.Status != st {
				c.Status, c.LastTransitionTime = st, now
			}
		}
		if !found {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: typ, Status: st, LastTransitionTime: now})
		}
	}
}

// forceDelete deletes the pod with grace period 0, as the kubelet does
// once its containers are gone (and as `kubectl delete --force` does).
func (k kubelet) forceDelete(ctx context.Context, ns, name string, uid types.UID) error {
	zero := int64(0)
	return k.c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid},
	})
}

// headlessService is a StatefulSet's governing Service: headless, the
// pods of app selected, one UDP port named "dtls" (as backend.yaml's).
func headlessService(app string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app.kubernetes.io/name": app},
			Ports: []corev1.ServicePort{{
				Name: "dtls", Port: 5684, TargetPort: intstr.FromString("dtls"), Protocol: corev1.ProtocolUDP,
			}},
		},
	}
}

// statefulPod is pod ordinal of a StatefulSet sts governed by the Service
// svc, as the StatefulSet controller makes it: name and hostname sts-N,
// subdomain svc, the pod-index label.
func statefulPod(sts, svc string, ordinal int) *corev1.Pod {
	name := fmt.Sprintf("%s-%d", sts, ordinal)
	grace := int64(120)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{
			"app.kubernetes.io/name":             svc,
			"apps.kubernetes.io/pod-index":       strconv.Itoa(ordinal),
			"statefulset.kubernetes.io/pod-name": name,
		}},
		Spec: corev1.PodSpec{
			Hostname: name, Subdomain: svc,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "backend", Image: "cidroute/dtls-backend:dev",
				Ports: []corev1.ContainerPort{{Name: "dtls", ContainerPort: 5684, Protocol: corev1.ProtocolUDP}},
			}},
		},
	}
}

// startPod creates a StatefulSet-shaped pod, binds it and reports it
// running at ip, ready or not.
func startPod(t *testing.T, ctx context.Context, k kubelet, p *corev1.Pod, ip string, isReady bool) *corev1.Pod {
	t.Helper()
	got, err := k.c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
	if err := k.bind(ctx, got); err != nil {
		t.Fatalf("binding pod %s: %v", p.Name, err)
	}
	if err := k.status(ctx, p.Namespace, p.Name, running(ip, isReady)); err != nil {
		t.Fatalf("pod %s status: %v", p.Name, err)
	}
	return got
}
