package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"qrtd.io/tools/clients/go/qrtd"
)

// bindingClaim is a claim the scheduler allocated to devices published
// with binding conditions: it copied them into the allocation, and the pod
// waits for them before it binds (not reserved for it yet).
func bindingClaim(ns, name, params string, devices ...string) *resourceapi.ResourceClaim {
	c := newClaim(ns, name, params, devices...)
	for i := range c.Status.Allocation.Devices.Results {
		r := &c.Status.Allocation.Devices.Results[i]
		r.BindingConditions = []string{ConditionReserved}
		r.BindingFailureConditions = []string{ConditionReserveFailed}
	}
	c.Status.ReservedFor = nil
	return c
}

// waitCondition waits for the claim's device status to hold condition typ
// True, and returns the device status.
func waitCondition(t *testing.T, kube kubernetes.Interface, c *resourceapi.ResourceClaim, typ string) resourceapi.AllocatedDeviceStatus {
	t.Helper()
	var got resourceapi.AllocatedDeviceStatus
	waitFor(t, fmt.Sprintf("claim %s's condition %s", c.Name, typ), 20*time.Second, func() bool {
		cur, err := kube.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
		if err != nil || len(cur.Status.Devices) != 1 {
			return false
		}
		got = cur.Status.Devices[0]
		return meta.IsStatusConditionTrue(got.Conditions, typ)
	})
	return got
}

func TestBindingConditionsReserveBeforeThePodBinds(t *testing.T) {
	l := newLab(t, periodic)
	kube, api := newHTTPAPI(t)
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	devs := waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	if q := devs["qpu0"]; len(q.BindingConditions) != 1 || q.BindingConditions[0] != ConditionReserved ||
		len(q.BindingFailureConditions) != 1 || q.BindingFailureConditions[0] != ConditionReserveFailed {
		t.Fatalf("qpu0 is published without the binding conditions: %v / %v", q.BindingConditions, q.BindingFailureConditions)
	}

	T := slotStart(8 * time.Second)
	params := slotParams(fmt.Sprintf(`"duration":"50ms","notBefore":%q,"deadline":%q`, rfc(T), rfc(T.Add(time.Second))))
	a := bindingClaim("team-a", "bound", params, "qpu0")
	createClaims(t, kube, a)
	st := waitCondition(t, kube, a, ConditionReserved)
	var data SlotStatus
	if st.Data == nil || json.Unmarshal(st.Data.Raw, &data) != nil || data.ReservationID == 0 || data.QPU != "qpu0" {
		t.Fatalf("claim's device status after the reservation: %+v", st)
	}
	c := meta.FindStatusCondition(st.Conditions, ConditionReserved)
	if !strings.Contains(c.Message, fmt.Sprint(data.ReservationID)) {
		t.Errorf("condition %+v does not name reservation %d", c, data.ReservationID)
	}
	if held := l.status("team-a", data.ReservationID); held.State != "held" || held.StartNS != data.StartNS {
		t.Fatalf("qrtd holds %+v for the claim", held)
	}
	// The pod binds; the kubelet prepares: the same reservation.
	r := requireOK(t, "prepare after binding", k.prepare(a), a)
	s := slotOf(t, rc.CDIDir, r.Devices[0].CdiDeviceIds[0])
	if s.ReservationID != data.ReservationID {
		t.Fatalf("prepare gave reservation %d, the controller reserved %d", s.ReservationID, data.ReservationID)
	}
	// Exactly one: qrtd knows no other reservation of the namespace.
	if err := l.call("jobs.status", map[string]any{"job_id": data.ReservationID + 1, "on_behalf_of": "team-a"}, nil); qrtd.ReasonOf(err) != "not_found" {
		t.Errorf("a second reservation exists? jobs.status %d: %v", data.ReservationID+1, err)
	}

	// An impossible deadline: the failure condition, with qrtd's reason
	// and where it would fit; nothing is held.
	tight := bindingClaim("team-a", "tight", slotParams(fmt.Sprintf(`"duration":"50ms","notBefore":%q,"deadline":%q`,
		rfc(T), rfc(T.Add(90*time.Millisecond)))), "qpu0")
	createClaims(t, kube, tight)
	fst := waitCondition(t, kube, tight, ConditionReserveFailed)
	fc := meta.FindStatusCondition(fst.Conditions, ConditionReserveFailed)
	if fc.Reason != "no_fit" || !strings.Contains(fc.Message, "next possible start: "+rfc(T.Add(time.Duration(blackoutNS+50*ms)))) { // after the bound claim's 50 ms
		t.Errorf("failure condition %+v, want reason no_fit and the next start", fc)
	}
	if meta.IsStatusConditionTrue(fst.Conditions, ConditionReserved) {
		t.Errorf("a refused claim is marked reserved: %+v", fst.Conditions)
	}
	t.Logf("refused before binding: %s: %s", fc.Reason, fc.Message)
	if _, err := os.Stat(filepath.Join(rc.PluginDir, "claims", string(tight.UID)+".json")); !os.IsNotExist(err) {
		t.Errorf("the refused claim left a checkpoint: %v", err)
	}

	// A claim deleted before its pod was prepared: its slot is released.
	gone := bindingClaim("team-b", "gone", params, "qpu0")
	createClaims(t, kube, gone)
	var gdata SlotStatus
	gst := waitCondition(t, kube, gone, ConditionReserved)
	if err := json.Unmarshal(gst.Data.Raw, &gdata); err != nil {
		t.Fatal(err)
	}
	if err := kube.ResourceV1().ResourceClaims("team-b").Delete(context.Background(), gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted claim's reservation released", 10*time.Second, func() bool {
		return l.status("team-b", gdata.ReservationID).State == "released"
	})
	waitFor(t, "the deleted claim's checkpoint removed", 5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(rc.PluginDir, "claims", string(gone.UID)+".json"))
		return os.IsNotExist(err)
	})
	// The prepared claim is the kubelet's: still held until it unprepares.
	if st := l.status("team-a", data.ReservationID); st.State != "held" {
		t.Errorf("the prepared claim's reservation is %s", st.State)
	}
	k.unprepare(a)
	if st := l.status("team-a", data.ReservationID); st.State != "released" {
		t.Errorf("after unprepare: %s", st.State)
	}
	requireOverHTTP(t, api)
}

// A claim the controller reserved for, deleted while the driver was down
// (SIGKILL): the restarted driver finds its checkpoint, no such claim in
// the API, and releases the reservation.
func TestAReservationOfAClaimDeletedWhileTheDriverWasDownIsReleased(t *testing.T) {
	l := newLab(t, periodic)
	T := slotStart(8 * time.Second)
	c := bindingClaim("team-a", "orphan", slotParams(fmt.Sprintf(`"duration":"10ms","notBefore":%q`, rfc(T))), "qpu0")
	child, rc := l.startChild("c", c)
	path := filepath.Join(rc.PluginDir, "claims", string(c.UID)+".json")
	var cp Checkpoint
	waitFor(t, "the controller's reservation in the checkpoint", 20*time.Second, func() bool {
		data, err := os.ReadFile(path)
		return err == nil && json.Unmarshal(data, &cp) == nil && len(cp.Slots) == 1 && cp.Binding
	})
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	id := cp.Slots[0].ReservationID
	if st := l.status("team-a", id); st.State != "held" {
		t.Fatalf("reservation %d before the restart: %s", id, st.State)
	}
	l.startChild("c") // the same directories; the claim is gone from the API
	waitFor(t, "the orphan's reservation released", 20*time.Second, func() bool {
		return l.status("team-a", id).State == "released"
	})
	waitFor(t, "the orphan's checkpoint removed", 5*time.Second, func() bool {
		_, err := os.Stat(path)
		return os.IsNotExist(err)
	})
}
