package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The control plane starts, a node registers with its own credential and
// the real scheduler binds a pod to it.
func TestTheControlPlaneSchedulesAPodOnARegisteredNode(t *testing.T) {
	if Bin() == "" {
		t.Skip("QRT_K8S_BIN not given (run-tests.sh builds the control plane and gives it)")
	}
	dir, err := os.MkdirTemp("", "qrt-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	c, err := Start(ctx, Bin(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	t.Logf("control plane ready in %v", c.Started.Round(time.Millisecond))
	if _, err := c.AddNode(ctx, "n1", nil); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if _, err := c.Admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := c.Admin.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err == nil && p.Spec.NodeName == "n1" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod not bound in 60 s: %v\n%s\n%s", err, c.Events(ctx, "default", "p"), Tail(c.Log("kube-scheduler"), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
