#!/bin/sh
# The fleet simulator runs the agent's own ledger and placement policies:
#   - libqrt_fleet.a references qrt::timeline::ledger (U) and defines none
#     of its code or of the policies';
#   - libqrt_timeline.a defines them (agent/src/timeline);
#   - the qrt-fleet-sim binary contains them (linked from libqrt_timeline.a).
#   check_own_ledger.sh LIBQRT_FLEET LIBQRT_TIMELINE QRT_FLEET_SIM
set -eu
fleet=$1 agent=$2 sim=$3
syms='qrt::timeline::ledger::open( qrt::timeline::ledger::reserve( qrt::timeline::ledger::update_calibration( qrt::timeline::ledger::commit( qrt::timeline::ledger::query('
fail=0
for s in $syms; do
	# In the simulator's library: used, never defined.
	if nm -C --defined-only "$fleet" | grep -F " $s" | grep -qv ' [UVWw] '; then
		echo "libqrt_fleet.a defines $s: the simulator must call the agent's code, not a copy"; fail=1
	fi
	if ! nm -C --undefined-only "$fleet" | grep -qF "$s"; then
		echo "libqrt_fleet.a does not call $s"; fail=1
	fi
	# In the daemon's library: defined in agent/src/timeline.
	if ! nm -C -A --defined-only "$agent" | grep -F " T $s" | grep -qE '(ledger[a-z_]*|policy)\.cpp\.o'; then
		echo "libqrt_timeline.a does not define $s in ledger*.cpp.o/policy.cpp.o"; fail=1
	fi
	if ! nm -C --defined-only "$sim" | grep -qF " $s"; then
		echo "qrt-fleet-sim does not contain $s"; fail=1
	fi
done
# The policies come with the ledger (ledger::open calls make_policy).
p='qrt::timeline::make_policy('
if nm -C --defined-only "$fleet" | grep -qF " T $p"; then
	echo "libqrt_fleet.a defines $p"; fail=1
fi
if ! nm -C -A --defined-only "$agent" | grep -F " T $p" | grep -q 'policy\.cpp\.o'; then
	echo "libqrt_timeline.a does not define $p in policy.cpp.o"; fail=1
fi
if ! nm -C --defined-only "$sim" | grep -qF " $p"; then
	echo "qrt-fleet-sim does not contain $p"; fail=1
fi
[ "$fail" = 0 ] || exit 1
echo "qrt-fleet-sim runs libqrt_timeline.a's ledger and policies ($(( $(echo $syms | wc -w) + 1 )) symbols checked)"
