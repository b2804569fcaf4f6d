package v1alpha1

import (
	stdjson "encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// Decoder reads the opaque parameters strictly, through a scheme that
// knows this group's versions: an unknown or repeated field, a wrong type,
// apiVersion or kind, and a value Validate refuses are each a field.Error
// of one InvalidError.
type Decoder struct {
	codec runtime.Decoder
}

// NewDecoder is a Decoder of this group's types.
func NewDecoder() *Decoder {
	scheme := runtime.NewScheme()
	utilruntime.Must(AddToScheme(scheme))
	return &Decoder{codec: json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Strict: true})}
}

// Decode decodes and validates raw (JSON).
func (d *Decoder) Decode(raw []byte) (*SlotParameters, error) {
	obj, gvk, err := d.codec.Decode(raw, nil, nil)
	strict, isStrict := runtime.AsStrictDecodingError(err)
	if err != nil && !isStrict {
		return nil, Invalid(decodeErrors(raw, gvk, err))
	}
	p, ok := obj.(*SlotParameters)
	if !ok {
		// A kind the scheme knows of every group (ListOptions, ...).
		return nil, Invalid(field.ErrorList{field.NotSupported(kindPath, gvk.Kind, []string{SlotParametersKind})})
	}
	var errs field.ErrorList
	if isStrict {
		for _, e := range strict.Errors() {
			errs = append(errs, strictError(e))
		}
	}
	return p, Invalid(append(errs, p.Validate()...))
}

// decodeErrors says which field the decoder could not read.
func decodeErrors(raw []byte, gvk *schema.GroupVersionKind, err error) field.ErrorList {
	switch {
	case runtime.IsMissingKind(err):
		return field.ErrorList{field.Required(kindPath, SlotParametersKind)}
	case runtime.IsMissingVersion(err):
		return field.ErrorList{field.Required(apiVersionPath, SchemeGroupVersion.String())}
	case runtime.IsNotRegisteredError(err) && gvk != nil:
		if gvk.GroupVersion() != SchemeGroupVersion {
			return field.ErrorList{field.NotSupported(apiVersionPath, gvk.GroupVersion().String(), []string{SchemeGroupVersion.String()})}
		}
		return field.ErrorList{field.NotSupported(kindPath, gvk.Kind, []string{SlotParametersKind})}
	}
	// A value of the wrong type, or not JSON: the standard library's
	// decoder names the field in its error's fields.
	var p SlotParameters
	jerr := stdjson.Unmarshal(raw, &p)
	var te *stdjson.UnmarshalTypeError
	if errors.As(jerr, &te) {
		path := ObjectPath
		if te.Field != "" {
			path = field.NewPath(te.Field)
		}
		return field.ErrorList{field.TypeInvalid(path, te.Value, "must be a "+te.Type.String())}
	}
	return field.ErrorList{field.Invalid(ObjectPath, truncate(string(raw), 120), "not a JSON object of "+SlotParametersKind+": "+err.Error())}
}

// strictError: a field given twice, or one SlotParameters does not have.
func strictError(e error) *field.Error {
	var fe kjson.FieldError
	if !errors.As(e, &fe) {
		return field.Invalid(ObjectPath, nil, e.Error())
	}
	name := fe.FieldPath()
	if knownFields()[name] {
		return field.Forbidden(field.NewPath(name), "given more than once")
	}
	return field.Forbidden(field.NewPath(name), "unknown field (SlotParameters has "+strings.Join(knownFieldList(), ", ")+")")
}

var knownOnce struct {
	sync.Once
	set  map[string]bool
	list []string
}

func loadKnown() {
	knownOnce.Do(func() {
		knownOnce.set = map[string]bool{"apiVersion": true, "kind": true}
		t := reflect.TypeOf(SlotParameters{})
		for i := 0; i < t.NumField(); i++ {
			if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" {
				knownOnce.set[name] = true
			}
		}
		for n := range knownOnce.set {
			knownOnce.list = append(knownOnce.list, n)
		}
		sort.Strings(knownOnce.list)
	})
}

// knownFields are the JSON names of SlotParameters' fields.
func knownFields() map[string]bool { loadKnown(); return knownOnce.set }
func knownFieldList() []string     { loadKnown(); return knownOnce.list }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
