//go:build !race

package regional

// raceAllocs is how many more allocations per check the race detector
// makes a check take (it changes what escapes to the heap).
const raceAllocs = 0
