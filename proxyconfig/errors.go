package proxyconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/cidroute/cidroute/internal/boundedread"
	"github.com/cidroute/cidroute/internal/strictjson"
)

// An Error is one mistake in a configuration file (or in a file it names),
// in one format for every mistake:
//
//	FILE:LINE:COLUMN: KEY: PROBLEM; FIX
//
// for instance
//
//	cidproxy.json:12:21: services[0].cid_length: 0 is not a DTLS CID length; write 5-255 (8 is usual)
//
// LINE:COLUMN is where the value (or, for an unknown or repeated key, the
// key) starts; the column counts bytes, as Go's tools do. Parts that do
// not apply are left out: Parse has no FILE, a file that cannot be read
// no position, a syntax error no KEY.
type Error struct {
	// File is the path of the file as the program was given it ("" from
	// Parse).
	File string
	// Line and Column are 1-based; 0 when the mistake has no position
	// (a file that cannot be read, a missing file).
	Line, Column int
	// Key is the key's JSON path: "services[0].cid_length",
	// "services[1].backends[2].ordinal", "[0].address" in a backend list
	// file; "" for the file as a whole.
	Key string
	// Problem says what is wrong, quoting the value as written.
	Problem string
	// Fix says what to write instead.
	Fix string
	// Err is the underlying error (a registry, cidkeys or os error, or
	// ErrNoSource, ErrNoKubernetes), for errors.Is; nil for most mistakes.
	Err error
}

// Error formats e as FILE:LINE:COLUMN: KEY: PROBLEM; FIX.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		if e.File != "" {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%d:%d", e.Line, e.Column)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	if e.Fix != "" {
		b.WriteString("; ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// A source is a file being read: its bytes and where each key's value is,
// so that a mistake found in the decoded values is reported at its line
// and column.
type source struct {
	file    string
	data    []byte
	nodes   map[string]node // by JSON path; "" is the whole file
	keyEnds map[int]string  // offset just after a key's closing quote → the key's path
	// services are the paths of the services by name ("services[2]"),
	// to position the errors found after parsing (Validate, Build).
	services map[string]string
}

// A node is where one value is in the file.
type node struct {
	key int // offset of the key's opening quote; -1 for list elements and the root
	val int // offset of the value's first byte
	end int // offset just after the value
}

// readSource checks that data is one JSON value of the kind want ('{' or
// '[') and indexes it. The errors are *Error.
func readSource(file string, data []byte, want byte) (*source, error) {
	s := &source{file: file, data: data, nodes: map[string]node{}, keyEnds: map[int]string{}, services: map[string]string{}}
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return nil, s.errAt(0, "", "the file starts with a byte order mark (U+FEFF)", "save it as UTF-8 without a BOM")
	}
	first := skipSpace(data, 0)
	if first == len(data) {
		return nil, &Error{File: file, Problem: "the file is empty", Fix: "write one JSON " + kindWord(want)}
	}
	if data[first] != want {
		if looksLikeYAML(data) {
			return nil, s.errAt(first, "", "this looks like YAML; cidproxy reads JSON",
				`write the same keys as one JSON object: {"services": [{"name": "coaps", ...}]}`)
		}
		if data[first] == '/' || data[first] == '#' {
			return nil, s.errAt(first, "", "a comment", "remove it: JSON has no comments")
		}
		if want == '{' && data[first] == '[' {
			return nil, s.errAt(first, "", "the file is a JSON list, not an object (a backend list belongs in a backends_file)",
				`write one JSON object: {"services": [...]}`)
		}
		return nil, s.errAt(first, "", fmt.Sprintf("the file starts with %s", quoteByte(data[first])), "write one JSON "+kindWord(want))
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, s.syntaxError(err)
	}
	s.value(0, "", -1)
	return s, nil
}

func kindWord(c byte) string {
	if c == '[' {
		return "list [...] (see docs/configuration.md)"
	}
	return "object {...} (see docs/configuration.md)"
}

func quoteByte(c byte) string {
	if c < 0x20 || c >= 0x7f {
		return fmt.Sprintf("byte 0x%02x", c)
	}
	return fmt.Sprintf("%q", rune(c))
}

// looksLikeYAML reports whether a line of data is a line of a YAML
// mapping or list: "key:", "key: value", "- item", or a document marker.
func looksLikeYAML(data []byte) bool {
	for line := range bytes.Lines(data) {
		line = bytes.TrimLeft(line, " \t\r\f")
		switch {
		case bytes.HasPrefix(line, []byte("---")) && len(bytes.TrimSpace(line[3:])) == 0,
			bytes.HasPrefix(line, []byte("- ")):
			return true
		}
		i := 0
		for i < len(line) && (isAlnum(line[i]) || line[i] == '_' || i > 0 && line[i] == '-') {
			i++
		}
		if i == 0 || '0' <= line[0] && line[0] <= '9' {
			continue
		}
		rest := bytes.TrimLeft(line[i:], " \t")
		if len(rest) > 0 && rest[0] == ':' && (len(rest) == 1 || strings.ContainsRune(" \t\r\n\f\v", rune(rest[1]))) {
			return true
		}
	}
	return false
}

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\r' || d[i] == '\n') {
		i++
	}
	return i
}

// skipString returns the offset after the string starting at d[i] ('"'),
// or -1.
func skipString(d []byte, i int) int {
	for i++; i < len(d); i++ {
		switch d[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// value indexes the value at d[i:] under path and returns the offset after
// it, or -1 (the data is valid JSON when it is called, so only on a bug).
func (s *source) value(i int, path string, key int) int {
	d := s.data
	if i = skipSpace(d, i); i >= len(d) {
		return -1
	}
	start := i
	switch d[i] {
	case '{':
		for i++; ; {
			if i = skipSpace(d, i); i >= len(d) {
				return -1
			}
			if d[i] == '}' {
				i++
				break
			}
			if d[i] == ',' {
				i++
				continue
			}
			k := i
			e := skipString(d, i)
			var name string
			if d[i] != '"' || e < 0 || json.Unmarshal(d[k:e], &name) != nil {
				return -1
			}
			child := name
			if path != "" {
				child = path + "." + name
			}
			s.keyEnds[e] = child
			if i = skipSpace(d, e); i >= len(d) || d[i] != ':' {
				return -1
			}
			if i = s.value(i+1, child, k); i < 0 {
				return -1
			}
		}
	case '[':
		for n, i0 := 0, i+1; ; {
			if i0 = skipSpace(d, i0); i0 >= len(d) {
				return -1
			}
			if d[i0] == ']' {
				i = i0 + 1
				break
			}
			if d[i0] == ',' {
				i0++
				continue
			}
			if i0 = s.value(i0, path+"["+strconv.Itoa(n)+"]", -1); i0 < 0 {
				return -1
			}
			n++
		}
	case '"':
		if i = skipString(d, i); i < 0 {
			return -1
		}
	default:
		for i < len(d) && !strings.ContainsRune(",]} \t\r\n", rune(d[i])) {
			i++
		}
	}
	s.nodes[path] = node{key: key, val: start, end: i}
	return i
}

// has reports whether the file gives path.
func (s *source) has(path string) bool {
	_, ok := s.nodes[path]
	return ok
}

// raw is the value at path as written ("" when absent).
func (s *source) raw(path string) string {
	n, ok := s.nodes[path]
	if !ok {
		return ""
	}
	return string(s.data[n.val:n.end])
}

// lineCol turns a byte offset into a 1-based line and column.
func (s *source) lineCol(off int) (line, col int) {
	off = max(0, min(off, len(s.data)))
	line = 1 + bytes.Count(s.data[:off], []byte{'\n'})
	return line, off - (bytes.LastIndexByte(s.data[:off], '\n') + 1) + 1
}

func (s *source) errAt(off int, key, problem, fix string) *Error {
	e := &Error{File: s.file, Key: key, Problem: problem, Fix: fix}
	e.Line, e.Column = s.lineCol(off)
	return e
}

// err makes the error of the value at path, positioned at the value, or
// at the innermost object that holds it when the key is absent.
func (s *source) err(path, problem, fix string) *Error {
	return s.errAt(s.offset(path, false), path, problem, fix)
}

// keyErr is err positioned at the key.
func (s *source) keyErr(path, problem, fix string) *Error {
	return s.errAt(s.offset(path, true), path, problem, fix)
}

func (s *source) offset(path string, atKey bool) int {
	for {
		if n, ok := s.nodes[path]; ok {
			if atKey && n.key >= 0 {
				return n.key
			}
			return n.val
		}
		if path == "" {
			return 0
		}
		path = parentPath(path)
	}
}

// parentPath is the path of the object or list that holds path.
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// wrap positions err, an error of the value at path, keeping it for
// errors.Is.
func (s *source) wrap(path string, err error, problem, fix string) *Error {
	e := s.err(path, problem, fix)
	e.Err = err
	return e
}

// syntaxError words an encoding/json syntax error at its line and column,
// naming the usual causes.
func (s *source) syntaxError(err error) *Error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return &Error{File: s.file, Problem: err.Error(), Err: err}
	}
	d := s.data
	off := int(se.Offset) - 1 // the offending byte
	msg := strings.TrimPrefix(se.Error(), "invalid character ")
	if se.Error() == "unexpected end of JSON input" || off >= len(d) {
		return s.errAt(len(d), "", "the file ends before the JSON does", "close every { and [, and every string")
	}
	off = max(off, 0)
	prev := off - 1
	for prev >= 0 && (d[prev] == ' ' || d[prev] == '\t' || d[prev] == '\r' || d[prev] == '\n') {
		prev--
	}
	switch {
	case (d[off] == '}' || d[off] == ']') && prev >= 0 && d[prev] == ',':
		return s.errAt(prev, "", fmt.Sprintf("a comma before %q", d[off]), "remove it: JSON allows no trailing comma")
	case d[off] == '/' || d[off] == '#':
		return s.errAt(off, "", "a comment", "remove it: JSON has no comments")
	case d[off] == '\'':
		return s.errAt(off, "", "a single quote", `write strings and keys in double quotes: "coaps"`)
	case strings.Contains(msg, "after object key:value pair") || strings.Contains(msg, "after array element"):
		return s.errAt(off, "", fmt.Sprintf("%s where a comma or the end of the %s is expected", quoteByte(d[off]), map[bool]string{true: "object", false: "list"}[strings.Contains(msg, "object")]),
			"add the missing comma before it")
	case strings.Contains(msg, "looking for beginning of object key string"):
		return s.errAt(off, "", fmt.Sprintf("%s where a key is expected", quoteByte(d[off])), `write each key in double quotes: "name": "coaps"`)
	case strings.Contains(msg, "after object key"):
		return s.errAt(off, "", fmt.Sprintf("%s after a key", quoteByte(d[off])), `write a colon between a key and its value: "name": "coaps"`)
	case strings.Contains(msg, "in string literal"):
		return s.errAt(off, "", "a control character (a tab or a line break) inside a string", `write it escaped (\t, \n) or end the string with " first`)
	case strings.Contains(msg, "looking for beginning of value"):
		return s.errAt(off, "", fmt.Sprintf("%s where a value is expected", quoteByte(d[off])), "close each [ with ] and each { with }, and write every value: a string, number, true, false, object or list")
	case strings.Contains(msg, "after top-level value"):
		return s.errAt(off, "", "more after the end of the JSON object", "remove it: the file is one JSON object")
	}
	return s.errAt(off, "", "not valid JSON: "+se.Error(), "see docs/configuration.md for the format")
}

// decode decodes the value at path (the whole file when path is "") into
// v strictly (strictjson: exact keys, each once), wording its errors at
// their line and column.
func (s *source) decode(path string, v any) error {
	n, ok := s.nodes[path]
	if !ok {
		return s.err(path, "missing", "")
	}
	if err := strictjson.Decode(bytes.NewReader(s.data[n.val:n.end]), v); err != nil {
		return s.decodeError(path, n.val, err)
	}
	return nil
}

func (s *source) decodeError(path string, base int, err error) error {
	var ke *strictjson.KeyError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &ke):
		key := s.keyEnds[base+int(ke.Offset)]
		if key == "" { // not where strictjson said: name it at least
			key = join(path, ke.Key)
		}
		if errors.Is(err, strictjson.ErrRepeatedKey) {
			return s.keyErr(key, "given twice in one object", "keep one (JSON objects have no repeated keys)")
		}
		return s.keyErr(key, "unknown key", didYouMean(ke.Key, knownKeys(key)))
	case errors.As(err, &te):
		key := join(path, te.Field)
		return s.typeError(key, te.Type)
	}
	return s.err(path, err.Error(), "")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	if key == "" {
		return path
	}
	return path + "." + key
}

// typeError says that the value at key is not of the Go type t.
func (s *source) typeError(key string, t reflect.Type) *Error {
	raw := s.raw(key)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var fix string
	unq, _ := strconv.Unquote(raw)
	switch t.Kind() {
	case reflect.Bool:
		if unq == "true" || unq == "false" {
			fix = "write " + unq + " without quotes"
		}
	case reflect.Int, reflect.Int64, reflect.Uint64, reflect.Uint8, reflect.Uint32:
		if _, err := strconv.ParseUint(unq, 10, 64); err == nil {
			fix = "write " + unq + " without quotes"
		} else if _, err := strconv.ParseInt(unq, 10, 64); err == nil {
			fix = "write " + unq + " without quotes"
		}
	}
	if fix == "" {
		fix = "write " + want(key)
	}
	return s.err(key, fmt.Sprintf("%s is %s", shorten(raw), jsonKind(raw, t)), fix)
}

// jsonKind names what is wrong with a value as written, decoded into t.
func jsonKind(raw string, t reflect.Type) string {
	switch {
	case raw == "":
		return "missing"
	case raw[0] == '"':
		return "a string"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "a list"
	case raw == "true" || raw == "false":
		return "a boolean"
	case raw == "null":
		return "null"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint64, reflect.Uint8, reflect.Uint32:
	default:
		return "a number"
	}
	switch {
	case strings.ContainsAny(raw, ".eE"):
		return "not a whole number"
	case raw[0] == '-':
		return "negative"
	}
	return "out of range"
}

func shorten(raw string) string {
	if len(raw) > 40 {
		switch raw[0] {
		case '{':
			return "{...}"
		case '[':
			return "[...]"
		}
		return raw[:37] + "..."
	}
	return raw
}

// knownKeys lists the keys of the object that holds key.
func knownKeys(key string) []string {
	t := fileTypes[normalize(parentPath(key))]
	if t == nil {
		return nil
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" && f.IsExported() {
			names = append(names, name)
		}
	}
	return names
}

// fileTypes are the Go types of the file's objects, by normalized path.
var fileTypes = map[string]reflect.Type{
	"":                        reflect.TypeFor[fileConfig](),
	"services[]":              reflect.TypeFor[fileService](),
	"services[].limits":       reflect.TypeFor[fileLimits](),
	"services[].health_check": reflect.TypeFor[fileHealthCheck](),
	"services[].kubernetes":   reflect.TypeFor[Kubernetes](),
	"services[].backends[]":   reflect.TypeFor[fileBackend](),
	"[]":                      reflect.TypeFor[fileBackend](), // a backends_file
}

// normalize drops the list indices of a path: services[2].limits →
// services[].limits.
func normalize(path string) string {
	var b strings.Builder
	for {
		open := strings.IndexByte(path, '[')
		if open < 0 {
			break
		}
		end := open + 1
		for end < len(path) && '0' <= path[end] && path[end] <= '9' {
			end++
		}
		if end > open+1 && end < len(path) && path[end] == ']' {
			b.WriteString(path[:open+1])
			path = path[end:]
		} else {
			b.WriteString(path[:open+1])
			path = path[open+1:]
		}
	}
	b.WriteString(path)
	return b.String()
}

// didYouMean is the fix of an unknown key: the known key it most likely
// means, or the list of known keys.
func didYouMean(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Sprintf("write %q (keys are lower case)", k)
		}
		if d := editDistance(strings.ToLower(key), k); d < bestD || d == bestD && best == "" && d <= len(k)/3 {
			best, bestD = k, d
		}
	}
	if best != "" && bestD <= max(1, len(best)/3) {
		return fmt.Sprintf("did you mean %q?", best)
	}
	if len(known) == 0 {
		return "remove it"
	}
	return "remove it, or write one of " + quoteList(known)
}

func quoteList(ks []string) string {
	q := make([]string, len(ks))
	for i, k := range ks {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, ", ")
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// readError words the failure to read the file at path: what is wrong
// with it (to follow its name) and what to do.
func readError(path string, err error) (problem, fix string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist", "create it, or correct the path"
	case errors.Is(err, fs.ErrPermission):
		return "cannot be read (permission denied)", "make it readable by the user cidproxy runs as"
	case errors.Is(err, boundedread.ErrNotRegular):
		what := "not a regular file"
		if fi, serr := os.Stat(path); serr == nil {
			what = fmt.Sprintf("%s (mode %04o), not a regular file", boundedread.TypeName(fi.Mode()), fi.Mode().Perm())
		}
		return "is " + what, "give the path of a regular file"
	case errors.Is(err, boundedread.ErrTooLarge):
		return "is too large (" + strings.TrimPrefix(err.Error(), path+": ") + ")", "give the path of the JSON file (a few kilobytes)"
	case errors.Is(err, boundedread.ErrTimeout), errors.Is(err, boundedread.ErrBlocked):
		return fmt.Sprintf("could not be read within %v", readTimeout), "check the file system it is on"
	}
	return "cannot be read: " + err.Error(), ""
}
