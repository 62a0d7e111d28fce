package main

import "github.com/kvindex/kvindex/internal/kvsimcmd"

// The simulator's command is cmd/kvsim; `kvindexd simulate` (and replay,
// genworkload) are aliases that run the same code (internal/kvsimcmd).
func init() {
	for name, c := range kvsimcmd.Commands {
		subcommands[name] = subcommand{c.Summary + " (alias of kvsim " + name + ")", c.Run}
	}
}
