package driver

import (
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	qpuv1alpha1 "qrtd.io/tools/integrations/k8s/api/qpu.qrtd.io/v1alpha1"
)

// Request is what the driver asks qrtd for (slots.reserve), resolved to
// absolute times once, when the claim is first prepared.
type Request struct {
	DurationNS  int64    `json:"duration_ns"`
	NotBeforeNS int64    `json:"not_before_ns,omitempty"`
	DeadlineNS  int64    `json:"deadline_ns,omitempty"`
	MinFidelity float64  `json:"min_fidelity,omitempty"`
	Priority    int32    `json:"priority,omitempty"`
	QPUs        []string `json:"qpus"`
	GangSize    int      `json:"gang_size,omitempty"`
}

// paramsDecoder reads the opaque parameters (api/qpu.qrtd.io/v1alpha1):
// strictly, through the API's scheme.
var paramsDecoder = qpuv1alpha1.NewDecoder()

// parametersOf finds this driver's opaque SlotParameters for the claim's
// allocation (the claim's own config wins over the class's), decoded and
// validated.
func parametersOf(claim *resourceapi.ResourceClaim) (*qpuv1alpha1.SlotParameters, error) {
	alloc := claim.Status.Allocation
	var fromClass, fromClaim []byte
	for _, c := range alloc.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		if c.Source == resourceapi.AllocationConfigSourceClaim {
			fromClaim = c.Opaque.Parameters.Raw
		} else {
			fromClass = c.Opaque.Parameters.Raw
		}
	}
	raw := fromClaim
	if raw == nil {
		raw = fromClass
	}
	if raw == nil {
		return nil, qpuv1alpha1.Invalid(field.ErrorList{field.Required(qpuv1alpha1.ObjectPath,
			fmt.Sprintf("the claim carries no opaque parameters for driver %s (spec.devices.config[].opaque with kind %s)",
				DriverName, qpuv1alpha1.SlotParametersKind))})
	}
	return paramsDecoder.Decode(raw)
}

// Resolve turns the parameters into a qrtd request for the allocated
// QPUs, a relative notBefore or deadline counted from start (the pod's
// start).  A refusal is a *qpuv1alpha1.InvalidError naming the field.
func Resolve(p *qpuv1alpha1.SlotParameters, qpus []string, start time.Time) (Request, error) {
	var r Request
	if errs := p.Validate(); len(errs) > 0 {
		return r, qpuv1alpha1.Invalid(errs)
	}
	var errs field.ErrorList
	d := p.SlotDuration()
	r.DurationNS = d.Nanoseconds()
	when := func(path *field.Path, text string) int64 {
		if text == "" {
			return 0
		}
		w, _ := qpuv1alpha1.ParseWhen(path, text) // Validate took it
		t := w.From(start)
		if t.Sub(start) > qpuv1alpha1.MaxAhead {
			errs = append(errs, field.Invalid(path, text, fmt.Sprintf("more than %s after the pod's start", qpuv1alpha1.MaxAhead)))
		}
		return t.UnixNano()
	}
	r.NotBeforeNS = when(qpuv1alpha1.NotBeforePath, p.NotBefore)
	r.DeadlineNS = when(qpuv1alpha1.DeadlinePath, p.Deadline)
	if r.DeadlineNS != 0 {
		from := r.NotBeforeNS
		if from == 0 {
			from = start.UnixNano()
		}
		if r.DeadlineNS < from+r.DurationNS {
			errs = append(errs, field.Invalid(qpuv1alpha1.DeadlinePath, p.Deadline,
				fmt.Sprintf("leaves less than duration %s after notBefore (or the pod's start)", d)))
		}
	}
	if p.MinFidelity != nil {
		r.MinFidelity = *p.MinFidelity
	}
	if p.Priority != nil {
		r.Priority = *p.Priority
	}
	switch {
	case len(qpus) == 0:
		errs = append(errs, field.Invalid(qpuv1alpha1.CountPath, 0, "no QPU of this driver is allocated to the claim"))
	case len(qpus) > qpuv1alpha1.MaxGang:
		errs = append(errs, field.Invalid(qpuv1alpha1.CountPath, len(qpus), fmt.Sprintf("QPUs allocated; a gang has at most %d", qpuv1alpha1.MaxGang)))
	case p.Count != nil && *p.Count != len(qpus):
		errs = append(errs, field.Invalid(qpuv1alpha1.CountPath, *p.Count,
			fmt.Sprintf("the claim was allocated %d QPU(s) (set the request's count to match)", len(qpus))))
	}
	if len(errs) > 0 {
		return r, qpuv1alpha1.Invalid(errs)
	}
	r.QPUs = append([]string(nil), qpus...)
	if len(qpus) > 1 {
		r.GangSize = len(qpus)
	}
	return r, nil
}
