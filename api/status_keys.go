package api

// StatusKeys is the block-key configuration in GET /v1/status, named as the
// daemon's flags and config keys are: what a publisher's block hashes must
// be computed with to equal the daemon's keys (engines: PYTHONHASHSEED,
// --prefix-caching-hash-algo, --block-size). Tools that publish like an
// engine (hack/loadgen) read it instead of being told it twice. It is the
// default configuration: a model with its own (models.NAME.hash_algo,
// hash_seed, block_size in the config file) is not listed here; its pods'
// parity counters in /v1/pods show a publisher that hashes otherwise.
type StatusKeys struct {
	HashAlgo  string `json:"hash_algo"`
	HashSeed  string `json:"hash_seed"`
	BlockSize int    `json:"block_size"`
}

// statusKeys is the default key configuration. A model name that is not
// configured gets the default, and the empty name is never a model.
func (s *Server) statusKeys() *StatusKeys {
	c := s.idx.KeyConfig("")
	return &StatusKeys{HashAlgo: string(c.Algo), HashSeed: c.Seed, BlockSize: c.BlockSize}
}
