// Package v1alpha1 is the API of the DRA driver qpu.qrtd.io: the opaque
// parameter object a ResourceClaim (or its DeviceClass) passes to the
// driver in spec.devices.config[].opaque.parameters.
//
//	apiVersion: qpu.qrtd.io/v1alpha1
//	kind: SlotParameters
//	duration: 2ms
//
// register.go names the group and version and adds the type to a scheme,
// types.go is the type, decode.go its strict decoder (through that scheme)
// and validate.go its checks; every refusal is a field.ErrorList naming the
// field, so that nothing reads an error's text.
//
// zz_generated.deepcopy.go is deepcopy-gen's (hack/update-codegen.sh;
// run-tests.sh fails while it is stale).
//
// +groupName=qpu.qrtd.io
package v1alpha1
