package jinja

import "fmt"

// SyntaxError is a template that does not parse.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("template syntax error, line %d: %s", e.Line, e.Msg)
}

// UnsupportedError is a template using a Jinja2 feature this engine does
// not implement; it is reported when the template is loaded, never as a
// silently different render.
type UnsupportedError struct {
	Line    int
	Feature string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("unsupported template feature, line %d: %s", e.Line, e.Feature)
}

// RenderError is a failure while rendering (an undefined value used, a
// type error, ...), as Jinja2 would raise.
type RenderError struct{ Msg string }

func (e *RenderError) Error() string { return "template render error: " + e.Msg }

// RaisedError is raise_exception(message) called by the template.
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return "template raised an exception: " + e.Message }

// renderPanic carries an error from deep inside evaluation to Render.
type renderPanic struct{ err error }

func throw(format string, args ...any) {
	panic(renderPanic{&RenderError{Msg: fmt.Sprintf(format, args...)}})
}

func throwErr(err error) { panic(renderPanic{err}) }
