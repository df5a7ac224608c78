package regional

import (
	"errors"

	"github.com/quotacoord/quota/bucket"
)

// inputErrors are store errors caused by the request, not by the store:
// they never trip the breaker or trigger a failure mode.
var inputErrors = []error{bucket.ErrInvalidSubject, bucket.ErrInvalidPolicyName, bucket.ErrInvalidLimits, bucket.ErrInvalidRequest,
	bucket.ErrDuplicateKey, bucket.ErrTakeAllSize}

func isInputError(err error) bool {
	for _, e := range inputErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
