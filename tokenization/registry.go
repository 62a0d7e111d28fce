package tokenization

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// RegistryConfig says where tokenizers are found. Lookup order for a model name
// (first hit wins):
//  1. Models: explicit model name -> directory. Authoritative: if the name is mapped,
//     no other location is tried.
//  2. HFCacheDir: a HuggingFace hub cache (e.g. ~/.cache/huggingface/hub):
//     <HFCacheDir>/models--<org>--<name>/snapshots/<rev>/, using the revision named by
//     refs/main when that snapshot has a tokenizer, else the newest snapshot that has one.
//  3. Dirs, in order: <dir>/<model>/ (so <dir>/<org>/<name>/ for "org/name"), then
//     <dir>/<name>/ (the last path element of the model name).
//
// A directory qualifies when it holds tokenizer.json or tokenizer.json.gz;
// tokenizer_config.json is optional but changes ids for some models (see Load).
type RegistryConfig struct {
	Models     map[string]string // model name -> dir
	HFCacheDir string            // "" = not used; see DefaultHFCacheDir
	Dirs       []string
}

// failedLoadRetry is how long a failed load is remembered. It keeps a broken file from
// being re-parsed on every request, and still picks up a fixed file without a restart.
const failedLoadRetry = 10 * time.Second

// maxCachedNames bounds the name -> tokenizer fast path. Names come from requests and
// many resolve to one directory ("a/x", "b/x", ... all find <dir>/x); past the bound a
// name is resolved again (a few stats) on each request instead of growing the map.
const maxCachedNames = 4096

// Registry resolves model names to tokenizers, loading each tokenizer once and sharing
// it. Safe for concurrent use; concurrent first requests for a model wait for a single
// load.
type Registry struct {
	cfg RegistryConfig
	// load is LoadDir; a field so tests can count real loads.
	load func(dir string) (*Tokenizer, error)
	now  func() time.Time

	mu     sync.RWMutex
	byDir  map[string]*regEntry // cleaned absolute dir -> entry (aliases share a load)
	byName map[string]*regEntry // model name -> entry, only after a successful load (bounded)
}

type regEntry struct {
	dir      string
	done     chan struct{} // closed when the load finished
	tok      *Tokenizer
	info     ModelInfo
	err      error
	failedAt time.Time
}

// ModelInfo is what the registry knows about a loaded tokenizer besides the encoder.
type ModelInfo struct {
	Dir      string        // directory the files were read from
	LoadTime time.Duration // read + parse time of the first load
}

// NewRegistry returns a registry; nothing is read until the first Get.
func NewRegistry(cfg RegistryConfig) *Registry {
	models := make(map[string]string, len(cfg.Models))
	for k, v := range cfg.Models {
		models[k] = v
	}
	cfg.Models = models
	cfg.Dirs = append([]string(nil), cfg.Dirs...)
	return &Registry{
		cfg:    cfg,
		load:   LoadDir,
		now:    time.Now,
		byDir:  map[string]*regEntry{},
		byName: map[string]*regEntry{},
	}
}

// Get returns the tokenizer for model, loading it on first use. The error names every
// location tried when the model is not found, or the load failure.
func (r *Registry) Get(model string) (*Tokenizer, error) {
	tok, _, err := r.GetInfo(model)
	return tok, err
}

// GetInfo is Get plus the model's ModelInfo.
func (r *Registry) GetInfo(model string) (*Tokenizer, ModelInfo, error) {
	r.mu.RLock()
	if e, ok := r.byName[model]; ok {
		r.mu.RUnlock()
		return e.tok, e.info, nil
	}
	r.mu.RUnlock()

	dir, err := r.Resolve(model)
	if err != nil {
		return nil, ModelInfo{}, err
	}
	key := dir
	if abs, err := filepath.Abs(dir); err == nil {
		key = abs
	}

	r.mu.Lock()
	e, ok := r.byDir[key]
	if ok {
		select {
		case <-e.done:
			if e.err != nil && r.now().Sub(e.failedAt) >= failedLoadRetry {
				ok = false // retry a load that failed a while ago
			}
		default:
		}
	}
	if !ok {
		e = &regEntry{dir: dir, done: make(chan struct{})}
		r.byDir[key] = e
		r.mu.Unlock()
		start := time.Now()
		tok, err := r.safeLoad(dir)
		r.mu.Lock()
		e.tok, e.info, e.err = tok, ModelInfo{Dir: dir, LoadTime: time.Since(start)}, err
		if err != nil {
			e.failedAt = r.now()
		}
		close(e.done)
	}
	r.mu.Unlock()

	<-e.done
	if e.err != nil {
		return nil, ModelInfo{}, fmt.Errorf("tokenizer for model %q: %w", model, e.err)
	}
	r.mu.Lock()
	if len(r.byName) < maxCachedNames {
		r.byName[model] = e
	}
	r.mu.Unlock()
	return e.tok, e.info, nil
}

// safeLoad turns a panic in the loader into an error: a malformed file must not take
// the server down.
func (r *Registry) safeLoad(dir string) (tok *Tokenizer, err error) {
	defer func() {
		if p := recover(); p != nil {
			tok, err = nil, fmt.Errorf("load tokenizer from %s: panic: %v", dir, p)
		}
	}()
	tok, err = r.load(dir)
	if err == nil && tok == nil {
		err = fmt.Errorf("load tokenizer from %s: no tokenizer returned", dir)
	}
	return tok, err
}

// LoadedModel describes a tokenizer held by the registry.
type LoadedModel struct {
	Model    string
	Dir      string
	LoadTime time.Duration
}

// Loaded lists the model names served from a loaded tokenizer (the first
// maxCachedNames), sorted by name.
func (r *Registry) Loaded() []LoadedModel {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]LoadedModel, 0, len(r.byName))
	for name, e := range r.byName {
		out = append(out, LoadedModel{Model: name, Dir: e.dir, LoadTime: e.info.LoadTime})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// ErrModelNotFound is wrapped by Resolve and Get when no location has the model.
var ErrModelNotFound = errors.New("tokenizer not found")

// Resolve returns the directory Get would load model from, without loading it.
func (r *Registry) Resolve(model string) (string, error) {
	if dir, ok := r.cfg.Models[model]; ok {
		if HasTokenizerFile(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("model %q: %w: configured directory %s has no tokenizer.json or tokenizer.json.gz", model, ErrModelNotFound, dir)
	}
	// Names come from API requests: refuse anything that could walk out of the
	// configured directories.
	if err := validModelName(model); err != nil {
		return "", err
	}
	var tried []string
	if r.cfg.HFCacheDir != "" {
		dir, where := resolveHFCache(r.cfg.HFCacheDir, model)
		if dir != "" {
			return dir, nil
		}
		tried = append(tried, where)
	} else {
		tried = append(tried, "HuggingFace cache (not configured)")
	}
	if len(r.cfg.Dirs) == 0 {
		tried = append(tried, "model dirs (none configured)")
	}
	for _, base := range r.cfg.Dirs {
		cands := []string{filepath.Join(base, filepath.FromSlash(model))}
		if i := strings.LastIndexByte(model, '/'); i >= 0 {
			cands = append(cands, filepath.Join(base, model[i+1:]))
		}
		for _, c := range cands {
			if HasTokenizerFile(c) {
				return c, nil
			}
			tried = append(tried, c)
		}
	}
	if len(r.cfg.Models) == 0 {
		tried = append([]string{"models map (empty)"}, tried...)
	} else {
		tried = append([]string{"models map (no entry)"}, tried...)
	}
	return "", fmt.Errorf("model %q: %w; tried: %s", model, ErrModelNotFound, strings.Join(tried, ", "))
}

func validModelName(model string) error {
	if model == "" {
		return fmt.Errorf("empty model name: %w", ErrModelNotFound)
	}
	if len(model) > 256 || strings.ContainsAny(model, "\\\x00") || strings.HasPrefix(model, "/") {
		return fmt.Errorf("model %q: %w: invalid model name", model, ErrModelNotFound)
	}
	for _, seg := range strings.Split(model, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("model %q: %w: invalid model name", model, ErrModelNotFound)
		}
	}
	return nil
}

// resolveHFCache finds model in a HuggingFace hub cache. It returns the snapshot dir,
// or "" and a description of what was looked at.
func resolveHFCache(cacheDir, model string) (dir, tried string) {
	repoDir := filepath.Join(cacheDir, "models--"+strings.ReplaceAll(model, "/", "--"))
	snaps := filepath.Join(repoDir, "snapshots")
	if ref, err := os.ReadFile(filepath.Join(repoDir, "refs", "main")); err == nil {
		rev := strings.TrimSpace(string(ref))
		if rev != "" && !strings.ContainsAny(rev, "/\\") && rev != "." && rev != ".." {
			d := filepath.Join(snaps, rev)
			if HasTokenizerFile(d) {
				return d, ""
			}
		}
	}
	ents, err := os.ReadDir(snaps)
	if err != nil {
		return "", snaps
	}
	type snap struct {
		dir string
		mod time.Time
	}
	var cands []snap
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := filepath.Join(snaps, e.Name())
		if !HasTokenizerFile(d) {
			continue
		}
		// The tokenizer file's own mtime: snapshot dirs are re-touched when any file
		// of the revision is fetched. HF stores symlinks into blobs/, Stat follows them.
		st, err := os.Stat(filepath.Join(d, tokenizerJSONName))
		if err != nil {
			st, err = os.Stat(filepath.Join(d, tokenizerJSONGzName))
		}
		if err != nil {
			continue
		}
		info, err := e.Info()
		mod := st.ModTime()
		if err == nil && info.ModTime().After(mod) {
			mod = info.ModTime()
		}
		cands = append(cands, snap{d, mod})
	}
	if len(cands) == 0 {
		return "", snaps + " (no snapshot with tokenizer.json)"
	}
	sort.Slice(cands, func(i, j int) bool {
		if !cands[i].mod.Equal(cands[j].mod) {
			return cands[i].mod.After(cands[j].mod)
		}
		return cands[i].dir < cands[j].dir // deterministic on equal times
	})
	return cands[0].dir, ""
}

// DefaultHFCacheDir returns the HuggingFace hub cache the huggingface_hub library
// would use: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub. It does not check that the directory exists.
func DefaultHFCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub")
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "huggingface", "hub")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "huggingface", "hub")
	}
	return ""
}
