// Package testenv starts the real services pinflow's tests run against, on
// loopback ports in temporary directories, and stops them when the test
// ends.
//
// A test that needs a service calls its Start function first. When the
// service's program is not installed the test is skipped, except under
// CI=true, where a missing dependency fails the test: a CI run must never
// pass by silently testing less.
package testenv
