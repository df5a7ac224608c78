// Package clock is the one source of time for the project's long-running
// code. Core logic takes an explicit now; the convenience wrappers that read
// the clock take a Clock, so tests drive time with a Manual clock instead of
// sleeping.
//
// There is no package-global clock: every component is handed the Clock it
// uses. Real is safe for concurrent use; so is Manual.
package clock
