package driver

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What a claim socket refuses before anything reaches qrtd: no qrtd needed.
func TestTheClaimSocketRefusesBatchesGarbageAndFloods(t *testing.T) {
	d := &Driver{cfg: Config{Proxy: ProxyLimits{RequestsPerS: 1, RequestBurst: 2}.withDefaults()}}
	p := &claimProxy{d: d, namespace: "team-a", name: "c", ids: map[uint64]bool{7: true},
		lim: rate.NewLimiter(rate.Limit(1), 2)}
	reply := func(line string) map[string]any {
		t.Helper()
		out := p.handle(nil, []byte(line))
		if out == nil {
			return nil
		}
		var r map[string]any
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("reply %q: %v", out, err)
		}
		return r
	}
	reason := func(r map[string]any) string {
		e, _ := r["error"].(map[string]any)
		data, _ := e["data"].(map[string]any)
		s, _ := data["reason"].(string)
		return s
	}
	if r := reply(`[{"jsonrpc":"2.0","id":1,"method":"agent.hello"}]`); reason(r) != "invalid_request" {
		t.Errorf("a batch: %v", r)
	}
	if r := reply(`{"jsonrpc":`); reason(r) != "parse_error" {
		t.Errorf("garbage: %v", r)
	}
	// A notification gets no answer, whatever becomes of it.
	if r := reply(`{"jsonrpc":"2.0","method":"slots.reserve"}`); r != nil {
		t.Errorf("a notification was answered: %v", r)
	}
	// Every line was charged: the burst (2) is spent, and the next is
	// refused, naming the quota.
	r := reply(`{"jsonrpc":"2.0","id":"x","method":"slots.release","params":{}}`)
	if reason(r) != "quota_exceeded" || r["id"] != "x" || !strings.Contains(r["error"].(map[string]any)["message"].(string), "per second") {
		t.Errorf("beyond the claim's rate: %v", r)
	}
}

func TestAFailureConditionOfAnEarlierAllocationIsStale(t *testing.T) {
	at := metav1.NewTime(time.Now())
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{AllocationTimestamp: &at},
		Devices: []resourceapi.AllocatedDeviceStatus{{Driver: DriverName, Pool: "n", Device: "qpu0",
			Conditions: []metav1.Condition{{Type: ConditionReserveFailed, Status: metav1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(at.Add(-time.Minute))}}}}}}
	if failed(claim) {
		t.Errorf("a failure before this allocation stops the controller")
	}
	claim.Status.Devices[0].Conditions[0].LastTransitionTime = metav1.NewTime(at.Add(time.Second))
	if !failed(claim) {
		t.Errorf("this allocation's failure is not seen")
	}
}
