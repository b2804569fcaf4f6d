package driver

// What Kubernetes 1.36-1.37 gives a time-sliced device, against the real
// control plane: events pushed to the pods, device taints, "QPU A, else
// B" (prioritized list), a gang across two QPU nodes with one start.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// onNode pins a pod to a node (the tests' nodes all publish a qpu0).
func onNode(p *corev1.Pod, node string) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// waitPushed waits (up to timeout) for an events.event on the pod's
// connection, pinging with agent.hello (which reads them on the way):
// nothing the pod sends asks qrtd about the job.
func waitPushed(t *testing.T, pod *podConn, timeout time.Duration) pushedEvent {
	t.Helper()
	waitFor(t, "job.finished pushed to "+pod.name, timeout, func() bool {
		if len(pod.events) > 0 {
			return true
		}
		pod.ok("agent.hello", map[string]any{"client": "pod"}, nil)
		time.Sleep(50 * time.Millisecond)
		return len(pod.events) > 0
	})
	return pod.events[0]
}

func TestRealClusterAPodHearsJobFinishedPushedFromQrtdsOwnStream(t *testing.T) {
	e := realCluster(t)
	sim := e.addNode("qpu-node-ev", "nv", periodic)
	wo := e.addNode("qpu-node-wo", "nw", writeOnly)
	e.namespace("events")
	e.slotTemplate("events", "slot", slotParams(`"duration":"20ms","notBefore":"3s","deadline":"60s"`))
	for _, c := range []struct {
		n     *e2eNode
		state string
	}{{sim, "completed"}, {wo, "sent"}} {
		pod := e.createPod(onNode(podWith("events", "job-"+c.state, "", "slot"), c.n.name))
		_, p, _ := e.waitRunning(pod, podStart, c.n)
		pc := startPod(t, c.n.rc, e.claimOf(pod))
		pc.ok("events.subscribe", map[string]any{"topics": []string{"job.finished"}}, nil)
		var sub struct {
			State string `json:"state"`
		}
		pc.ok("jobs.submit", map[string]any{"reservation_id": p.Container.ReservationID,
			"fencing_token": p.Container.Token, "payload": payload(c.state)}, &sub)
		if sub.State != "committed" {
			t.Fatalf("%s: jobs.submit: %s", c.n.name, sub.State)
		}
		// The driver asks qrtd nothing about the job: the event comes
		// from qrtd's own stream (no jobs.status, which the driver polled
		// every 200 ms before).
		polls := c.n.lab.metric("qrt_rpc_requests_total", `method="jobs.status"`)
		ev := waitPushed(t, pc, 30*time.Second)
		after := c.n.lab.metric("qrt_rpc_requests_total", `method="jobs.status"`)
		t.Logf("%s: job.finished %+v; jobs.status at qrtd meanwhile: %v", c.n.name, ev, after-polls)
		if ev.Type != "job.finished" || ev.Data.ReservationID != p.Container.ReservationID || ev.Data.State != c.state {
			t.Errorf("%s: pushed %+v, want job.finished of reservation %d, state %s", c.n.name, ev, p.Container.ReservationID, c.state)
		}
		if after != polls {
			t.Errorf("%s: %v jobs.status calls reached qrtd while the pod waited", c.n.name, after-polls)
		}
		e.deletePod(pod)
	}
}

// slotTemplateSpec makes a template of spec.
func (e *e2e) templateOf(ns, name string, spec resourceapi.ResourceClaimSpec) {
	e.t.Helper()
	_, err := e.c.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(context.Background(), &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// taintOf is the device's taint with the key (nil: none).
func taintOf(d resourceapi.Device, key string) *resourceapi.DeviceTaint {
	for i := range d.Taints {
		if d.Taints[i].Key == key {
			return &d.Taints[i]
		}
	}
	return nil
}

func TestRealClusterAQPUWhoseEndpointIsDownIsTaintedNoSchedule(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-down", "ns", periodic)
	b := e.addNode("qpu-node-up", "nu", periodic)
	e.namespace("taints")
	stopProc(a.lab.sim) // the control electronics go away
	waitFor(t, "the endpoint-down taint on "+a.name, 30*time.Second, func() bool {
		tt := taintOf(a.slice()["qpu0"], TaintEndpointDown)
		return tt != nil && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
	// A claim that does not tolerate it goes to the other node.
	e.slotTemplate("taints", "slot", slotParams(`"duration":"20ms","notBefore":"3s","deadline":"60s"`))
	plain := e.createPod(podWith("taints", "plain", "", "slot"))
	if n, _, _ := e.waitRunning(plain, podStart, a, b); n != b {
		t.Fatalf("a pod was given the QPU whose endpoint is down")
	}
	// One that tolerates it may book the QPU ahead of the outage (qrtd
	// accepts a start beyond timeline.endpoint_down_horizon_ns, 30 s):
	// what a DeviceClass selector on endpointUp could not allow.
	spec := e.slotClaimSpec(slotParams(`"duration":"20ms","notBefore":"45s","deadline":"120s"`))
	spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: TaintEndpointDown,
		Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	e.templateOf("taints", "ahead", spec)
	ahead := e.createPod(onNode(podWith("taints", "ahead", "", "ahead"), a.name))
	_, p, _ := e.waitRunning(ahead, podStart, a)
	if st := a.lab.status("taints", p.Container.ReservationID); st.State != "held" {
		t.Errorf("the tolerating pod's reservation on the down QPU: %+v", st)
	}
	a.lab.sim = a.lab.startSim()
	waitFor(t, "the taint gone from "+a.name, 30*time.Second, func() bool {
		return taintOf(a.slice()["qpu0"], TaintEndpointDown) == nil
	})
}

func TestRealClusterAnAdminsDeviceTaintRuleIsHonoured(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-maint", "nm", periodic)
	b := e.addNode("qpu-node-free", "nf", periodic)
	e.namespace("maint")
	ctx := context.Background()
	rules := e.c.Admin.ResourceV1().DeviceTaintRules()
	rule := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "qpu-maintenance"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(DriverName), Pool: ptr.To(a.name), Device: ptr.To("qpu0")},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Value: "recalibration", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}
	if _, err := rules.Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rules.Delete(context.Background(), rule.Name, metav1.DeleteOptions{}) })
	e.slotTemplate("maint", "slot", slotParams(`"duration":"20ms","notBefore":"3s","deadline":"60s"`))
	// The scheduler honours the rule.
	first := e.createPod(podWith("maint", "first", "", "slot"))
	if n, _, _ := e.waitRunning(first, podStart, a, b); n != b {
		t.Fatalf("a pod was given the QPU under maintenance")
	}
	// The driver honours it too: a claim the scheduler allocated the QPU
	// before the rule came (here: while the node's driver was restarting)
	// is refused, not reserved.
	if err := rules.Delete(ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rule gone", 10*time.Second, func() bool {
		_, err := rules.Get(ctx, rule.Name, metav1.GetOptions{})
		return err != nil
	})
	a.stopDriver()
	reserves := a.lab.metric("qrt_rpc_requests_total", `method="slots.reserve"`)
	second := e.createPod(onNode(podWith("maint", "second", "", "slot"), a.name))
	var claim *resourceapi.ResourceClaim
	waitFor(t, "the second pod's claim allocated", 30*time.Second, func() bool {
		cur, err := e.c.Admin.CoreV1().Pods("maint").Get(ctx, second.Name, metav1.GetOptions{})
		if err != nil || len(cur.Status.ResourceClaimStatuses) == 0 {
			return false
		}
		claim, err = e.c.Admin.ResourceV1().ResourceClaims("maint").Get(ctx, *cur.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		return err == nil && claim.Status.Allocation != nil
	})
	rule.ResourceVersion = ""
	if _, err := rules.Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := e.c.Admin.ResourceV1().ResourceClaims("maint").Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + claim.Name, ResourceVersion: claim.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	a.startDriver()
	var why *metav1.Condition
	timeout := time.After(30 * time.Second)
	for why == nil {
		select {
		case ev := <-w.ResultChan():
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok {
				continue
			}
			for _, st := range c.Status.Devices {
				if cond := meta.FindStatusCondition(st.Conditions, ConditionReserveFailed); cond != nil && cond.Status == metav1.ConditionTrue {
					why = cond
				}
				if meta.IsStatusConditionTrue(st.Conditions, ConditionReserved) {
					t.Fatalf("the driver reserved a claim allocated a device under maintenance")
				}
			}
		case <-timeout:
			t.Fatalf("no %s on the claim allocated the QPU under maintenance", ConditionReserveFailed)
		}
	}
	t.Logf("the driver refused: %s: %s", why.Reason, why.Message)
	if why.Reason != "DeviceTainted" || !strings.Contains(why.Message, "qpu-maintenance") {
		t.Errorf("refused as %s: %s", why.Reason, why.Message)
	}
	if got := a.lab.metric("qrt_rpc_requests_total", `method="slots.reserve"`); got != reserves {
		t.Errorf("%v slots.reserve reached the QPU under maintenance", got-reserves)
	}
}

// firstAvailableSpec is "QPU A if a booking there waits less than a
// minute, else QPU B" (deploy/example-firstavailable.yaml's selectors).
func (e *e2e) firstAvailableSpec(params string) resourceapi.ResourceClaimSpec {
	objs, err := manifestObjects(deployFile("example-firstavailable.yaml"))
	if err != nil {
		e.t.Fatal(err)
	}
	spec := objs[0].(*resourceapi.ResourceClaimTemplate).Spec.Spec
	spec.Devices.Config[0].Opaque.Parameters.Raw = []byte(params)
	return spec
}

func TestRealClusterAClaimTakesQPUBWhenQPUACannotGiveASlotBeforeItsDeadline(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-pa", "pa", pushed, "qpu-a")
	b := e.addNode("qpu-node-pb", "pb", periodic, "qpu-b")
	e.namespace("prio")
	// QPU A's next calibration window opens in three minutes: nothing
	// booked now can start before.
	now := time.Now()
	if err := a.lab.call("calibration.update", map[string]any{"qpu": "qpu-a", "windows": []map[string]any{{
		"calibration_id": 1, "valid_from_ns": now.Add(3 * time.Minute).UnixNano(), "valid_until_ns": now.Add(10 * time.Minute).UnixNano(),
		"f0": 0.99}}}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "QPU A's backlog published", 30*time.Second, func() bool {
		return intOf(a.slice()["qpu-a"], "backlogMs") >= 120000
	})
	params := slotParams(`"duration":"20ms","notBefore":"3s","deadline":"60s"`)
	e.templateOf("prio", "a-else-b", e.firstAvailableSpec(params))
	pod := e.createPod(podWith("prio", "job", "", "a-else-b"))
	n, _, took := e.waitRunning(pod, podStart, a, b)
	claim := e.claimOf(pod)
	got := claim.Status.Allocation.Devices.Results[0].Request
	t.Logf("QPU A busy for 3 min: Running on %s (request %s) in %v", n.name, got, took.Round(time.Millisecond))
	if n != b || got != "qpu/qpu-b" {
		t.Fatalf("the claim went to %s as %s, want %s as qpu/qpu-b", n.name, got, b.name)
	}
	// A free again: the next claim takes A.
	now = time.Now()
	if err := a.lab.call("calibration.update", map[string]any{"qpu": "qpu-a", "windows": []map[string]any{{
		"calibration_id": 2, "valid_from_ns": now.UnixNano(), "valid_until_ns": now.Add(10 * time.Minute).UnixNano(),
		"f0": 0.99}}}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "QPU A's backlog gone", 30*time.Second, func() bool {
		return intOf(a.slice()["qpu-a"], "backlogMs") == 0
	})
	next := e.createPod(podWith("prio", "next", "", "a-else-b"))
	if n, _, _ := e.waitRunning(next, podStart, a, b); n != a {
		t.Fatalf("with QPU A free the claim went to %s", n.name)
	}
}

// A calibration block on QPU A: the driver taints A's device NoSchedule
// for the block (from BindingCheck + PodStart before it), so the
// prioritized list "A, else B" takes B, though A's backlog is nothing; the
// taint is gone after the block.
func TestRealClusterACalibrationBlockOnQPUATaintsItAndTheClaimTakesQPUB(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-ka", "ka", pushed, "qpu-a")
	b := e.addNode("qpu-node-kb", "kb", periodic, "qpu-b")
	e.namespace("calib")
	base := a.lab.windowFromNow(t, "qpu-a", 1, 10*time.Minute)
	waitFor(t, "QPU A free now", 30*time.Second, func() bool {
		return intOf(a.slice()["qpu-a"], "backlogMs") == 0
	})
	blk := a.lab.requestBlock(t, "qpu-a", "k8s", 20*time.Second, base.Add(30*time.Second))
	if blk.State != "scheduled" {
		t.Fatalf("block %+v", blk)
	}
	waitFor(t, "the calibration taint on QPU A", 30*time.Second, func() bool {
		tt := taintOf(a.slice()["qpu-a"], TaintCalibration)
		return tt != nil && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
	if intOf(a.slice()["qpu-a"], "backlogMs") >= 60000 {
		t.Fatalf("QPU A's backlog excludes it anyway: the taint would prove nothing")
	}
	params := slotParams(`"duration":"20ms","notBefore":"3s","deadline":"60s"`)
	e.templateOf("calib", "a-else-b", e.firstAvailableSpec(params))
	pod := e.createPod(podWith("calib", "job", "", "a-else-b"))
	n, _, took := e.waitRunning(pod, podStart, a, b)
	got := e.claimOf(pod).Status.Allocation.Devices.Results[0].Request
	t.Logf("QPU A calibrating from %s: Running on %s (request %s) in %v", rfc(time.Unix(0, blk.StartNS)), n.name, got,
		took.Round(time.Millisecond))
	if n != b || got != "qpu/qpu-b" {
		t.Fatalf("the claim went to %s as %s, want %s as qpu/qpu-b", n.name, got, b.name)
	}
	waitFor(t, "the calibration taint gone from QPU A after the block", time.Until(time.Unix(0, blk.EndNS))+30*time.Second,
		func() bool {
			return time.Now().UnixNano() >= blk.EndNS && taintOf(a.slice()["qpu-a"], TaintCalibration) == nil
		})
}

// startGangController runs the gang controller under the deploy's
// ServiceAccount qrt-dra-gang-controller until the test ends.
func (e *e2e) startGangController() {
	e.t.Helper()
	cfg, err := e.c.ServiceAccountConfig(context.Background(), "qrtd-system", "qrt-dra-gang-controller", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunGangController(ctx, kube, GangConfig{}) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("gang controller: %v", err)
		}
	})
}

func TestRealClusterAGangAcrossTwoQPUNodesStartsAtOneInstant(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-ga", "ga", periodic)
	b := e.addNode("qpu-node-gb", "gb", periodic)
	e.startGangController()
	e.namespace("gang")
	created := time.Now()
	if err := applyManifest(e.c.Admin, deployFile("example-gang.yaml"), "gang"); err != nil {
		t.Fatal(err)
	}
	var starts []int64
	nodes := map[string]bool{}
	for _, name := range []string{"qpu-gang-0", "qpu-gang-1"} {
		pod, err := e.c.Admin.CoreV1().Pods("gang").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n, p, _ := e.waitRunning(pod, 2*podStart, a, b)
		nodes[n.name] = true
		st := n.lab.status("gang", p.Container.ReservationID)
		if st.State != "held" || st.StartNS != p.Container.Start {
			t.Errorf("%s on %s: qrtd holds %+v, the container has start %d", name, n.name, st, p.Container.Start)
		}
		starts = append(starts, p.Container.Start)
	}
	t.Logf("gang of 2: both Running %v after creation, on %d nodes, starts %v", time.Since(created).Round(time.Millisecond), len(nodes), starts)
	if len(nodes) != 2 || starts[0] != starts[1] || starts[0] == 0 {
		t.Fatalf("the gang runs on %v with starts %v: not two nodes at one instant", nodes, starts)
	}
}

func TestRealClusterAGangWithoutACommonStartBindsNone(t *testing.T) {
	e := realCluster(t)
	a := e.addNode("qpu-node-gc", "gc", pushed)
	b := e.addNode("qpu-node-gd", "gd", pushed)
	// A has one window from now on (so it holds any start the gang plans);
	// B's next window opens in 3 minutes: past the claims' 60 s deadline.
	now := time.Now()
	if err := a.lab.call("calibration.update", map[string]any{"qpu": "qpu0", "windows": []map[string]any{{
		"calibration_id": 1, "valid_from_ns": now.UnixNano(), "valid_until_ns": now.Add(10 * time.Minute).UnixNano(),
		"f0": 0.99}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.lab.call("calibration.update", map[string]any{"qpu": "qpu0", "windows": []map[string]any{{
		"calibration_id": 1, "valid_from_ns": now.Add(3 * time.Minute).UnixNano(), "valid_until_ns": now.Add(10 * time.Minute).UnixNano(),
		"f0": 0.99}}}, nil); err != nil {
		t.Fatal(err)
	}
	e.startGangController()
	e.namespace("nogang")
	ctx := context.Background()
	w, err := e.c.Admin.ResourceV1().ResourceClaims("nogang").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := applyManifest(e.c.Admin, deployFile("example-gang.yaml"), "nogang"); err != nil {
		t.Fatal(err)
	}
	// Watch the rounds: A holds, B refuses with its next start (3 min),
	// the next round's start is past the deadline: abort, both claims fail.
	var heldOnA []uint64
	aborted := map[string]string{}
	timeout := time.After(60 * time.Second)
	for len(aborted) < 2 {
		select {
		case ev := <-w.ResultChan():
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok || c.Status.Allocation == nil {
				continue
			}
			for _, st := range c.Status.Devices {
				if st.Pool == a.name {
					if _, s := deviceStatusOf(t, c); s.ReservationID != 0 && meta.IsStatusConditionTrue(st.Conditions, ConditionGangHeld) {
						heldOnA = append(heldOnA, s.ReservationID)
					}
				}
				if cond := meta.FindStatusCondition(st.Conditions, ConditionReserveFailed); cond != nil && cond.Status == metav1.ConditionTrue {
					aborted[c.Name] = cond.Reason + ": " + cond.Message
				}
				if meta.IsStatusConditionTrue(st.Conditions, ConditionReserved) {
					t.Fatalf("claim %s reserved: a gang member bound without a common start", c.Name)
				}
			}
		case <-timeout:
			t.Fatalf("no abort on both claims in 60 s (aborted: %v)", aborted)
		}
	}
	for name, why := range aborted {
		t.Logf("%s: %s", name, why)
		if !strings.HasPrefix(why, "GangAborted") {
			t.Errorf("claim %s failed as %s", name, why)
		}
	}
	for _, name := range []string{"qpu-gang-0", "qpu-gang-1"} {
		if pod, err := e.c.Admin.CoreV1().Pods("nogang").Get(ctx, name, metav1.GetOptions{}); err != nil || pod.Spec.NodeName != "" {
			t.Errorf("pod %s bound to %q (%v)", name, pod.Spec.NodeName, err)
		}
	}
	if len(heldOnA) == 0 {
		t.Errorf("A never held its part: the abort proved nothing")
	}
	for _, id := range heldOnA {
		waitFor(t, fmt.Sprintf("A's hold %d released", id), 30*time.Second, func() bool {
			return a.lab.status("nogang", id).State != "held"
		})
	}
	// The scheduler deallocates the claims and tries again: each round ends
	// the same way while B has no window; the pods are deleted meanwhile.
	for _, name := range []string{"qpu-gang-0", "qpu-gang-1"} {
		_ = e.c.Admin.CoreV1().Pods("nogang").Delete(ctx, name, metav1.DeleteOptions{})
	}
}
