package driver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParametersAreDecodedStrictlyAndRefusalsNameTheField(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	good := `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters","duration":"2ms","notBefore":"5s",` +
		`"deadline":"2026-01-01T00:01:00Z","minFidelity":0.95,"priority":3,"count":1}`
	p, err := DecodeParameters([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Resolve([]string{"qpu0"}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := Request{DurationNS: 2e6, NotBeforeNS: now.Add(5 * time.Second).UnixNano(),
		DeadlineNS: now.Add(time.Minute).UnixNano(), MinFidelity: 0.95, Priority: 3, QPUs: []string{"qpu0"}}
	if r.DurationNS != want.DurationNS || r.NotBeforeNS != want.NotBeforeNS || r.DeadlineNS != want.DeadlineNS ||
		r.MinFidelity != want.MinFidelity || r.Priority != want.Priority || r.GangSize != 0 {
		t.Errorf("resolved %+v, want %+v", r, want)
	}
	if g, err := p.Resolve([]string{"a", "b"}, now); err == nil || !strings.Contains(err.Error(), "count") {
		t.Errorf("count 1 with 2 QPUs: %v %+v", err, g)
	}
	p.Count = nil
	if g, _ := p.Resolve([]string{"a", "b"}, now); g.GangSize != 2 {
		t.Errorf("two QPUs are a gang of 2: %+v", g)
	}

	head := `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters",`
	for field, raw := range map[string]string{
		"durations":  head + `"durations":"2ms"}`,
		"duration":   head + `"duration":2}`,
		"apiVersion": `{"apiVersion":"v1","kind":"SlotParameters","duration":"2ms"}`,
		"kind":       `{"apiVersion":"qpu.qrtd.io/v1alpha1","duration":"2ms"}`,
		"priority":   head + `"duration":"2ms","priority":"high"}`,
		"(object)":   head + `"duration":"2ms"} {}`,
	} {
		_, err := DecodeParameters([]byte(raw))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: error %v, want one naming field %q", raw, err, field)
		}
	}
	for field, p := range map[string]SlotParameters{
		"duration":    {},
		"duration ":   {Duration: "1h1m"},
		"notBefore":   {Duration: "1ms", NotBefore: "yesterday"},
		"deadline":    {Duration: "10ms", NotBefore: "1s", Deadline: "1s"},
		"minFidelity": {Duration: "1ms", MinFidelity: ptrTo(1.01)},
		"notBefore ":  {Duration: "1ms", NotBefore: "1000h"},
	} {
		_, err := p.Resolve([]string{"qpu0"}, now)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != strings.TrimSpace(field) {
			t.Errorf("%+v: error %v, want one naming field %q", p, err, strings.TrimSpace(field))
		}
	}
	if _, err := (&SlotParameters{Duration: "1ms"}).Resolve(nil, now); err == nil {
		t.Error("no QPU allocated: accepted")
	}
}

func ptrTo[T any](v T) *T { return &v }

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
