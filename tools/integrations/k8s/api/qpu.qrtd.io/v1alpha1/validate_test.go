package v1alpha1

import (
	"fmt"
	"testing"
	"time"
)

func ptrTo[T any](v T) *T { return &v }

func TestValidateRefusesEachBadValueByItsField(t *testing.T) {
	for _, c := range []struct {
		p     SlotParameters
		field string
	}{
		{SlotParameters{}, "duration"},
		{SlotParameters{Duration: "1h1m"}, "duration"},
		{SlotParameters{Duration: "0s"}, "duration"},
		{SlotParameters{Duration: "1ms", NotBefore: "yesterday"}, "notBefore"},
		{SlotParameters{Duration: "1ms", NotBefore: "-1s"}, "notBefore"},
		{SlotParameters{Duration: "1ms", NotBefore: "1000h"}, "notBefore"},
		{SlotParameters{Duration: "1ms", Deadline: "soon"}, "deadline"},
		{SlotParameters{Duration: "10ms", NotBefore: "1s", Deadline: "1s"}, "deadline"},
		{SlotParameters{Duration: "10ms", NotBefore: "2026-01-01T00:00:00Z", Deadline: "2026-01-01T00:00:00.005Z"}, "deadline"},
		{SlotParameters{Duration: "1ms", MinFidelity: ptrTo(1.01)}, "minFidelity"},
		{SlotParameters{Duration: "1ms", MinFidelity: ptrTo(-0.5)}, "minFidelity"},
		{SlotParameters{Duration: "1ms", Count: ptrTo(0)}, "count"},
		{SlotParameters{Duration: "1ms", Count: ptrTo(MaxGang + 1)}, "count"},
	} {
		errs := c.p.Validate()
		if len(errs) != 1 || errs[0].Field != c.field {
			t.Errorf("%+v: %v, want one error of field %q", c.p, errs, c.field)
		}
	}
	ok := SlotParameters{Duration: "2ms", NotBefore: "+5s", Deadline: "60s", MinFidelity: ptrTo(1.0), Count: ptrTo(MaxGang)}
	if errs := ok.Validate(); len(errs) != 0 {
		t.Errorf("%+v: %v", ok, errs)
	}
	// A deadline of the other form is checked once the pod's start is
	// known (the driver's Resolve).
	mixed := SlotParameters{Duration: "10ms", NotBefore: "1s", Deadline: "2026-01-01T00:00:00Z"}
	if errs := mixed.Validate(); len(errs) != 0 {
		t.Errorf("%+v: %v", mixed, errs)
	}
}

func TestWhenCountsARelativeTimeFromThePodsStart(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for text, want := range map[string]time.Time{
		"5s":                     start.Add(5 * time.Second),
		"+2m":                    start.Add(2 * time.Minute),
		"2026-03-01T10:00:00.5Z": time.Date(2026, 3, 1, 10, 0, 0, 5e8, time.UTC),
		fmt.Sprint(MaxAhead):     start.Add(MaxAhead),
	} {
		w, err := ParseWhen(NotBeforePath, text)
		if err != nil || !w.From(start).Equal(want) {
			t.Errorf("%s: %v %v, want %v", text, w.From(start), err, want)
		}
	}
}
