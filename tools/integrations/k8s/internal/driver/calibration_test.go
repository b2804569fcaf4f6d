package driver

// Calibration blocks against a real qrtd (qrtd(8), CALIBRATION BLOCKS): the
// device is tainted NoSchedule for a block and untainted after it, and a
// claim's slot that qrtd asks back for a block gets the yield request in
// its status.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// block is calibration.request's answer, as much as the tests read.
type block struct {
	BlockID  uint64   `json:"block_id"`
	State    string   `json:"state"`
	StartNS  int64    `json:"start_ns"`
	EndNS    int64    `json:"end_ns"`
	Yielding []uint64 `json:"yielding"`
}

func (l *lab) requestBlock(t *testing.T, qpu, key string, duration time.Duration, neededBy time.Time) block {
	t.Helper()
	var b block
	if err := l.call("calibration.request", map[string]any{"qpu": qpu, "step": "x_amplitude",
		"duration_ns": duration.Nanoseconds(), "needed_by_ns": neededBy.UnixNano(), "idempotency_key": key}, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func (l *lab) windowFromNow(t *testing.T, qpu string, id int, length time.Duration) time.Time {
	t.Helper()
	now := time.Now()
	if err := l.call("calibration.update", map[string]any{"qpu": qpu, "windows": []map[string]any{{
		"calibration_id": id, "valid_from_ns": now.UnixNano(), "valid_until_ns": now.Add(length).UnixNano(),
		"f0": 0.99}}}, nil); err != nil {
		t.Fatal(err)
	}
	return now
}

func TestACalibrationBlockTaintsTheDeviceForItsTimeAndAYieldRequestReachesTheClaim(t *testing.T) {
	l := newLab(t, pushed)
	kube, api := newHTTPAPI(t)
	rc := l.startDriver("d", kube)
	newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	base := l.windowFromNow(t, "qpu0", 1, 10*time.Minute)

	// A block a few seconds ahead: tainted from BindingCheck + PodStart
	// before it (8 s: at once here) to its end.
	b := l.requestBlock(t, "qpu0", "soon", 5*time.Second, base.Add(12*time.Second))
	if b.State != "scheduled" {
		t.Fatalf("block %+v", b)
	}
	want := fmt.Sprintf("qpu0.block-%d", b.BlockID)
	devs := waitSlice(t, kube, "qpu0 tainted for the block", func(d map[string]resourceapi.Device) bool {
		tt := taintOf(d["qpu0"], TaintCalibration)
		return tt != nil && tt.Value == want && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
	t.Logf("taint %+v for block [%s, %s)", *taintOf(devs["qpu0"], TaintCalibration), rfc(time.Unix(0, b.StartNS)),
		rfc(time.Unix(0, b.EndNS)))
	if now := time.Now().UnixNano(); now >= b.EndNS {
		t.Fatalf("the taint came after the block's end")
	}
	waitSlice(t, kube, "qpu0 untainted after the block", func(d map[string]resourceapi.Device) bool {
		return time.Now().UnixNano() >= b.EndNS && taintOf(d["qpu0"], TaintCalibration) == nil
	})

	// A claim's held slot [40 s, 60 s); the only room for a 30 s block
	// ending by 60 s is where it sits: qrtd asks it back, and the driver
	// writes the request into the claim's status.
	T := base.Add(40 * time.Second)
	claim := bindingClaim("team-a", "held", slotParams(fmt.Sprintf(`"duration":"20s","notBefore":%q,"deadline":%q`,
		rfc(T), rfc(T.Add(20*time.Second)))), "qpu0")
	createClaims(t, kube, claim)
	waitCondition(t, kube, claim, ConditionReserved)
	y := l.requestBlock(t, "qpu0", "yield", 30*time.Second, T.Add(20*time.Second))
	if y.State != "yielding" || len(y.Yielding) != 1 {
		t.Fatalf("block %+v: want yielding to the claim's slot", y)
	}
	st := waitCondition(t, kube, claim, ConditionYieldRequested)
	c := meta.FindStatusCondition(st.Conditions, ConditionYieldRequested)
	t.Logf("%s: %s", c.Reason, c.Message)
	if c.Reason != "CalibrationBlock" || !strings.Contains(c.Message, fmt.Sprintf("calibration block %d", y.BlockID)) ||
		!strings.Contains(c.Message, fmt.Sprint(y.Yielding[0])) {
		t.Errorf("condition %+v does not name the block and the reservation", c)
	}
	if !meta.IsStatusConditionTrue(st.Conditions, ConditionReserved) {
		t.Errorf("the claim lost its reserved condition: %+v", st.Conditions)
	}
	requireOverHTTP(t, api)
}
