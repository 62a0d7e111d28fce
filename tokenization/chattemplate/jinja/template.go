package jinja

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// Template is a parsed template. It is immutable and safe for concurrent
// Render calls.
type Template struct {
	body []Node
}

// Limits on work one render may do, so a hostile template or input fails
// with an error instead of exhausting the stack or memory.
const (
	maxCallDepth = 200      // nested macro calls
	maxOutput    = 64 << 20 // bytes of rendered text
	maxRangeLen  = 1 << 20  // items of one range()
	maxSteps     = 1 << 18  // loop iterations and macro calls
)

// checkLen fails a render that would build a string or list larger than
// the output cap.
func checkLen(n int) {
	if n > maxOutput {
		throw("value larger than %d bytes or items", maxOutput)
	}
}

func (r *renderer) step() {
	r.steps++
	if r.steps > maxSteps {
		throw("template did more than %d loop iterations and macro calls", maxSteps)
	}
}

// Parse parses a template with transformers' chat-template environment
// settings. Unknown filters and tests and unsupported tags are load-time
// errors (*UnsupportedError), as are syntax errors (*SyntaxError).
func Parse(src string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			if pe, ok := r.(parseError); ok {
				err = pe.err
				return
			}
			if re, ok := r.(runtime.Error); ok {
				err = fmt.Errorf("internal template parser error: %v", re)
				return
			}
			panic(r)
		}
	}()
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, _ := p.parseBody()
	t = &Template{body: body}
	if err := t.check(); err != nil {
		return nil, err
	}
	return t, nil
}

// check rejects at load time what Jinja2 rejects at compile time (unknown
// filters and tests) and the method calls this engine does not implement.
func (t *Template) check() error {
	var err error
	t.Walk(func(n Node) bool {
		if err != nil {
			return false
		}
		switch n := n.(type) {
		case *Filter:
			if _, ok := filters[n.Name]; !ok {
				err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", n.Name)}
			}
		case *Test:
			if _, ok := tests[n.Name]; !ok {
				err = &UnsupportedError{Feature: fmt.Sprintf("test %q", n.Name)}
			}
		case *FilterBlock:
			for _, f := range n.Filters {
				if _, ok := filters[f.Name]; !ok {
					err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", f.Name)}
				}
			}
		case *AssignBlock:
			for _, f := range n.Filters {
				if _, ok := filters[f.Name]; !ok {
					err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", f.Name)}
				}
			}
		case *Call:
			if a, ok := n.Func.(*Attr); ok && unsupportedMethods[a.Name] {
				err = &UnsupportedError{Feature: fmt.Sprintf("method .%s()", a.Name)}
			}
		case *Name:
			if unsupportedGlobals[n.Name] {
				err = &UnsupportedError{Feature: fmt.Sprintf("global %s()", n.Name)}
			}
		}
		return true
	})
	return err
}

// Env holds what a render needs besides the variables.
type Env struct {
	// Now is strftime_now's clock; nil means time.Now.
	Now func() time.Time
}

// Render renders the template with vars: template values (see FromJSON)
// or plain Go nil, bools, numbers, strings, []any, []string and
// map[string]any. Errors are *RenderError, *RaisedError or, for a panic
// that escaped the engine's own checks, a plain error; Render never panics.
func (t *Template) Render(env Env, vars map[string]any) (out string, err error) {
	r := &renderer{env: env}
	defer func() {
		if rec := recover(); rec != nil {
			switch v := rec.(type) {
			case renderPanic:
				err = v.err
			case controlFlow:
				err = &RenderError{Msg: "break or continue outside a loop"}
			default:
				// Last resort: an engine bug must not take the daemon down.
				err = fmt.Errorf("internal template engine error: %v", rec)
			}
			out = ""
		}
	}()
	root := &scope{vars: map[string]any{}}
	for k, v := range vars {
		val, err := valueOf(v)
		if err != nil {
			return "", &RenderError{Msg: fmt.Sprintf("variable %s: %v", k, err)}
		}
		root.vars[k] = val
	}
	r.globals = r.makeGlobals()
	var b strings.Builder
	r.out = &b
	r.execList(t.body, root)
	return b.String(), nil
}
