package blockkeys

// Key is a block's 64-bit key: the last 8 bytes, big-endian, of the engine's
// block digest. This is the form vLLM puts on the wire by default, so a key we
// compute from token ids and a hash an engine publishes compare directly.
type Key uint64
