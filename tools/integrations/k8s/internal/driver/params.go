package driver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
)

// ParametersAPIVersion and ParametersKind name the opaque parameter object
// a ResourceClaim (or its DeviceClass) passes to this driver in
// spec.devices.config[].opaque.parameters.
const (
	ParametersAPIVersion = "qpu.qrtd.io/v1alpha1"
	ParametersKind       = "SlotParameters"
)

// Limits of the parameter object (documented in tools/integrations/k8s/README.md).
const (
	MaxDuration = time.Hour
	MaxGang     = 64
	// How far ahead notBefore and deadline may lie (qrtd's own horizon
	// refuses what it cannot plan, with its reason).
	MaxAhead = 30 * 24 * time.Hour
)

// SlotParameters is the opaque parameter object:
//
//	apiVersion: qpu.qrtd.io/v1alpha1
//	kind: SlotParameters
//	duration: 2ms          # the slot's length (Go duration), required
//	notBefore: 5s          # a duration from the prepare, or RFC 3339 time
//	deadline: 60s          # the slot ends by then (same forms)
//	minFidelity: 0.95      # predicted fidelity at the slot's start, 0..1
//	priority: 0            # qrtd priority (capped by the tenant's ceiling)
//	count: 2               # a gang: must equal the devices allocated
type SlotParameters struct {
	APIVersion  string   `json:"apiVersion"`
	Kind        string   `json:"kind"`
	Duration    string   `json:"duration"`
	NotBefore   string   `json:"notBefore,omitempty"`
	Deadline    string   `json:"deadline,omitempty"`
	MinFidelity *float64 `json:"minFidelity,omitempty"`
	Priority    *int32   `json:"priority,omitempty"`
	Count       *int     `json:"count,omitempty"`
}

// FieldError is a refused parameter, naming its field.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("SlotParameters.%s: %s", e.Field, e.Message)
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

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

// DecodeParameters decodes raw strictly: unknown fields, a wrong
// apiVersion/kind, trailing data and bad values are refused naming the
// field.
func DecodeParameters(raw []byte) (*SlotParameters, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var p SlotParameters
	if err := dec.Decode(&p); err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "unknown field "); i >= 0 {
			name := strings.Trim(msg[i+len("unknown field "):], `"`)
			return nil, fieldErr(name, "unknown field (known: apiVersion, kind, duration, notBefore, deadline, minFidelity, priority, count)")
		}
		var te *json.UnmarshalTypeError
		if asType(err, &te) {
			return nil, fieldErr(te.Field, "must be a %s, not %s", te.Type.String(), te.Value)
		}
		return nil, fieldErr("(object)", "not a JSON object of SlotParameters: %v", err)
	}
	if dec.More() {
		return nil, fieldErr("(object)", "trailing data after the object")
	}
	if p.APIVersion != ParametersAPIVersion {
		return nil, fieldErr("apiVersion", "must be %q, got %q", ParametersAPIVersion, p.APIVersion)
	}
	if p.Kind != ParametersKind {
		return nil, fieldErr("kind", "must be %q, got %q", ParametersKind, p.Kind)
	}
	return &p, nil
}

func asType(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*te = t
	}
	return ok
}

// parseWhen reads a time: a Go duration from now ("5s", "+5s") or an RFC
// 3339 time.
func parseWhen(field, text string, now time.Time) (int64, error) {
	if d, err := time.ParseDuration(strings.TrimPrefix(text, "+")); err == nil {
		if d < 0 || d > MaxAhead {
			return 0, fieldErr(field, "%q: a duration from now must be in [0, %s]", text, MaxAhead)
		}
		return now.Add(d).UnixNano(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return 0, fieldErr(field, "%q is neither a duration from now (5s, 2m) nor an RFC 3339 time", text)
	}
	if t.Sub(now) > MaxAhead {
		return 0, fieldErr(field, "%q is more than %s ahead", text, MaxAhead)
	}
	return t.UnixNano(), nil
}

// Resolve turns the parameters into a qrtd request for the allocated
// QPUs, with times relative to now.
func (p *SlotParameters) Resolve(qpus []string, now time.Time) (Request, error) {
	var r Request
	if p.Duration == "" {
		return r, fieldErr("duration", "is required (a Go duration such as 2ms)")
	}
	d, err := time.ParseDuration(p.Duration)
	if err != nil {
		return r, fieldErr("duration", "%q is not a Go duration (2ms, 500us)", p.Duration)
	}
	if d <= 0 || d > MaxDuration {
		return r, fieldErr("duration", "%s must be in (0, %s]", d, MaxDuration)
	}
	r.DurationNS = d.Nanoseconds()
	if p.NotBefore != "" {
		if r.NotBeforeNS, err = parseWhen("notBefore", p.NotBefore, now); err != nil {
			return r, err
		}
	}
	if p.Deadline != "" {
		if r.DeadlineNS, err = parseWhen("deadline", p.Deadline, now); err != nil {
			return r, err
		}
		start := r.NotBeforeNS
		if start == 0 {
			start = now.UnixNano()
		}
		if r.DeadlineNS < start+r.DurationNS {
			return r, fieldErr("deadline", "%s leaves less than duration %s after notBefore", p.Deadline, d)
		}
	}
	if p.MinFidelity != nil {
		f := *p.MinFidelity
		if math.IsNaN(f) || f < 0 || f > 1 {
			return r, fieldErr("minFidelity", "%v must be in [0, 1]", f)
		}
		r.MinFidelity = f
	}
	if p.Priority != nil {
		r.Priority = *p.Priority
	}
	if len(qpus) == 0 {
		return r, fieldErr("count", "no QPU of this driver is allocated to the claim")
	}
	if len(qpus) > MaxGang {
		return r, fieldErr("count", "%d QPUs allocated; a gang has at most %d", len(qpus), MaxGang)
	}
	if p.Count != nil && *p.Count != len(qpus) {
		return r, fieldErr("count", "%d, but the claim was allocated %d QPU(s) (set the request's count to match)", *p.Count, len(qpus))
	}
	r.QPUs = append([]string(nil), qpus...)
	if len(qpus) > 1 {
		r.GangSize = len(qpus)
	}
	return r, nil
}
