package ec2test

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Config points an AWS SDK client at the fake: its region, static test credentials (the
// SDK signs every request, so signing runs too) and the fake's URL as the endpoint.
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIAEC2TESTFAKE00000", "fake-secret-key", ""),
		BaseEndpoint: aws.String(s.URL),
	}
}
