// Package aws runs Proxy instances on EC2 (provider aws, spec.aws) through the AWS SDK for
// Go v2. A create looks for its instance first (by its proxyfleet-instance tag) and asks
// RunInstances under a client token made of the name and a hash of the request, so a
// retried or replayed create returns the first instance and one cut short is still found
// and deleted. Instances require IMDSv2 with a hop limit of 1, have no instance profile
// unless the spec names one, and boot the hardened Squid (squid.InstanceScript) from
// their user data. Ownership tags are listed a page at a time and checked with
// Owner.Owns; terminate is idempotent; a Spot instance EC2 took back is ErrPreempted;
// EC2's errors are classified. One owned security group per configuration (VPC, port,
// source ranges of either family) is shared, put back when it drifts, and reported to the
// sweep once unused (deleted only while no instance uses it). EC2's lists are eventually
// consistent, so a create reports a provider ID with the instance's ID and launch time,
// and a young instance no list shows is "not listed yet", not gone; Gets of a region are
// coalesced into one describe call (batch.go). Tests run the real SDK against ec2test.
package aws
