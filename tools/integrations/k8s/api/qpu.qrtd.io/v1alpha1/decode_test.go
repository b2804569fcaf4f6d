package v1alpha1

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// refusal is the one field error of err, which must be an InvalidError.
func refusal(t *testing.T, raw string, err error) *field.Error {
	t.Helper()
	var ie *InvalidError
	if !errors.As(err, &ie) || len(ie.Errs) == 0 {
		t.Fatalf("%s: error %v (%T), want an InvalidError", raw, err, err)
	}
	return ie.Errs[0]
}

func TestTheExampleDecodes(t *testing.T) {
	raw := `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters","duration":"2ms","notBefore":"5s",` +
		`"deadline":"2026-01-01T00:01:00Z","minFidelity":0.95,"priority":3,"count":2}`
	p, err := NewDecoder().Decode([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if p.Duration != "2ms" || p.NotBefore != "5s" || *p.MinFidelity != 0.95 || *p.Priority != 3 || *p.Count != 2 ||
		p.Kind != SlotParametersKind || p.APIVersion != SchemeGroupVersion.String() {
		t.Errorf("decoded %+v", p)
	}
	c := p.DeepCopy()
	*c.Count = 5
	if *p.Count != 2 {
		t.Error("DeepCopy shares count")
	}
}

// Every refusal names its field in a field.Error, of the type k8s's own
// validation uses: nothing reads an error's text.
func TestEveryRefusalOfTheDecoderNamesItsField(t *testing.T) {
	head := `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters",`
	for _, c := range []struct {
		raw   string
		field string
		typ   field.ErrorType
	}{
		{head + `"durations":"2ms"}`, "durations", field.ErrorTypeForbidden},
		{head + `"Duration":"2ms"}`, "Duration", field.ErrorTypeForbidden},
		{head + `"duration":"2ms","duration":"3ms"}`, "duration", field.ErrorTypeForbidden},
		{head + `"duration":2}`, "duration", field.ErrorTypeTypeInvalid},
		{head + `"duration":"2ms","priority":"high"}`, "priority", field.ErrorTypeTypeInvalid},
		{head + `"duration":"2ms","count":1.5}`, "count", field.ErrorTypeTypeInvalid},
		{`{"apiVersion":"v1","kind":"SlotParameters","duration":"2ms"}`, "apiVersion", field.ErrorTypeNotSupported},
		{`{"apiVersion":"qpu.qrtd.io/v1beta9","kind":"SlotParameters","duration":"2ms"}`, "apiVersion", field.ErrorTypeNotSupported},
		{`{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"GpuConfig","duration":"2ms"}`, "kind", field.ErrorTypeNotSupported},
		{`{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"ListOptions"}`, "kind", field.ErrorTypeNotSupported},
		{`{"apiVersion":"qpu.qrtd.io/v1alpha1","duration":"2ms"}`, "kind", field.ErrorTypeRequired},
		{`{"kind":"SlotParameters","duration":"2ms"}`, "apiVersion", field.ErrorTypeRequired},
		{head + `"duration":"2ms"} {}`, "(object)", field.ErrorTypeInvalid},
		{`[1]`, "(object)", field.ErrorTypeTypeInvalid},
		{`not json`, "(object)", field.ErrorTypeInvalid},
		{head + `"duration":"fast"}`, "duration", field.ErrorTypeInvalid},
		{head + `"minFidelity":1.01,"duration":"1ms"}`, "minFidelity", field.ErrorTypeInvalid},
	} {
		_, err := NewDecoder().Decode([]byte(c.raw))
		fe := refusal(t, c.raw, err)
		if fe.Field != c.field || fe.Type != c.typ {
			t.Errorf("%s: %s (field %q, type %q), want field %q, type %q", c.raw, err, fe.Field, fe.Type, c.field, c.typ)
		}
	}
	// All the causes at once, each with its field.
	_, err := NewDecoder().Decode([]byte(head + `"duration":"fast","minFidelity":2,"colour":"red"}`))
	var ie *InvalidError
	if !errors.As(err, &ie) || len(ie.Errs) != 3 || ie.Errs[0].Field != "colour" || ie.Errs[1].Field != "duration" ||
		ie.Errs[2].Field != "minFidelity" {
		t.Errorf("three causes: %v", err)
	}
	want := `SlotParameters: colour: Forbidden: unknown field (SlotParameters has apiVersion, count, deadline, duration, kind, minFidelity, notBefore, priority); ` +
		`duration: Invalid value: "fast": not a Go duration (2ms, 500us); minFidelity: Invalid value: 2: must be in [0, 1]`
	if err.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", err, want)
	}
}
