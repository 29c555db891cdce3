// Package tools holds no code. Its directory builds the project's pinned tools
// (install.sh, one wrapper module per tool), and its test proves what a new user sees: on a
// fresh clone with an empty tool cache, `make test` builds the tools it needs before it
// uses them.
package tools
