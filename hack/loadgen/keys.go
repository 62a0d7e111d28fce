package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/blockkeys"
)

// Block-key flags: loadgen publishes block hashes as an engine does, and
// the daemon checks them against its own keys (the parity check), so they
// must be computed with the daemon's hash algorithm, seed and block size.
// With a mismatch every published block is a parity mismatch (indexed under
// the daemon's key, the engine's hash aliased): the load is not the load of
// a correctly configured fleet. So loadgen hashes with the daemon's default
// configuration, read from GET /v1/status, and after publishing asks the
// daemon (GET /v1/pods) whether its pods' blocks matched: a mismatch (a flag
// that contradicts the daemon, or a model with a key config of its own in
// the daemon) is an error naming the cause.
const (
	flagAlgo      = "hash-algo"
	flagSeed      = "hash-seed"
	flagBlockSize = "block-size"
)

var httpClient = &http.Client{Timeout: 5 * time.Second}

// getJSON decodes the answer of GET http://addr/path into v.
func getJSON(addr, path string, v any) error {
	u := "http://" + addr + path
	resp, err := httpClient.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: HTTP %s %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %v", u, err)
	}
	return nil
}

// daemonKeys reads the daemon's default key configuration.
func daemonKeys(httpAddr string) (*api.StatusKeys, error) {
	var st api.Status
	if err := getJSON(httpAddr, "/v1/status", &st); err != nil {
		return nil, err
	}
	if st.Keys == nil {
		return nil, fmt.Errorf("GET /v1/status: the answer has no \"keys\" (a daemon older than loadgen)")
	}
	return st.Keys, nil
}

// resolveKeys is the key configuration loadgen hashes with: the daemon's
// (daemon, read by daemonKeys; daemonErr when it could not be read), with
// the flags the user gave (o.set) taking precedence. A given flag that
// differs from the daemon's default is right only for a model configured
// with its own keys in the daemon: that is said on warn, and the parity
// check after publishing decides. Without the daemon's answer the flags
// are used only when all three were given.
func resolveKeys(o options, daemon *api.StatusKeys, daemonErr error, warn io.Writer) (blockkeys.KeyConfig, error) {
	set := o.set
	given := blockkeys.KeyConfig{Algo: blockkeys.HashAlgo(o.algo), Seed: o.seed, BlockSize: o.blockSize}
	if daemonErr != nil {
		if set[flagAlgo] && set[flagSeed] && set[flagBlockSize] {
			fmt.Fprintf(warn, "loadgen: cannot read the daemon's key config (%v); using the flags as given: %s\n", daemonErr, given)
			return given, nil
		}
		return blockkeys.KeyConfig{}, fmt.Errorf("cannot read the daemon's block-key config from --http-addr %s: %v "+
			"(give --%s, --%s and --%s as the daemon has them to run without it)", o.httpAddr, daemonErr, flagAlgo, flagSeed, flagBlockSize)
	}
	keys := blockkeys.KeyConfig{Algo: blockkeys.HashAlgo(daemon.HashAlgo), Seed: daemon.HashSeed, BlockSize: daemon.BlockSize}
	for _, c := range []struct {
		flag, given, daemon string
		use                 func()
	}{
		{flagAlgo, string(given.Algo), string(keys.Algo), func() { keys.Algo = given.Algo }},
		{flagSeed, strconv.Quote(given.Seed), strconv.Quote(keys.Seed), func() { keys.Seed = given.Seed }},
		{flagBlockSize, strconv.Itoa(given.BlockSize), strconv.Itoa(keys.BlockSize), func() { keys.BlockSize = given.BlockSize }},
	} {
		if !set[c.flag] || c.given == c.daemon {
			continue
		}
		fmt.Fprintf(warn, "loadgen: --%s %s differs from the daemon's %s %s: right only if model %q has its own key config "+
			"in the daemon; its parity check will tell\n", c.flag, c.given, c.flag, c.daemon, o.model)
		c.use()
	}
	return keys, nil
}

// checkParity fails when the daemon's parity check found loadgen's blocks
// hashed otherwise than it hashes them (pods: the pod names published).
func checkParity(o options, keys blockkeys.KeyConfig, pods map[string]bool) error {
	var out struct {
		Pods []api.PodInfo `json:"pods"`
	}
	if err := getJSON(o.httpAddr, "/v1/pods", &out); err != nil {
		return fmt.Errorf("reading the daemon's parity check: %w", err)
	}
	var mismatches uint64
	hint := ""
	for _, p := range out.Pods {
		if !pods[p.Pod] || p.Model != o.model {
			continue
		}
		mismatches += p.ParityMismatches
		if hint == "" {
			hint = p.ParityHint
		}
	}
	if mismatches == 0 {
		return nil
	}
	if hint == "" {
		hint = "no hint"
	}
	return fmt.Errorf("the daemon hashes model %q otherwise than loadgen (%s): %d blocks of its pods are parity mismatches (daemon's hint: %s); "+
		"give --%s, --%s and --%s as the daemon's config has them for this model (models.NAME), or drop flags that contradict it",
		o.model, keys, mismatches, hint, flagAlgo, flagSeed, flagBlockSize)
}
