// Package doccheck holds a test that keeps go doc complete: it fails when
// an exported identifier, field or method of a published package has no
// doc comment. It has no code of its own; the test parses the packages'
// source files, so it covers the nested modules too without importing them.
package doccheck
