package main

import (
	"testing"
	"time"
)

func TestPickConfig(t *testing.T) {
	c := Config{PickPolicy: "aibrix", SpecTTL: "500ms", HistoryTTL: "-1s", HistoryCapacity: 10}
	pc, err := c.pickConfig()
	if err != nil || pc.DefaultPolicy != "aibrix" || pc.SpeculativeTTL != 500*time.Millisecond || pc.HistoryTTL != -time.Second || pc.HistoryCapacity != 10 {
		t.Fatalf("%+v %v", pc, err)
	}
	for _, bad := range []Config{{PickPolicy: "best"}, {SpecTTL: "soon"}, {HistoryTTL: "0s"}, {HistoryCapacity: -1}} {
		if _, err := bad.pickConfig(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
