package driver

// What the real control plane showed, each against it: a relative slot is
// still ahead when the pod runs; a claim allocated again gets a new
// reservation; the example schedules on the demo profile; the heartbeat
// stops once the job committed.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// slotTemplate is a ResourceClaimTemplate (or, claim true, a
// ResourceClaim) of one QPU of the class with the given SlotParameters.
func (e *e2e) slotClaimSpec(params string) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "qpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DriverName}}},
		Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"qpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}},
	}}
}

func (e *e2e) slotTemplate(ns, name, params string) {
	e.t.Helper()
	_, err := e.c.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(context.Background(), &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: e.slotClaimSpec(params)}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *e2e) slotResourceClaim(ns, name, params string) {
	e.t.Helper()
	_, err := e.c.Admin.ResourceV1().ResourceClaims(ns).Create(context.Background(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: e.slotClaimSpec(params)}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// submitThroughClaim: the pod's container submits a job into its
// reservation through its claim socket; the reply's state or error.
func submitThroughClaim(t *testing.T, n *e2eNode, claim *resourceapi.ResourceClaim, p *e2ePod, tag string) (string, *rpcError) {
	t.Helper()
	pod := startPod(t, n.rc, claim)
	raw, e := pod.call("jobs.submit", map[string]any{"reservation_id": p.Container.ReservationID,
		"fencing_token": p.Container.Token, "payload": payload(tag)})
	if e != nil {
		return "", e
	}
	var sub struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(raw, &sub)
	return sub.State, nil
}

func TestRealClusterARelativeSlotIsStillAheadWhenThePodRuns(t *testing.T) {
	e := realCluster(t)
	n := e.addNode("qpu-node-rel", "nr", periodic)
	e.namespace("rel-slot")
	// No notBefore: "as soon as the pod can use it", within a minute.
	e.slotTemplate("rel-slot", "soon", slotParams(`"duration":"20ms","deadline":"60s"`))
	pod := e.createPod(podWith("rel-slot", "soon", "", "soon"))
	_, p, took := e.waitRunning(pod, podStart, n)
	start := time.Unix(0, p.Container.Start)
	t.Logf("created -> Running %v; the slot starts %v after Running", took.Round(time.Millisecond), start.Sub(p.Running).Round(time.Millisecond))
	if !start.After(p.Running) {
		t.Errorf("the slot started at %s, %v before the pod ran (%s)", start.Format(time.RFC3339Nano),
			p.Running.Sub(start).Round(time.Millisecond), p.Running.Format(time.RFC3339Nano))
	}
	state, rerr := submitThroughClaim(t, n, e.claimOf(pod), p, "rel")
	if rerr != nil || state != "committed" {
		t.Errorf("the pod's jobs.submit into its slot: %s %+v", state, rerr)
	}
}

func TestRealClusterAClaimAllocatedAgainGetsANewReservation(t *testing.T) {
	e := realCluster(t)
	n := e.addNode("qpu-node-re", "ne", periodic)
	e.namespace("realloc")
	e.slotResourceClaim("realloc", "shared", slotParams(`"duration":"20ms","notBefore":"2s","deadline":"60s"`))
	// A kubelet slow after it reported the first pod Running: the pod's
	// container (its CDI environment) is what the pod runs with, whatever
	// the kubelet does next.  (It once read as reservation 0: the stand-in
	// kept the container's environment only after the status write.)
	n.mu.Lock()
	n.reported = func(p *corev1.Pod) {
		if p.Name == "first" {
			time.Sleep(2 * time.Second)
		}
	}
	n.mu.Unlock()
	first := e.createPod(podWith("realloc", "first", "shared", ""))
	_, p1, _ := e.waitRunning(first, podStart, n)
	id1 := p1.Container.ReservationID
	e.deletePod(first)
	// The resourceclaim controller takes the pod off the claim and
	// deallocates it; the next pod's allocation is a new one.
	second := e.createPod(podWith("realloc", "second", "shared", ""))
	_, p2, took := e.waitRunning(second, podStart, n)
	t.Logf("second pod on the same claim: created -> Running %v, reservation %d (first %d)", took.Round(time.Millisecond), p2.Container.ReservationID, id1)
	if p2.Container.ReservationID == 0 || p2.Container.ReservationID == id1 {
		t.Fatalf("the second allocation got reservation %d, the first had %d", p2.Container.ReservationID, id1)
	}
	if st := n.lab.status("realloc", id1); st.State == "held" {
		t.Errorf("the first allocation's reservation %d is still held", id1)
	}
	if st := n.lab.status("realloc", p2.Container.ReservationID); st.State != "held" {
		t.Errorf("the second allocation's reservation is %s", st.State)
	}
}

func TestRealClusterTheExampleSchedulesOnTheDemoProfile(t *testing.T) {
	e := realCluster(t)
	n := e.addNode("qpu-node-demo", "nd", demoProfile)
	if _, ok := n.slice()["qpu0"].Attributes["qubits"]; ok {
		t.Fatalf("the demo profile's QPU publishes qubits: not the case this test is for")
	}
	e.namespace("ex-demo")
	if err := applyManifest(e.c.Admin, deployFile("example.yaml"), "ex-demo"); err != nil {
		t.Fatal(err)
	}
	pod, err := e.c.Admin.CoreV1().Pods("ex-demo").Get(context.Background(), "qpu-job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, took := e.waitRunning(pod, podStart, n)
	t.Logf("the example on the demo profile: created -> Running %v", took.Round(time.Millisecond))
}

// metric reads one counter of qrtd's metrics (0 when absent).
func (l *lab) metric(name, labels string) float64 {
	l.t.Helper()
	var m struct {
		Text string `json:"text"`
	}
	if err := l.call("metrics", nil, &m); err != nil {
		l.t.Fatalf("metrics: %v", err)
	}
	text := m.Text
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name+"{"+labels+"}") + ` ([0-9.e+]+)$`)
	got := re.FindStringSubmatch(text)
	if got == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(got[1], 64)
	return v
}

func TestRealClusterTheHeartbeatStopsOnceTheJobCommitted(t *testing.T) {
	e := realCluster(t)
	n := e.addNode("qpu-node-hb", "nh", periodic)
	e.namespace("hb")
	e.slotTemplate("hb", "slot", slotParams(`"duration":"20ms","notBefore":"8s","deadline":"60s"`))
	pod := e.createPod(podWith("hb", "job", "", "slot"))
	_, p, _ := e.waitRunning(pod, podStart, n)
	if state, rerr := submitThroughClaim(t, n, e.claimOf(pod), p, "hb"); rerr != nil || state != "committed" {
		t.Fatalf("jobs.submit: %s %+v", state, rerr)
	}
	// Nothing else is held at this qrtd: over three heartbeat periods
	// (lease/3), no slots.heartbeat reaches it, and none is refused.
	hb := func() (float64, float64) {
		return n.lab.metric("qrt_rpc_requests_total", `method="slots.heartbeat"`),
			n.lab.metric("qrt_rpc_errors_total", `reason="illegal_transition"`)
	}
	// One period for a heartbeat already on its way.
	time.Sleep(n.rc.Lease / 3)
	h0, i0 := hb()
	time.Sleep(3 * n.rc.Lease / 3)
	h1, i1 := hb()
	t.Logf("after the commit: slots.heartbeat %v -> %v, illegal_transition %v -> %v", h0, h1, i0, i1)
	if h1 != h0 || i1 != i0 {
		t.Errorf("the driver still heartbeats a committed reservation: %s", fmt.Sprintf("%v heartbeats, %v refused in 3 periods", h1-h0, i1-i0))
	}
	e.deletePod(pod)
}
