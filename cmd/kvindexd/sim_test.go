package main

import "testing"

func TestSimSubcommandsRegistered(t *testing.T) {
	for _, n := range []string{"replay", "simulate", "genworkload"} {
		if sc, ok := subcommands[n]; !ok || sc.run == nil {
			t.Errorf("subcommand %q not registered", n)
		}
	}
}
