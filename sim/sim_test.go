package sim

import (
	"testing"
	"time"
)

func TestSmoke(t *testing.T) {
	sc, err := LoadScenario("steady")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Scenario: sc, Duration: 2 * time.Minute, Subjects: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res.Series = nil
	t.Logf("%+v", res)
}
