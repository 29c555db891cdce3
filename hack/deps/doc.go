// Package deps holds no code. Its directory installs the system packages the tests need
// (apt.sh, run by `make deps`, which `make test` runs first), and its test runs apt.sh
// against stand-ins for dpkg-query, apt-get and id, so nothing is installed.
package deps
