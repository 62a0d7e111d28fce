// Package kvsimcmd is the simulator's command line: flag parsing, input
// files and output formats for `kvsim` and its alias `kvindexd simulate`
// (and `replay`, `genworkload`). Both mains call it, so the two spellings
// run the same code; the simulation itself is package sim.
package kvsimcmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// Command is one subcommand: its one-line summary and its entry point.
type Command struct {
	Summary string
	Run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

// Commands are the simulator's subcommands by name.
var Commands = map[string]Command{
	"simulate":    {"simulate a fleet of engines behind each routing policy, on a trace or a scenario file", Simulate},
	"replay":      {"replay a Mooncake trace against one block cache (lru, lfu, s3fifo); prints JSON", Replay},
	"genworkload": {"write the generated shared-system-prompt workload as Mooncake JSONL", GenWorkload},
}

// Main runs `kvsim [subcommand] [flags]` and returns the exit status. A
// first argument that is a flag means `simulate`, the command's main use.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	name := "simulate"
	if len(args) > 0 {
		switch a := args[0]; {
		case a == "help" || a == "-h" || a == "--help" || a == "-help":
			usage(stdout)
			return 0
		case len(a) > 0 && a[0] != '-':
			name, args = a, args[1:]
		}
	}
	c, ok := Commands[name]
	if !ok {
		fmt.Fprintf(stderr, "kvsim: unknown subcommand %q\n", name)
		usage(stderr)
		return 2
	}
	if err := c.Run(args, stdin, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "kvsim %s: %v\n", name, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	names := make([]string, 0, len(Commands))
	for n := range Commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: kvsim [subcommand] [flags]   (no subcommand: simulate)\n\nsubcommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, Commands[n].Summary)
	}
	fmt.Fprintln(w, "\n`kvsim SUBCOMMAND --help` lists its flags; docs/simulator.md is the manual.")
}

// newFlagSet returns a flag set that prints its usage only when asked
// (--help), so that a mistyped flag costs one line of error, not the whole
// flag list.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses args into fs, printing the flags to stderr on --help.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "usage: kvsim %s [flags]\n", fs.Name())
		fs.PrintDefaults()
		return err
	case err != nil:
		return fmt.Errorf("%w (--help lists the flags)", err)
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	return nil
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
