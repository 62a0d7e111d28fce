package api

// StatusKeys is the block-key configuration in GET /v1/status, named as the
// daemon's flags and config keys are: what a publisher's block hashes must
// be computed with to equal the daemon's keys (engines: PYTHONHASHSEED,
// --prefix-caching-hash-algo, --block-size). Tools that publish like an
// engine (hack/loadgen) read it instead of being told it twice.
type StatusKeys struct {
	Model     string `json:"model,omitempty"` // the ?model= asked about; empty = the default
	HashAlgo  string `json:"hash_algo"`
	HashSeed  string `json:"hash_seed"`
	BlockSize int    `json:"block_size"`
}

// statusKeys is model's key configuration (its per-model override, or the
// default; "" is the default).
func (s *Server) statusKeys(model string) *StatusKeys {
	c := s.idx.KeyConfig(model)
	return &StatusKeys{Model: model, HashAlgo: string(c.Algo), HashSeed: c.Seed, BlockSize: c.BlockSize}
}
