//go:build race

package reliability

// raceEnabled: the test binary was built with -race, which makes every
// check several times slower (see the soak's budgets).
const raceEnabled = true
