package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/kvindex"
)

// Block-key flags: loadgen publishes block hashes as an engine does, and
// the daemon checks them against its own keys, so they must be computed
// with the daemon's hash algorithm, seed and block size. With a mismatch
// every published block is a parity mismatch (indexed under the daemon's
// key, the engine's hash aliased): the load would not be the load of a
// correctly configured fleet. loadgen therefore reads the daemon's
// configuration from GET /v1/status?model=M and uses it; a flag that is
// given must agree with it.
const (
	flagAlgo      = "hash-algo"
	flagSeed      = "hash-seed"
	flagBlockSize = "block-size"
)

// daemonKeys reads the model's key configuration from the daemon's
// /v1/status.
func daemonKeys(httpAddr, model string) (*api.StatusKeys, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	u := "http://" + httpAddr + "/v1/status?" + url.Values{"model": {model}}.Encode()
	resp, err := c.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %s", u, resp.Status)
	}
	var st api.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("GET %s: %v", u, err)
	}
	if st.Keys == nil {
		return nil, fmt.Errorf("GET %s: the answer has no \"keys\" (a daemon older than loadgen)", u)
	}
	return st.Keys, nil
}

// resolveKeys is the key configuration loadgen hashes with: the daemon's
// (daemon, read by daemonKeys; daemonErr when it could not be read), with
// every flag the user gave (o.set) checked against it. Without the
// daemon's answer, the flags are used only when all three were given.
func resolveKeys(o options, daemon *api.StatusKeys, daemonErr error) (kvindex.KeyConfig, error) {
	set := o.set
	given := kvindex.KeyConfig{Algo: kvindex.HashAlgo(o.algo), Seed: o.seed, BlockSize: o.blockSize}
	if daemonErr != nil {
		if set[flagAlgo] && set[flagSeed] && set[flagBlockSize] {
			fmt.Fprintf(os.Stderr, "loadgen: cannot read the daemon's key config (%v); using --%s %s --%s %q --%s %d as given\n",
				daemonErr, flagAlgo, given.Algo, flagSeed, given.Seed, flagBlockSize, given.BlockSize)
			return given, nil
		}
		return kvindex.KeyConfig{}, fmt.Errorf("cannot read the daemon's block-key config from --http-addr %s: %v "+
			"(give --%s, --%s and --%s as the daemon has them to run without it)", o.httpAddr, daemonErr, flagAlgo, flagSeed, flagBlockSize)
	}
	keys := kvindex.KeyConfig{Algo: kvindex.HashAlgo(daemon.HashAlgo), Seed: daemon.HashSeed, BlockSize: daemon.BlockSize}
	for _, c := range []struct {
		flag, given, daemon string
	}{
		{flagAlgo, string(given.Algo), string(keys.Algo)},
		{flagSeed, strconv.Quote(given.Seed), strconv.Quote(keys.Seed)},
		{flagBlockSize, strconv.Itoa(given.BlockSize), strconv.Itoa(keys.BlockSize)},
	} {
		if set[c.flag] && c.given != c.daemon {
			return kvindex.KeyConfig{}, fmt.Errorf("--%s %s, but the daemon at %s hashes model %q with %s %s: "+
				"every published block would be a parity mismatch; drop the flag (loadgen uses the daemon's) or restart the daemon with it",
				c.flag, c.given, o.httpAddr, o.model, c.flag, c.daemon)
		}
	}
	return keys, nil
}
