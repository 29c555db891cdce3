// Package layers holds no code. Its test states which of the project's packages may link
// which, and fails when an import runs up the house: a package that reads or starts
// workflows linking the workflow code, or discovery linking Kubernetes. An arrow up costs
// more than a longer build: the process links and initialises everything behind it, and a
// change below starts breaking callers it should never have had.
package layers
