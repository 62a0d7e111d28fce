package main

import (
	"fmt"
	"io"
	"strconv"
)

// intRange is the documented range of a numeric option, bounds included.
type intRange struct{ min, max int64 }

// numericRanges holds every integer option's range, checked at start
// (validateRanges) and shown in docs/configuration.md (gendocs). The upper
// bounds are far above any real deployment; they exist because a huge
// value is a start-up error, not a panic (make with a negative or
// overflowing size), a hang (a pool or cache sized up front), a spinning
// worker or a server that answers 431 to everything.
// TestEveryNumericFlagHasARange keeps this table complete.
var numericRanges = map[string]intRange{
	"workers":                  {0, 1024},
	"queue-size":               {0, 1 << 20},
	"capacity":                 {0, 1 << 32},
	"block-size":               {1, 1 << 16},
	"key-cache-size":           {-1, 1 << 24},
	"digest-cache-size":        {0, 1 << 24},
	"prefix-store-chunk-bytes": {0, 1 << 20},
	"prefix-store-capacity":    {0, 1 << 24},
	"history-capacity":         {0, 1 << 28},
	"prediction-capacity":      {0, 1 << 24},
	"zmq-max-message-size":     {1, 1 << 30},
	"zmq-max-conns":            {1, 1 << 20},
	"max-streams":              {1, 1 << 20},
	"max-models":               {1, 1 << 16},
	"max-dp-ranks":             {1, 1024},
	"max-digest-caches":        {1, 4096},
	"max-alias-tables":         {1, 1 << 16},
	"max-sessions-per-pod":     {0, 1 << 20},
	"discover-zmq-port":        {1, 65535},
	"discover-replay-port":     {0, 65535},
	"discover-dp-size":         {1, 1024},
	"discover-serve-port":      {1, 65535},
	"discover-max-pods":        {1, 1 << 20},
	"http-max-header-bytes":    {0, 16 << 20},
	"http-header-budget-bytes": {1, 1 << 40},
	"http-max-body-bytes":      {0, 1 << 32},
	"http-max-conns":           {0, 1 << 20},
	"grpc-max-conns":           {0, 1 << 20},
	// and at least --max-prompt-bytes (checked with the other tokenization
	// settings in validate)
	"max-prompt-bytes":            {1, maxPromptBytesLimit},
	"tokenize-max-inflight-bytes": {1, maxInflightBytesLimit},
}

func (r intRange) String() string { return fmt.Sprintf("%d..%d", r.min, r.max) }

// validateRanges checks every numeric option against numericRanges, reading
// the values through the flags bound to c (so a value from the config file
// or the environment is checked the same way).
func (c *Config) validateRanges() error {
	var configPath string
	fs := flagSet(c, &configPath, io.Discard)
	for name, r := range numericRanges {
		f := fs.Lookup(name)
		if f == nil {
			continue // a subcommand's flag
		}
		v, err := strconv.ParseInt(f.Value.String(), 10, 64)
		if err != nil {
			continue // "auto" and the like: checked by their own parser
		}
		if v < r.min || v > r.max {
			return fmt.Errorf("--%s %d: out of range %s", name, v, r)
		}
	}
	return nil
}
