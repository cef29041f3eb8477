package proxyconfig

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"
)

// TestGoDocComplete: every exported type, function, method, constant,
// variable and struct field of the package has a comment (a doc comment,
// or a line comment on a field), so that go doc -all leaves nothing
// unexplained.
func TestGoDocComplete(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	missing := func(pos token.Pos, what string) { t.Errorf("%v: %s has no comment", fset.Position(pos), what) }
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if d.Name.IsExported() && d.Doc == nil && (d.Recv == nil || exportedRecv(d.Recv)) {
						missing(d.Pos(), d.Name.Name)
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							if d.Doc == nil && s.Doc == nil {
								missing(s.Pos(), s.Name.Name)
							}
							if st, ok := s.Type.(*ast.StructType); ok {
								for _, fld := range st.Fields.List {
									for _, n := range fld.Names {
										if n.IsExported() && fld.Doc == nil && fld.Comment == nil {
											missing(n.Pos(), s.Name.Name+"."+n.Name)
										}
									}
								}
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								// In a group each needs its own (as internal/doccheck asks).
								if n.IsExported() && s.Doc == nil && s.Comment == nil && (d.Lparen.IsValid() || d.Doc == nil) {
									missing(n.Pos(), n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
}

func exportedRecv(fl *ast.FieldList) bool {
	typ := fl.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.IsExported()
}
