package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	qpuv1alpha1 "qrtd.io/tools/integrations/k8s/api/qpu.qrtd.io/v1alpha1"
)

// The decoder's own refusals are api/qpu.qrtd.io/v1alpha1's tests; here
// what needs the allocation or the pod's start, each naming its field.
func TestResolveCountsFromThePodsStartAndRefusalsNameTheField(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	good := `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters","duration":"2ms","notBefore":"5s",` +
		`"deadline":"2026-01-01T00:01:00Z","minFidelity":0.95,"priority":3,"count":1}`
	p, err := paramsDecoder.Decode([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Resolve(p, []string{"qpu0"}, start)
	if err != nil {
		t.Fatal(err)
	}
	want := Request{DurationNS: 2e6, NotBeforeNS: start.Add(5 * time.Second).UnixNano(),
		DeadlineNS: start.Add(time.Minute).UnixNano(), MinFidelity: 0.95, Priority: 3, QPUs: []string{"qpu0"}}
	if r.DurationNS != want.DurationNS || r.NotBeforeNS != want.NotBeforeNS || r.DeadlineNS != want.DeadlineNS ||
		r.MinFidelity != want.MinFidelity || r.Priority != want.Priority || r.GangSize != 0 {
		t.Errorf("resolved %+v, want %+v", r, want)
	}
	p.Count = nil
	if g, _ := Resolve(p, []string{"a", "b"}, start); g.GangSize != 2 {
		t.Errorf("two QPUs are a gang of 2: %+v", g)
	}
	one := 1
	for _, c := range []struct {
		p     qpuv1alpha1.SlotParameters
		qpus  int
		field string
	}{
		{qpuv1alpha1.SlotParameters{Duration: "1ms", Count: &one}, 2, "count"},
		{qpuv1alpha1.SlotParameters{Duration: "1ms"}, 0, "count"},
		{qpuv1alpha1.SlotParameters{Duration: "1ms"}, qpuv1alpha1.MaxGang + 1, "count"},
		{qpuv1alpha1.SlotParameters{Duration: "1ms", NotBefore: "2026-03-01T00:00:00Z"}, 1, "notBefore"},
		{qpuv1alpha1.SlotParameters{Duration: "10ms", Deadline: "2025-12-31T23:59:59Z"}, 1, "deadline"},
		{qpuv1alpha1.SlotParameters{Duration: "10ms", NotBefore: "1s", Deadline: "2026-01-01T00:00:01Z"}, 1, "deadline"},
		{qpuv1alpha1.SlotParameters{Duration: "fast"}, 1, "duration"},
	} {
		qpus := make([]string, c.qpus)
		for i := range qpus {
			qpus[i] = fmt.Sprint("qpu", i)
		}
		_, err := Resolve(&c.p, qpus, start)
		var ie *qpuv1alpha1.InvalidError
		if !errors.As(err, &ie) || len(ie.Errs) != 1 || ie.Errs[0].Field != c.field {
			t.Errorf("%+v on %d QPUs: %v, want one error of field %q", c.p, c.qpus, err, c.field)
		}
	}
	// No parameters at all: the object is refused, saying what is missing.
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}}}
	_, err = parametersOf(claim)
	var ie *qpuv1alpha1.InvalidError
	if !errors.As(err, &ie) || ie.Errs[0].Field != "(object)" || ie.Errs[0].Type != field.ErrorTypeRequired {
		t.Errorf("no parameters: %v", err)
	}
}

func TestDeviceNamesAreDNSLabels(t *testing.T) {
	for in, want := range map[string]string{"qpu0": "qpu0", "QPU_A.1": "qpu-a-1", "__": "qpu",
		strings.Repeat("x", 80): strings.Repeat("x", 63)} {
		if got := DeviceName(in); got != want {
			t.Errorf("DeviceName(%q) = %q, want %q", in, got, want)
		}
	}
}

// qpus.list's "device" facts (qrtd.toml [qpu.device]) become attributes.
func TestQrtdsDeviceFactsBecomeAttributes(t *testing.T) {
	reply := `{"qpus":[{"name":"ibm_A","endpoint_up":true,"calibration_id":18446744073709551615,"min_lead_ns":12500000,
	  "device":{"qubits":27,"technology":"superconducting","basis_gates":["cx","rz","sx","x"],
	  "coupling_map":[[0,1]],"gate_durations_ns":{"cx":300},"max_shots":100000}},
	 {"name":"q2","endpoint_up":false,"calibration_id":4,"min_lead_ns":1,"device":null}]}`
	var list struct {
		QPUs []QPU `json:"qpus"`
	}
	if err := json.Unmarshal([]byte(reply), &list); err != nil {
		t.Fatal(err)
	}
	ws := []window{{CalibrationID: 9, F0: 0.985, ValidFromNS: 100, ValidUntilNS: 200}, {CalibrationID: 10, F0: 0.99, ValidFromNS: 1100, ValidUntilNS: 1200}}
	d := deviceOf(list.QPUs[0], ws, 150, 20*time.Second)
	want := map[string]int64{"qubits": 27, "maxShots": 100000, "minLeadNs": 12500000, "windowCalibrationId": 9,
		"predictedFidelityPpm": 985000, "windowPeriodNs": 1000, "windowUntilNs": 200, "backlogMs": 20000}
	for k, v := range want {
		if got := intOf(d, k); got != v {
			t.Errorf("%s = %d, want %d", k, got, v)
		}
	}
	if d.Name != "ibm-a" || *d.Attributes["qpu"].StringValue != "ibm_A" || *d.Attributes["technology"].StringValue != "superconducting" {
		t.Errorf("device %+v", d)
	}
	if _, ok := d.Attributes["calibrationId"]; ok {
		t.Error("no calibration yet (MaxUint64) published as an id")
	}
	d2 := deviceOf(list.QPUs[1], nil, 0, 0)
	if _, ok := d2.Attributes["qubits"]; ok || intOf(d2, "calibrationId") != 4 || *d2.Attributes["endpointUp"].BoolValue {
		t.Errorf("device without facts %+v", d2)
	}
}
