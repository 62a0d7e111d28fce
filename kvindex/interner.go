package kvindex

import "sync"

// Interner maps (pod name, data-parallel rank) pairs and model names to small
// dense integers starting at 0. The index packs PodIDs into its holder words
// and the scorer indexes slices by PodID, so ids must stay small and dense:
// they are never reused or released (a fleet names a bounded set of pods).
//
// Reads (Lookup*, *Name) take a read lock only; interning a new name takes the
// write lock once per new name, which is rare after warm-up.
type Interner struct {
	mu       sync.RWMutex
	pods     map[podName]PodID
	podNames []podName
	byName   map[string][]PodID
	models   map[string]ModelID
	modNames []string
}

type podName struct {
	name   string
	dpRank int
}

// NewInterner returns an empty interner. It is safe for concurrent use.
func NewInterner() *Interner {
	return &Interner{
		pods:   make(map[podName]PodID),
		byName: make(map[string][]PodID),
		models: make(map[string]ModelID),
	}
}

// Pod returns the id of (name, dpRank), assigning the next free id if new.
func (in *Interner) Pod(name string, dpRank int) PodID {
	k := podName{name, dpRank}
	in.mu.RLock()
	id, ok := in.pods[k]
	in.mu.RUnlock()
	if ok {
		return id
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if id, ok := in.pods[k]; ok { // another goroutine won the race
		return id
	}
	id = PodID(len(in.podNames))
	in.pods[k] = id
	in.podNames = append(in.podNames, k)
	in.byName[name] = append(in.byName[name], id)
	return id
}

// LookupPod returns the id of (name, dpRank) without interning it.
func (in *Interner) LookupPod(name string, dpRank int) (PodID, bool) {
	in.mu.RLock()
	id, ok := in.pods[podName{name, dpRank}]
	in.mu.RUnlock()
	return id, ok
}

// PodName returns the pod name and DP rank of id; ("", 0) for an unknown id.
func (in *Interner) PodName(id PodID) (name string, dpRank int) {
	in.mu.RLock()
	defer in.mu.RUnlock()
	if int(id) < len(in.podNames) {
		k := in.podNames[id]
		return k.name, k.dpRank
	}
	return "", 0
}

// PodNames is a read-only view of the pods interned when it was taken, for
// resolving many ids without a lock per id. Interning only appends, so the
// view never changes; a pod interned later is not in it.
type PodNames struct{ names []podName }

// PodNames returns the current view.
func (in *Interner) PodNames() PodNames {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return PodNames{in.podNames}
}

// Len is the number of pods in the view: every id below it resolves.
func (v PodNames) Len() int { return len(v.names) }

// Name is PodName within the view.
func (v PodNames) Name(id PodID) (name string, dpRank int) {
	if int(id) < len(v.names) {
		k := v.names[id]
		return k.name, k.dpRank
	}
	return "", 0
}

// PodsNamed returns the ids of every DP rank seen for name, in interning
// order. The slice is a copy the caller may keep.
func (in *Interner) PodsNamed(name string) []PodID {
	in.mu.RLock()
	defer in.mu.RUnlock()
	ids := in.byName[name]
	if len(ids) == 0 {
		return nil
	}
	return append([]PodID(nil), ids...)
}

// AppendPodsNamed appends the ids of every DP rank seen for name to dst,
// in interning order, without allocating when dst has room.
func (in *Interner) AppendPodsNamed(dst []PodID, name string) []PodID {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return append(dst, in.byName[name]...)
}

// NumPods is how many pods have been interned; every PodID is below it.
func (in *Interner) NumPods() int {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return len(in.podNames)
}

// Model returns the id of a model name, assigning the next free id if new.
func (in *Interner) Model(name string) ModelID {
	in.mu.RLock()
	id, ok := in.models[name]
	in.mu.RUnlock()
	if ok {
		return id
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if id, ok := in.models[name]; ok {
		return id
	}
	id = ModelID(len(in.modNames))
	in.models[name] = id
	in.modNames = append(in.modNames, name)
	return id
}

// LookupModel returns the id of a model name without interning it.
func (in *Interner) LookupModel(name string) (ModelID, bool) {
	in.mu.RLock()
	id, ok := in.models[name]
	in.mu.RUnlock()
	return id, ok
}

// ModelName returns the name of id; "" for an unknown id.
func (in *Interner) ModelName(id ModelID) string {
	in.mu.RLock()
	defer in.mu.RUnlock()
	if int(id) < len(in.modNames) {
		return in.modNames[id]
	}
	return ""
}
