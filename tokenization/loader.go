package tokenization

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// File names looked up in a model directory. tokenizer.json.gz lets fixtures and
// air-gapped deployments keep the (10-30 MB) file compressed.
const (
	tokenizerJSONName   = "tokenizer.json"
	tokenizerJSONGzName = "tokenizer.json.gz"
	tokenizerConfigName = "tokenizer_config.json"
)

// maxTokenizerFileBytes caps what we read (after decompression), so a corrupt or
// hostile .gz cannot exhaust memory. The largest real tokenizer.json files
// (Gemma 3, ~33 MB) are far below it.
const maxTokenizerFileBytes = 512 << 20

// ErrNoTokenizerFile is returned (wrapped) when a directory has neither tokenizer.json
// nor tokenizer.json.gz.
var ErrNoTokenizerFile = errors.New("no tokenizer.json or tokenizer.json.gz")

// HasTokenizerFile reports whether dir contains tokenizer.json or tokenizer.json.gz.
func HasTokenizerFile(dir string) bool {
	for _, n := range []string{tokenizerJSONName, tokenizerJSONGzName} {
		if st, err := os.Stat(filepath.Join(dir, n)); err == nil && st.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// ReadTokenizerFiles reads dir/tokenizer.json (or dir/tokenizer.json.gz) and the
// optional dir/tokenizer_config.json (config is nil when absent; the file may also be
// gzip-compressed as tokenizer_config.json.gz).
func ReadTokenizerFiles(dir string) (tokenizerJSON, tokenizerConfigJSON []byte, err error) {
	tokenizerJSON, err = readMaybeGz(filepath.Join(dir, tokenizerJSONName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s: %w", dir, ErrNoTokenizerFile)
	}
	if err != nil {
		return nil, nil, err
	}
	tokenizerConfigJSON, err = readMaybeGz(filepath.Join(dir, tokenizerConfigName))
	if errors.Is(err, fs.ErrNotExist) {
		return tokenizerJSON, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return tokenizerJSON, tokenizerConfigJSON, nil
}

// LoadDir loads the tokenizer stored in dir (see ReadTokenizerFiles).
func LoadDir(dir string) (*Tokenizer, error) {
	tj, cfg, err := ReadTokenizerFiles(dir)
	if err != nil {
		return nil, err
	}
	tok, err := Load(tj, cfg)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", dir, err)
	}
	return tok, nil
}

// ReadTokenizerPath reads a model directory (see ReadTokenizerFiles) or a
// tokenizer.json[.gz] file of any name, with tokenizer_config.json[.gz] from
// the file's directory when present.
func ReadTokenizerPath(path string) (tokenizerJSON, tokenizerConfigJSON []byte, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if st.IsDir() {
		return ReadTokenizerFiles(path)
	}
	if strings.HasSuffix(path, ".gz") {
		tokenizerJSON, err = readGz(path)
	} else {
		tokenizerJSON, err = readLimited(path)
	}
	if err != nil {
		return nil, nil, err
	}
	tokenizerConfigJSON, err = readMaybeGz(filepath.Join(filepath.Dir(path), tokenizerConfigName))
	if errors.Is(err, fs.ErrNotExist) {
		return tokenizerJSON, nil, nil
	}
	return tokenizerJSON, tokenizerConfigJSON, err
}

// readMaybeGz reads path, or path+".gz" decompressed when path does not exist.
func readMaybeGz(path string) ([]byte, error) {
	b, err := readLimited(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	b, gzErr := readGz(path + ".gz")
	if errors.Is(gzErr, fs.ErrNotExist) {
		return nil, err // report the plain name as missing
	}
	return b, gzErr
}

// readGz reads and decompresses a gzip file, within the same size limit.
func readGz(path string) ([]byte, error) {
	raw, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxTokenizerFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) > maxTokenizerFileBytes {
		return nil, fmt.Errorf("%s: decompressed size exceeds %d bytes", path, maxTokenizerFileBytes)
	}
	return out, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s: is a directory", path)
	}
	if st.Size() > maxTokenizerFileBytes {
		return nil, fmt.Errorf("%s: %d bytes exceeds the %d byte limit", path, st.Size(), maxTokenizerFileBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenizerFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTokenizerFileBytes {
		return nil, fmt.Errorf("%s: exceeds the %d byte limit", path, maxTokenizerFileBytes)
	}
	return b, nil
}
