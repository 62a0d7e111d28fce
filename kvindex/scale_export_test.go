package kvindex

// MemBreakdown is where a MemoryIndex's memory goes, for the scale test in
// package kvindex_test (scale_test.go): slot tables, holder arenas and the
// arenas' free lists, summed over shards.
type MemBreakdown struct {
	Shards                   int
	Keys, Slots              int64 // occupied slots, table slots
	MinShardKeys, MaxShard   int64 // spread of keys over shards
	TableBytes               int64
	ArenaUsed, ArenaCap      int64 // words: handed out, allocated
	FreeWords, FreeListBytes int64 // words in free chunks, the lists' own size
}

// Breakdown walks idx's shards under their locks.
func Breakdown(idx *MemoryIndex) MemBreakdown {
	b := MemBreakdown{Shards: len(idx.shards), MinShardKeys: 1 << 62}
	for i := range idx.shards {
		sh := &idx.shards[i]
		sh.mu.Lock()
		t := *sh.tab.Load()
		k := sh.keys.Load()
		b.Keys += k
		b.MinShardKeys = min(b.MinShardKeys, k)
		b.MaxShard = max(b.MaxShard, k)
		b.Slots += int64(len(t) / slotWords)
		b.TableBytes += int64(len(t)) * 8
		b.ArenaUsed += int64(sh.arenaLen)
		b.ArenaCap += int64(len(*sh.arena.Load()))
		for c, fl := range sh.free {
			b.FreeWords += int64(len(fl)) * int64(chunkWords(c))
			b.FreeListBytes += int64(cap(fl)) * 4
		}
		sh.mu.Unlock()
	}
	return b
}
