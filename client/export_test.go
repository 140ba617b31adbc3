package client

import (
	"github.com/pinflow/pinflow/api"
)

// RunFailedForTest is the client's error of an evacuation of guest u
// whose run ended with err.
func RunFailedForTest(err error) error {
	return runFailed(api.OpEvacuation, "u", "instance-u", "r", err)
}
