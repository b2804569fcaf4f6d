package v1alpha1

import (
	"fmt"
	"math"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The bounds of SlotParameters (README.md, "Request").
const (
	// MaxDuration is the longest slot.
	MaxDuration = time.Hour
	// MaxGang is the most QPUs of one claim (count).
	MaxGang = 64
	// MaxAhead is how far ahead notBefore and deadline may lie; qrtd's
	// own horizon refuses what it cannot plan, with its reason.
	MaxAhead = 30 * 24 * time.Hour
)

// The paths of the fields, for their errors.
var (
	durationPath    = field.NewPath("duration")
	notBeforePath   = field.NewPath("notBefore")
	deadlinePath    = field.NewPath("deadline")
	minFidelityPath = field.NewPath("minFidelity")
	countPath       = field.NewPath("count")
	apiVersionPath  = field.NewPath("apiVersion")
	kindPath        = field.NewPath("kind")
)

// ObjectPath names the object as a whole (not JSON, not an object, or
// not there).
var ObjectPath = field.NewPath("(object)")

// NotBeforePath, DeadlinePath and CountPath name the fields whose checks
// need the allocation or a clock (the driver's Resolve).
var (
	NotBeforePath = notBeforePath
	DeadlinePath  = deadlinePath
	CountPath     = countPath
)

// InvalidError is a parameter object refused: each cause names its field.
type InvalidError struct {
	Errs field.ErrorList
}

func (e *InvalidError) Error() string {
	msgs := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		msgs[i] = err.Error()
	}
	return SlotParametersKind + ": " + strings.Join(msgs, "; ")
}

// Invalid is an InvalidError of errs, nil when there are none.
func Invalid(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return &InvalidError{Errs: errs}
}

// When is a point in time of the parameters: a duration from the pod's
// start (After, Relative) or an RFC 3339 time (At).
type When struct {
	Relative bool
	After    time.Duration
	At       time.Time
}

// From is the time w names for a pod that starts at start.
func (w When) From(start time.Time) time.Time {
	if w.Relative {
		return start.Add(w.After)
	}
	return w.At
}

// ParseWhen reads notBefore or deadline: a Go duration ("5s", "+5s") in
// [0, MaxAhead], or an RFC 3339 time.
func ParseWhen(path *field.Path, text string) (When, *field.Error) {
	if d, err := time.ParseDuration(strings.TrimPrefix(text, "+")); err == nil {
		if d < 0 || d > MaxAhead {
			return When{}, field.Invalid(path, text, fmt.Sprintf("a duration from the pod's start must be in [0, %s]", MaxAhead))
		}
		return When{Relative: true, After: d}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return When{}, field.Invalid(path, text, "neither a duration from the pod's start (5s, 2m) nor an RFC 3339 time")
	}
	return When{At: t}, nil
}

// SlotDuration is the slot's length (Validate has refused a bad one).
func (p *SlotParameters) SlotDuration() time.Duration {
	d, _ := time.ParseDuration(p.Duration)
	return d
}

// Validate checks what needs neither a clock nor the allocation: the
// duration, the forms of notBefore and deadline, minFidelity and count.
func (p *SlotParameters) Validate() field.ErrorList {
	var errs field.ErrorList
	if p.Duration == "" {
		errs = append(errs, field.Required(durationPath, "a Go duration such as 2ms"))
	} else if d, err := time.ParseDuration(p.Duration); err != nil {
		errs = append(errs, field.Invalid(durationPath, p.Duration, "not a Go duration (2ms, 500us)"))
	} else if d <= 0 || d > MaxDuration {
		errs = append(errs, field.Invalid(durationPath, p.Duration, fmt.Sprintf("must be in (0, %s]", MaxDuration)))
	}
	var nb, dl When
	var nbErr, dlErr *field.Error
	if p.NotBefore != "" {
		if nb, nbErr = ParseWhen(notBeforePath, p.NotBefore); nbErr != nil {
			errs = append(errs, nbErr)
		}
	}
	if p.Deadline != "" {
		if dl, dlErr = ParseWhen(deadlinePath, p.Deadline); dlErr != nil {
			errs = append(errs, dlErr)
		}
	}
	// Both of one form: the deadline leaves the duration after notBefore
	// whenever the pod starts.
	if p.NotBefore != "" && p.Deadline != "" && nbErr == nil && dlErr == nil && nb.Relative == dl.Relative && len(errs) == 0 {
		var zero time.Time
		if dl.From(zero).Sub(nb.From(zero)) < p.SlotDuration() {
			errs = append(errs, field.Invalid(deadlinePath, p.Deadline, fmt.Sprintf("leaves less than duration %s after notBefore %s", p.Duration, p.NotBefore)))
		}
	}
	if f := p.MinFidelity; f != nil && (math.IsNaN(*f) || *f < 0 || *f > 1) {
		errs = append(errs, field.Invalid(minFidelityPath, *f, "must be in [0, 1]"))
	}
	if c := p.Count; c != nil && (*c < 1 || *c > MaxGang) {
		errs = append(errs, field.Invalid(countPath, *c, fmt.Sprintf("must be in [1, %d]", MaxGang)))
	}
	return errs
}
