// Package aws runs Proxy instances on EC2 (issue 33, in progress). What is here: exactly-
// once creates (a create looks for its instance first, and the instance's name is
// RunInstances' ClientToken and a tag, so a retried or replayed create returns the first
// instance, and one cut short is still found and deleted), IMDSv2 required with a hop
// limit of 1, no instance profile unless the machine names one, user data that boots the
// hardened Squid (squid.InstanceScript), ownership tags listed a page at a time and
// checked with Owner.Owns, idempotent terminate, Spot interruptions reported as
// preempted, EC2's errors classified, and one owned security group per configuration
// (VPC, port, source ranges of either family), shared, put back when it drifts, and
// reported to the sweep once unused (deleted only while no instance uses it). An image may
// be an SSM parameter (Debian's public one), which EC2 resolves at launch.
//
// Not yet: spec.aws in the API (Machine stands for it) and the worker's --providers flag
// (and so the sweeper's coverage in a deployment). Tests run the real SDK against ec2test.
package aws
