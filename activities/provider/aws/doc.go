// Package aws will be the provider of Squid instances on EC2 (issue 33): exactly-once
// creates through RunInstances' ClientToken, ownership tags, a shared security group per
// configuration, Spot, and user data that installs Debian's Squid with the hardened
// configuration. Only its test fake (ec2test) exists so far, built first so that every
// later step runs the real SDK against the EC2 query protocol.
package aws
