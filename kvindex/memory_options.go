package kvindex

import "github.com/kvindex/kvindex/internal/option"

// MemoryOptions is the one declaration of the in-memory index's tunable:
// its default, range and help, read by NewMemoryIndex (the one place a zero
// Capacity becomes the default) and by kvindexd's --capacity.
var MemoryOptions = struct {
	Capacity option.Int
}{
	Capacity: option.Int{Name: "capacity", Default: DefaultMemoryCapacity, Min: 0, Max: 1 << 32,
		Help: "in-memory index bound in (block, pod) entries"},
}
