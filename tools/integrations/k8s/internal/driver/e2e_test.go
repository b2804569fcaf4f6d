package driver

// End-to-end against the real control plane (e2e_node_test.go): the
// scheduler allocates from the driver's slices and waits for the binding
// conditions, the resourceclaim controller makes the claims from the
// templates, the driver runs under the deploy's ServiceAccount and RBAC,
// qrtd is real; the kubelet's side is the stand-in.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podStart bounds a pod's create -> Running: the scheduler checks binding
// conditions every 5 s; the rest is a few API round trips.
const podStart = 60 * time.Second

// deviceStatusOf is the claim's device status entry of this driver.
func deviceStatusOf(t *testing.T, c *resourceapi.ResourceClaim) (resourceapi.AllocatedDeviceStatus, SlotStatus) {
	t.Helper()
	for _, st := range c.Status.Devices {
		if st.Driver == DriverName {
			var s SlotStatus
			if st.Data != nil {
				_ = json.Unmarshal(st.Data.Raw, &s)
			}
			return st, s
		}
	}
	t.Fatalf("claim %s has no device status of %s: %+v", c.Name, DriverName, c.Status)
	return resourceapi.AllocatedDeviceStatus{}, SlotStatus{}
}

func TestRealClusterRunsTheExamplePodWithItsReservation(t *testing.T) {
	e := realCluster(t)
	n := e.addNode("qpu-node-a", "na", periodic)
	e.namespace("ex-dev")
	if err := applyManifest(e.c.Admin, deployFile("example.yaml"), "ex-dev"); err != nil {
		t.Fatal(err)
	}
	pod, err := e.c.Admin.CoreV1().Pods("ex-dev").Get(context.Background(), "qpu-job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, p, took := e.waitRunning(pod, podStart, n)
	t.Logf("example pod: created -> Running in %v", took.Round(time.Millisecond))
	claim := e.claimOf(pod)
	st, slot := deviceStatusOf(t, claim)
	if !meta.IsStatusConditionTrue(st.Conditions, ConditionReserved) {
		t.Errorf("claim %s: not %s: %+v", claim.Name, ConditionReserved, st.Conditions)
	}
	if got := p.Container.ReservationID; got == 0 || got != slot.ReservationID {
		t.Errorf("the container's QRT_RESERVATION_ID %d, the claim's status %d", got, slot.ReservationID)
	}
	held := n.lab.status("ex-dev", slot.ReservationID)
	if held.State != "held" || held.Tenant == "" {
		t.Errorf("qrtd holds %+v", held)
	}
	e.deletePod(pod)
	waitFor(t, "the reservation released", 30*time.Second, func() bool {
		return n.lab.status("ex-dev", slot.ReservationID).State != "held"
	})
}
