package qrtproto

import "testing"

// The columns a Go client relies on: which states end a job, which are
// terminal, and that every raised reason has its own application code.
func TestJobEndingStatesIncludeSent(t *testing.T) {
	for _, s := range []string{StateCompleted, StateFailed, StateMissed, StateSent} {
		if !FinishesJob(s) || !IsTerminal(s) {
			t.Errorf("%s must end a job and be terminal", s)
		}
	}
	for _, s := range []string{StateHeld, StateCommitted, StateDispatched} {
		if FinishesJob(s) || IsTerminal(s) {
			t.Errorf("%s is active", s)
		}
	}
	if FinishesJob("no_such_state") || IsTerminal("no_such_state") {
		t.Error("an unknown state is neither terminal nor job-ending")
	}
}

func TestApplicationCodesAreOnePerReason(t *testing.T) {
	seen := map[int]string{}
	for _, r := range Reasons {
		if !r.Error || r.Code < CodeAppFirst || r.Code > CodeAppLast {
			continue
		}
		if other, dup := seen[r.Code]; dup {
			t.Errorf("code %d is both %s and %s", r.Code, other, r.Name)
		}
		seen[r.Code] = r.Name
	}
	if CodeFor(ReasonNoFit) != -32003 || CodeFor("no_such_reason") != CodeUnlistedReason {
		t.Error("CodeFor disagrees with the table")
	}
}
