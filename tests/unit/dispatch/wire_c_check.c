/* wire.h must compile as C11 (the header is shared with C tools); the
 * _Static_asserts in it run here. */
#include "qrt/proto/wire.h"

size_t qrt_wire_c_header_size(void);
size_t qrt_wire_c_tolerance_offset(void);

size_t qrt_wire_c_header_size(void) { return sizeof(struct qrt_wire_header); }
size_t qrt_wire_c_tolerance_offset(void) { return offsetof(struct qrt_wire_header, tolerance_ns); }
