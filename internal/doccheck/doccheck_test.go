package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// published lists the directories, relative to the repository root, of the
// packages users import. proxyconfig and the examples are left out on
// purpose (proxyconfig has its own reference document; examples are
// programs).
var published = []string{
	".",
	"cidkeys",
	"cidroutetest",
	"dtls",
	"dtls/piondtls",
	"dtls/piondtls/dtlsecho",
	"edge",
	"health",
	"hrw",
	"ppv2",
	"ppv2/backend",
	"promcollector",
	"quic",
	"quic/quicgo",
	"quic/quicgo/quicecho",
	"registry",
	"registry/kubernetes",
	"shutdown",
	"udpio",
	"xdp",
}

// TestDocComments fails for each exported identifier, struct field,
// interface method or method of an exported type in a published package
// that go doc would show without a comment. A member of a grouped const or
// var declaration needs its own comment (a line comment will do), since
// the group's comment rarely says what each value means.
func TestDocComments(t *testing.T) {
	root := filepath.Join("..", "..")
	var missing []string
	for _, dir := range published {
		m, err := undocumented(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range m {
			missing = append(missing, filepath.ToSlash(filepath.Join(dir, s)))
		}
	}
	sort.Strings(missing)
	for _, s := range missing {
		t.Errorf("no doc comment: %s", s)
	}
	if len(missing) > 0 {
		t.Logf("%d undocumented", len(missing))
	}
}

// TestDocCommentsCatches checks the checker on a package that lacks each
// kind of comment, so that a checker that finds nothing cannot pass.
func TestDocCommentsCatches(t *testing.T) {
	dir := t.TempDir()
	src := `package p

type T struct {
	A int
	b int
	// C is documented.
	C int
	D int // D is documented.
}

// U is documented.
type U interface {
	M()
}

func (T) String() string { return "" }

func (t *T) unexported() {}

type hidden struct{ X int }

func (hidden) Exported() {}

const (
	// K is documented.
	K = iota
	L
)

var V, W = 1, 2

func F() {}
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// A test file is not part of go doc.
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nfunc G() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := undocumented(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"p.go: package p",
		"p.go:27: const L",
		"p.go:30: var V",
		"p.go:30: var W",
		"p.go:32: func F",
		"p.go:3: type T",
		"p.go:4: field T.A",
		"p.go:13: method U.M",
		"p.go:16: method T.String",
	}
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// undocumented parses the non-test Go files of dir (every build tag, since
// go doc shows a declaration whichever platform declares it), skipping
// generated files, and returns "file:line: what" for each missing comment.
func undocumented(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	pkgs := map[string]map[string]*ast.File{}
	for _, e := range entries {
		fn := e.Name()
		if e.IsDir() || !strings.HasSuffix(fn, ".go") || strings.HasSuffix(fn, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, fn), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if pkgs[f.Name.Name] == nil {
			pkgs[f.Name.Name] = map[string]*ast.File{}
		}
		pkgs[f.Name.Name][fn] = f
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("%s: no Go package: update the published list", dir)
	}
	var out []string
	report := func(pos token.Pos, what string) {
		p := fset.Position(pos)
		out = append(out, fmt.Sprintf("%s:%d: %s", filepath.Base(p.Filename), p.Line, what))
	}
	for name, pkg := range pkgs {
		if name == "main" {
			continue
		}
		files := make([]string, 0, len(pkg))
		for fn := range pkg {
			files = append(files, fn)
		}
		sort.Strings(files)
		hasPkgDoc := false
		exportedTypes := map[string]bool{}
		for _, fn := range files {
			f := pkg[fn]
			if f.Doc != nil {
				hasPkgDoc = true
			}
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
					for _, s := range g.Specs {
						if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
							exportedTypes[ts.Name.Name] = true
						}
					}
				}
			}
		}
		if !hasPkgDoc {
			out = append(out, fmt.Sprintf("%s: package %s", filepath.Base(files[0]), name))
		}
		for _, fn := range files {
			f := pkg[fn]
			if ast.IsGenerated(f) {
				continue
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					checkFunc(d, exportedTypes, report)
				case *ast.GenDecl:
					checkGen(d, report)
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func checkFunc(d *ast.FuncDecl, exportedTypes map[string]bool, report func(token.Pos, string)) {
	if !d.Name.IsExported() || d.Doc != nil {
		return
	}
	if d.Recv == nil {
		report(d.Pos(), "func "+d.Name.Name)
		return
	}
	recv := recvName(d.Recv.List[0].Type)
	if exportedTypes[recv] {
		report(d.Pos(), "method "+recv+"."+d.Name.Name)
	}
}

// recvName is the receiver's type name, without pointer or type parameters.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

func checkGen(d *ast.GenDecl, report func(token.Pos, string)) {
	for _, s := range d.Specs {
		switch s := s.(type) {
		case *ast.TypeSpec:
			if !s.Name.IsExported() {
				continue
			}
			if s.Doc == nil && s.Comment == nil && (d.Lparen.IsValid() || d.Doc == nil) {
				report(s.Pos(), "type "+s.Name.Name)
			}
			checkMembers(s.Name.Name, s.Type, report)
		case *ast.ValueSpec:
			for _, n := range s.Names {
				if !n.IsExported() {
					continue
				}
				// An ungrouped declaration's comment is the decl's; a
				// grouped one needs the member's own.
				documented := s.Doc != nil || s.Comment != nil || (!d.Lparen.IsValid() && d.Doc != nil)
				if !documented {
					report(n.Pos(), strings.ToLower(d.Tok.String())+" "+n.Name)
				}
			}
		}
	}
}

// checkMembers reports the exported fields of a struct type and the
// exported methods of an interface type that have neither a doc comment
// nor a line comment. Embedded fields document themselves by their type.
func checkMembers(typ string, e ast.Expr, report func(token.Pos, string)) {
	var list *ast.FieldList
	kind := "field"
	switch x := e.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list, kind = x.Methods, "method"
	default:
		return
	}
	for _, f := range list.List {
		if len(f.Names) == 0 || f.Doc != nil || f.Comment != nil {
			continue
		}
		for _, n := range f.Names {
			if n.IsExported() {
				report(n.Pos(), kind+" "+typ+"."+n.Name)
			}
		}
	}
}
