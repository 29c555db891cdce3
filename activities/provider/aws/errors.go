package aws

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/smithy-go"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// EC2's error codes, by what the workflow does about them. A code's meaning does not
// depend on the call, except a missing instance, which a describe or terminate answers
// with InvalidInstanceID.NotFound and which is an answer there (see classify).
var (
	// quotaCodes are refusals for want of room that only waiting (or a raised limit)
	// fixes: the zone out of an instance type, the account's instance or vCPU limits,
	// and Spot capacity.
	quotaCodes = []string{"InsufficientInstanceCapacity", "InstanceLimitExceeded", "VcpuLimitExceeded",
		"InsufficientCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
		"MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet",
		"SecurityGroupLimitExceeded", "RulesPerSecurityGroupLimitExceeded", "AddressLimitExceeded"}
	// permanentCodes are refusals a retry repeats: the request is wrong or not allowed.
	// The message goes into the Proxy's condition as EC2 wrote it.
	permanentCodes = []string{"UnauthorizedOperation", "InvalidParameterValue", "InvalidParameterCombination",
		"InvalidParameter", "MissingParameter", "InvalidSubnetID.NotFound", "InvalidSubnetID.Malformed",
		"InvalidGroup.NotFound", "InvalidGroupId.Malformed", "InvalidKeyPair.NotFound",
		"InvalidInstanceType", "Unsupported", "UnsupportedOperation", "OptInRequired",
		"InvalidUserData.Malformed", "InvalidBlockDeviceMapping", "InvalidIamInstanceProfile.NotFound",
		"VPCIdNotSpecified", "AuthFailure.ServiceLinkedRoleCreationNotPermitted"}
	// Left transient on purpose: the worker's own credentials (AuthFailure,
	// ExpiredToken, RequestExpired, SignatureDoesNotMatch), which are not the Proxy's
	// fault and would park it as Failed until an unrelated edit. (And
	// IdempotentParameterMismatch, which the client token, a hash of the request, never
	// meets: were it met, a retry could still succeed.)
	// permanentPrefixes cover families of such codes: every malformed or unknown AMI.
	permanentPrefixes = []string{"InvalidAMIID."}
)

// classify turns an EC2 error into the provider's kinds: quota waits, permanent refusals,
// and everything else transient (throttling included: the SDK's retryer has already
// backed off and tried again, and the workflow's backoff takes it from there).
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return fmt.Errorf("%s: %w", op, err)
	}
	code := ae.ErrorCode()
	wrapped := fmt.Errorf("%s: %s: %s", op, code, ae.ErrorMessage())
	switch {
	case contains(quotaCodes, code):
		return provider.QuotaError(wrapped)
	case contains(permanentCodes, code) || hasPrefix(permanentPrefixes, code):
		return provider.Permanent(wrapped)
	}
	return wrapped
}

// errorMessage is EC2's message of err ("" when it is no API error).
func errorMessage(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorMessage()
	}
	return ""
}

// isCode reports whether err is EC2's error code.
func isCode(err error, code string) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == code
}

func contains(codes []string, code string) bool {
	return slices.ContainsFunc(codes, func(c string) bool { return strings.EqualFold(c, code) })
}

func hasPrefix(prefixes []string, code string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(code, p) })
}
