package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SlotParametersKind is the kind of SlotParameters.
const SlotParametersKind = "SlotParameters"

// SlotParameters is the slot a claim asks qrtd for (README.md, "Request"):
//
//	apiVersion: qpu.qrtd.io/v1alpha1
//	kind: SlotParameters
//	duration: 2ms          # the slot's length (a Go duration), required
//	notBefore: 5s          # a duration from the pod's start, or an RFC 3339 time
//	deadline: 60s          # the slot ends by then (same forms)
//	minFidelity: 0.95      # predicted fidelity at the slot's start, [0, 1]
//	priority: 0            # qrtd priority (capped by the namespace's ceiling)
//	count: 2               # a gang: must equal the devices allocated
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type SlotParameters struct {
	metav1.TypeMeta `json:",inline"`

	Duration    string   `json:"duration"`
	NotBefore   string   `json:"notBefore,omitempty"`
	Deadline    string   `json:"deadline,omitempty"`
	MinFidelity *float64 `json:"minFidelity,omitempty"`
	Priority    *int32   `json:"priority,omitempty"`
	Count       *int     `json:"count,omitempty"`
}
