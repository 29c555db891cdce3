package workflows

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestContractPhasesAreAPIPhases: the leaf package repeats the phases its readers act on
// (it must not import the API); they are the API's values.
func TestContractPhasesAreAPIPhases(t *testing.T) {
	assert.Equal(t, string(v1alpha1.PhasePending), contract.PhasePending)
	assert.Equal(t, string(v1alpha1.PhaseReady), contract.PhaseReady)
	assert.Equal(t, string(v1alpha1.PhaseReplacing), contract.PhaseReplacing)
}
